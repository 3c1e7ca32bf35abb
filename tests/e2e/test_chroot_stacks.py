"""py-spy stacks of an interpreter whatever switched its root, taken by the
agent's own py-spy from the host: ``chroot``, ``pivot_root``, and a chroot
inside a pivot_root container (tests/containerns.py makes them: new PID,
mount and UTS namespaces, the image on a tmpfs the host cannot see).

With a shared libpython, py-spy alone fails on the chroot'd ones (it opens
``/proc/PID/root`` + the maps path, and the maps path is then relative to the
top of the mount tree, not to the root); the agent runs it in a view of its
own making (ncclwatch/agent/rootview.py). The view needs CAP_SYS_ADMIN and
CAP_SYS_CHROOT: run with the two capabilities the unit and the DaemonSet
grant, the agent says so instead of failing silently; with the two added
(systemd/examples/agent-chroot-ranks.conf), it gets the stack.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from ncclwatch.agent import rootview
from ncclwatch.agent.pyspy import PySpy, PySpyError, find_pyspy
from tests.conftest import ROOT, Proc, need
from tests.containerns import ROOT_KINDS, Container, script, unshare_argv

pytestmark = pytest.mark.e2e

CODE = """
import os, sys, time
def spin_in_image():
    print("up", flush=True)
    while True:
        time.sleep(0.2)
spin_in_image()
"""


def _start(tmp: Path, kind: str) -> tuple[Container, Proc, int]:
    """An interpreter in a container whose root ``kind`` switched; its host pid."""
    if os.geteuid() != 0:
        pytest.fail("the chroot tests make namespaces and mounts: they run as root (CI does)")
    need("py-spy")
    root = tmp / "ctr-root"
    root.mkdir()
    c = Container(root, "stacks-" + uuid.uuid4().hex[:6], "", "", "", root_kind=kind)
    proc = Proc(unshare_argv(script(c, ["-c", CODE], {}, None)), name=f"chroot-{kind}")
    deadline = time.time() + 60
    while time.time() < deadline:
        for child in psutil.Process(proc.popen.pid).children(recursive=True):
            try:
                if "spin_in_image" in " ".join(child.cmdline()) and "up" in proc.output():
                    return c, proc, child.pid
            except psutil.Error:
                pass
        if not proc.alive():
            break
        time.sleep(0.2)
    proc.stop()
    pytest.fail(f"the {kind} container never started:\n{proc.output()[-3000:]}")


def _shared_libpython(pid: int) -> bool:
    return bool(rootview.libpython_paths(Path(f"/proc/{pid}/maps").read_text()))


@pytest.mark.parametrize("kind", ROOT_KINDS)
def test_the_agents_py_spy_reads_the_stack_whatever_switched_the_root(tmp_path, kind) -> None:
    c, proc, pid = _start(tmp_path, kind)
    try:
        assert os.readlink(f"/proc/{pid}/root") == c.root_link
        threads = asyncio.run(PySpy().dump(pid))
        frames = [f.name for t in threads for f in t.stack.frames]
        assert "spin_in_image" in frames, frames
        # The view is taken exactly where py-spy alone would miss libpython.
        expect = "chroot" in kind and _shared_libpython(pid)
        assert rootview.needed(pid) == expect, (kind, Path(f"/proc/{pid}/maps").read_text()[:2000])
        if expect:
            plain = subprocess.run([find_pyspy(), "dump", "--nonblocking", "--pid", str(pid)],
                                   capture_output=True, text=True, timeout=30)
            assert plain.returncode != 0, "py-spy alone read it: the view is not needed"
        print(f"\n{kind}: stack read; shared libpython {_shared_libpython(pid)}, view {expect}")
    finally:
        proc.stop()


PROBE = """
import asyncio, json, sys
from ncclwatch.agent.pyspy import PySpy, PySpyError
try:
    t = asyncio.run(PySpy().dump(int(sys.argv[1])))
    print(json.dumps({"frames": [f.name for x in t for f in x.stack.frames]}))
except PySpyError as e:
    print(json.dumps({"error": str(e)}))
"""


def _probe_with(caps: list[str], pid: int) -> dict:
    """PySpy().dump(pid) by root holding only ``caps`` (as the unit or the pod grant them)."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.fail("setpriv missing: install Debian's util-linux")
    spec = ",".join(["-all"] + [f"+{c}" for c in caps])
    out = subprocess.run([setpriv, "--bounding-set", spec, "--inh-caps", "-all", "--no-new-privs",
                          sys.executable, "-c", PROBE, str(pid)], capture_output=True, text=True,
                         timeout=60, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_view_needs_sys_admin_and_sys_chroot_and_says_so(tmp_path) -> None:
    c, proc, pid = _start(tmp_path, "chroot")
    try:
        if not rootview.needed(pid):
            pytest.fail("this interpreter loads no shared libpython: py-spy needs no view "
                        "here, so this test cannot check one (build the venv from a "
                        "--enable-shared Python, as CI's is)")
        pair = _probe_with(["sys_ptrace", "dac_read_search"], pid)
        assert "CAP_SYS_ADMIN and CAP_SYS_CHROOT" in pair.get("error", ""), pair
        four = _probe_with(["sys_ptrace", "dac_read_search", "sys_admin", "sys_chroot"], pid)
        assert "spin_in_image" in four.get("frames", []), four
    finally:
        proc.stop()


def _in_container(pid: int, command: str) -> None:
    """A shell command in the container's mount namespace (the test's doing, not the agent's)."""
    r = subprocess.run([shutil.which("nsenter") or "nsenter", "-t", str(pid), "-m",
                        "sh", "-ec", command], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr


def test_a_symlink_planted_for_libpython_never_leads_to_a_host_file(tmp_path) -> None:
    """The image swaps its libpython for a symlink to a path that holds a good
    copy on the host only: py-spy in the view does not reach it. Given the same
    copy at that path inside the container's own mount tree, it does."""
    c, proc, pid = _start(tmp_path, "chroot")
    host_only = tmp_path / "host-only"
    host_only.mkdir()
    try:
        if not rootview.needed(pid):
            pytest.fail("this interpreter loads no shared libpython: nothing to plant")
        lib = rootview.libpython_paths(Path(f"/proc/{pid}/maps").read_text())[0]
        inner = lib[len(c.root_link):]            # the path inside the chroot
        name = Path(lib).name
        saved = tmp_path / "saved-libpython"
        shutil.copyfile(f"/proc/{pid}/root{inner}", saved)
        # A tmpfs mounted on the host after the container was made: only the host has it.
        subprocess.run(["mount", "-t", "tmpfs", "host-only", str(host_only)], check=True)
        try:
            shutil.copyfile(saved, host_only / name)
            _in_container(pid, f"mount -t tmpfs plant {Path(lib).parent}; "
                               f"ln -s {host_only / name} {lib}")
            with pytest.raises(PySpyError):
                asyncio.run(PySpy().dump(pid))
            # Control: the same file where the link points, in the container's tree.
            _in_container(pid, f"mount -t tmpfs ctr {host_only}; cp {saved} {host_only / name}")
            threads = asyncio.run(PySpy().dump(pid))
            assert "spin_in_image" in [f.name for t in threads for f in t.stack.frames]
        finally:
            subprocess.run(["umount", str(host_only)], check=False)
    finally:
        proc.stop()
