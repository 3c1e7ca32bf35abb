"""Forecasts in a save's first seconds, on the size the checkpoint's header gives.

The issue's case: a first checkpoint (no previous file beside it) of 64 MB
written at 0.5 MB/s against a 60 s process-group timeout. Reports are built
as an agent sends them, one per simulated second, through Daemon.ingest/tick.
"""

from __future__ import annotations

import pytest

from ncclwatch.daemon.api import forecast_view
from ncclwatch.daemon.core import Daemon, DaemonConfig
from ncclwatch.daemon.forecast import write_forecast
from ncclwatch.model import CollectiveOp, RankState, StallKind
from ncclwatch.status import render
from ncclwatch.v1 import collector_pb2 as pb
from tests.harness.reports import report, sample

S, Op = RankState, CollectiveOp
MB = 1 << 20
TIMEOUT = 60.0
GATHER_RSS = 22 * MB   # what the rank's host memory grew by: less than the file


def _rank0(i: int, *, rate: float, total: int, header: bool, t0: int = 3) -> pb.RankSample:
    """Rank 0: gathering for t0 s (memory grows), then saving at ``rate``."""
    saving = i >= t0
    s = sample("job-1", 0, 2, S.SAVING, seconds=i, timeout=TIMEOUT)
    s.process.rss_bytes = 1000 * MB + (GATHER_RSS if i >= 1 else 0)
    s.process.cpu_utilization = 0.9
    written = min(total, int((i - t0 + 1) * rate)) if saving else 0
    s.process.io_write_bytes = written
    if saving:
        s.process.files_writing.append(pb.OpenFile(
            path="/ckpt/run/ckpt-step200.pt", size_bytes=written,
            expected_size_bytes=total if header else 0,
            expected_source="torch_zip_header" if header else ""))
    return s


def _run(seconds: int, **kw):
    """Yield (second since the save started, daemon, incident or None) each second."""
    d = Daemon(DaemonConfig(stall_threshold=5.0))
    start = 1000.0
    for i in range(seconds):
        now = start + i
        waiter = sample("job-1", 1, 2, S.COLLECTIVE, Op.BARRIER, seconds=i, timeout=TIMEOUT)
        d.ingest(report([_rank0(i, **kw), waiter], seq=i + 1), now=now)
        d.tick(now=now, wall=now)
        yield i - kw.get("t0", 3), d, d.incidents.active.get(("job-1", StallKind.CHECKPOINT_GATHER))


def test_first_checkpoint_overrun_is_forecast_within_seconds() -> None:
    total, rate = 64 * MB, 0.5 * MB        # 128 s of writing against 60 s
    flagged = None
    for t, d, inc in _run(20, rate=rate, total=total, header=True):
        if inc is not None and inc.diagnosis.evidence.overrun is not None \
                and inc.diagnosis.evidence.overrun > 0:
            flagged = t
            break
    assert flagged is not None and flagged <= 5, flagged
    dx = inc.diagnosis
    w = dx.evidence.write
    assert (w.expected_bytes, w.expected_source, w.exact) == (total, "torch_zip_header", True)
    assert w.rate_bytes_per_second == pytest.approx(rate, rel=0.01)
    assert dx.root_cause.id == "save_overruns_watchdog" and inc.at_risk
    assert "size from the torch.save header" in dx.sentence
    view = forecast_view(dx)["checkpoint"]
    assert view["expected_source"] == "torch_zip_header" and view["expected_exact"] is True


def test_the_early_rate_is_the_growth_since_the_file_was_first_seen() -> None:
    seen = {}
    for t, d, _ in _run(8, rate=0.5 * MB, total=64 * MB, header=True):
        if t >= 0:
            w = write_forecast(d.table.jobs["job-1"].ranks[0], 1003.0 + t)
            seen[t] = (w.rate_source, w.rate_bytes_per_second, w.eta_seconds)
    assert seen[0] == ("", 0.0, None)                  # one report: no rate yet
    # The second report: no fit yet (MIN_POINTS over MIN_SPAN), the growth since first seen.
    assert seen[1][0] == "since_first_seen" and seen[1][1] == pytest.approx(0.5 * MB)
    assert seen[1][2] == pytest.approx((64 * MB - MB) / (0.5 * MB))
    assert {seen[t][0] for t in range(2, 5)} == {"fit"}
    assert all(r == pytest.approx(0.5 * MB) for _, r, _ in list(seen.values())[1:])


def test_without_the_header_the_gathered_memory_underestimates_it() -> None:
    """What the daemon did before: 22 MiB from host memory, "time to spare"."""
    for t, d, inc in _run(12, rate=0.5 * MB, total=64 * MB, header=False):
        pass
    w = inc.diagnosis.evidence.write
    assert w.expected_source == "gathered_bytes" and w.expected_bytes == GATHER_RSS
    assert inc.diagnosis.evidence.overrun < 0     # wrong: the save will overrun


def test_first_checkpoint_within_budget_is_never_at_risk() -> None:
    """16 MB at 0.5 MB/s ends ~35 s into a 60 s budget: past half of it, but
    the header's size says it ends in time, so it is never at risk."""
    total, rate = 16 * MB, 0.5 * MB
    risky, last = [], None
    for t, d, inc in _run(38, rate=rate, total=total, header=True):
        if inc is not None:
            last = inc
            if inc.at_risk:
                risky.append((t, inc.diagnosis.sentence))
    assert not risky, risky
    assert last.budget.remaining < TIMEOUT / 2      # the half-budget rule would have fired
    assert last.diagnosis.root_cause.id == "save_within_budget"


def test_status_and_api_name_the_size_source() -> None:
    for t, d, inc in _run(10, rate=0.5 * MB, total=64 * MB, header=True):
        pass
    from ncclwatch.daemon import page
    from ncclwatch.daemon.api import jobs_view
    view = jobs_view(d, now=1009.0)
    text = render(view)
    assert "64.0 MiB (size from the torch.save header)" in text, text
    assert "64.0 MiB (size from the torch.save header)" in page.render(view)
    ck = view["jobs"][0]["stalls"][0]["forecast"]["checkpoint"]
    assert ck["expected_source"] == "torch_zip_header"


def test_a_preallocated_file_is_measured_by_the_ranks_writes_not_its_size() -> None:
    """safetensors sets the file's length first and fills it (seen on a throttled
    mount: the file is full-size at the first look while the save has far to
    go). Its size then says nothing; the bytes the rank wrote since do, and a
    6 MiB save at 60 kB/s is forecast to overrun a 60 s timeout."""
    total, rate = 6 * MB, 60_000.0
    d = Daemon(DaemonConfig(stall_threshold=5.0))
    inc = None
    for i in range(12):
        now = 1000.0 + i
        s = sample("job-1", 0, 2, S.SAVING, seconds=i, timeout=TIMEOUT)
        s.process.io_write_bytes = 5 * MB + int(i * rate)      # writes before the save count too
        s.process.files_writing.append(pb.OpenFile(
            path="/ckpt/model.safetensors", size_bytes=total, expected_size_bytes=total,
            expected_source="safetensors_header"))
        waiter = sample("job-1", 1, 2, S.COLLECTIVE, Op.BARRIER, seconds=i, timeout=TIMEOUT)
        d.ingest(report([s, waiter], seq=i + 1), now=now)
        d.tick(now=now, wall=now)
        inc = d.incidents.active.get(("job-1", StallKind.CHECKPOINT_GATHER))
    w = inc.diagnosis.evidence.write
    assert w.written_bytes == pytest.approx(11 * rate, rel=0.01)   # not the full 6 MiB
    assert w.rate_source == "write_calls"
    assert w.rate_bytes_per_second == pytest.approx(rate, rel=0.05)
    assert inc.diagnosis.evidence.overrun > 0
    assert inc.diagnosis.root_cause.id == "save_overruns_watchdog" and inc.at_risk


def test_a_header_the_file_outgrows_is_not_its_size() -> None:
    """A DCP .distcp file starts with one torch.save record (1577 bytes in a real run
    on a throttled mount) and goes on: once the file is larger, that header size is
    not the checkpoint's, and the save is not 'done'."""
    d = Daemon(DaemonConfig(stall_threshold=5.0))
    inc = None
    for i in range(10):
        now = 1000.0 + i
        s = sample("job-1", 0, 2, S.SAVING, seconds=i, timeout=TIMEOUT)
        size = 135_168 + i * 60_000
        s.process.io_write_bytes = size
        s.process.files_writing.append(pb.OpenFile(
            path="/ckpt/dcp/__0_0.distcp", size_bytes=size, expected_size_bytes=1577,
            expected_source="torch_zip_header"))
        waiter = sample("job-1", 1, 2, S.COLLECTIVE, Op.BARRIER, seconds=i, timeout=TIMEOUT)
        d.ingest(report([s, waiter], seq=i + 1), now=now)
        d.tick(now=now, wall=now)
        inc = d.incidents.active.get(("job-1", StallKind.CHECKPOINT_GATHER))
    w = inc.diagnosis.evidence.write
    assert w.expected_source != "torch_zip_header" and w.eta_seconds != 0.0
    assert w.written_bytes == 135_168 + 9 * 60_000
    assert inc.diagnosis.root_cause.id != "save_within_budget"
