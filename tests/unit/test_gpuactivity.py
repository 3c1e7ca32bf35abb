"""GPU utilisation and power: NVML's answers to the page, and the rule that reads them.

NVML is the one part with no GPU here: a test module stands in for pynvml
(calls that raise as a board that does not answer them would), recorded
readings feed the rest, and the wire, the contract, the daemon and the API
are the real ones.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from ncclwatch import gpuactivity
from ncclwatch.agent.gpu import NvmlGpuReader, RecordedGpuReader
from ncclwatch.agent.report import _activity_pb
from ncclwatch.contract import checks
from ncclwatch.daemon.api import jobs_view
from ncclwatch.daemon.core import Daemon
from ncclwatch.daemon.page import _gpu_cell
from ncclwatch.daemon.records import RankRecord
from ncclwatch.model import CollectiveOp, RankState
from ncclwatch.v1 import collector_pb2 as pb
from tests.harness.paths import DATA
from tests.harness.reports import report, sample

HANG = DATA / "nvml" / "h100_allreduce_hang.json"


class _NotSupported(Exception):
    pass


class _Nvml:
    """pynvml's calls the reader makes; ``refuse`` names those that raise."""

    def __init__(self, refuse: set[str]) -> None:
        self.refuse = refuse

    def _call(self, name, value):
        if name in self.refuse:
            raise _NotSupported(name)
        return value

    def nvmlDeviceGetCount(self): return 1
    def nvmlDeviceGetHandleByIndex(self, i): return i
    def nvmlDeviceGetUUID(self, h): return b"GPU-1"
    def nvmlDeviceGetName(self, h): return "NVIDIA H100 80GB HBM3"
    def nvmlDeviceGetMemoryInfo(self, h): return SimpleNamespace(total=80 << 30, used=60 << 30)
    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [SimpleNamespace(pid=4242, usedGpuMemory=59 << 30)]

    def nvmlDeviceGetUtilizationRates(self, h):
        return self._call("util", SimpleNamespace(gpu=100, memory=0))

    def nvmlDeviceGetPowerUsage(self, h): return self._call("power", 161_700)
    def nvmlDeviceGetEnforcedPowerLimit(self, h): return self._call("limit", 700_000)


def _reader(refuse: set[str]) -> NvmlGpuReader:
    r = NvmlGpuReader.__new__(NvmlGpuReader)
    r.up, r.reason, r._nvml = True, "", _Nvml(refuse)
    return r


@pytest.mark.parametrize("refuse, want", [
    (set(), (100, 161.7, 700.0)),
    ({"util"}, (-1, 161.7, 700.0)),
    ({"power"}, (100, -1.0, 700.0)),
    ({"limit"}, (100, 161.7, 0.0)),
    ({"util", "power", "limit"}, (-1, -1.0, 0.0)),
])
def test_an_unanswered_nvml_call_costs_only_its_value(refuse, want) -> None:
    (d,) = _reader(refuse).read().devices
    assert (d.util_percent, d.power_watts, d.power_limit_watts) == want
    assert (d.total_bytes, d.used_bytes) == (80 << 30, 60 << 30)  # memory kept


def test_recordings_with_and_without_activity_load() -> None:
    hung = RecordedGpuReader.from_file(HANG)
    hung.read()
    r = hung.read()
    assert len(r.devices) == 8 and {d.util_percent for d in r.devices} == {100}
    assert min(d.power_watts for d in r.devices) == 154.1
    # before utilisation and power: unknown, memory as before
    (old,) = RecordedGpuReader.from_file(DATA / "nvml" / "h100_gather.json").read().devices
    assert (old.util_percent, old.power_watts, old.power_limit_watts) == (-1, -1.0, 0.0)
    assert old.used_bytes == 41875931136
    # the real H200 recording kept device utilisation apart: it is read
    (h200,) = RecordedGpuReader.from_file(
        DATA / "gpu" / "h200-torch2.11" / "nvml_readings.json").read().devices
    assert (h200.util_percent, h200.power_watts) == (100, -1.0)


def _wire(device) -> pb.GpuMemory:
    m = pb.GpuMemory(device_index=device.index, used_bytes=1)
    _activity_pb(m, device)
    return pb.GpuMemory.FromString(m.SerializeToString())


def test_the_report_carries_activity_and_leaves_unknowns_absent() -> None:
    readings = RecordedGpuReader.from_file(HANG)
    readings.read()
    m = _wire(readings.read().devices[2])
    assert (m.device_util_percent, m.device_power_watts, m.device_power_limit_watts) == (
        100, 175.0, 700.0)
    unknown = _wire(readings.read().devices[0])  # no power answer
    assert unknown.HasField("device_util_percent")
    assert not unknown.HasField("device_power_watts")
    assert not unknown.HasField("device_power_limit_watts")


def _gpu_sample(rank: int, **activity) -> pb.RankSample:
    s = sample("job-1", rank, 8, RankState.COLLECTIVE, CollectiveOp.ALL_REDUCE, seconds=30.0)
    s.gpu.add(device_index=rank, used_bytes=60 << 30, device_total_bytes=80 << 30,
              device_used_bytes=61 << 30, **activity)
    return s


@pytest.mark.parametrize("field, value, ok", [
    ("device_util_percent", 100, True),
    ("device_util_percent", 101, False),
    ("device_power_watts", 0.0, True),
    ("device_power_watts", 2700.0, True),
    ("device_power_watts", -1.0, False),
    ("device_power_watts", math.nan, False),
    ("device_power_watts", math.inf, False),
    ("device_power_limit_watts", 10_001.0, False),
    ("device_power_limit_watts", -0.5, False),
])
def test_the_contract_bounds_gpu_readings(field, value, ok) -> None:
    fault = checks.check_sample(_gpu_sample(1, **{field: value}))
    assert (fault is None) == ok
    if not ok:
        assert (fault.part, fault.reason) == ("rank_sample", "bad_gpu_reading")


def test_bad_gpu_reading_is_appended_to_reasons() -> None:
    # an older agent's counts keep their labels: the new reason comes after the old ones
    reasons = list(checks.REASONS)
    assert reasons.index("bad_gpu_reading") > reasons.index("job_over_bound")


def test_a_bad_power_costs_its_sample_alone_and_the_rest_reach_the_api() -> None:
    hung = RecordedGpuReader.from_file(HANG)
    hung.read()
    devices = hung.read().devices
    samples = []
    for d in devices:
        s = _gpu_sample(d.index)
        _activity_pb(s.gpu[0], d)
        samples.append(s)
    samples[7].gpu[0].device_power_watts = 1e9
    d = Daemon()
    resp = d.ingest(report(samples), now=1.0)
    assert [(p.what, p.rank) for p in resp.dropped_parts] == [("rank_sample", 7)]
    job = d.table.jobs["job-1"]
    assert job.ranks[2].gpu_activity == ((2, 100, 175.0, 700.0),)
    assert 7 not in job.ranks
    view = jobs_view(d, now=1.0)
    (jv,) = [j for j in view["jobs"] if j["job"] == "job-1"]
    g = {r["rank"]: r["gpu"] for r in jv["ranks"]}
    assert g[0] == [{"device": 0, "used_bytes": 60 << 30, "total_bytes": 80 << 30,
                     "util_percent": 100, "power_watts": 154.1, "power_limit_watts": 700.0,
                     "activity": "spinning"}]
    assert "gpu0 60.0 GiB 100% 154/700 W spinning" in _gpu_cell(g[0])
    assert gpuactivity.summary(job.ranks.values()) == (
        "GPUs: 7 at 100% utilisation, 22-25% of their power limit: "
        "spinning in NCCL kernels, not computing")


def test_an_old_agent_without_activity_shows_unknown() -> None:
    d = Daemon()
    d.ingest(report([_gpu_sample(0)]), now=1.0)
    rec = d.table.jobs["job-1"].ranks[0]
    assert rec.gpu_activity == ()
    (jv,) = jobs_view(d, now=1.0)["jobs"]
    (g,) = jv["ranks"][0]["gpu"]
    assert (g["util_percent"], g["power_watts"], g["activity"]) == (None, None, "unknown")
    assert gpuactivity.summary([rec]) == ""


@pytest.mark.parametrize("util, power, limit, word", [
    (100, 160.0, 700.0, "spinning"),     # NCCL kernels polling: busy at 23%
    (90, 280.0, 700.0, "spinning"),      # the edges: 90%, 40%
    (89, 160.0, 700.0, "working"),       # not busy enough to call spinning
    (100, 281.0, 700.0, "working"),
    (100, 650.0, 700.0, "working"),
    (5, 70.0, 700.0, "idle"),
    (0, -1.0, 0.0, "idle"),              # idle needs no power reading
    (100, -1.0, 700.0, "unknown"),       # busy with no power: cannot tell
    (100, 160.0, 0.0, "unknown"),        # no limit to compare with
    (-1, 160.0, 700.0, "unknown"),
    (101, 160.0, 700.0, "unknown"),
])
def test_judge(util, power, limit, word) -> None:
    assert gpuactivity.judge(util, power, limit) == word


def _rec(node: str, rank: int, *activity) -> RankRecord:
    r = RankRecord(rank)
    r.node, r.gpu_activity = node, tuple(activity)
    return r


@pytest.mark.parametrize("recs, text", [
    ([], ""),
    ([_rec("a", 0)], ""),
    ([_rec("a", 0, (0, -1, -1.0, 0.0))], ""),
    ([_rec("a", i, (i, 100, 154.0 + 3 * i, 700.0)) for i in range(8)],
     "GPUs: 8 at 100% utilisation, 22-25% of their power limit: spinning in NCCL kernels, "
     "not computing"),
    ([_rec("a", 0, (0, 97, 160.0, 700.0)), _rec("a", 1, (1, 100, 640.0, 700.0)),
      _rec("b", 2, (0, 2, 60.0, 700.0))],
     "GPUs: 1 at 97% utilisation, 23% of their power limit: spinning in NCCL kernels, not "
     "computing; 1 at 100% utilisation, 91% of their power limit: computing; "
     "1 at 2% utilisation: idle"),
    # two ranks on one device count it once; the same index on another node is another device
    ([_rec("a", 0, (0, 100, 160.0, 700.0)), _rec("a", 1, (0, 100, 160.0, 700.0)),
      _rec("b", 2, (0, 100, 160.0, 700.0))],
     "GPUs: 2 at 100% utilisation, 23% of their power limit: spinning in NCCL kernels, "
     "not computing"),
])
def test_summary(recs, text) -> None:
    assert gpuactivity.summary(recs) == text
