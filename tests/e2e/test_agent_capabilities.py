"""The agent's capability set, as the DaemonSet and the systemd unit grant it,
run for real: root with every capability dropped but SYS_PTRACE and
DAC_READ_SEARCH (and no_new_privs) finds a rank that belongs to another user
and gets its stack; without DAC_READ_SEARCH it never finds it, which is why
the pod and the unit keep both (docs/security.md)."""

from __future__ import annotations

import os
import shutil
import sys
import time
import urllib.request

import pytest
import yaml

from tests.harness.kubelet import cap_eff
from tests.harness.monitor import api_jobs
from tests.harness.paths import ROOT
from tests.harness.procs import Proc, free_port
from tests.harness.tools import need, setpriv

pytestmark = pytest.mark.e2e

NOBODY = 65534
JOB = "caps-test"


def _granted() -> list[str]:
    docs = yaml.safe_load_all((ROOT / "deploy/kubernetes/agent-daemonset.yaml").read_text())
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    sc = ds["spec"]["template"]["spec"]["containers"][0]["securityContext"]
    assert sc["runAsUser"] == 0 and sc["capabilities"]["drop"] == ["ALL"]
    return [c.lower() for c in sc["capabilities"]["add"]]


def _agent_up(http: int, node: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{http}/metrics", timeout=5) as r:
            return f'ncclwatch_agent_up{{node="{node}"}} 1.0' in r.read().decode()
    except OSError:
        return False


def test_pod_capabilities_find_another_users_rank_and_its_stack(tmp_path) -> None:
    if os.geteuid() != 0:
        pytest.fail("this test runs the agent as root with a reduced capability set: run as root")
    granted = _granted()
    assert sorted(granted) == ["dac_read_search", "setuid", "sys_ptrace"]
    os.chmod(tmp_path, 0o755)
    rank = Proc([shutil.which("setpriv"), "--reuid", str(NOBODY), "--regid", str(NOBODY),
                 "--clear-groups", sys.executable, "-c",
                 "import torch, time; print('rank up', flush=True); time.sleep(120)"],
                env={"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
                     "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
                     "NCCLWATCH_JOB_ID": JOB, "HOME": str(tmp_path)}, name="rank-as-nobody")
    grpc, http = free_port(), free_port()
    daemon = Proc([need("ncclwatch"), "daemon", "--grpc", f"127.0.0.1:{grpc}",
                   "--http", f"127.0.0.1:{http}"], name="daemon")
    agent = None
    try:
        deadline = time.time() + 60
        while "rank up" not in rank.output():
            assert rank.alive() and time.time() < deadline, rank.output()
            time.sleep(0.2)
        pid = rank.popen.pid
        argv = [need("ncclwatch"), "agent", "--collector", f"127.0.0.1:{grpc}", "--interval", "0.5"]

        # Without DAC_READ_SEARCH: connected, rounds run, the rank is never found.
        agent = Proc(setpriv(["sys_ptrace"]) + argv + ["--node", "ptrace-only"], name="agent-1")
        deadline = time.time() + 30
        while not _agent_up(http, "ptrace-only"):
            assert agent.alive() and time.time() < deadline, agent.output()[-2000:]
            time.sleep(0.3)
        assert cap_eff(agent.popen.pid) == {"SYS_PTRACE"}
        time.sleep(5)  # ten rounds
        assert not any(j["job"] == JOB for j in api_jobs(http)), api_jobs(http)
        agent.stop()

        # The pod's two capabilities: found, numbered from its environment, with a stack.
        started = time.time()
        agent = Proc(setpriv(granted) + argv + ["--node", "pod-caps"], name="agent-2")
        found = None
        while found is None or not found.get("stack_id"):
            assert agent.alive() and time.time() < started + 60, agent.output()[-3000:]
            time.sleep(0.3)
            job = next((j for j in api_jobs(http) if j["job"] == JOB), None)
            found = next((r for r in (job or {}).get("ranks", []) if r["pid"] == pid), None)
        print(f"rank of uid {NOBODY} found with a stack {time.time() - started:.1f} s "
              f"after the agent started")
        # Read once it reports (setpriv has exec'd it): before, the pid is setpriv's own.
        assert cap_eff(agent.popen.pid) == {c.upper() for c in granted}
        assert found["rank"] == 0 and found["host"] == "pod-caps"
        assert "Permission denied" not in agent.output(), agent.output()[-3000:]
    finally:
        if agent is not None:
            agent.stop()
        daemon.stop()
        rank.stop()
