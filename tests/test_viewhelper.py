"""The view helper's request: one small JSON line, a pid and a mode; nothing
else is taken (no path, argv or text reaches py-spy). The helper itself runs
against real chroot'd ranks in tests/e2e/test_chroot_stacks.py."""

from __future__ import annotations

import asyncio
import json
import os
import stat

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
