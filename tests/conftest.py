"""Shared fixtures: real ncclwatch processes and real torchrun jobs."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
ARTIFACTS = ROOT / "artifacts"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def need_system(binary: str, package: str) -> str:
    """A tool from a Debian package (make test installs it); a clear failure if absent."""
    path = shutil.which(binary)
    if path is None:
        pytest.fail(f"{binary} not found: install Debian's `{package}` package "
                    f"(make test does: apt-get install -y {package})")
    return path


def need(binary: str) -> str:
    path = BIN / binary
    if not path.exists():
        pytest.fail(f"{binary} is missing from {BIN}: run `make test` (it installs it)")
    return str(path)


class Proc:
    """A child process in its own session, its output collected by a thread."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None, name: str = "") -> None:
        self.name = name or Path(argv[0]).name
        self.lines: list[tuple[float, str]] = []
        self.popen = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            text=True, env={**os.environ, **(env or {})}, start_new_session=True, cwd=ROOT)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.popen.stdout:
            self.lines.append((time.time(), line.rstrip("\n")))

    def output(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int | None:
        if self.alive():
            try:
                os.killpg(self.popen.pid, sig)
            except ProcessLookupError:
                pass
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(5)
        self._reader.join(5)
        return self.popen.returncode


MARKER = re.compile(r"NCCLWATCH_DEMO phase=(\S+) rank=(\d+) pid=(\d+) t=([\d.]+)(.*)")


@dataclass
class Job:
    proc: Proc
    world: int

    def markers(self, phase: str) -> list[dict]:
        out = []
        for _, line in self.proc.lines:
            m = MARKER.search(line)
            if m and m.group(1) == phase:
                extra = dict(kv.split("=", 1) for kv in m.group(5).split() if "=" in kv)
                out.append({"rank": int(m.group(2)), "pid": int(m.group(3)),
                            "t": float(m.group(4)), **extra})
        return out

    def wait_marker(self, phase: str, timeout: float, count: int = 1) -> list[dict]:
        deadline = time.time() + timeout
        while time.time() < deadline:
            found = self.markers(phase)
            if len(found) >= count:
                return found
            if not self.proc.alive():
                break
            time.sleep(0.1)
        pytest.fail(f"job never reached phase {phase!r} (x{count}) within {timeout}s; "
                    f"output:\n{self.proc.output()[-4000:]}")

    def pids(self) -> set[int]:
        return {m["pid"] for m in self.markers("ready")}


@dataclass
class Monitor:
    """A running ncclwatch (run, or daemon + agent) and its HTTP side."""

    procs: list[Proc]
    http: str
    samples: list = field(default_factory=list)

    def get(self, path: str) -> str:
        with urllib.request.urlopen(self.http + path, timeout=10) as r:
            return r.read().decode()

    def metrics(self) -> dict[tuple[str, tuple], float]:
        text = self.get("/metrics")
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for fam in text_string_to_metric_families(text) for s in fam.samples}

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


def _wait_http(mon: Monitor, timeout: float = 30.0) -> None:
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


@pytest.fixture
def ncclwatch_run():
    """``ncclwatch run`` on free loopback ports, as a user starts it."""
    started: list[Monitor] = []

    def start(*extra: str, env: dict[str, str] | None = None) -> Monitor:
        grpc_port, http_port = free_port(), free_port()
        proc = Proc([need("ncclwatch"), "run", "--grpc", f"127.0.0.1:{grpc_port}",
                     "--http", f"127.0.0.1:{http_port}", *extra], env=env, name="ncclwatch-run")
        mon = Monitor([proc], f"http://127.0.0.1:{http_port}")
        started.append(mon)
        _wait_http(mon)
        return mon

    yield start
    for mon in started:
        for p in mon.procs:
            p.stop()
        _save_log(mon)


@pytest.fixture
def ncclwatch_split():
    """``ncclwatch daemon`` and ``ncclwatch agent`` as two processes."""
    started: list[Monitor] = []

    def start(*agents: tuple[str, ...]) -> Monitor:
        """Each agent is a tuple of extra flags (default: one plain agent)."""
        grpc_port, http_port = free_port(), free_port()
        daemon = Proc([need("ncclwatch"), "daemon", "--grpc", f"127.0.0.1:{grpc_port}",
                       "--http", f"127.0.0.1:{http_port}"], name="ncclwatch-daemon")
        mon = Monitor([daemon], f"http://127.0.0.1:{http_port}")
        started.append(mon)
        _wait_http(mon)
        for i, extra in enumerate(agents or ((),)):
            mon.procs.append(Proc([need("ncclwatch"), "agent", "--collector",
                                   f"127.0.0.1:{grpc_port}", *extra],
                                  name=f"ncclwatch-agent-{i}"))
        return mon

    yield start
    for mon in started:
        for p in reversed(mon.procs):
            p.stop()
        _save_log(mon)


@pytest.fixture(scope="session")
def slurm():
    """A real single-node Slurm (munged, slurmctld, slurmd) for the session (tests/slurm.py)."""
    from tests.slurm import PREFIX, SlurmCluster, SlurmError, remove_stale
    if os.getuid() != 0:
        pytest.fail("the Slurm tests start slurmd, which must run as root (CI does)")
    remove_stale(Path(tempfile.gettempdir()))
    cluster = SlurmCluster(Path(tempfile.mkdtemp(prefix=PREFIX)))
    try:
        cluster.start()
    except SlurmError as e:
        cluster.stop()
        shutil.rmtree(cluster.dir, ignore_errors=True)
        pytest.fail(f"could not start a test Slurm cluster: {e}")
    record("slurm_cluster", {"start_seconds": round(cluster.start_seconds, 2)})
    yield cluster
    cluster.stop()
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "slurm-daemons.log").write_text(cluster.logs(tail=20000))
    shutil.rmtree(cluster.dir, ignore_errors=True)


def _save_log(mon: Monitor) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "ncclwatch-last.log").write_text(mon.output())


@pytest.fixture
def torch_job():
    """Launch ``ncclwatch.demo.job`` under real torchrun; killed at teardown."""
    jobs: list[Job] = []

    def start(scenario: str, world: int = 4, env: dict[str, str] | None = None,
              *args: str) -> Job:
        torchrun = need("torchrun")
        argv = [torchrun, "--standalone", f"--nproc-per-node={world}", "--max-restarts=0",
                "-m", "ncclwatch.demo.job", "--scenario", scenario, *args]
        job = Job(Proc(argv, env={"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1",
                                  **(env or {})}, name=f"torchrun-{scenario}"), world)
        jobs.append(job)
        return job

    yield start
    for job in jobs:
        job.proc.stop(signal.SIGTERM)
        ARTIFACTS.mkdir(exist_ok=True)
        (ARTIFACTS / f"{job.proc.name}.log").write_text(job.proc.output())


def record(name: str, data: dict) -> None:
    """Keep a measurement of an e2e run under artifacts/ (for notes and CI logs)."""
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / "e2e-measurements.json"
    current = json.loads(path.read_text()) if path.exists() else {}
    current[name] = data
    path.write_text(json.dumps(current, indent=1))
    print(f"\n[measurement] {name}: {json.dumps(data)}")


def py_spy_available() -> None:
    if shutil.which("py-spy", path=str(BIN)) is None:
        pytest.fail("py-spy is missing from the venv: run `make test`")
from tests.throttlefs_fixture import throttlefs  # noqa: E402,F401  (slow FUSE mount)
