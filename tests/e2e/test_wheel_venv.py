"""The release as a node gets it: the wheel, built here, installed into a clean
venv with the hashed lock (requirements/runtime.lock: pip takes the lines for
this machine's Python), and a daemon and an agent run from that venv against a
real job.

Nothing comes from the test venv or the checkout: the venv has its own pip,
the dependencies come from PyPI only as the lock pins and hashes them, the
wheel goes in without dependencies, and the processes run without PYTHONPATH
from a folder outside the checkout. A short slow save must be named
(checkpoint_gather, rank 0) by that daemon.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request

import pytest
from packaging.utils import canonicalize_name
from packaging.version import Version

import ncclwatch
from tests.harness.procs import Proc, free_port
from tests.harness.release import LOCK, PYTHONS, build_wheel, pins_for

pytestmark = pytest.mark.e2e

NO_CHECKOUT = {"PYTHONPATH": ""}


def _run(argv: list[str], **kw) -> subprocess.CompletedProcess:
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300, **kw)
    assert out.returncode == 0, f"{argv}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


@pytest.fixture(scope="module")
def release_venv(tmp_path_factory):
    """(venv, environment without the checkout) with the wheel and the lock installed."""
    tmp = tmp_path_factory.mktemp("release")
    wheel = build_wheel(tmp)
    assert wheel.name.startswith(f"ncclwatch-{ncclwatch.__version__}-"), wheel.name
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], env=env)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-cache-dir"]
    _run([*pip, "--require-hashes", "-r", str(LOCK)], env=env)
    _run([*pip, "--no-deps", str(wheel)], env=env)
    return venv, env, tmp


def test_the_installed_release_runs(release_venv) -> None:
    venv, env, tmp = release_venv
    exe = str(venv / "bin" / "ncclwatch")
    out = _run([exe, "--version"], env=env, cwd=tmp)
    assert out.stdout.strip() == f"ncclwatch {ncclwatch.__version__}"
    where = _run([str(venv / "bin" / "python"), "-c",
                  "import ncclwatch, grpc; print(ncclwatch.__file__, grpc.__file__)"],
                 env={**os.environ, **NO_CHECKOUT}, cwd=tmp).stdout
    assert all(p.startswith(str(venv)) for p in where.split()), where
    assert (venv / "bin" / "py-spy").exists(), "py-spy's binary, where the agent looks first"
    _run([str(venv / "bin" / "python"), "-m", "pip", "check"], env=env)
    # Exactly the lock's lines for this Python, as the release tests choose them
    # for every supported one (tests/repo/test_release.py), and nothing else.
    python = "{}.{}".format(*sys.version_info[:2])
    assert python in PYTHONS, f"Python {python} is not in the support matrix"
    listed = json.loads(_run([str(venv / "bin" / "python"), "-m", "pip", "list",
                              "--format=json"], env=env).stdout)
    got = {canonicalize_name(d["name"]): Version(d["version"]) for d in listed
           if canonicalize_name(d["name"]) not in ("pip", "setuptools", "ncclwatch")}
    assert got == {n: p.version for n, p in pins_for(python).items()}, got


def test_daemon_and_agent_from_the_release_name_a_real_stall(release_venv, torch_job) -> None:
    venv, env, tmp = release_venv
    exe = str(venv / "bin" / "ncclwatch")
    grpc_port, http_port = free_port(), free_port()
    # Proc adds to os.environ: an empty PYTHONPATH keeps the checkout off the path.
    procs = [Proc([exe, "daemon", "--grpc", f"127.0.0.1:{grpc_port}", "--http",
                   f"127.0.0.1:{http_port}"], env=NO_CHECKOUT, name="release-daemon"),
             Proc([exe, "agent", "--collector", f"127.0.0.1:{grpc_port}"], env=NO_CHECKOUT,
                  name="release-agent")]
    try:
        job = torch_job("slow-save", 2, {"NCCLWATCH_WATCHDOG_TIMEOUT_SECONDS": "90"},
                        "--model-mb", "4", "--save-seconds", "40", "--pg-timeout", "90")
        job.wait_marker("save_start", timeout=120)
        pids, stall, deadline = job.pids(), None, time.time() + 30
        while time.time() < deadline and stall is None:
            with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/api/v1/jobs?ranks=1",
                                        timeout=10) as r:
                view = json.load(r)
            for j in view["jobs"]:
                if pids & {r["pid"] for r in j["ranks"]} and j["stalls"]:
                    stall = j["stalls"][0]
            time.sleep(0.5)
        log = "\n".join(f"--- {p.name}\n{p.output()[-2000:]}" for p in procs)
        assert stall is not None, log
        assert stall["kind"] == "checkpoint_gather", stall
        assert [c["rank"] for c in stall["culprits"]] == [0], stall
        assert view["agents"][0]["version"] == ncclwatch.__version__, view["agents"]
    finally:
        for p in reversed(procs):
            p.stop()
