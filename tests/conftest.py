"""The suite's fixtures; what they start and observe lives in tests/harness."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

import hypothesis
import pytest

from tests.harness.artifacts import keep, record
from tests.harness.credentials import make_certs, make_pki
from tests.harness.jobs import Job
from tests.harness.monitor import Monitor, wait_healthy
from tests.harness.paths import ARTIFACTS
from tests.harness.procs import Proc, free_port
from tests.harness.throttlefs import mounted
from tests.harness.tools import need

# No wall-clock deadline per Hypothesis example: make test runs four workers
# beside real jobs on two cores, where an example's wall time says nothing about
# the code (speed lives in bench/; a test that bounds work bounds CPU time).
hypothesis.settings.register_profile("ncclwatch", deadline=None)
hypothesis.settings.load_profile("ncclwatch")


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
        wait_healthy(mon)
        return mon

    yield start
    for mon in started:
        for p in mon.procs:
            p.stop()
        keep("ncclwatch-last.log", mon.output())


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
        wait_healthy(mon)
        for i, extra in enumerate(agents or ((),)):
            mon.procs.append(Proc([need("ncclwatch"), "agent", "--collector",
                                   f"127.0.0.1:{grpc_port}", *extra],
                                  name=f"ncclwatch-agent-{i}"))
        return mon

    yield start
    for mon in started:
        for p in reversed(mon.procs):
            p.stop()
        keep("ncclwatch-last.log", mon.output())


@pytest.fixture(scope="session")
def slurm():
    """A real single-node Slurm (munged, slurmctld, slurmd) for the session (harness/slurm.py)."""
    from tests.harness.slurm import PREFIX, SlurmCluster, SlurmError, remove_stale
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
    keep("slurm-daemons.log", cluster.logs(tail=20000))
    shutil.rmtree(cluster.dir, ignore_errors=True)


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
        keep(f"{job.proc.name}.log", job.proc.output())


@pytest.fixture
def throttlefs():
    """Factory: ``throttlefs(write_rate=..., read_rate=None, sync_rate=None) -> Mounted``
    (tests/harness/throttlefs.py: a slow FUSE mount, unmounted at teardown)."""
    with contextlib.ExitStack() as stack:
        yield lambda write_rate=None, read_rate=None, sync_rate=None: stack.enter_context(
            mounted(write_rate, read_rate, sync_rate))


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    """The module's CA and node certificates for mTLS (``credentials.make_pki``)."""
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def web_pki(tmp_path_factory) -> Path:
    """A CA, the daemon's certificate (localhost) and a ``scraper`` client's (``--web-config``)."""
    d = tmp_path_factory.mktemp("web") / "certs"
    make_certs(d, "scraper")
    return d


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The scenario matrix first: under ``make test`` it runs on one worker beside
    the unit tests, and it is the longest test, so it must start at once."""
    items.sort(key=lambda item: not item.nodeid.startswith("tests/scenarios/"))


_SESSION_START = time.time()


def pytest_terminal_summary(terminalreporter) -> None:
    """The matrix's table, when this session ran it (a worker of ``-n`` cannot print)."""
    table = ARTIFACTS / "scenarios.md"
    if table.exists() and table.stat().st_mtime >= _SESSION_START:
        terminalreporter.section("scenario matrix (artifacts/scenarios.md)")
        terminalreporter.write(table.read_text())
