"""Child processes the tests start: a free port, a process and its output, readiness."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from tests.harness.paths import ROOT


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    """A child process in its own session, its output collected by a thread."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None, name: str = "") -> None:
        self.name = name or Path(argv[0]).name
        self.lines: list[tuple[float, str]] = []
        self.popen = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            text=True, env={**os.environ, **(env or {})}, start_new_session=True, cwd=ROOT)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.popen.stdout:
            self.lines.append((time.time(), line.rstrip("\n")))

    def output(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int | None:
        if self.alive():
            try:
                os.killpg(self.popen.pid, sig)
            except ProcessLookupError:
                pass
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(5)
        self._reader.join(5)
        return self.popen.returncode


def wait_ready(proc: Proc, url: str, timeout: float = 60.0) -> None:
    """Until ``url`` answers 200; a failure with the process's output if it dies or never does."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if not proc.alive():
            break
        time.sleep(0.3)
    pytest.fail(f"{proc.name} did not become ready at {url}:\n{proc.output()[-3000:]}")
