"""`pip install .` gives a working `ncclwatch`: code, generated protos, entry point.

The wheel is built from this checkout and installed (without dependencies)
into a fresh virtual environment; the dependencies come from the test venv
through PYTHONPATH, where ncclwatch itself is only an editable hook that
PYTHONPATH does not load, so the import must resolve to the installed wheel.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path

from tests.harness.paths import ROOT
from tests.harness.procs import free_port
from tests.harness.slurm import BINARIES


def _run(*argv, **kw) -> subprocess.CompletedProcess:
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300, **kw)
    assert out.returncode == 0, f"{argv}: {out.stdout[-2000:]}{out.stderr[-2000:]}"
    return out


def test_pip_install_gives_a_working_ncclwatch(tmp_path) -> None:
    # Build from a copy: setuptools leaves build/ and *.egg-info in the source tree.
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".venv", ".git", "artifacts", "build", "*.egg-info", "__pycache__", ".pytest_cache"))
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path / "dist"), str(src))
    wheel = next((tmp_path / "dist").glob("ncclwatch-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("ncclwatch/v1/collector_pb2.py", "ncclwatch/v1/collector_pb2_grpc.py",
                   "ncclwatch/daemon/page.py", "ncclwatch/agent/agent.py", "ncclwatch/py.typed"):
        assert needed in names, f"{needed} missing from {wheel.name}"
    assert not any(n.startswith("tests/") for n in names), "tests shipped in the wheel"
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "ncclwatch = ncclwatch.cli:main" in zipfile.ZipFile(wheel).read(entry).decode()

    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", str(venv))
    _run(sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
         "--no-deps", "-q", str(wheel))
    env = {**os.environ, "PYTHONPATH": sysconfig.get_paths()["purelib"]}
    exe = str(venv / "bin" / "ncclwatch")
    where = _run(str(venv / "bin" / "python"), "-c", "import ncclwatch; print(ncclwatch.__file__)",
                 env=env, cwd=tmp_path).stdout
    assert where.startswith(str(venv)), f"imported from {where}, not the installed wheel"
    helptext = _run(exe, "--help", env=env, cwd=tmp_path).stdout
    for cmd in ("run", "agent", "daemon", "status"):
        assert cmd in helptext
    # The installed daemon serves metrics and its page.
    port = free_port()
    proc = subprocess.Popen([exe, "daemon", "--grpc", f"127.0.0.1:{free_port()}",
                             "--http", f"127.0.0.1:{port}"], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        argv = [exe, "status", "--daemon", f"http://127.0.0.1:{port}", "--json"]
        deadline = time.time() + 30
        while True:
            status = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True,
                                    text=True, timeout=60)
            if status.returncode == 0 or time.time() > deadline or proc.poll() is not None:
                break
            time.sleep(0.3)
        assert status.returncode == 0, status.stdout + status.stderr
        assert '"jobs"' in status.stdout
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0, out[-2000:]
    assert Path(exe).exists()


def test_make_test_installs_what_the_slurm_fixture_needs() -> None:
    deps = re.search(r"^SYSTEM_DEPS := (.*?)(?<!\\)$", (ROOT / "Makefile").read_text(),
                     re.M | re.S).group(1)
    installed = {d.split(":")[1] for d in deps.replace("\\\n", " ").split()}
    assert {pkg for _, pkg in BINARIES} <= installed, installed
