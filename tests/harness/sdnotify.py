"""The systemd end of sd_notify(3): a bound datagram socket that keeps what a unit's process sends."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field

import pytest

from tests.harness.procs import Proc

WATCHDOG_USEC = 2_000_000
START_TIMEOUT = 30.0  # a loaded 2-core CI box imports grpc slowly


@dataclass
class Message:
    at: float
    fields: dict[str, str]
    # For READY=1: which of the watched ports accepted a TCP connection right then.
    listening: dict[int, bool] = field(default_factory=dict)


class NotifySocket:
    """The systemd end: a bound datagram socket, read by a thread."""

    def __init__(self, address: str | None = None, check_ports: tuple[int, ...] = ()) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="ncw-sd-")  # short: sun_path is 108 bytes
        self.path = address or os.path.join(self._dir.name, "notify")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path.replace("@", "\0", 1) if self.path.startswith("@") else self.path)
        self.sock.settimeout(0.1)
        self.check_ports = check_ports
        self.messages: list[Message] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(4096)
            except socket.timeout:
                continue
            fields = dict(line.split("=", 1) for line in data.decode().split("\n") if line)
            msg = Message(time.monotonic(), fields)
            if fields.get("READY") == "1":  # probe at once, before the test thread wakes
                msg.listening = {p: _accepts(p) for p in self.check_ports}
            self.messages.append(msg)

    def env(self) -> dict[str, str]:
        return {"NOTIFY_SOCKET": self.path, "WATCHDOG_USEC": str(WATCHDOG_USEC)}

    def having(self, key: str, value: str | None = None) -> list[Message]:
        return [m for m in list(self.messages)
                if key in m.fields and (value is None or m.fields[key] == value)]

    def wait_for(self, key: str, value: str | None = None, *, match: str | None = None,
                 timeout: float = START_TIMEOUT, count: int = 1, proc: Proc | None = None,
                 since: float = 0.0) -> list[Message]:
        deadline = time.monotonic() + timeout
        while True:
            got = [m for m in self.having(key, value) if m.at >= since
                   and (match is None or re.search(match, m.fields[key]))]
            if len(got) >= count:
                return got
            if time.monotonic() > deadline or (proc is not None and not proc.alive()):
                seen = "\n".join(repr(m.fields) for m in self.messages[-20:])
                out = proc.output()[-3000:] if proc else ""
                pytest.fail(f"no {count}x {key}={value or match or '*'} within {timeout}s; "
                            f"got:\n{seen}\nprocess output:\n{out}")
            time.sleep(0.02)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()
        self._dir.cleanup()


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def stop_and_expect_stopping(proc: Proc, sd: NotifySocket) -> None:
    """SIGTERM ``proc``: it must exit 0 within 20 s, having sent STOPPING=1."""
    t0 = time.monotonic()
    proc.popen.send_signal(signal.SIGTERM)
    try:
        rc = proc.popen.wait(20)
    except subprocess.TimeoutExpired:
        proc.stop(signal.SIGKILL)
        pytest.fail(f"{proc.name} did not exit within 20 s of SIGTERM:\n{proc.output()[-3000:]}")
    sd.wait_for("STOPPING", "1", timeout=5, since=t0)
    assert rc == 0, proc.output()[-3000:]

