"""A running ncclwatch seen from outside: its HTTP side, its metrics, the jobs it shows."""

from __future__ import annotations

import json
import time
import urllib.request
from dataclasses import dataclass, field

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.harness.procs import Proc

#: /metrics as a dict: (family sample name, sorted label items) -> value.
Metrics = dict[tuple[str, tuple], float]


def parse_metrics(text: str) -> Metrics:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def metrics_at(port: int, path: str = "/metrics") -> Metrics:
    """The metrics a daemon serves on loopback ``port``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        return parse_metrics(r.read().decode())


def metric_value(m: Metrics, name: str, **labels) -> float | None:
    """The first sample of ``name`` whose labels include ``labels``; None if none."""
    want = tuple(sorted(labels.items()))
    for (n, lab), v in m.items():
        if n == name and all(item in lab for item in want):
            return v
    return None


def api_jobs(port: int) -> list[dict]:
    """/api/v1/jobs?ranks=1 of a daemon on loopback ``port``; [] while it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/jobs?ranks=1",
                                    timeout=5) as r:
            return json.loads(r.read())["jobs"]
    except OSError:
        return []


@dataclass
class Monitor:
    """A running ncclwatch (run, or daemon + agent) and its HTTP side."""

    procs: list[Proc]
    http: str
    samples: list = field(default_factory=list)

    def get(self, path: str) -> str:
        with urllib.request.urlopen(self.http + path, timeout=10) as r:
            return r.read().decode()

    def metrics(self) -> Metrics:
        return parse_metrics(self.get("/metrics"))

    def jobs(self) -> dict:
        """Every job with per-rank detail (``ranks=1``), all pages of it."""
        view = json.loads(self.get("/api/v1/jobs?ranks=1"))
        while view.get("next_cursor"):
            more = json.loads(self.get(f"/api/v1/jobs?ranks=1&cursor={view['next_cursor']}"))
            for job in more["jobs"]:  # a job larger than a page continues on the next
                if view["jobs"] and view["jobs"][-1]["job"] == job["job"]:
                    view["jobs"][-1]["ranks"] += job["ranks"]
                else:
                    view["jobs"].append(job)
            view["next_cursor"] = more.get("next_cursor")
        return view

    def job_of(self, pids: set[int]) -> dict | None:
        for job in self.jobs()["jobs"]:
            if pids & {r["pid"] for r in job["ranks"]}:
                return job
        return None

    def wait_stall(self, pids: set[int], kind: str, until: float) -> dict | None:
        """The job's active stall of ``kind`` (the job that holds ``pids``), polled
        until it shows or the wall clock passes ``until``; None if it never did."""
        while True:
            j = self.job_of(pids)
            stall = next((s for s in (j or {}).get("stalls", [])
                          if s["kind"] == kind and s["active"]), None)
            if stall is not None or time.time() >= until:
                return stall
            time.sleep(0.25)

    def alive(self) -> bool:
        return all(p.alive() for p in self.procs)

    def output(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.output()}" for p in self.procs)


def wait_healthy(mon: Monitor, timeout: float = 30.0) -> None:
    """Until the monitor answers /healthz; a failure with its processes' output if it never does."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            mon.get("/healthz")
            return
        except OSError:
            if not mon.alive():
                break
            time.sleep(0.2)
    pytest.fail(f"ncclwatch did not come up:\n{mon.output()}")


def job_id_of(mon: Monitor, pids: set[int], timeout: float = 30.0) -> str:
    """The id of the job the monitor shows holding ``pids``, once every one of them reports."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        job = mon.job_of(pids)
        if job is not None and job["ranks_reporting"] == len(pids):
            return job["job"]
        time.sleep(0.3)
    pytest.fail(f"ncclwatch never saw ranks {sorted(pids)}:\n{mon.output()[-3000:]}")
