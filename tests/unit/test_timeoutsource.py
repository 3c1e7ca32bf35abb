"""A guessed watchdog timeout says it is one, and the advice under it is safe for any timeout.

A job that sets its timeout in code (``init_process_group(timeout=...)``)
shows ncclwatch nothing: the budget runs on the daemon's default, torch's
600 s. The same save that is "within budget" for a job that stated 90 s must,
for such a job, read "assumed" in the API, the page, ``ncclwatch status`` and
the metrics, and its advice must never be "let it run".
"""

from __future__ import annotations

import pytest

from ncclwatch import status, timeoutsource
from ncclwatch.daemon import api, page
from ncclwatch.daemon.core import Daemon, DaemonConfig
from ncclwatch.daemon.export import make_registry
from ncclwatch.model import CollectiveOp as Op, RankState as S
from tests.harness.reports import report, sample

MB = 2**20


def _save(timeout: float, *, default: float | None = None, seconds: int = 12) -> tuple[Daemon, float]:
    """Rank 0 writes a 30 MiB checkpoint (its previous one: 30 MiB) at 1 MiB/s
    while ranks 1-3 wait in a barrier; every rank states ``timeout`` (0: none)."""
    cfg = DaemonConfig(stall_threshold=5.0)
    if default is not None:
        cfg = DaemonConfig(stall_threshold=5.0, watchdog_timeout=default)
    d = Daemon(cfg)
    for i in range(seconds):
        now = 1000.0 + i
        r0 = sample("job-1", 0, 4, S.SAVING, seconds=i, timeout=timeout)
        r0.process.rss_bytes = 1000 * MB
        r0.process.io_write_bytes = (i + 1) * MB
        r0.process.cpu_utilization = 0.9
        r0.process.files_writing.append(_file((i + 1) * MB))
        samples = [r0] + [sample("job-1", r, 4, S.COLLECTIVE, Op.BARRIER, seconds=i,
                                 timeout=timeout) for r in (1, 2, 3)]
        d.ingest(report(samples, seq=i + 1), now=now)
        d.tick(now=now, wall=now)
    return d, 1000.0 + seconds - 1


def _file(size: int):
    from ncclwatch.v1 import collector_pb2 as pb
    return pb.OpenFile(path="/ckpt/run/ckpt-step200.pt", size_bytes=size,
                       previous_path="/ckpt/run/ckpt-step100.pt", previous_size_bytes=30 * MB)


def _metric(d: Daemon, name: str) -> float:
    return next(s.value for fam in make_registry(d).collect() for s in fam.samples
                if s.name == name and s.labels.get("job_id") == "job-1")


def test_a_job_that_stated_no_timeout_reads_assumed_everywhere_and_is_never_let_run() -> None:
    d, now = _save(timeout=0.0)
    view = api.jobs_view(d, now=now)
    [job] = view["jobs"]
    [stall] = job["stalls"]
    note = "assumed 600 s (torch's default); set in code? the job may time out sooner"
    for w in (job["watchdog"], stall["watchdog"]):
        assert w["timeout_source"] == "default" and w["timeout_assumed"] is True
        assert w["timeout_note"] == note
    assert stall["diagnosis"]["root_cause"] == "save_within_assumed_timeout"
    assert note in stall["diagnosis"]["cause"]
    advice = stall["advice"]
    assert advice["action"] == "dump_now", advice
    assert "let it run" not in advice["headline"].lower()
    assert advice["decide_within_seconds"] is None       # no deadline is certain
    assert _metric(d, "ncclwatch_watchdog_timeout_assumed") == 1.0
    text = status.render(view)
    assert f"left ({note})" in text
    assert "before an assumed watchdog fires" in text
    assert "LET IT RUN" not in text
    html = page.render(view)
    assert html.count("class='assumed'") == 2          # the job's line and the stall's budget
    assert "assumed 600 s (torch&#x27;s default)" in html


def test_the_same_save_under_a_stated_timeout_is_let_run_and_says_nothing_assumed() -> None:
    d, now = _save(timeout=90.0)
    view = api.jobs_view(d, now=now)
    [job] = view["jobs"]
    [stall] = job["stalls"]
    assert job["watchdog"]["timeout_assumed"] is False and job["watchdog"]["timeout_note"] == ""
    assert stall["diagnosis"]["root_cause"] == "save_within_budget"
    assert stall["advice"]["action"] == "let_it_run"
    assert _metric(d, "ncclwatch_watchdog_timeout_assumed") == 0.0
    assert "assumed" not in status.render(view)
    assert "class='assumed'" not in page.render(view)


def test_a_site_default_is_named_as_the_daemons_not_torchs() -> None:
    d, now = _save(timeout=0.0, default=1800.0)
    [job] = api.jobs_view(d, now=now)["jobs"]
    assert job["watchdog"]["timeout_note"].startswith(
        "assumed 1800 s (this daemon's --watchdog-timeout)")


@pytest.mark.parametrize("source,assumed", [
    ("default", True), ("flight_recorder", False), ("job", False), ("config", False)])
def test_only_the_daemons_default_is_a_guess(source: str, assumed: bool) -> None:
    assert timeoutsource.assumed(source) is assumed
    assert bool(timeoutsource.note(600.0, source)) is assumed
    words = timeoutsource.budget_words("9m41s", 600.0, source)
    assert (words == "9m41s (of an assumed 600 s)") is assumed


def test_a_stall_view_from_an_older_daemon_takes_the_jobs_source() -> None:
    """A stall's watchdog without timeout_note/source (an older daemon): status
    reads the job's source and still says the guess."""
    d, now = _save(timeout=0.0)
    view = api.jobs_view(d, now=now)
    for key in ("timeout_note", "timeout_source", "timeout_assumed"):
        view["jobs"][0]["stalls"][0]["watchdog"].pop(key)
    assert "(assumed 600 s (torch's default)" in status.render(view)
