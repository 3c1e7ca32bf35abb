"""py-spy stacks of an interpreter whatever switched its root, taken by the
agent's own py-spy from the host: ``chroot``, ``pivot_root``, and a chroot
inside a pivot_root container (tests/harness/containerns.py makes them: new PID,
mount and UTS namespaces, the image on a tmpfs the host cannot see).

With a shared libpython, py-spy alone fails on the chroot'd ones (it opens
``/proc/PID/root`` + the maps path, and the maps path is then relative to the
top of the mount tree, not to the root); the agent runs it in a view of its
own making (ncclwatch/agent/rootview.py). The view needs CAP_SYS_ADMIN and
CAP_SYS_CHROOT: run with the two capabilities the unit and the DaemonSet
grant, the agent says so instead of failing silently; with the view helper
beside it (the one process that holds the two: ncclwatch view-helper), it
gets the stack. Only a static py-spy runs in a view: a planted loader never.
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
from tests.harness.containerns import ROOT_KINDS, Container, script, unshare_argv
from tests.harness.paths import ROOT
from tests.harness.procs import Proc
from tests.harness.tools import need

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
    t = asyncio.run(PySpy(view_socket=sys.argv[2]).dump(int(sys.argv[1])))
    print(json.dumps({"frames": [f.name for x in t for f in x.stack.frames]}))
except PySpyError as e:
    print(json.dumps({"error": str(e)}))
"""


def _with_caps(caps: list[str]) -> list[str]:
    """The argv prefix that runs a command as root holding only ``caps``."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.fail("setpriv missing: install Debian's util-linux")
    spec = ",".join(["-all"] + [f"+{c}" for c in caps])
    return [setpriv, "--bounding-set", spec, "--inh-caps", "-all", "--no-new-privs"]


def _probe_with(caps: list[str], pid: int, view_socket: str = "/nonexistent/view.sock") -> dict:
    """PySpy().dump(pid) by root holding only ``caps`` (as the unit or the pod grant them)."""
    out = subprocess.run([*_with_caps(caps), sys.executable, "-c", PROBE, str(pid), view_socket],
                         capture_output=True, text=True,
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


def test_the_view_helper_alone_holds_the_two_capabilities(tmp_path) -> None:
    """The agent with the unit's two capabilities gets the chroot'd rank's stack
    through the view helper (systemd/ncclwatch-view.service: the only part
    that holds CAP_SYS_ADMIN and CAP_SYS_CHROOT); without it, it says so."""
    c, proc, pid = _start(tmp_path, "chroot")
    sock = str(tmp_path / "run" / "view.sock")
    helper = None
    try:
        if not rootview.needed(pid):
            pytest.fail("this interpreter loads no shared libpython: no view to ask for")
        agent_caps = ["sys_ptrace", "dac_read_search"]
        alone = _probe_with(agent_caps, pid, sock)
        assert "view helper" in alone.get("error", ""), alone
        helper = Proc([*_with_caps([*agent_caps, "sys_admin", "sys_chroot"]), sys.executable,
                       "-m", "ncclwatch", "view-helper", "--socket", sock,
                       "--log-level", "debug"], name="view-helper")
        deadline = time.time() + 30
        while not os.path.exists(sock) and time.time() < deadline and helper.alive():
            time.sleep(0.1)
        assert os.path.exists(sock), helper.output()[-2000:]
        got = _probe_with(agent_caps, pid, sock)
        assert "spin_in_image" in got.get("frames", []), (got, helper.output()[-2000:])
    finally:
        if helper is not None:
            helper.stop()
        proc.stop()


EVIL = r"""
#include <fcntl.h>
#include <unistd.h>
int main(void) {
    int fd = open("/tmp/loader-ran", O_CREAT | O_WRONLY, 0644);
    if (fd >= 0) { write(fd, "ran as the agent\n", 17); close(fd); }
    return 0;
}
"""


def test_a_loader_planted_in_the_image_never_runs(tmp_path) -> None:
    """A py-spy that is not static (conda's, a wrapper) would have its loader
    looked up in the view, where /lib64 is the rank's: an image that plants a
    loader there gets code run as root. The view refuses such a binary, and
    the planted loader never runs; the agent's static py-spy still reads."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.fail("gcc missing: install Debian's gcc (and libc6-dev) to build the planted loader")
    src, evil = tmp_path / "evil.c", tmp_path / "evil"
    src.write_text(EVIL)
    subprocess.run([cc, "-static", "-O1", "-o", str(evil), str(src)], check=True, timeout=120)
    dynamic = tmp_path / "py-spy-dynamic"
    shutil.copyfile("/usr/bin/true", dynamic)
    dynamic.chmod(0o755)
    c, proc, pid = _start(tmp_path, "chroot")
    try:
        if not rootview.needed(pid):
            pytest.fail("this interpreter loads no shared libpython: no view is built here")
        interp = subprocess.run(["readelf", "-l", str(dynamic)], capture_output=True,
                                text=True).stdout
        loader = interp.split("interpreter: ", 1)[1].split("]", 1)[0]
        d = os.path.dirname(loader).lstrip("/")
        _in_container(pid, f"rm -f {c.image}/{d}; mkdir -p {c.image}/{d}; "
                           f"cp {evil} {c.image}{loader}; chmod 755 {c.image}{loader}")
        with pytest.raises(PySpyError) as refused:
            asyncio.run(PySpy(binary=str(dynamic), view_socket=None).dump(pid))
        marker = Path(f"/proc/{pid}/root/tmp/loader-ran")
        assert not marker.exists(), "the image's loader ran as the agent"
        assert "dynamically linked" in str(refused.value), refused.value
        threads = asyncio.run(PySpy(view_socket=None).dump(pid))
        assert "spin_in_image" in [f.name for t in threads for f in t.stack.frames]
    finally:
        proc.stop()
