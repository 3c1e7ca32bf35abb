"""sd_notify: the client alone, then the real daemon, ``run`` and agent against a
socket that stands in for systemd's."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from ncclwatch import sdnotify
from ncclwatch.agent.agent import Agent, AgentConfig
from ncclwatch.agent.gpu import NvmlGpuReader
from ncclwatch.daemon.core import Daemon, DaemonConfig
from ncclwatch.daemon.server import DaemonServer
from tests.harness.procs import Proc, free_port
from tests.harness.sdnotify import Message, NotifySocket, stop_and_expect_stopping
from tests.harness.tools import need


@pytest.fixture
def notify_socket():
    made: list[NotifySocket] = []

    def make(**kw) -> NotifySocket:
        made.append(NotifySocket(**kw))
        return made[-1]

    yield make
    for s in made:
        s.close()


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for k in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(sdnotify, "_warned", False)


# -- the client ---------------------------------------------------------------


def test_abstract_socket_address(monkeypatch, notify_socket) -> None:
    sd = notify_socket(address=f"@ncclwatch-test-{uuid.uuid4().hex}")
    monkeypatch.setenv("NOTIFY_SOCKET", sd.path)
    assert sdnotify.ready("2 jobs,\nno stalls")
    got = sd.wait_for("READY", "1", timeout=5)
    # STATUS is one line: systemctl shows only that.
    assert got[0].fields == {"READY": "1", "STATUS": "2 jobs, no stalls"}


def test_unset_notify_socket_is_a_no_op(caplog) -> None:
    assert sdnotify.notify("READY=1") is False
    assert sdnotify.watchdog() is False
    n = sdnotify.Notifier()
    assert not n.enabled

    def never() -> str:
        raise AssertionError("status line computed outside systemd")

    n.ready("x")
    n.alive(never)
    n.stopping()
    assert not caplog.records


@pytest.mark.parametrize("address", ["/nonexistent/ncclwatch/notify", "vsock:2:1234", "@"])
def test_bad_socket_does_not_raise_and_warns_once(monkeypatch, caplog, address) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", address)
    monkeypatch.setenv("WATCHDOG_USEC", "1000000")
    with caplog.at_level(logging.WARNING, logger="ncclwatch.sdnotify"):
        assert sdnotify.ready("x") is False
        assert sdnotify.watchdog() is False
        assert sdnotify.stopping() is False
        n = sdnotify.Notifier()
        n.alive(lambda: "s")
        n.alive(lambda: "s")
    warnings = [r for r in caplog.records if r.name == "ncclwatch.sdnotify"]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]


def test_watchdog_interval_and_pid(monkeypatch, notify_socket) -> None:
    assert sdnotify.watchdog_interval() is None
    monkeypatch.setenv("WATCHDOG_USEC", "2000000")
    assert sdnotify.watchdog_interval() == 2.0
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert sdnotify.watchdog_interval() == 2.0
    for bad in ("0", "-5", "soon"):
        monkeypatch.setenv("WATCHDOG_USEC", bad)
        assert sdnotify.watchdog_interval() is None
    # Meant for another process (we inherited its environment): stay silent.
    sd = notify_socket()
    monkeypatch.setenv("NOTIFY_SOCKET", sd.path)
    monkeypatch.setenv("WATCHDOG_USEC", "2000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getppid()))
    assert sdnotify.watchdog_interval() is None
    assert sdnotify.watchdog() is False
    assert sdnotify.Notifier().ping_every is None
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert sdnotify.watchdog() is True
    sd.wait_for("WATCHDOG", "1", timeout=5)
    assert len(sd.messages) == 1


def test_notifier_ready_once_pings_when_due_status_when_changed(monkeypatch,
                                                                notify_socket) -> None:
    sd = notify_socket()
    monkeypatch.setenv("NOTIFY_SOCKET", sd.path)
    monkeypatch.setenv("WATCHDOG_USEC", "4000000")  # ping every 1 s
    now = [100.0]
    n = sdnotify.Notifier(status_every=3.0, clock=lambda: now[0])
    calls = []

    def line() -> str:
        calls.append(now[0])
        return "A" if now[0] < 105 else "B"

    sent = []
    monkeypatch.setattr(sdnotify, "notify", lambda *f: sent.append(f) or True)
    for t in (100.0, 100.5, 101.0, 101.5, 102.0, 103.0, 104.0, 105.0, 106.0, 107.0):
        now[0] = t
        n.alive(line)
    kinds = [f[0].split("=")[0] for f in sent]
    assert sent[0] == ("READY=1", "STATUS=A")
    assert kinds.count("READY") == 1
    # Pings at 101, 102, 103, 104, 105, 106, 107 (not at 100.5, 101.5: not due).
    assert kinds.count("WATCHDOG") == 7
    # The status line is computed only every 3 s, and sent only when it changed.
    assert calls == [100.0, 103.0, 106.0]
    assert ("STATUS=B",) in sent and kinds.count("STATUS") == 1


def test_daemon_status_line_names_stalls() -> None:
    from ncclwatch.daemon.server import status_line
    from ncclwatch.model import StallKind

    daemon = Daemon(DaemonConfig())
    assert status_line(daemon) == "0 jobs, no stalls, 0 agents connected"
    # Only the keys matter to the line: (job, kind) of each open incident.
    for job, kind in (("b", StallKind.DESYNC), ("a", StallKind.CHECKPOINT_GATHER)):
        daemon.incidents.active[(job, kind)] = object()
    assert status_line(daemon) == ("0 jobs, 2 stalls (checkpoint_gather in job a, desync in "
                                   "job b), 0 agents connected")
    daemon.incidents.active[("c", StallKind.RANK_LOST)] = object()
    assert "+1 more" in status_line(daemon)


# -- the main loops: pings only after healthy iterations ------------------------


def _mark(sd: NotifySocket, n: int) -> Message:
    """Send a marker through the socket and wait for it: datagrams keep their
    order, so every ping sent before it has been read once it is."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.sendto(f"MARK={n}".encode(), sd.path)
    return sd.wait_for("MARK", str(n), timeout=5)[0]


def _pings_between(sd: NotifySocket, a: Message, b: Message) -> int:
    msgs = list(sd.messages)
    return sum("WATCHDOG" in m.fields for m in msgs[msgs.index(a) + 1:msgs.index(b)])


async def _until(cond, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


async def _check_pings_stop_while_failing(sd: NotifySocket, failing: dict) -> None:
    """``failing``: {"on": bool, "calls": int}, driven by a patched loop body."""
    await _until(lambda: len(sd.having("WATCHDOG")) >= 2, "the first pings")
    failing["on"] = True
    await _until(lambda: failing["calls"] >= 1, "a failing iteration")
    m1 = _mark(sd, 1)
    await _until(lambda: failing["calls"] >= 10, "ten failing iterations")
    m2 = _mark(sd, 2)
    assert _pings_between(sd, m1, m2) == 0, "pinged after a failing iteration"
    failing["on"] = False
    await _until(lambda: any("WATCHDOG" in m.fields for m in sd.messages[sd.messages.index(m2):]),
                 "pings to resume")


def test_daemon_pings_only_after_healthy_ticks(monkeypatch, notify_socket) -> None:
    sd = notify_socket()
    monkeypatch.setenv("NOTIFY_SOCKET", sd.path)
    monkeypatch.setenv("WATCHDOG_USEC", "40000")  # due at every tick

    async def go() -> None:
        daemon = Daemon(DaemonConfig(grpc="127.0.0.1:0", http="127.0.0.1:0", tick=0.01))
        server = DaemonServer(daemon, sdnotify.Notifier())
        healthy, failing = daemon.tick, {"on": False, "calls": 0}

        def tick(*a, **kw):
            if failing["on"]:
                failing["calls"] += 1
                raise RuntimeError("detector bug")
            return healthy(*a, **kw)

        monkeypatch.setattr(daemon, "tick", tick)
        await server.start()
        try:
            await _check_pings_stop_while_failing(sd, failing)
        finally:
            await server.stop(grace=0.1)

    asyncio.run(go())


def test_agent_pings_only_after_completed_rounds(monkeypatch, notify_socket) -> None:
    sd = notify_socket()
    monkeypatch.setenv("NOTIFY_SOCKET", sd.path)
    monkeypatch.setenv("WATCHDOG_USEC", "40000")

    async def go() -> None:
        agent = Agent(AgentConfig(collector=f"127.0.0.1:{free_port()}", interval=0.01,
                                  node="n"), gpu=NvmlGpuReader(), notifier=sdnotify.Notifier())
        healthy, failing = agent.round, {"on": False, "calls": 0}

        async def round_():
            if failing["on"]:
                failing["calls"] += 1
                raise RuntimeError("sampler bug")
            return await healthy()

        monkeypatch.setattr(agent, "round", round_)
        task = asyncio.create_task(agent.run())
        try:
            await _check_pings_stop_while_failing(sd, failing)
            assert len(sd.having("READY")) == 1
        finally:
            agent.stop()
            await task

    asyncio.run(go())


# -- the real processes -----------------------------------------------------------


@pytest.mark.parametrize("command", ["daemon", "run"])
def test_daemon_ready_after_ports_listen_then_status_watchdog_stopping(
        notify_socket, command) -> None:
    grpc_port, http_port = free_port(), free_port()
    sd = notify_socket(check_ports=(grpc_port, http_port))
    proc = Proc([need("ncclwatch"), command, "--grpc", f"127.0.0.1:{grpc_port}",
                 "--http", f"127.0.0.1:{http_port}"], env=sd.env(), name=f"ncclwatch-{command}")
    agent = None
    try:
        ready = sd.wait_for("READY", "1", proc=proc)[0]
        assert ready.listening == {grpc_port: True, http_port: True}, \
            "READY=1 came before both ports listened"
        assert re.fullmatch(r"\d+ jobs?, (no stalls|\d+ stalls? \(.+\)), \d+ agents? connected",
                            ready.fields.get("STATUS", "")), ready.fields
        assert len(sd.having("READY")) == 1
        sd.wait_for("WATCHDOG", "1", count=2, timeout=3.5, since=ready.at, proc=proc)
        if command == "daemon":  # `run` brings its own agent
            agent_sd = notify_socket()
            agent = Proc([need("ncclwatch"), "agent", "--collector", f"127.0.0.1:{grpc_port}"],
                         env=agent_sd.env(), name="ncclwatch-agent")
            agent_sd.wait_for("STATUS", match=rf"collector 127\.0\.0\.1:{grpc_port} connected",
                              proc=agent)
        # STATUS follows the daemon's state: the agent shows up in it.
        sd.wait_for("STATUS", match=r", [1-9]\d* agents? connected$", proc=proc)
        stop_and_expect_stopping(proc, sd)
        if agent is not None:
            stop_and_expect_stopping(agent, agent_sd)
    finally:
        proc.stop()
        if agent is not None:
            agent.stop()


@pytest.fixture
def fake_ranks():
    """Two processes that look like ranks of one job (a port nobody else uses)."""
    env = {"WORLD_SIZE": "2", "MASTER_ADDR": "10.9.9.9", "MASTER_PORT": str(free_port())}
    procs = [subprocess.Popen([sys.executable, "-c", "import torch.distributed, time\nwhile True: time.sleep(1)"],
                              env={**os.environ, **env, "RANK": str(r)}, start_new_session=True)
             for r in range(2)]
    yield procs
    for p in procs:
        p.kill()
        p.wait()


def test_agent_ready_without_collector_then_watchdog_status_stopping(notify_socket,
                                                                     fake_ranks) -> None:
    dead = free_port()  # nothing listens there
    sd = notify_socket()
    proc = Proc([need("ncclwatch"), "agent", "--collector", f"127.0.0.1:{dead}",
                 "--interval", "0.5"], env=sd.env(), name="ncclwatch-agent")
    try:
        ready = sd.wait_for("READY", "1", proc=proc)[0]
        assert len(sd.having("READY")) == 1
        assert f"collector 127.0.0.1:{dead}" in ready.fields.get("STATUS", ""), ready.fields
        sd.wait_for("WATCHDOG", "1", count=2, timeout=3.5, since=ready.at, proc=proc)
        # Down collector: the agent says so, and that its reports queue.
        got = sd.wait_for("STATUS", match=rf"collector 127\.0\.0\.1:{dead} unreachable "
                                          r"\(queue [1-9]\d*\)$", proc=proc)
        m = re.match(r"watching (\d+) ranks? of (\d+) jobs?, ", got[-1].fields["STATUS"])
        assert m and int(m.group(1)) >= 2 and int(m.group(2)) >= 1, got[-1].fields
        # Still alive and pinging after it knew the collector was down.
        sd.wait_for("WATCHDOG", "1", count=2, since=got[-1].at, timeout=5, proc=proc)
        stop_and_expect_stopping(proc, sd)
    finally:
        proc.stop()


def test_sdnotify_module_has_no_third_party_imports() -> None:
    text = Path(sdnotify.__file__).read_text()
    imports = set(re.findall(r"^(?:from|import) (\w+)", text, flags=re.M))
    assert imports <= {"__future__", "logging", "os", "socket", "time", "typing"}, imports


def _probe(path: Path, max_age: float) -> subprocess.CompletedProcess:
    """The DaemonSet's exec liveness probe, as the kubelet runs it."""
    return subprocess.run([sys.executable, "-m", "ncclwatch.agent.alive", str(path),
                           str(max_age)], capture_output=True, text=True, timeout=30)


def test_agent_alive_file_fails_the_probe_when_the_loop_wedges(tmp_path) -> None:
    """The pod's liveness is the watchdog ping's: a round that ends marks it. A
    stopped agent (a wedged loop) fails the probe; once it goes round again, it passes."""
    path = tmp_path / "alive"
    assert _probe(path, 5).returncode == 1                       # no round yet
    proc = Proc([need("ncclwatch"), "agent", "--collector", f"127.0.0.1:{free_port()}",
                 "--interval", "0.2", "--alive-file", str(path)], name="ncclwatch-agent")
    try:
        deadline = time.time() + 30
        while _probe(path, 1).returncode != 0:
            assert time.time() < deadline and proc.alive(), proc.output()
            time.sleep(0.2)
        os.kill(proc.popen.pid, signal.SIGSTOP)                  # the loop goes no further
        time.sleep(2.0)
        stale = _probe(path, 1)
        assert stale.returncode == 1 and "last healthy round" in stale.stderr, stale
        os.kill(proc.popen.pid, signal.SIGCONT)
        deadline = time.time() + 10
        while _probe(path, 1).returncode != 0:
            assert time.time() < deadline, proc.output()
            time.sleep(0.2)
    finally:
        os.kill(proc.popen.pid, signal.SIGCONT)
        proc.stop()


def test_alive_check_imports_only_the_standard_library() -> None:
    """The probe runs every few seconds: it must start fast and never need the agent."""
    from ncclwatch.agent import alive

    text = Path(alive.__file__).read_text()
    assert set(re.findall(r"^(?:from|import) (\w+)", text, flags=re.M)) <= {
        "__future__", "os", "sys", "time"}
