"""End to end: a real job's stall found and named beside neighbours that break the report contract.

One node, one ``ncclwatch run``. A real 2-rank gloo job stalls in a slow
``torch.save`` (rank 0 saves for 60 s while rank 1 waits in the next
collective). Beside it, three processes any user may start, each run as
uid 65534 and each with torch loaded:

- one whose environment claims rank 0 of a world of 10**8 (far past
  ``max_ranks_per_job``);
- a member of the real job (its job id, no RANK) that holds open a file
  named as the Flight Recorder pipe of rank 0: the agent learns "rank 0"
  from it while the real rank 0 holds rank 0 from its environment;
- one sleeping in a set-up frame (``init_process_group`` of a file whose path
  ends in torch/distributed/distributed_c10d.py) whose locals say rank 0 of a
  world of 10**8, nothing in its environment.

Before the contract, either of the first two made the daemon refuse the
node's whole report every round: the job's stall went unseen. Now each bad
process costs its own part: the stall is found and named, the real rank 0
keeps its number, each bad process is accounted for (left out by the agent
with its reason, or sent unnumbered with its rank_conflict), the counts are
on /metrics and NCCLWatchNodeReportFaults fires on them (promtool, on the
real daemon's series: the agent catches these before sending, so the
daemon-side count alone would never have fired).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from tests.harness.alerting import RULES
from tests.harness.artifacts import record
from tests.harness.monitor import Monitor
from tests.harness.procs import Proc
from tests.harness.tools import promtool

pytestmark = pytest.mark.e2e

NOBODY = 65534
JOB = "bad-neighbours-job"
HUGE = 10 ** 8
#: The 10 s goal of the issue; asserted with a wide margin (30 s) under CI's load.
GOAL, WITHIN = 10.0, 30.0

SLEEPER = "import time, torch\nwhile True: time.sleep(1)\n"
#: Holds the file named as rank 0's Flight Recorder pipe open, then sleeps.
PIPE_HOLDER = ("import os, sys, time, torch\n"
               "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)\n"
               "while True: time.sleep(1)\n")
#: Loads a module from a path ending in torch/distributed/distributed_c10d.py (under
#: its own name: the real torch stays importable) and sleeps in its set-up frame.
SETUP_FRAME = ("import importlib.util, sys, torch\n"
               "spec = importlib.util.spec_from_file_location('c10d_lookalike', sys.argv[1])\n"
               "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
               f"m.init_process_group(rank=0, world_size={HUGE})\n")
C10D = ("import time\n\n\ndef init_process_group(rank, world_size):\n"
        "    while True:\n        time.sleep(1)\n")


def _as_nobody(code: str, args: list[str], env: dict[str, str], name: str) -> Proc:
    """``code`` under python as uid 65534 (setpriv execs it: the pid is python's).
    The rank variables of the test's own environment are not inherited."""
    base = {k: "" for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                            "NCCLWATCH_JOB_ID", "TORCHELASTIC_RUN_ID")}
    argv = [shutil.which("setpriv") or "setpriv", "--reuid", str(NOBODY), "--regid",
            str(NOBODY), "--clear-groups", sys.executable, "-c", code, *args]
    return Proc(argv, env={**base, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **env},
                name=name)


def _until(what, deadline: float, step: float = 0.5):
    while True:
        got = what()
        if got or time.time() >= deadline:
            return got
        time.sleep(step)


def _counters(m: dict, name: str) -> dict[tuple[str, str], float]:
    return {(dict(lab)["node"], dict(lab)["reason"]): v for (n, lab), v in m.items()
            if n == name}


def _said(mon: Monitor, pid: int, reason: str) -> bool:
    """The agent's warning that names the process and the reason it was caught for."""
    return re.search(rf"pid {pid} of job .*\({reason}\)", mon.output()) is not None


def _alert_fires(tmp_path: Path, scrapes: list[tuple[float, dict]]) -> tuple[set, str]:
    """NCCLWatchNodeReportFaults (its expr, for and labels as shipped; the
    annotations, tested in tests.yaml, left out) run by promtool on the real
    daemon's two counters as two scrapes saw them, each continued at the rate
    it rose between them. Returns the alerts expected (caught_by, reason) and
    promtool's output; promtool fails unless exactly those fire."""
    rules = yaml.safe_load((RULES / "alerts.yaml").read_text())
    (rule,) = [dict(r) for g in rules["groups"] for r in g["rules"]
               if r.get("alert") == "NCCLWatchNodeReportFaults"]
    rule.pop("annotations")
    (tmp_path / "rule.yaml").write_text(yaml.safe_dump({"groups": [
        {"name": "node-faults", "rules": [rule]}]}, sort_keys=False))
    (t1, m1), (t2, m2) = scrapes
    series, expected = [], set()
    for name, side in (("ncclwatch_agent_parts_left_out_total", "agent"),
                       ("ncclwatch_daemon_node_faults_total", "daemon")):
        before, after = _counters(m1, name), _counters(m2, name)
        for (node, reason), v in after.items():
            step = (v - before.get((node, reason), 0.0)) / (t2 - t1) * 5   # per 5 s scrape
            series.append({"series": f'{name}{{job="ncclwatch",instance="127.0.0.1:7471",'
                                     f'node="{node}",reason="{reason}"}}',
                           "values": f"{v:g}+{step:g}x60"})
            if step > 0:
                expected.add((node, reason, side))
    tests = {"rule_files": [str(tmp_path / "rule.yaml")], "evaluation_interval": "5s",
             "tests": [{"interval": "5s", "input_series": series, "alert_rule_test": [
                 {"eval_time": "90s", "alertname": "NCCLWatchNodeReportFaults",
                  "exp_alerts": []},
                 {"eval_time": "3m", "alertname": "NCCLWatchNodeReportFaults",
                  "exp_alerts": [{"exp_labels": {"severity": "warning", "job": "ncclwatch",
                                                 "node": n, "reason": r, "caught_by": s}}
                                 for n, r, s in sorted(expected)]}]}]}
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests, sort_keys=False))
    out = subprocess.run([promtool(), "test", "rules", "tests.yaml"], capture_output=True,
                         text=True, cwd=tmp_path, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    return {(s, r) for _, r, s in expected}, out.stdout


def test_a_stall_is_found_and_named_beside_processes_that_break_the_contract(
        ncclwatch_run, torch_job, tmp_path) -> None:
    if os.geteuid() != 0:
        pytest.fail("runs the neighbours as uid 65534 with setpriv: run as root")
    home = Path(tempfile.mkdtemp(prefix="ncclwatch-neighbours-", dir="/tmp"))
    os.chmod(home, 0o755)
    fr = home / "fr"
    lookalike = home / "site" / "torch" / "distributed" / "distributed_c10d.py"
    lookalike.parent.mkdir(parents=True)
    lookalike.write_text(C10D)
    fr.mkdir()
    for p in (home, fr, *lookalike.parents):
        if p.is_relative_to(home):
            os.chown(p, NOBODY, NOBODY)
    user = {"HOME": str(home), "TMPDIR": str(home)}
    neighbours: list[Proc] = []
    try:
        mon = ncclwatch_run()
        huge = _as_nobody(SLEEPER, [], {**user, "NCCLWATCH_JOB_ID": "bad-neighbours-huge",
                                        "RANK": "0", "LOCAL_RANK": "0",
                                        "WORLD_SIZE": str(HUGE), "MASTER_ADDR": "127.0.0.1",
                                        "MASTER_PORT": "29611"}, "huge-world")
        dup = _as_nobody(PIPE_HOLDER, [str(fr / "pipe_rank_0.pipe")],
                         {**user, "NCCLWATCH_JOB_ID": JOB, "MASTER_ADDR": "127.0.0.1",
                          "MASTER_PORT": "29612",
                          "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": f"{fr}/pipe_rank_"},
                         "learned-duplicate")
        setup = _as_nobody(SETUP_FRAME, [str(lookalike)],
                           {**user, "NCCLWATCH_JOB_ID": "bad-neighbours-setup",
                            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29613"},
                           "setup-frame")
        neighbours += [huge, dup, setup]
        job = torch_job("slow-save", 2, {"NCCLWATCH_JOB_ID": JOB}, "--model-mb", "4",
                        "--save-seconds", "60", "--pg-timeout", "90")
        ready = job.wait_marker("ready", timeout=120, count=2)
        pids = job.pids()
        rank0 = next(r["pid"] for r in ready if r["rank"] == 0)
        save = job.wait_marker("save_start", timeout=60)[0]
        stall = mon.wait_stall(pids, "checkpoint_gather", save["t"] + WITHIN)
        delay = time.time() - save["t"]
        assert stall is not None, (f"no checkpoint_gather stall within {WITHIN:.0f} s of "
                                   f"torch.save\n{mon.get('/api/v1/jobs')[:3000]}\n"
                                   f"{mon.output()[-4000:]}")
        print(f"checkpoint_gather found {delay:.1f} s after save_start (goal {GOAL:.0f} s)")
        record("bad_neighbours", {"detection_delay_s": round(delay, 2), "goal_s": GOAL})
        assert all(p.alive() for p in neighbours), [p.output()[-2000:] for p in neighbours]
        who = {huge.popen.pid: "huge-world", dup.popen.pid: "learned-duplicate",
               setup.popen.pid: "setup-frame"}
        # Named right: rank 0, saving, the real rank 0's process.
        c = stall["culprits"][0]
        assert (c["rank"], c["state"], c["pid"]) == (0, "saving", rank0), stall["culprits"]

        # The job's rank 0 is its own (the environment's), the learned duplicate is
        # shown beside it, unnumbered, with the number it claimed and who holds it.
        def conflict() -> dict | None:
            ranks = (mon.job_of(pids) or {}).get("ranks", [])
            return next((r for r in ranks if r["pid"] == dup.popen.pid
                         and r.get("rank_conflict")), None)

        shown = _until(conflict, time.time() + 30)
        view = mon.job_of(pids)
        assert view["job"] == JOB, view["job"]
        numbered = {r["rank"]: r["pid"] for r in view["ranks"] if r["rank"] is not None}
        assert numbered == {0: rank0, 1: next(p for p in pids if p != rank0)}, view["ranks"]
        assert shown is not None, (view["ranks"], mon.output()[-4000:])
        assert shown["rank"] is None and "flight_recorder:0" in shown["rank_conflict"] \
            and f"pid {rank0}" in shown["rank_conflict"], shown
        # The huge world is in no job the daemon holds: the agent left it out from the
        # first. (The set-up frame is a rank-less member of its own job until its
        # locals are read: then its sample is left out too.)
        held = {r["pid"] for j in mon.jobs()["jobs"] for r in j["ranks"]}
        assert huge.popen.pid not in held, held

        # Each bad process accounted for, with its reason, in the agent's log (the
        # set-up frame once a slow round's dump with locals catches it: under a
        # CPU hog that took over 30 s).
        accounted = _until(lambda: all((
            _said(mon, huge.popen.pid, "world_size_over_limit"),
            _said(mon, setup.popen.pid, "world_size_over_limit"),
            _said(mon, dup.popen.pid, "duplicate_rank"))), time.time() + 90)
        assert accounted, {name: [ln for ln in mon.output().splitlines() if f"pid {pid} " in ln]
                           for pid, name in who.items()}

        # Counted on /metrics, by reason; no report of the node refused whole.
        t1, m1 = time.time(), mon.metrics()
        time.sleep(8)
        t2, m2 = time.time(), mon.metrics()
        agent = _counters(m2, "ncclwatch_agent_parts_left_out_total")
        daemon = _counters(m2, "ncclwatch_daemon_node_faults_total")
        print(f"agent parts left out: { {k: v for k, v in agent.items() if v} }; "
              f"daemon node faults: { {k: v for k, v in daemon.items() if v} }")
        by_reason = {r: sum(v for (_, rr), v in agent.items() if rr == r) for _, r in agent}
        assert by_reason.get("world_size_over_limit", 0) > 0, agent
        assert by_reason.get("duplicate_rank", 0) > 0, agent
        from ncclwatch.contract.checks import REASONS
        node_reasons = list(REASONS)[:list(REASONS).index("bad_job_id")]
        assert not any(v for (_, r), v in daemon.items() if r in node_reasons), daemon

        # Alerted on: the shipped rule fires on these series, named by the end that caught them.
        fired, out = _alert_fires(tmp_path, [(t1, m1), (t2, m2)])
        assert {("agent", "world_size_over_limit"), ("agent", "duplicate_rank")} <= fired, \
            (fired, out)
        assert job.proc.alive(), "the job must not be disturbed"
    finally:
        for p in neighbours:
            p.stop()
        shutil.rmtree(home, ignore_errors=True)
