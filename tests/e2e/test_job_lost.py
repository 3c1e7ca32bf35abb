"""End to end: a job that sets its timeout in code, and the watchdog that kills it mid-stall.

A real 2-rank gloo job under torchrun sets a 60 s process-group timeout the
way most scripts do, in code (``init_process_group(timeout=timedelta(...))``),
and tells ncclwatch nothing. Rank 0 saves for 95 s while rank 1 waits in the
barrier that follows. While it waits, every surface must say the 600 s
budget is assumed and no advice may say "let it run". At 60 s the waiter's
gloo barrier times out and it exits, torchrun stops rank 0: the stall's
incident must end as ``killed_by_watchdog`` with the measured wait, and the
page, the API and /metrics must still show it after the job's ranks are gone
and after the job left the daemon's table (``--gone-job-ttl`` shortened for
the test; the day it is kept is unit-tested).
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from html import escape

import pytest

from ncclwatch.daemon.links import job_anchor
from tests.harness.monitor import Monitor
from tests.harness.tools import need

pytestmark = pytest.mark.e2e

PG_TIMEOUT = 60
SAVE_SECONDS = 95
TTL = 8


def _ended(mon: Monitor, job_id: str) -> list[dict]:
    return [e for e in json.loads(mon.get("/api/v1/jobs")).get("ended", [])
            if e["job"] == job_id]


def _until(what, deadline: float, step: float = 0.5):
    while time.time() < deadline:
        got = what()
        if got:
            return got
        time.sleep(step)
    return None


def test_a_timeout_set_in_code_reads_assumed_and_the_kill_stays_on_every_surface(
        ncclwatch_run, torch_job) -> None:
    mon = ncclwatch_run("--gone-job-ttl", str(TTL))
    job = torch_job("slow-save", 2, {}, "--model-mb", "4", "--save-seconds", str(SAVE_SECONDS),
                    "--pg-timeout", str(PG_TIMEOUT))
    job.wait_marker("ready", timeout=120, count=2)
    pids = job.pids()
    job.wait_marker("wait_start", timeout=60)
    stall = mon.wait_stall(pids, "checkpoint_gather", time.time() + 30)
    assert stall is not None, mon.output()[-3000:]
    job_id = mon.job_of(pids)["job"]
    # Nothing told ncclwatch the 60 s: the budget is torch's 600 s, said to be a guess.
    w = stall["watchdog"]
    assert w["timeout_seconds"] == 600 and w["timeout_assumed"], w
    assert w["timeout_note"].startswith("assumed 600 s (torch's default)"), w
    assert stall["advice"]["action"] != "let_it_run", stall["advice"]
    status = subprocess.run([need("ncclwatch"), "status", "--daemon", mon.http],
                            capture_output=True, text=True, timeout=30)
    assert "assumed 600 s (torch's default); set in code? the job may time out sooner" \
        in status.stdout, status.stdout
    assert "LET IT RUN" not in status.stdout, status.stdout
    m = mon.metrics()
    assert m[("ncclwatch_watchdog_timeout_assumed", (("job_id", job_id),))] == 1.0
    # The waiter's barrier times out at 60 s; its exit ends the stall. No advice
    # on the way there may be "let it run" (the job's real budget is 60 s).
    advised: set[str] = set()

    def outcome() -> list[dict]:
        view = json.loads(mon.get("/api/v1/jobs"))
        advised.update(s["advice"]["action"] for j in view["jobs"] if j["job"] == job_id
                       for s in j["stalls"] if s.get("advice"))
        return [e for e in view.get("ended", []) if e["job"] == job_id and e["outcome"]]

    lost = _until(outcome, time.time() + PG_TIMEOUT + 40)
    assert lost, f"no ended incident with an outcome:\n{mon.get('/api/v1/jobs')[:3000]}"
    assert advised and "let_it_run" not in advised, advised
    (e,) = [x for x in lost if x["kind"] == "checkpoint_gather"]
    o = e["outcome"]
    assert o["outcome"] == "killed_by_watchdog" and o["lost"], e
    # The measured wait is the job's timeout, within the agent's rounds (wide margin).
    assert PG_TIMEOUT - 5 <= o["waited_seconds"] <= PG_TIMEOUT + 20, o
    assert "the waiters died" in o["sentence"]
    assert e["culprits"][0]["rank"] == "0" and e["culprits"][0]["state"] == "saving"
    assert _until(lambda: not job.proc.alive(), time.time() + 30), "torchrun did not stop"

    # Ranks all gone, the job still held: shown lost, its bundle linked.
    html = mon.get("/")
    assert "LOST" in html and "killed by the watchdog" in html, html[-3000:]
    # Then it leaves the table: still on the page and in the API, its bundle kept.
    assert _until(lambda: not any(j["job"] == job_id
                                  for j in json.loads(mon.get("/api/v1/jobs"))["jobs"]),
                  time.time() + TTL + 30), "the job never left the table"
    (e,) = [x for x in _ended(mon, job_id) if x["kind"] == "checkpoint_gather"]
    assert e["outcome"]["outcome"] == "killed_by_watchdog" and not e["job_held"]
    html = mon.get("/")
    assert f"<section class='job gone' id='{escape(job_anchor(job_id))}'>" in html
    assert "killed by the watchdog" in html and e["evidence_bundle"] in html.replace("&amp;", "&")
    with urllib.request.urlopen(mon.http + e["evidence_bundle"], timeout=10) as r:
        assert r.status == 200 and r.headers["Content-Type"] == "application/gzip"
    m = mon.metrics()
    lost_series = [dict(lab) for (n, lab), v in m.items() if n == "ncclwatch_job_lost" and v == 1]
    assert [(s["job_id"], s["kind"], s["outcome"], s["rank"]) for s in lost_series] == [
        (job_id, "checkpoint_gather", "killed_by_watchdog", "0")], lost_series
    assert m[("ncclwatch_incident_outcomes_total",
              (("kind", "checkpoint_gather"), ("outcome", "killed_by_watchdog")))] >= 1
