"""The view helper's request: one small JSON line, a pid and a mode; nothing
else is taken (no path, argv or text reaches py-spy). The helper itself runs
against real chroot'd ranks in tests/e2e/test_chroot_stacks.py."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import socket
import stat
import subprocess

import pytest

from ncclwatch.agent import viewhelper
from ncclwatch.agent.pyspy import PySpyError
from ncclwatch.agent.viewhelper import MODES, ViewHelperError, parse_request


@pytest.mark.parametrize("line,pid,mode", [
    (b'{"pid": 42, "mode": "dump"}', 42, "dump"),
    (b'{"mode": "native", "pid": 7}', 7, "native"),
    (b'{"pid": 9, "mode": "locals"}', 9, "locals"),
])
def test_a_request_names_a_pid_and_a_mode(line, pid, mode) -> None:
    assert parse_request(line) == (pid, mode)


@pytest.mark.parametrize("line,why", [
    (b"not json", "not JSON"),
    (b"[1, 2]", "must be"),
    (b'{"pid": 1}', "must be"),
    (b'{"pid": 1, "mode": "dump", "argv": ["sh"]}', "must be"),       # no extra keys
    (b'{"pid": "1", "mode": "dump"}', "positive process id"),
    (b'{"pid": true, "mode": "dump"}', "positive process id"),
    (b'{"pid": 0, "mode": "dump"}', "positive process id"),
    (b'{"pid": -5, "mode": "dump"}', "positive process id"),
    (b'{"pid": 5, "mode": "record"}', "mode must be one of"),
    (b'{"pid": 5, "mode": "dump", "x": "' + b"a" * 300 + b'"}', "over 256 bytes"),
])
def test_anything_else_is_refused_with_its_reason(line, why) -> None:
    with pytest.raises(ViewHelperError, match=why):
        parse_request(line)


def test_every_mode_builds_py_spys_own_argv_for_the_pid_alone() -> None:
    for mode, (argv_of, timeout, _paused) in MODES.items():
        argv = argv_of("/x/py-spy", 1234)
        assert argv[0] == "/x/py-spy" and argv[1] == "dump" and argv[-2:] == ["--pid", "1234"]
        assert timeout > 0, mode
    assert "--nonblocking" in MODES["dump"][0]("p", 1) and not MODES["dump"][2]
    assert "--nonblocking" not in MODES["native"][0]("p", 1) and MODES["native"][2]


def test_a_pid_that_needs_no_view_is_refused_over_a_real_socket(tmp_path) -> None:
    """The helper serves only ranks whose root needs a view: this test's own
    process (root at the top) is refused, and the agent's side says why. The
    socket is made 0600 in a 0700 directory; an open directory is refused."""
    sock = str(tmp_path / "run" / "view.sock")

    async def go() -> tuple[str, int]:
        server = asyncio.create_task(viewhelper.serve(sock))
        for _ in range(100):
            if os.path.exists(sock):
                break
            await asyncio.sleep(0.02)
        mode = stat.S_IMODE(os.stat(sock).st_mode)
        try:
            with pytest.raises(PySpyError) as e:
                await viewhelper.ask(sock, os.getpid(), "dump", 5.0)
            return str(e.value), mode
        finally:
            server.cancel()

    why, mode = asyncio.run(go())
    assert "needs no view" in why and mode == 0o600, (why, oct(mode))
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o777)
    open_dir.chmod(0o777)
    with pytest.raises(ViewHelperError, match="open to others"):
        asyncio.run(viewhelper.serve(str(open_dir / "view.sock")))


def test_a_malformed_request_gets_an_answer_not_a_hang(tmp_path) -> None:
    sock = str(tmp_path / "run" / "view.sock")

    async def go() -> dict:
        server = asyncio.create_task(viewhelper.serve(sock))
        for _ in range(100):
            if os.path.exists(sock):
                break
            await asyncio.sleep(0.02)
        try:
            r, w = await asyncio.open_unix_connection(sock)
            w.write(b'{"pid": 1, "mode": "dump", "exec": "/bin/sh"}\n')
            await w.drain()
            return json.loads(await asyncio.wait_for(r.readline(), 5))
        finally:
            server.cancel()

    answer = asyncio.run(go())
    assert answer["ok"] is False and "must be" in answer["error"], answer


async def _served(sock: str, helper: viewhelper.Helper) -> asyncio.Task:
    server = asyncio.create_task(viewhelper.serve(sock, helper))
    for _ in range(100):
        if os.path.exists(sock):
            break
        await asyncio.sleep(0.02)
    return server


def test_a_folder_of_another_uid_or_a_symlink_is_refused(tmp_path) -> None:
    """Before, only the folder's mode was checked: one another user made (and
    could swap the socket in) or a symlink to a 0700 folder was used."""
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 4321, 4321)
    with pytest.raises(ViewHelperError, match="owned by uid 4321"):
        asyncio.run(asyncio.wait_for(viewhelper.serve(str(theirs / "view.sock")), 5))
    # The agent's own uid may own it (the socket is made, then the test stops).
    async def agents() -> bool:
        server = await _served(str(theirs / "view.sock"), viewhelper.Helper(agent_uid=4321))
        server.cancel()
        return os.path.exists(theirs / "view.sock")
    assert asyncio.run(agents())
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(ViewHelperError, match="not a folder"):
        asyncio.run(asyncio.wait_for(viewhelper.serve(str(tmp_path / "link" / "view.sock")), 5))
    assert not (real / "view.sock").exists()


def test_a_peer_of_another_uid_is_refused(tmp_path) -> None:
    """Each connection's SO_PEERCRED names the agent's uid, or it is refused
    before its request is read: here the helper serves uid 4321 and this
    test's process (another uid) connects over the real socket."""
    sock = str(tmp_path / "run" / "view.sock")
    async def go() -> dict:
        helper = viewhelper.Helper(agent_uid=4321)
        server = await _served(sock, helper)
        try:
            r, w = await asyncio.open_unix_connection(sock)
            w.write(json.dumps({"pid": os.getpid(), "mode": "dump"}).encode() + b"\n")
            await w.drain()
            answer = json.loads(await asyncio.wait_for(r.readline(), 5))
            assert helper.refused_total == 1 and helper.runs_total == 0
            return answer
        finally:
            server.cancel()

    answer = asyncio.run(go())
    assert answer == {"ok": False, "error": f"uid {os.geteuid()} is not the agent's (uid 4321)"}
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with left, right:
        assert viewhelper.peer_uid(left) == os.geteuid()


def test_a_pid_is_pinned_and_a_replaced_one_refused() -> None:
    """The pid asked for is pinned (a pidfd and its start time) and checked
    again before py-spy runs: one that exited, or whose number now names a
    process started at another time, is refused."""
    child = subprocess.Popen(["sleep", "30"])
    try:
        p = viewhelper.pin(child.pid)
        try:
            viewhelper.same(p)                                     # still it
            with open(f"/proc/{child.pid}/stat", "rb") as f:
                raw = f.read()
            assert p.start == int(raw[raw.rindex(b")") + 2:].split()[19])
            # The same number, another process (another start): refused.
            other = dataclasses.replace(p, start=p.start + 1)
            with pytest.raises(ViewHelperError, match="names another process"):
                viewhelper.same(other)
            child.kill()
            child.wait()
            with pytest.raises(ViewHelperError, match="exited"):
                viewhelper.same(p)
        finally:
            os.close(p.fd)
    finally:
        child.kill()
        child.wait()
    with pytest.raises(ViewHelperError, match="no such process"):
        viewhelper.pin(child.pid)
