"""End to end: ncclwatch against real torchrun jobs, real py-spy, real gRPC.

Rank 0 of a 4-rank gloo job gathers the model state and sits in torch.save
writing to slow storage while ranks 1-3 wait in barrier; the process-group
timeout is 90 s. ncclwatch must name rank 0 (saving) within 15 s, with a
watchdog budget that counts down, long before the watchdog would fire.
"""

from __future__ import annotations

import itertools
import signal
import subprocess
import time

import pytest

from tests.harness.artifacts import record
from tests.harness.monitor import Monitor, job_id_of, metric_value
from tests.harness.statusview import assert_snippets_as_lines
from tests.harness.tools import need

pytestmark = pytest.mark.e2e

PG_TIMEOUT = 90
DETECT_WITHIN = 15.0


def _series(m: dict, name: str, **labels) -> list[tuple[dict, float]]:
    out = []
    for (n, lab), v in m.items():
        d = dict(lab)
        if n == name and all(d.get(k) == val for k, val in labels.items()):
            out.append((d, v))
    return out


def _wait_stall(mon: Monitor, job: str, kind: str, deadline: float) -> dict:
    while time.time() < deadline:
        m = mon.metrics()
        if metric_value(m, "ncclwatch_stall_active", job_id=job, kind=kind) == 1:
            return m
        time.sleep(0.25)
    return {}


def test_slow_save_culprit_named_before_the_watchdog(ncclwatch_run, torch_job, tmp_path) -> None:
    mon = ncclwatch_run()  # default watchdog 600 s: the job declares its own 90 s
    fr_env = {"TORCH_FR_BUFFER_SIZE": "2000",  # the live Flight Recorder (debug_pipe.py)
              "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": str(tmp_path / "pipe_"),
              "TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "fr_rank_")}
    job = torch_job("slow-save", 4, {"NCCLWATCH_WATCHDOG_TIMEOUT_SECONDS": str(PG_TIMEOUT),
                                     **fr_env},
                    "--model-mb", "16", "--save-seconds", "60", "--pg-timeout", str(PG_TIMEOUT))
    job.wait_marker("ready", timeout=120, count=4)
    job_id = job_id_of(mon, job.pids())
    save = job.wait_marker("save_start", timeout=120)[0]
    waits = job.wait_marker("wait_start", timeout=30, count=3)
    m = _wait_stall(mon, job_id, "checkpoint_gather", save["t"] + DETECT_WITHIN + 5)
    detected = time.time()
    assert m, (f"no checkpoint_gather stall within {DETECT_WITHIN + 5:.0f}s of torch.save:\n"
               f"{mon.get('/api/v1/jobs')[:3000]}\n{mon.output()[-3000:]}")
    delay = detected - save["t"]
    culprits = _series(m, "ncclwatch_stall_culprit_info", job_id=job_id, kind="checkpoint_gather")
    assert [(c["rank"], c["state"]) for c, _ in culprits] == [("0", "saving")], culprits
    assert metric_value(m, "ncclwatch_watchdog_timeout_seconds", job_id=job_id) == PG_TIMEOUT
    assert metric_value(m, "ncclwatch_ranks", job_id=job_id, state="collective") == 3
    first_wait = min(w["t"] for w in waits)
    lead = (first_wait + PG_TIMEOUT) - detected
    r1 = metric_value(m, "ncclwatch_watchdog_remaining_seconds", job_id=job_id)
    time.sleep(3)
    # The truth is taken before the scrape: the budget is read during it, when
    # at most this much was left (taken after, a slow scrape under load would
    # shrink the truth and blame the budget).
    true_left = (first_wait + PG_TIMEOUT) - time.time()
    m2 = mon.metrics()
    r2 = metric_value(m2, "ncclwatch_watchdog_remaining_seconds", job_id=job_id)
    assert r1 is not None and r2 is not None and 0 < r2 < r1 < PG_TIMEOUT, (r1, r2)
    assert r1 - r2 == pytest.approx(3, abs=1.5)
    # The budget never claims more time than the job really has left: the wait's
    # start is the earliest the evidence allows (issue 20), so the budget reads
    # below the truth; the 1 s is margin, not an error the design allows.
    print(f"budget {r2:.2f}s, truth {true_left:.2f}s, margin {true_left - r2:+.2f}s")
    assert r2 <= true_left + 1.0, (r2, true_left)

    # The API and the status command tell the same story, with rank 0's stack.
    view = mon.job_of(job.pids())
    stall = view["stalls"][0]
    frames = [f["name"] for f in stall["culprits"][0]["stack"]["frames"]]
    assert any(f.endswith("_save") or f == "save" for f in frames), frames
    assert stall["waiting"]["ranks"] == [1, 2, 3]
    assert stall["culprits"][0]["files_writing"], "checkpoint file not seen open for writing"
    # Its size, read by the agent from the torch.save header while it is written:
    # the tensor bytes (the save_start marker) plus the zip records around them.
    ck = stall["forecast"]["checkpoint"]
    assert ck["expected_source"] == "torch_zip_header", ck
    assert 0 < ck["expected_bytes"] - int(save["bytes"]) < 4096, (ck, save)
    status = subprocess.run([need("ncclwatch"), "status", "--daemon", mon.http],
                            capture_output=True, text=True, timeout=30)
    assert status.returncode == 0, status.stderr
    assert "culprit: rank 0" in status.stdout and "checkpoint_gather" in status.stdout
    # The demo's fixes: each snippet line on its own line, no newline shown escaped.
    assert assert_snippets_as_lines({"jobs": [mon.job_of(job.pids())]}, status.stdout) > 0, \
        status.stdout
    # This job's stall block (another job on the machine may show its own escapes).
    after = status.stdout.partition(f"STALL checkpoint_gather in {job_id}")[2].splitlines()[1:]
    block = list(itertools.takewhile(lambda line: line.startswith(" ") or not line, after))
    assert block and not any("\\x0a" in line for line in block), status.stdout
    record("slow_save", {"detection_delay_s": round(delay, 2), "lead_time_s": round(lead, 1),
                         "pg_timeout_s": PG_TIMEOUT, "remaining_at_detection_s": r1})
    assert delay <= DETECT_WITHIN, f"detected {delay:.1f}s after torch.save started"

    # The job's own Flight Recorder, asked for through each rank's pipe during the
    # stall: ranks 1-3 enqueued the barrier, rank 0 never did; its timeout is exact.
    fr, deadline = None, time.time() + 25
    while time.time() < deadline:
        stall = mon.job_of(job.pids())["stalls"][0]
        fr = stall.get("flight_recorder")
        if fr and fr["dumps"] == 4:
            break
        time.sleep(0.5)
    assert fr and fr["dumps"] == 4, (fr, mon.output()[-3000:])
    assert fr["missing_ranks"] == [0] and fr["waiting_ranks"] == [1, 2, 3], fr
    assert fr["timeout_ms"] == PG_TIMEOUT * 1000, fr
    assert "rank(s) 0 never started barrier" in fr["sentence"], fr["sentence"]
    assert sorted(p.name for p in tmp_path.glob("fr_rank_*")) == \
        [f"fr_rank_{r}" for r in range(4)]
    assert job.proc.alive(), "a dump request must not stop the job"
    status2 = subprocess.run([need("ncclwatch"), "status", "--daemon", mon.http],
                             capture_output=True, text=True, timeout=30)
    assert "Flight Recorder: rank(s) 0 never started barrier" in status2.stdout


def test_fast_save_reports_no_stall(ncclwatch_run, torch_job) -> None:
    mon = ncclwatch_run()
    job = torch_job("fast-save", 4, None, "--model-mb", "16", "--steps", "3")
    job.wait_marker("ready", timeout=120, count=4)
    job_id = job_id_of(mon, job.pids())
    seen_collective = False
    while job.proc.alive():
        m = mon.metrics()
        for kind in ("checkpoint_gather", "checkpoint_restore"):
            assert metric_value(m, "ncclwatch_stall_active", job_id=job_id, kind=kind) in (0, None), \
                mon.get("/api/v1/jobs")
        seen_collective |= bool(metric_value(m, "ncclwatch_ranks", job_id=job_id, state="collective"))
        time.sleep(0.25)
    assert job.proc.popen.returncode == 0, job.proc.output()[-3000:]
    assert len(job.markers("save_end")) == 1
    m = mon.metrics()
    assert metric_value(m, "ncclwatch_incidents_opened_total", kind="checkpoint_gather") == 0
    assert metric_value(m, "ncclwatch_agent_pyspy_runs_total") > 0


def test_fsdp_full_state_dict_gather_culprit(ncclwatch_run, torch_job) -> None:
    mon = ncclwatch_run("--watchdog-timeout", str(PG_TIMEOUT))
    job = torch_job("fsdp-gather-slow", 4, None, "--model-mb", "8", "--save-seconds", "45",
                    "--slow-copies", "1", "--pg-timeout", str(PG_TIMEOUT))
    job.wait_marker("ready", timeout=120, count=4)
    job_id = job_id_of(mon, job.pids())
    start = job.wait_marker("gather_start", timeout=120, count=4)
    m = _wait_stall(mon, job_id, "checkpoint_gather", max(s["t"] for s in start) + 25)
    assert m, f"no stall seen:\n{mon.get('/api/v1/jobs')[:3000]}"
    culprits = _series(m, "ncclwatch_stall_culprit_info", job_id=job_id, kind="checkpoint_gather")
    assert [(c["rank"], c["state"]) for c, _ in culprits] == [("0", "gathering_state_dict")]
    view = mon.job_of(job.pids())
    waiting = {r["rank"]: r for r in view["ranks"] if r["rank"] != 0}
    assert all(r["state"] == "gathering_state_dict" and r["op"] for r in waiting.values()), \
        waiting
    assert metric_value(m, "ncclwatch_watchdog_timeout_seconds", job_id=job_id) == PG_TIMEOUT
    record("fsdp_gather", {"detection_delay_s":
                           round(time.time() - max(s["t"] for s in start), 2)})


def test_killing_ranks_mid_sampling_gives_no_crash_and_no_stall(ncclwatch_run, torch_job) -> None:
    mon = ncclwatch_run("--suspect-stack-interval", "0.5")
    job = torch_job("compute", 4, None, "--save-seconds", "60")
    job.wait_marker("compute_start", timeout=120, count=4)
    job_id = job_id_of(mon, job.pids())
    time.sleep(2)
    victim = next(m["pid"] for m in job.markers("ready") if m["rank"] == 2)
    import os
    os.kill(victim, signal.SIGKILL)  # torchrun then tears the other ranks down
    deadline = time.time() + 30
    gone = False
    while time.time() < deadline:
        m = mon.metrics()
        assert metric_value(m, "ncclwatch_stall_active", job_id=job_id, kind="checkpoint_gather") in (0, None)
        view = mon.job_of(job.pids())
        if view is None or all(r["gone"] for r in view["ranks"]):
            gone = True
            break
        time.sleep(0.3)
    assert gone, mon.get("/api/v1/jobs")[:3000]
    assert mon.alive(), mon.output()[-3000:]
    assert "Traceback" not in mon.output(), mon.output()[-3000:]


def _rank_processes() -> set[int]:
    """Pids whose environment declares a torchrun-style rank and that loaded
    torch, read independently of ncclwatch (it also finds ranks of other
    launchers: this is a lower bound)."""
    import psutil

    pids = set()
    for p in psutil.process_iter():
        try:
            env = p.environ()
            if "RANK" in env and "WORLD_SIZE" in env and p.parent() \
                    and "RANK" not in p.parent().environ() and _loaded_torch(p.pid) \
                    and time.time() - p.create_time() > 5:  # the agent had rounds to see it
                pids.add(p.pid)
        except (psutil.Error, OSError):
            continue
    return pids


def _loaded_torch(pid: int) -> bool:
    with open(f"/proc/{pid}/maps") as f:
        return "/torch/_C." in f.read()


def test_agent_with_no_training_processes(ncclwatch_split) -> None:
    mon = ncclwatch_split()
    deadline = time.time() + 20
    while time.time() < deadline:
        m = mon.metrics()
        if (metric_value(m, "ncclwatch_daemon_reports_total") or 0) >= 3:
            break
        time.sleep(0.3)
    else:
        pytest.fail(f"agent never reported:\n{mon.output()}")
    assert mon.alive(), mon.output()
    m = mon.metrics()
    assert metric_value(m, "ncclwatch_agent_up") == 1
    assert metric_value(m, "ncclwatch_agent_nvml_up") == 0  # no GPU here: says so, keeps working
    # Nothing of ours runs; whatever else this machine runs is counted, not invented:
    # every rank a torchrun-style environment declares (alive throughout) is
    # watched, and every watched process is one that loaded torch.
    before = _rank_processes()
    watched = {r["pid"] for j in mon.jobs()["jobs"] for r in j["ranks"] if not r["gone"]}
    steady = before & _rank_processes()
    assert steady <= watched, (steady - watched, mon.output()[-3000:])
    for pid in watched:
        try:
            assert _loaded_torch(pid), pid
        except FileNotFoundError:
            pass  # exited since
    assert all(v == 0 for _, v in _series(m, "ncclwatch_stall_active"))
    out = subprocess.run([need("ncclwatch"), "status", "--daemon", mon.http],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert not [line for line in out.stdout.splitlines() if line.startswith("STALL ")], out.stdout
