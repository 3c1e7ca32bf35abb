"""A worker's pid namespace (tests/harness/nsinit.py): its own processes only,
orphans reaped, the worker's exit status and signals passed through."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys

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
