"""Forecasts and diagnoses over curves the daemon builds from reports.

Reports are built as an agent would send them, one per simulated second,
and fed through Daemon.ingest/tick; the expected numbers are computed here
independently (numpy's least squares) from the same inputs.
"""

from __future__ import annotations


import numpy as np
import pytest

from ncclwatch.agent.gpu import RecordedGpuReader
from ncclwatch.daemon.core import Daemon, DaemonConfig
from ncclwatch.daemon.export import make_registry
from ncclwatch.daemon.forecast import memory_forecasts
from ncclwatch.model import CollectiveOp, RankState, StallKind
from ncclwatch.v1 import collector_pb2 as pb
from tests.harness.paths import DATA
from tests.harness.reports import MB, drive_job, rank0_sample, report, sample

S, Op = RankState, CollectiveOp


def _metrics(d: Daemon) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in make_registry(d).collect() for s in fam.samples}


def _incident(d: Daemon, kind: StallKind = StallKind.CHECKPOINT_GATHER):
    inc = d.incidents.active.get(("job-1", kind))
    assert inc is not None, {k: i.diagnosis.sentence for k, i in d.incidents.active.items()}
    return inc


def _fit(ts, ys) -> float:
    return float(np.polyfit(np.asarray(ts, float), np.asarray(ys, float), 1)[0])


def test_a_file_far_past_a_small_previous_file_has_no_known_size() -> None:
    """DCP: rank 1's shard of the same save (2 KB, done in a second) sits beside
    rank 0's .distcp as its "previous checkpoint". Far past it, the write is not
    at its end: the matrix once called a 6 MiB save at 60 kB/s 'within budget'."""
    rate, prev = 60_000, 2_000
    d, now = drive_job(lambda i: rank0_sample(S.SAVING, i, file_size=(i + 1) * rate, prev=prev,
                                     seconds=i), 12)
    dx = _incident(d).diagnosis
    assert dx.root_cause.id != "save_within_budget", dx.sentence
    w = dx.evidence.write
    assert w.expected_bytes is None and w.eta_seconds is None, w
    # Just past a real previous checkpoint (zip records): the save is at its end.
    d, now = drive_job(lambda i: rank0_sample(S.SAVING, i, file_size=min((i + 1) * MB, 10 * MB + 100),
                                     prev=10 * MB, seconds=i), 12)
    w = _incident(d).diagnosis.evidence.write
    assert w.expected_source == "previous_checkpoint" and w.expected_bytes == 10 * MB + 100


def test_slow_save_forecast_to_overrun_the_watchdog() -> None:
    rate, prev = 1 * MB, 200 * MB  # 200 MB at 1 MB/s: 200 s against a 90 s budget
    d, now = drive_job(lambda i: rank0_sample(S.SAVING, i, file_size=(i + 1) * rate, prev=prev,
                                     seconds=i), 12)
    inc = _incident(d)
    dx = inc.diagnosis
    assert dx.root_cause.id == "save_overruns_watchdog"
    assert dx.at_risk and inc.at_risk
    w = dx.evidence.write
    assert w.expected_bytes == prev and w.expected_source == "previous_checkpoint"
    assert w.rate_bytes_per_second == pytest.approx(rate, rel=1e-6)
    assert dx.checkpoint_eta == pytest.approx((prev - 12 * rate) / rate, rel=1e-6)
    overrun = dx.checkpoint_eta - inc.budget.remaining
    assert overrun > 0
    m = _metrics(d)
    assert m[("ncclwatch_watchdog_forecast_overrun_seconds", (("job_id", "job-1"),))] == \
        pytest.approx(overrun)
    assert m[("ncclwatch_checkpoint_eta_seconds", (("job_id", "job-1"),))] == \
        pytest.approx(dx.checkpoint_eta)
    assert m[("ncclwatch_stall_at_risk", (("job_id", "job-1"), ("kind", "checkpoint_gather")))] == 1
    assert m[("ncclwatch_stall_root_cause_info", (("job_id", "job-1"), ("kind", "checkpoint_gather"),
                                                  ("root_cause", "save_overruns_watchdog")))] == 1
    job = (("job_id", "job-1"),)
    assert m[("ncclwatch_checkpoint_written_bytes", job)] == 12 * rate
    assert m[("ncclwatch_checkpoint_expected_bytes", job)] == prev
    assert m[("ncclwatch_checkpoint_write_rate_bytes_per_second", job)] == \
        pytest.approx(rate, rel=1e-6)
    assert m[("ncclwatch_culprit_memory_bytes", (("device", "host"),) + job + (("rank", "0"),))] \
        == 1000 * MB
    assert ("ncclwatch_culprit_memory_bytes", (("device", "host"),) + job + (("rank", "1"),)) \
        not in m  # waiting ranks: counts only, no per-rank series
    assert m[("ncclwatch_job_rank_memory_max_bytes", (("device", "host"),) + job)] >= 1000 * MB
    assert "200.0MiB at 1.0MiB/s" in dx.sentence and "too late" in dx.sentence
    assert "{" not in dx.sentence


def test_fast_enough_save_is_within_budget_and_not_at_risk() -> None:
    rate, prev = 10 * MB, 150 * MB  # 15 s of writing against 90 s
    d, _ = drive_job(lambda i: rank0_sample(S.SAVING, i, file_size=(i + 1) * rate, prev=prev,
                                   seconds=i), 10)
    inc = _incident(d)
    assert inc.diagnosis.root_cause.id == "save_within_budget"
    assert not inc.at_risk and inc.at_risk_since is None
    assert inc.diagnosis.evidence.overrun < -60
    m = _metrics(d)
    assert m[("ncclwatch_stall_at_risk", (("job_id", "job-1"), ("kind", "checkpoint_gather")))] == 0


def test_write_past_the_previous_size_is_at_its_end_not_unknown() -> None:
    """A non-seekable writer's zip records make the file a little larger than
    the previous checkpoint: in its last second the save is done, not unknown."""
    rate, prev = 2 * MB, 16 * MB
    size = lambda i: min((i + 1) * rate, prev + 4096)  # noqa: E731 - grows, then stops
    d, _ = drive_job(lambda i: rank0_sample(S.SAVING, i, file_size=size(i), prev=prev, seconds=i), 12)
    inc = _incident(d)
    assert inc.diagnosis.root_cause.id == "save_within_budget"
    assert inc.diagnosis.checkpoint_eta == 0.0
    assert not inc.at_risk


def test_a_closed_file_means_the_write_is_over_while_the_stack_still_says_saving() -> None:
    """Stacks lag /proc: for a round or two after torch.save closed the file
    the rank still looks "saving"; the save is done, not of unknown length."""
    rate = 2 * MB
    d, _ = drive_job(lambda i: rank0_sample(S.SAVING, i, file_size=(i + 1) * rate if i < 10 else 0,
                                   prev=20 * MB if i < 10 else 0, seconds=i), 12)
    inc = _incident(d)
    assert inc.diagnosis.root_cause.id == "save_within_budget"
    assert inc.diagnosis.checkpoint_eta == 0.0
    assert inc.diagnosis.evidence.write.expected_source == "file_closed"
    d2, _ = drive_job(lambda i: rank0_sample(S.SAVING, i, file_size=(i + 1) * rate if i < 10 else 0,
                                    seconds=i), 40)
    assert _incident(d2).diagnosis.root_cause.id == "slow_save"  # closed 30 s ago: no evidence


def test_unknown_size_is_not_forecast_and_turns_risky_with_the_budget() -> None:
    d, _ = drive_job(lambda i: rank0_sample(S.SAVING, i, file_size=(i + 1) * MB, seconds=i), 30)
    inc = _incident(d)
    assert inc.diagnosis.root_cause.id == "slow_save"
    assert inc.diagnosis.checkpoint_eta is None
    assert not inc.at_risk  # 61 s of 90 s left: no evidence yet that it will not finish
    m = _metrics(d)
    assert ("ncclwatch_checkpoint_eta_seconds", (("job_id", "job-1"),)) not in m
    d2, _ = drive_job(lambda i: rank0_sample(S.SAVING, i, file_size=(i + 1) * MB, seconds=i), 50)
    assert _incident(d2).at_risk  # under half the budget left


def test_expected_size_from_gathered_host_memory() -> None:
    """No previous checkpoint: the RSS taken on during the gather is the size."""
    base, gathered = 1000 * MB, 300 * MB

    def rank0(i: int) -> pb.RankSample:
        if i < 3:  # steady training before the checkpoint
            return rank0_sample(S.COMPUTE, i, rss=base)
        if i < 8:  # gathering: RSS grows to base + gathered
            return rank0_sample(S.GATHERING_STATE_DICT, i, rss=base + gathered * (i - 2) // 5,
                          seconds=i - 3)
        return rank0_sample(S.SAVING, i, rss=base + gathered, file_size=(i - 7) * 5 * MB,
                      seconds=i - 8)

    d, _ = drive_job(rank0, 16)
    w = _incident(d).diagnosis.evidence.write
    assert w.expected_source == "gathered_bytes"
    assert w.expected_bytes == gathered
    assert w.eta_seconds == pytest.approx((gathered - 8 * 5 * MB) / (5 * MB), rel=1e-6)


def test_address_space_limit_forecast_names_memory_as_root_cause() -> None:
    """RLIMIT_AS set just before the gather: only points that know it count."""
    limit, growth, start_vms = 3000 * MB, 40 * MB, 2000 * MB
    ts, used = [], []

    def rank0(i: int) -> pb.RankSample:
        vms = start_vms + growth * i
        limits = [(pb.MEMORY_LIMIT_KIND_HOST, 900 * MB + growth * i, 20_000 * MB)]
        if i >= 4:
            limits.append((pb.MEMORY_LIMIT_KIND_ADDRESS_SPACE, vms, limit))
            ts.append(i)
            used.append(vms)
        return rank0_sample(S.GATHERING_STATE_DICT, i, limits=limits, seconds=i)

    d, now = drive_job(rank0, 14)
    inc = _incident(d)
    dx = inc.diagnosis
    assert dx.root_cause.id == "gather_out_of_memory", dx.sentence
    m0 = dx.evidence.memory[0]
    assert m0.device == "address_space"
    assert m0.rate_bytes_per_second == pytest.approx(_fit(ts, used), rel=1e-6)
    assert m0.eta_seconds == pytest.approx((limit - used[-1]) / growth, rel=1e-6)
    assert dx.at_risk
    m = _metrics(d)
    key = ("ncclwatch_memory_exhaustion_eta_seconds",
           (("device", "address_space"), ("job_id", "job-1"), ("rank", "0")))
    assert m[key] == pytest.approx(m0.eta_seconds)
    assert "address space memory" in dx.sentence


def test_gpu_memory_forecast_from_recorded_nvml_readings() -> None:
    reader = RecordedGpuReader.from_file(DATA / "nvml" / "h100_gather.json")
    readings = [reader.read() for _ in range(5)]
    ts = list(range(len(readings)))
    dev_used = [r.devices[0].used_bytes for r in readings]
    total = readings[0].devices[0].total_bytes

    def rank0(i: int) -> pb.RankSample:
        r = readings[min(i, len(readings) - 1)]
        g = pb.GpuMemory(device_index=0, used_bytes=r.processes[0].used_bytes,
                         device_total_bytes=r.devices[0].total_bytes,
                         device_used_bytes=r.devices[0].used_bytes)
        return rank0_sample(S.GATHERING_STATE_DICT, i, gpu=[g], seconds=i)

    d = Daemon(DaemonConfig())
    for i in range(len(readings)):
        samples = [rank0(i)] + [sample("job-1", r, 4, S.COLLECTIVE, Op.ALL_GATHER, seconds=i + 5,
                                       timeout=600.0) for r in (1, 2, 3)]
        d.ingest(report(samples, seq=i + 1), now=100.0 + i)
        d.tick(now=100.0 + i, wall=100.0 + i)
    # Ranks 1-3 wait in all_gather outside a state-dict frame: rank 0 is the culprit.
    dx = _incident(d).diagnosis
    gpu = [m for m in dx.evidence.memory if m.device == "gpu0"][0]
    rate = _fit(ts, dev_used)
    assert gpu.rate_bytes_per_second == pytest.approx(rate, rel=1e-6)
    # The raw forecast is the fit's; the one the diagnosis uses is a countdown
    # smoothed toward it (smooth.py): never later than the raw one here.
    rec = d.table.jobs["job-1"].ranks[0]
    raw = [m for m in memory_forecasts(rec, 100.0 + len(readings) - 1) if m.device == "gpu0"][0]
    assert raw.eta_seconds == pytest.approx((total - dev_used[-1]) / rate, rel=1e-6)
    assert 0 <= gpu.eta_seconds <= raw.eta_seconds
    assert dx.root_cause.id == "gather_out_of_memory"
    assert "gpu0 memory" in dx.sentence


def test_flat_memory_gives_no_exhaustion_forecast() -> None:
    d, _ = drive_job(lambda i: rank0_sample(S.GATHERING_STATE_DICT, i, seconds=i, limits=[
        (pb.MEMORY_LIMIT_KIND_CGROUP, 4000 * MB, 4100 * MB)]), 12)
    dx = _incident(d).diagnosis
    assert dx.root_cause.id == "slow_state_dict_gather"
    assert all(m.eta_seconds is None for m in dx.evidence.memory)
    assert not any(k[0] == "ncclwatch_memory_exhaustion_eta_seconds" for k in _metrics(d))
