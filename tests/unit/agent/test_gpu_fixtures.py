"""What a real CUDA/NCCL rank looks like, recorded once on an H200 (tests/data/gpu/README.md).

No GPU here: these fixtures are the only real NCCL and CUDA the tests see. They
check the parts that read them (Flight Recorder loader and summary, signature
table, NVML reader path, ``ncclwatch diagnose``) against what torch 2.11 with
NCCL 2.28 really wrote, not against what we expected it to write.
"""

from __future__ import annotations

import json

import pytest

from ncclwatch import flightrec
from ncclwatch.agent.frprobe import summary_pb
from ncclwatch.agent.gpu import RecordedGpuReader
from ncclwatch.agent.report import sample_pb
from ncclwatch.agent.tracker import RankTracker
from ncclwatch.diagnose import diagnose
from ncclwatch.model import RankState
from ncclwatch.signatures import classify
from ncclwatch.stacks import main_thread, parse_pyspy_json
from tests.harness.paths import DATA

H200 = DATA / "gpu" / "h200-torch2.11"


def _main_stack(name: str):
    threads = parse_pyspy_json((H200 / name).read_text())
    return main_thread(threads, threads[0].os_thread_id).stack.frames


# -- Flight Recorder served by ProcessGroupNCCL's own debug-info pipe ---------------------------


def test_pipe_dump_from_processgroupnccl_parses_with_every_group() -> None:
    dump = flightrec.load_dump(H200 / "fr_pipe_dump_rank_0")
    assert (dump.version, dump.backend, dump.comm_lib_version) == ("2.10", "nccl", "2.28.9")
    progress = {p.pg_desc: p for p in flightrec.summarize(dump)}
    assert set(progress) == {"default_pg", "probe_subgroup"}
    default = progress["default_pg"]
    # all_reduce, broadcast, barrier (an all_reduce on NCCL), all_gather, then the loop's all_reduce
    assert (default.last_enqueued, default.last_completed, default.pending_op) == (5, 5, "")
    assert default.timeout_ms == 120_000
    assert progress["probe_subgroup"].timeout_ms == 600_000   # new_group's default, not the PG's
    ops = [e.op for e in dump.entries if e.pg_id == "0"]
    assert ops[:2] == ["all_reduce", "broadcast"] and "all_gather" in ops


def test_agent_ships_the_real_dump_as_progress() -> None:
    dump = flightrec.load_dump(H200 / "fr_pipe_dump_rank_0")
    pb = summary_pb(dump, written_at=100.0, now_wall=103.0)
    assert pb.version == "2.10" and pb.dump_age_seconds == pytest.approx(3.0)
    assert sorted(g.pg_desc for g in pb.groups) == ["default_pg", "probe_subgroup"]
    assert all(g.last_completed == g.last_enqueued for g in pb.groups)


def test_timeout_dump_names_the_collective_that_never_completed() -> None:
    dump = flightrec.load_dump(H200 / "fr_timeout_dump_rank_0")
    (pg,) = flightrec.summarize(dump)
    assert (pg.last_enqueued, pg.last_completed) == (4, 3)
    assert (pg.pending_op, pg.pending_seq, pg.pending_timeout_ms) == ("all_reduce", 4, 12_000)
    assert pg.pending_sizes == ((1 << 20,),)
    stuck = [e for e in dump.entries if not e.completed]
    assert [e.state for e in stuck] == ["scheduled"]   # queued behind the kernel, never started
    # The collective's Python frames are recorded with it: where the user called it.
    assert stuck[0].frames[0][0] == "all_reduce"


# -- py-spy of a CUDA rank blocked at a device sync point -----------------------------------------


@pytest.mark.parametrize("fixture, top", [
    ("pyspy_wait_sync_wait_1.json", "synchronize"),
    ("pyspy_wait_event_wait_1.json", "Event.synchronize"),
])
def test_real_device_sync_waits_classify_as_device_wait(fixture: str, top: str) -> None:
    frames = _main_stack(fixture)
    assert frames[0].name == top
    assert classify(frames).state is RankState.DEVICE_WAIT


def test_item_behind_a_stuck_collective_has_no_python_frame() -> None:
    """``.item()`` is C++: py-spy shows only the user's line, so the stack says compute.

    Recorded while the NCCL all_reduce sat behind a 75 s kernel and the watchdog was
    about to fire: only the time spent there (and the Flight Recorder) tell it apart.
    """
    frames = _main_stack("pyspy_wd_item_wait.json")
    assert [f.name for f in frames] == ["<module>"]
    assert classify(frames).state is RankState.COMPUTE


def test_native_dump_shows_the_driver_wait_under_the_python_frame() -> None:
    data = json.loads((H200 / "pyspy_wait_event_wait_native.json").read_text())
    names = [f["name"] for f in data[0]["frames"]]
    assert "cuEventSynchronize" in names and "Event.synchronize" in names
    assert names.index("cuEventSynchronize") < names.index("Event.synchronize")


def test_a_rank_waiting_on_the_device_is_not_cpu_quiet() -> None:
    """The waiting thread spins: ~one full core, in state R, in every recorded window."""
    windows = json.loads((H200 / "proc_cpu.json").read_text())["windows"]
    assert set(windows) == {"sync_wait", "event_wait", "watchdog_item_wait"}
    for name, w in windows.items():
        assert w["cpu_utilization"] > 0.9, name
        busiest = max(w["threads"], key=lambda t: t["cpu"])
        assert busiest["state"] == "R" and busiest["cpu"] > 0.9, name


# -- NVML on a real H200 ----------------------------------------------------------------------


def test_real_nvml_readings_reach_the_sample() -> None:
    from ncclwatch.agent.discover import RankProcess
    from ncclwatch.jobid import RankIdentity

    reading = RecordedGpuReader.from_file(H200 / "nvml_readings.json").read()
    (dev,) = reading.devices
    assert dev.name == "NVIDIA H200" and dev.total_bytes == 150_754_820_096
    (proc,) = reading.processes
    # The rank held 2 GiB of its own plus its CUDA context; NVML saw its pid.
    assert 2 << 30 < proc.used_bytes < dev.used_bytes
    t = RankTracker(RankProcess(proc.pid, 0.0, RankIdentity("j", "t", 0, 0, 1), {}), 0.0)
    s = sample_pb(t, 1.0, reading.by_pid()[proc.pid], {d.index: d for d in reading.devices}, False)
    assert s.gpu[0].used_bytes == proc.used_bytes
    assert s.gpu[0].device_total_bytes == dev.total_bytes


# -- the real watchdog timeout, read back by ncclwatch diagnose ------------------------------


def test_diagnose_reads_the_real_nccl_watchdog_timeout() -> None:
    result = diagnose([str(H200 / "watchdog_timeout.log")])
    assert result.timeout_s == pytest.approx(12.0)
    text = json.dumps(result.to_json())
    assert "SeqNum=4" in text and "ALLREDUCE" in text
    assert "taking the entire process down" in text


def test_diagnose_names_the_device_when_every_rank_waited() -> None:
    """The whole directory: logs and both dumps of rank 0. A world of one whose only
    rank timed out waited for its own GPU: initiating rank 0, nobody collateral."""
    result = diagnose([str(H200)])
    j = result.to_json()
    assert (j["class"], j["initiating_ranks"], j["collateral_ranks"]) == ("collective_hang", [0], [])
    assert j["root_cause"]["id"] == "collective_never_finished"
    # Two dumps of one rank (the on-demand one and the timeout's): the newer counts,
    # the other is named, nothing crashes. The fixture's JSON files (py-spy and NVML
    # readings) are no logs: skipped by what they hold, named too (issue 21).
    skipped = {s["path"]: s["why"] for s in j["inputs"]["skipped"]}
    assert "older dump" in skipped.pop(str(H200 / "fr_pipe_dump_rank_0"))
    assert skipped and all(p.endswith(".json") and "JSON document" in w
                           for p, w in skipped.items()), skipped
    progress = j["flight_recorder"]["progress"]["0"]
    assert progress[0]["pending_op"] == "all_reduce"
