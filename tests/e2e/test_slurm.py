"""End to end under a real Slurm: jobs submitted with sbatch, tasks started by srun.

The cluster is Debian's slurmctld + slurmd + munged, started for the session
by the ``slurm`` fixture (tests/harness/slurm.py). Each job's rank 0 writes a
checkpoint to slow storage while the other ranks wait in a barrier; ncclwatch
must find the ranks by SLURM_JOB_ID, group them into one job, name rank 0
(saving) well before the watchdog (the delay from the save's start is printed;
the goal is 10 s), and show the job's Slurm name and user.
"""

from __future__ import annotations

import pwd
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from tests.harness.artifacts import record
from tests.harness.jobs import MARKER
from tests.harness.monitor import Monitor
from tests.harness.paths import ROOT
from tests.harness.procs import free_port
from tests.harness.slurm import SlurmCluster
from tests.harness.tools import need

pytestmark = pytest.mark.e2e

#: The goal is 10 s (printed, in the measurements file); the test asserts the
#: promise with a wide margin: named well before the watchdog, on a loaded machine too.
DETECT_WITHIN = 30.0
WORLD = 3
USER = pwd.getpwuid(os.getuid()).pw_name
#: The slow save: long enough to look at the stall after detecting it.
JOB_ARGS = "--scenario slow-save --model-mb 8 --save-seconds 25 --steps 1 --pg-timeout 120"

HEADER = """#!/bin/bash
export MASTER_ADDR=127.0.0.1 MASTER_PORT={port} PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
"""
#: (a) srun starts the ranks; the script maps SLURM_PROCID/NTASKS itself.
SRUN_PYTHON = "srun -n {world} {python} -m tests.workloads.slurm_task {args} --ckpt-dir {ckpt}\n"
#: (b) one torchrun per node under srun; its workers get RANK (which wins).
#: Name and user are removed from the ranks' environment: the agent asks scontrol.
SRUN_TORCHRUN = ("srun -n 1 env -u SLURM_JOB_NAME -u SLURM_JOB_USER {torchrun} --nnodes=1 "
                 "--nproc-per-node={world} --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:{port} "
                 "--max-restarts=0 -m ncclwatch.demo.job {args} --ckpt-dir {ckpt}\n")
#: (c) steps that are no ranks, running beside the ranks (--overlap: sharing
#: their CPUs): a shell command and a Python process without torch.distributed.
NON_RANK_STEPS = ("srun --overlap -n 2 bash -c 'hostname; exec sleep 90' &\n"
                  "srun --overlap -n 2 {python} -c 'import time; time.sleep(90)' &\n"
                  "sleep 2\n")


@dataclass
class SlurmJob:
    id: str
    name: str
    out: Path

    def markers(self, phase: str) -> list[dict]:
        text = self.out.read_text(errors="replace") if self.out.exists() else ""
        found = []
        for m in MARKER.finditer(text):
            if m.group(1) == phase:
                found.append({"rank": int(m.group(2)), "pid": int(m.group(3)),
                              "t": float(m.group(4))})
        return found

    def wait_marker(self, slurm: SlurmCluster, phase: str, timeout: float,
                    count: int = 1) -> list[dict]:
        deadline = time.time() + timeout
        while time.time() < deadline:
            found = self.markers(phase)
            if len(found) >= count:
                return found
            if slurm.job_state(self.id) not in ("PENDING", "RUNNING", "CONFIGURING", ""):
                break
            time.sleep(0.2)
        log = self.out.read_text(errors="replace")[-4000:] if self.out.exists() else "(no output)"
        pytest.fail(f"Slurm job {self.id} never reached {phase!r} x{count} within {timeout}s "
                    f"(state {slurm.job_state(self.id)}):\n{log}\n{slurm.logs()}")


def _submit(slurm: SlurmCluster, tmp_path: Path, name: str, body: str, ntasks: int) -> SlurmJob:
    fill = {"port": free_port(), "python": sys.executable, "torchrun": need("torchrun"),
            "world": WORLD, "args": JOB_ARGS, "ckpt": tmp_path}
    script = (HEADER + body).format(**fill)
    out = tmp_path / "slurm-job.out"
    job = slurm.sbatch(script, f"--job-name={name}", f"--ntasks={ntasks}", "--time=5",
                       f"--output={out}", f"--chdir={ROOT}")
    return SlurmJob(job, name, out)


def _monitor(ncclwatch_run, slurm: SlurmCluster) -> Monitor:
    # The agent's scontrol reaches the test cluster through the agent's own SLURM_CONF.
    return ncclwatch_run(env={"SLURM_CONF": str(slurm.conf), "PATH": slurm.env["PATH"]})


def _stall_active(mon: Monitor, job_id: str) -> bool:
    return any(n == "ncclwatch_stall_active" and v == 1 and
               dict(lab) == {"job_id": job_id, "kind": "checkpoint_gather"}
               for (n, lab), v in mon.metrics().items())


def _stall(mon: Monitor, pids: dict[int, int]) -> dict | None:
    view = mon.job_of(set(pids.values())) or {"stalls": []}
    return next((s for s in view["stalls"] if s["kind"] == "checkpoint_gather"), None)


def _watch(mon: Monitor, slurm: SlurmCluster, job: SlurmJob, *, source: str) -> dict:
    """The checks every Slurm launcher must pass; returns the job's view in the API."""
    ready = job.wait_marker(slurm, "ready", timeout=150, count=WORLD)
    pids = {m["rank"]: m["pid"] for m in ready}
    deadline, view = time.time() + 30, None
    while time.time() < deadline:
        view = mon.job_of(set(pids.values()))
        if view and view["ranks_reporting"] == WORLD and view.get("scheduler_job"):
            break
        time.sleep(0.3)
    assert view, f"ncclwatch never saw the ranks {pids}:\n{mon.output()[-3000:]}"
    # Found by SLURM_JOB_ID (and step), one job with exactly the three ranks.
    assert view["job"].startswith(f"slurm:{job.id}."), view["job"]
    assert view["source"] == "slurm" and view["world_size"] == WORLD, view
    assert {r["rank"]: r["pid"] for r in view["ranks"]} == pids, (view["ranks"], pids)
    assert view["scheduler_job"] == {"scheduler": "slurm", "job_id": job.id,
                                     "job_name": job.name, "user": USER, "source": source}

    save = job.wait_marker(slurm, "save_start", timeout=120)[0]
    job.wait_marker(slurm, "wait_start", timeout=30, count=WORLD - 1)
    while time.time() < save["t"] + DETECT_WITHIN + 5 and not _stall_active(mon, view["job"]):
        time.sleep(0.25)
    delay = time.time() - save["t"]
    stall = _stall(mon, pids)
    assert stall, (f"no checkpoint_gather within {DETECT_WITHIN + 5:.0f}s of torch.save:\n"
                   f"{mon.job_of(set(pids.values()))}\n{mon.output()[-3000:]}")
    assert [(c["rank"], c["state"], c["pid"]) for c in stall["culprits"]] == \
        [(0, "saving", pids[0])], stall["culprits"]
    # A waiter's stack may lag the first one's by a round or two on a busy machine.
    deadline = time.time() + 10
    while stall["waiting"]["ranks"] != [1, 2] and time.time() < deadline:
        time.sleep(0.5)
        stall = _stall(mon, pids) or stall
    assert stall["waiting"]["ranks"] == [1, 2], stall["waiting"]
    status = subprocess.run([need("ncclwatch"), "status", "--daemon", mon.http],
                            capture_output=True, text=True, timeout=30)
    assert status.returncode == 0, status.stderr
    assert f"slurm {job.id} {job.name!r} by {USER}" in status.stdout, status.stdout
    assert "culprit: rank 0" in status.stdout
    page = mon.get("/")
    assert f"<p class='scheduler-job'>slurm {job.id} " in page and f"by {USER}</p>" in page
    assert delay <= DETECT_WITHIN, f"detected {delay:.1f}s after torch.save started"
    view = mon.job_of(set(pids.values()))
    view["detection_delay_s"] = round(delay, 2)
    return view


def _act_as_advised(slurm: SlurmCluster, job: SlurmJob, view: dict, mon: Monitor,
                    tmp: Path) -> None:
    """The stall's commands (actions.py) are Slurm's, and they work as shown
    against the real cluster: the evidence command writes the job's bundle,
    the logs command names the job's output, the stop command ends the job.
    The job sets no Flight Recorder pipe: that step says so instead of giving
    a command that cannot work."""
    stall = next(s for s in view["stalls"] if s["kind"] == "checkpoint_gather")
    steps = {c["step"]: c for c in stall["advice"]["commands"]}
    assert {c["platform"] for c in steps.values()} == {"slurm"}, steps
    assert steps["flight_recorder"]["command"].startswith("# not enabled"), steps
    env = {**os.environ, **slurm.env, "NCCLWATCH_DAEMON": mon.http,
           "PATH": f"{Path(need('ncclwatch')).parent}:{slurm.env['PATH']}"}
    out = tmp / "evidence"
    out.mkdir()
    dump = subprocess.run(["bash", "-c", steps["evidence"]["command"].replace("dump", "dump --wait 2", 1)],
                          capture_output=True, text=True, timeout=60, env=env, cwd=out)
    assert dump.returncode == 0 and list(out.glob("*.tar.gz")), (dump.stdout, dump.stderr)
    logs = subprocess.run(["bash", "-c", steps["logs"]["command"]], capture_output=True,
                          text=True, timeout=30, env=env)
    assert f"StdOut={job.out}" in logs.stdout, (logs.stdout, logs.stderr)
    stop = subprocess.run(["bash", "-c", steps["stop"]["command"]], capture_output=True,
                          text=True, timeout=30, env=env)
    assert stop.returncode == 0, stop.stderr
    deadline = time.time() + 60
    while time.time() < deadline and slurm.job_state(job.id) in ("RUNNING", "PENDING"):
        time.sleep(0.5)
    assert slurm.job_state(job.id) not in ("RUNNING", "PENDING"), slurm.job_state(job.id)


def test_srun_python_ranks_from_slurm_procid(slurm, ncclwatch_run, tmp_path) -> None:
    t0 = time.monotonic()
    mon = _monitor(ncclwatch_run, slurm)
    job = _submit(slurm, tmp_path, "ncclwatch srun-python", SRUN_PYTHON, WORLD)
    try:
        view = _watch(mon, slurm, job, source="env")
        # Nothing but Slurm's variables told ncclwatch the ranks.
        assert "RANK" not in view["env"] and view["env"]["SLURM_NTASKS"] == str(WORLD), view["env"]
        _act_as_advised(slurm, job, view, mon, tmp_path)
    finally:
        slurm.run("scancel", job.id, check=False)
    record("slurm_srun_python", {"detection_delay_s": view["detection_delay_s"],
                                 "test_seconds": round(time.monotonic() - t0, 1)})


def test_torchrun_under_srun_is_one_job_rank_wins(slurm, ncclwatch_run, tmp_path) -> None:
    t0 = time.monotonic()
    mon = _monitor(ncclwatch_run, slurm)
    job = _submit(slurm, tmp_path, "llm pretrain torchrun", SRUN_TORCHRUN, 1)
    try:
        # Depends on the launchers rule (torchrun itself is no rank): without it the
        # torchrun process, older than the workers, is taken for rank 0.
        view = _watch(mon, slurm, job, source="scontrol")
        assert view["env"]["RANK"] in {"0", "1", "2"} and view["env"]["SLURM_NTASKS"] == "1"
        ours = [j["job"] for j in mon.jobs()["jobs"] if j["job"].startswith(f"slurm:{job.id}")]
        assert ours == [view["job"]], ours
    finally:
        slurm.run("scancel", job.id, check=False)
    record("slurm_torchrun_under_srun", {"detection_delay_s": view["detection_delay_s"],
                                         "test_seconds": round(time.monotonic() - t0, 1)})


def test_non_rank_steps_appear_nowhere(slurm, ncclwatch_run, tmp_path) -> None:
    t0 = time.monotonic()
    mon = _monitor(ncclwatch_run, slurm)
    job = _submit(slurm, tmp_path, "ncclwatch with helpers", NON_RANK_STEPS + SRUN_PYTHON,
                  WORLD)
    try:
        view = _watch(mon, slurm, job, source="env")
        rank_pids = {r["pid"] for r in view["ranks"]}
        # Every other process of the Slurm job: the batch shell, srun, the
        # `hostname; sleep` tasks, the Python tasks without torch.distributed.
        others = {p.pid for p in psutil.process_iter()
                  if _slurm_job(p) == job.id and p.pid not in rank_pids}
        assert len(others) >= 5, others
        time.sleep(3)  # a few more agent rounds
        jobs = mon.jobs()["jobs"]
        # Depends on the launchers rule (non-Python / no torch.distributed: no rank).
        shown = {r["pid"] for j in jobs for r in j["ranks"]}
        leaked = sorted(others & shown)
        assert not leaked, ("shown as ranks: " + ", ".join(
            f"{pid} {_cmdline(pid)!r} in {j['job']}" for j in jobs for r in j["ranks"]
            for pid in leaked if r["pid"] == pid))
        assert [j["job"] for j in jobs if j["job"].startswith(f"slurm:{job.id}")] == \
            [view["job"]]
    finally:
        slurm.run("scancel", job.id, check=False)
    record("slurm_non_rank_steps", {"detection_delay_s": view["detection_delay_s"],
                                    "test_seconds": round(time.monotonic() - t0, 1)})


def _cmdline(pid: int) -> str:
    try:
        return " ".join(psutil.Process(pid).cmdline())[:80]
    except psutil.Error:
        return "?"


def _slurm_job(p: psutil.Process) -> str | None:
    try:
        return p.environ().get("SLURM_JOB_ID")
    except psutil.Error:
        return None


def test_scontrol_names_a_job_whose_ranks_do_not(slurm, monkeypatch) -> None:
    """The agent's fallback with the real client and controller: name and user
    of a running job from ``scontrol show job``, as the agent asks on a node."""
    from ncclwatch.agent.scheduler import SchedulerJob, SchedulerLookup
    job = slurm.sbatch("#!/bin/bash\nsleep 60\n", "--job-name=with a space", "--time=2",
                       "--output=/dev/null")
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    monkeypatch.setenv("PATH", slurm.env["PATH"])
    try:
        lookup = SchedulerLookup(timeout=10.0)
        found = lookup.job({"SLURM_JOB_ID": job, "SLURM_PROCID": "0"})
        assert found == SchedulerJob("slurm", job, "with a space", USER, "scontrol")
        assert lookup.job({"SLURM_JOB_ID": "999999"}) == SchedulerJob("slurm", "999999")
        assert (lookup.queries_total, lookup.failures_total) == (2, 1)
    finally:
        slurm.run("scancel", job, check=False)


def test_task_prolog_sets_the_flight_recorder_in_every_task(slurm: SlurmCluster,
                                                             tmp_path) -> None:
    """deploy/slurm/task-prolog.sh as slurmstepd runs it (srun --task-prolog: the same
    contract as TaskProlog=): each task's environment holds its exports, the job's
    own settings and the site's own prolog's exports win, the pipe folder is the
    job's own, and no timeout is made up."""
    from tests.harness.slurm import with_site_prolog

    tmp_path.chmod(0o755)
    site = tmp_path / "task-prolog.site"
    site.write_text("#!/bin/sh\necho export TORCH_FR_BUFFER_SIZE=100\n"
                    "echo export NCCLWATCH_SITE_SEEN=1\n")
    site.chmod(0o755)
    prolog = with_site_prolog(site, tmp_path)
    script = ("#!/bin/sh\n"
              f"srun --task-prolog={prolog} -n 2 sh -c "
              "'env | grep -E \"^(TORCH_|NCCLWATCH_)\" | sort > "
              f"{tmp_path}/env.$SLURM_PROCID'\n")
    job = slurm.sbatch(script, "--job-name=prolog", "--ntasks=2", "--time=2",
                       f"--output={tmp_path}/out", f"--chdir={tmp_path}",
                       f"--export=ALL,TMPDIR={tmp_path},TORCH_NCCL_DUMP_ON_TIMEOUT=0")
    deadline = time.time() + 60
    while slurm.job_state(job) not in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
        assert time.time() < deadline, slurm.logs()
        time.sleep(0.3)
    assert slurm.job_state(job) == "COMPLETED", (tmp_path / "out").read_text() + slurm.logs()
    folder = tmp_path / f"ncclwatch-fr-{job}"
    for rank in (0, 1):
        env = dict(line.split("=", 1) for line in
                   (tmp_path / f"env.{rank}").read_text().splitlines())
        assert env["TORCH_FR_BUFFER_SIZE"] == "100" and env["NCCLWATCH_SITE_SEEN"] == "1"
        assert "NCCLWATCH_PG_TIMEOUT_S" not in env
        assert env["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] == f"{folder}/pipe_rank_"
        assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "0"        # the job's, not the prolog's
    assert folder.is_dir()
