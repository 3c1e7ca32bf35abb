"""sd_notify(3) for the systemd units, without libsystemd.

``Type=notify`` lets systemd (and units ordered after ours) know when the
ports actually listen, not merely that the process exists. ``WatchdogSec=``
restarts a process whose main loop wedged while the process lives on: the
pings come from that loop, after a healthy iteration, so a stuck loop stops
them. Outside systemd (no ``$NOTIFY_SOCKET``) every call is a no-op, and a
broken socket never reaches the caller: it is logged once, and the service
goes on running unsupervised rather than dying of its supervisor's absence.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import Callable

log = logging.getLogger(__name__)

#: Send a changed STATUS= line at most this often (systemctl status shows it).
STATUS_EVERY = 2.0

_warned = False


def _address() -> str | None:
    addr = os.environ.get("NOTIFY_SOCKET", "")
    if not addr:
        return None
    if addr.startswith("@"):  # abstract namespace
        return "\0" + addr[1:]
    if addr.startswith("/"):
        return addr
    _warn(f"unsupported NOTIFY_SOCKET {addr!r} (only unix sockets)")
    return None


def _warn(msg: str) -> None:
    global _warned
    if not _warned:
        log.warning("sd_notify: %s; not telling systemd our state", msg)
        _warned = True


def notify(*fields: str) -> bool:
    """Send ``KEY=value`` fields in one datagram; False if not sent."""
    addr = _address()
    if addr is None:
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.sendto("\n".join(fields).encode(), addr)
        return True
    except Exception as e:  # noqa: BLE001 (the supervisor's trouble is not ours)
        _warn(f"cannot send to {os.environ.get('NOTIFY_SOCKET')}: {e}")
        return False


def _one_line(text: str) -> str:
    return " ".join(text.split())


def ready(status_text: str | None = None) -> bool:
    return notify("READY=1", *([f"STATUS={_one_line(status_text)}"] if status_text else []))


def status(text: str) -> bool:
    return notify(f"STATUS={_one_line(text)}")


def stopping() -> bool:
    return notify("STOPPING=1")


def watchdog_interval() -> float | None:
    """Seconds within which systemd wants a ping, or None (sd_watchdog_enabled).

    WATCHDOG_PID names the process meant to ping; any other (a child that
    inherited the environment) must stay silent.
    """
    try:
        usec = int(os.environ.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    if usec <= 0:
        return None
    pid = os.environ.get("WATCHDOG_PID", "")
    if pid and pid != str(os.getpid()):
        return None
    return usec / 1e6


def watchdog() -> bool:
    if watchdog_interval() is None:
        return False
    return notify("WATCHDOG=1")


class Notifier:
    """What a main loop tells systemd: READY once, WATCHDOG when due, STATUS when changed.

    ``alive()`` goes at the end of each healthy iteration; the status line is
    a callable so that it costs nothing when not running under systemd.
    """

    def __init__(self, status_every: float = STATUS_EVERY,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.enabled = _address() is not None
        wd = watchdog_interval() if self.enabled else None
        # Ping at a quarter of the deadline: loop jitter must never cost a restart.
        self.ping_every = wd / 4 if wd else None
        self.status_every = status_every
        self._clock = clock
        self._ready = False
        self._status: str | None = None
        self._status_at = -1e18
        self._pinged_at = -1e18

    def ready(self, status_text: str | None = None) -> None:
        if not self.enabled or self._ready:
            return
        self._ready = True
        self._status, self._status_at = status_text, self._clock()
        self._pinged_at = self._clock()
        ready(status_text)

    def alive(self, status_text: Callable[[], str]) -> None:
        if not self.enabled:
            return
        if not self._ready:
            self.ready(status_text())
            return
        now = self._clock()
        if self.ping_every is not None and now - self._pinged_at >= self.ping_every:
            self._pinged_at = now
            notify("WATCHDOG=1")
        if now - self._status_at >= self.status_every:
            self._status_at = now
            text = status_text()
            if text != self._status:
                self._status = text
                status(text)

    def stopping(self) -> None:
        if self.enabled:
            stopping()
