"""The live Flight Recorder of a job run by an ordinary user, read by the agent
as the shipped systemd unit runs it: root with exactly the unit's capability
set (read from the unit file) and no_new_privs.

The job is set up the way deploy/slurm/task-prolog.sh sets it up: a folder of
its own, mode 700, owned by the user, the FIFO made by the rank with
mkfifo(0666) under umask 022 (0644: root without CAP_DAC_OVERRIDE may not
write it). Before the agent opened the FIFO as its owner, every request
failed with EACCES and the stall never got its Flight Recorder evidence.
Without CAP_SETUID the agent says what it lacks."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.harness.monitor import api_jobs
from tests.harness.paths import ROOT
from tests.harness.procs import Proc, free_port
from tests.harness.tools import need, setpriv

pytestmark = pytest.mark.e2e

NOBODY = 65534
UNIT = ROOT / "systemd" / "ncclwatch-agent.service"
#: The demo job (ncclwatch/demo/job.py, whose gloo ranks serve the pipe as torch
#: does) under umask 022; exec'd by setpriv itself, so pids are the ranks'.
RUN_AS_USER = ("import os, runpy, sys; os.umask(0o022); sys.argv[0] = 'job'; "
               "runpy.run_module('ncclwatch.demo.job', run_name='__main__')")


def _unit_caps() -> list[str]:
    """CapabilityBoundingSet of the shipped unit, in setpriv's spelling."""
    line = next(x for x in UNIT.read_text().splitlines()
                if x.startswith("CapabilityBoundingSet="))
    return [c.removeprefix("CAP_").lower() for c in line.split("=", 1)[1].split()]


def _stall_fr(http: int, pids: set[int]) -> dict | None:
    for job in api_jobs(http):
        if pids & {r["pid"] for r in job.get("ranks", [])}:
            for stall in job.get("stalls", []):
                if stall.get("flight_recorder"):
                    return stall["flight_recorder"]
    return None


def _pair(agent_caps: list[str], node: str) -> tuple[Proc, Proc, int]:
    grpc, http = free_port(), free_port()
    daemon = Proc([need("ncclwatch"), "daemon", "--grpc", f"127.0.0.1:{grpc}",
                   "--http", f"127.0.0.1:{http}"], name=f"daemon-{node}")
    agent = Proc(setpriv(agent_caps) + [need("ncclwatch"), "agent", "--collector",
                                         f"127.0.0.1:{grpc}", "--interval", "0.5",
                                         "--node", node], name=f"agent-{node}")
    return daemon, agent, http


def test_live_flight_recorder_of_another_users_job(tmp_path) -> None:
    if os.geteuid() != 0:
        pytest.fail("runs the job as uid 65534 and the agent as root with the unit's "
                    "capabilities: run as root")
    caps = _unit_caps()
    assert "setuid" in caps, caps
    home = Path(tempfile.mkdtemp(prefix="ncclwatch-user-", dir="/tmp"))
    os.chmod(home, 0o755)
    os.chown(home, NOBODY, NOBODY)
    fr_dir = home / "ncclwatch-fr-1"           # as the prolog: the user's, mode 700
    fr_dir.mkdir(mode=0o700)
    os.chown(fr_dir, NOBODY, NOBODY)
    env = {"HOME": str(home), "TMPDIR": str(home), "PYTHONUNBUFFERED": "1",
           "OMP_NUM_THREADS": "1", "NCCLWATCH_JOB_ID": "fr-as-user",
           "TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
           "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
           "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": f"{fr_dir}/pipe_rank_",
           "TORCH_FR_DUMP_TEMP_FILE": f"{fr_dir}/trace_rank_",
           "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": f"{fr_dir}/trace_rank_"}
    # Rank 0 sleeps for 90 s; rank 1 waits for it in a barrier: a collective hang.
    # Two ranks started as a launcher would (env://); the umask a login shell has.
    port = str(free_port())
    ranks = [Proc(["setpriv", "--reuid", str(NOBODY), "--regid", str(NOBODY), "--clear-groups",
                   sys.executable, "-c", RUN_AS_USER, "--scenario", "park",
                   "--save-seconds", "90", "--ckpt-dir", str(home)],
                  env={**env, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port},
                  name=f"rank{r}-as-nobody") for r in range(2)]
    started: list[Proc] = []
    try:
        deadline = time.time() + 60
        while not all("phase=ready" in r.output() for r in ranks):
            assert all(r.alive() for r in ranks) and time.time() < deadline, \
                [r.output()[-2000:] for r in ranks]
            time.sleep(0.3)
        pipes = sorted(fr_dir.glob("pipe_rank_*.pipe"))
        assert [p.name for p in pipes] == ["pipe_rank_0.pipe", "pipe_rank_1.pipe"]
        assert {(p.stat().st_mode & 0o777, p.stat().st_uid) for p in pipes} == {(0o644, NOBODY)}
        pids = {r.popen.pid for r in ranks}

        # Side by side (one stall, two daemons): the unit's capabilities, and the
        # same without CAP_SETUID.
        daemon, agent, http = _pair(caps, "unit-caps")
        daemon2, agent2, http2 = _pair([c for c in caps if c != "setuid"], "no-setuid")
        started += [agent, daemon, agent2, daemon2]
        fr, deadline = None, time.time() + 75
        while not (fr and fr.get("dumps") == 2):
            assert agent.alive() and time.time() < deadline, (fr, agent.output()[-3000:])
            time.sleep(0.5)
            fr = _stall_fr(http, pids)
        # Both ranks' dumps, through their pipes: rank 1 entered the barrier, rank 0 never did.
        assert fr["missing_ranks"] == [0] and fr["waiting_ranks"] == [1], fr
        assert sorted(p.name for p in fr_dir.glob("trace_rank_*")) == \
            ["trace_rank_0", "trace_rank_1"]
        assert "Permission denied" not in agent.output(), agent.output()[-3000:]

        # Without CAP_SETUID: no dump, and the agent says why (once), not "nobody listens".
        while "CAP_SETUID" not in agent2.output():
            assert agent2.alive() and time.time() < deadline, agent2.output()[-3000:]
            time.sleep(0.5)
        assert agent2.output().count("live Flight Recorder unavailable") == 1, agent2.output()
        assert _stall_fr(http2, pids) is None
        assert all(r.alive() for r in ranks), "a dump request must not stop the job"
    finally:
        for p in started:
            p.stop()
        for r in ranks:
            r.stop()
        shutil.rmtree(home, ignore_errors=True)
