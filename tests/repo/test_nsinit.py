"""A worker's pid namespace (tests/harness/nsinit.py): its own processes only,
orphans reaped, the worker's exit status and signals passed through."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tests.harness import nsinit
from tests.harness.paths import ROOT

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                                reason="a pid namespace needs root and unshare(1)")

INIT = [
    "unshare", "--pid", "--fork", "--mount-proc", sys.executable, str(ROOT / "tests/harness/nsinit.py")]


def _run(code: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*INIT, sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=timeout)


def test_the_worker_sees_only_its_namespace_and_its_exit_status_passes_through() -> None:
    out = _run("import os, sys; print(sorted(int(p) for p in os.listdir('/proc') "
               "if p.isdigit())); sys.exit(7)")
    assert out.returncode == 7, out.stderr
    assert out.stdout.strip() == "[1, 2]", out.stdout   # the init and the worker


def test_an_orphan_is_reaped_not_left_a_zombie() -> None:
    """A daemonised child (its parent gone) is adopted by pid 1, which must reap it."""
    code = ("import os, subprocess, time, psutil\n"
            "subprocess.Popen(['sh', '-c', 'sleep 0.3 & exit 0']).wait()\n"
            "time.sleep(1.5)\n"
            "print([p.status() for p in psutil.process_iter() if p.pid not in (1, os.getpid())])")
    out = _run(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout   # no zombie 'sleep' left


def test_a_signal_to_the_init_reaches_the_worker() -> None:
    p = subprocess.Popen([*INIT, sys.executable, "-c",
                          "import signal, sys, time\n"
                          "signal.signal(signal.SIGTERM, lambda *a: sys.exit(5))\n"
                          "print('up', flush=True); time.sleep(60)"],
                         stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert p.stdout.readline().strip() == "up"
        import psutil
        init = next(c for c in psutil.Process(p.pid).children() if "nsinit.py" in " ".join(
            c.cmdline()))
        os.kill(init.pid, signal.SIGTERM)
        assert p.wait(timeout=30) == 5
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)


def test_ns_workers_wraps_each_local_worker_and_nothing_else() -> None:
    class Opt:
        ns_workers, tx = True, ["popen", "popen", "ssh=elsewhere//python=python3"]

    class Config:
        option = Opt()

        def getoption(self, name):
            return getattr(self.option, name)

    config = Config()
    nsinit.pytest_configure(config)
    assert config.option.tx[2] == "ssh=elsewhere//python=python3"
    for spec in config.option.tx[:2]:
        assert spec.startswith("popen//python=unshare --pid --fork --mount-proc ")
        assert spec.endswith(f"nsinit.py {sys.executable}"), spec


def test_a_slurm_cluster_held_by_a_worker_in_another_namespace_is_not_stale(tmp_path) -> None:
    """Each worker starts its own test Slurm cluster, and clears clusters left by
    earlier runs; another worker's controller pid is invisible from here (its pid
    namespace), so its directory is told by the lock its test process holds."""
    import fcntl

    from tests.harness.slurm import HELD, PREFIX, remove_stale
    held, left = tmp_path / f"{PREFIX}held", tmp_path / f"{PREFIX}left"
    for d in (held, left):
        d.mkdir()
        (d / HELD).touch()
        os.utime(d, (0, 0))   # old enough to be an earlier run's
    holder = subprocess.Popen([*INIT, sys.executable, "-c",
                               "import fcntl, sys, time\n"
                               f"f = open({str(held / HELD)!r})\n"
                               "fcntl.flock(f, fcntl.LOCK_EX)\n"
                               "print('up', flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert holder.stdout.readline().strip() == "up"
        assert remove_stale(tmp_path) == [left]
        assert held.exists() and not left.exists()
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
    fd, deadline = os.open(held / HELD, os.O_RDONLY), time.monotonic() + 30
    try:
        while True:   # released with its holder (the namespace dies after unshare)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                assert time.monotonic() < deadline, "the lock outlived its holder"
                time.sleep(0.1)
    finally:
        os.close(fd)
    assert remove_stale(tmp_path) == [held]
