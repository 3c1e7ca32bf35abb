"""Who may make the daemon ask a job's ranks for fresh evidence, and how often.

A fresh ask (``POST /api/v1/dump``, bundle.py) pauses ranks already sitting
still (bounded native dumps) and writes to their Flight Recorder pipes through
the agents. A web page the operator happens to visit can *send* a form or a
``fetch`` to the daemon without any CORS permission, so after basic auth a
fresh ask must be:

- from this daemon's own origin: an ``Origin`` header, where the client sends
  one, names the request's Host under the scheme served, and
  ``Sec-Fetch-Site``, where sent, is ``same-origin`` or ``none``;
- not a plain form from elsewhere: it carries the header ``X-Ncclwatch-Request:
  dump`` (a page may send a custom header only after a CORS preflight, which
  this daemon never grants; ``ncclwatch dump`` sends it), or the form field
  ``token`` equal to this daemon start's secret, which only the landing page
  (read under the same auth, unreadable cross-site) embeds in its dump form;
- within the client address's rate, and for a job no other dump is asking now.

GET and HEAD serve the bundle of what the daemon holds and ask nothing.
"""

from __future__ import annotations

import hmac
import math
import secrets
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Mapping
from urllib.parse import urlsplit

#: What ncclwatch_daemon_dump_requests_total{outcome} counts (all exported, 0 or not).
OUTCOMES = ("served", "refused_origin", "refused_token", "busy", "rate_limited")
#: The header a client that is not a web page sends (name, value).
HEADER = ("X-Ncclwatch-Request", "dump")
#: The form field that carries the page's token.
TOKEN_FIELD = "token"
#: Sec-Fetch-Site values of a request a browser made from this daemon's own
#: page (same-origin) or on the user's own (none: typed, bookmarked).
SAME_SITE = frozenset({"same-origin", "none"})
#: The port an origin leaves out, per scheme.
DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class Limits:
    """The guard's thresholds."""

    #: Fresh asks one client address may start per window.
    per_client: int = 6
    window_seconds: float = 60.0
    #: Client addresses remembered at most (the oldest forgotten first).
    max_clients: int = 1024
    #: Largest form body read (the token field and little else).
    max_form_bytes: int = 4096


LIMITS = Limits()


@dataclass(frozen=True)
class Refusal:
    """An answer other than the bundle: HTTP status, outcome counted, sentence."""

    status: int
    outcome: str
    message: str
    headers: tuple[tuple[str, str], ...] = ()


#: The refusals of the origin and token rules (status, sentence).
REFUSALS = {
    "refused_origin": (403, "forbidden: a fresh dump is asked from this daemon's own page "
                            "or a client such as `ncclwatch dump`, not from another site "
                            "(Origin, Sec-Fetch-Site)"),
    "refused_token": (403, f"forbidden: a fresh dump needs the header {HEADER[0]}: "
                           f"{HEADER[1]} (`ncclwatch dump` sends it) or the form token of "
                           "this daemon's page; GET serves what the daemon holds without "
                           "asking"),
}


def _origin(scheme: str, netloc: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) with the default port filled in; None: not one."""
    try:
        u = urlsplit(f"{scheme}://{netloc}")
        host, port = u.hostname, u.port
    except ValueError:
        return None
    if not host or scheme not in DEFAULT_PORTS:
        return None
    return scheme, host.rstrip("."), port if port is not None else DEFAULT_PORTS[scheme]


def same_origin(headers: Mapping[str, str], scheme: str) -> bool:
    """Whether the request may come from this daemon's own origin: no
    ``Origin`` or one equal to the Host under ``scheme``; no
    ``Sec-Fetch-Site`` or a same-origin one. ``Origin: null`` is refused."""
    site = headers.get("Sec-Fetch-Site")
    if site is not None and site.strip().lower() not in SAME_SITE:
        return False
    shown = headers.get("Origin")
    if shown is None:
        return True
    u = urlsplit(shown.strip().lower())
    theirs = _origin(u.scheme, u.netloc) if u.netloc and not u.path.strip("/") else None
    ours = _origin(scheme, (headers.get("Host") or "").strip().lower())
    return theirs is not None and theirs == ours


class DumpGuard:
    """One daemon start's guard: its token, the running dumps, the clients'
    recent asks and the counts by outcome. Thread-safe (HTTP handler threads)."""

    def __init__(self, limits: Limits = LIMITS, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limits, self._clock = limits, clock
        #: Random per daemon start: the landing page's dump form carries it.
        self.token = secrets.token_urlsafe(32)
        self._lock = threading.Lock()
        self._running: set[str] = set()
        self._asks: dict[str, deque[float]] = {}
        self._counts = dict.fromkeys(OUTCOMES, 0)

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def check(self, headers: Mapping[str, str], scheme: str,
              form_token: str = "") -> Refusal | None:
        """The origin and token rules (None: passed); a refusal is counted."""
        if not same_origin(headers, scheme):
            return self._refuse("refused_origin")
        said = (headers.get(HEADER[0]) or "").strip().lower()
        if said != HEADER[1] and not hmac.compare_digest(
                form_token.encode(), self.token.encode()):
            return self._refuse("refused_token")
        return None

    def start(self, client: str, job: str) -> Refusal | None:
        """The rate and one-at-a-time rules. None: the dump of ``job`` may run
        and is counted served; the caller calls ``done(job)`` when it ends."""
        lim = self.limits
        with self._lock:
            now = self._clock()
            asks = self._asks.pop(client, deque())
            while asks and asks[0] <= now - lim.window_seconds:
                asks.popleft()
            self._asks[client] = asks   # newest last: the oldest client goes first
            while len(self._asks) > lim.max_clients:
                del self._asks[next(iter(self._asks))]
            if len(asks) >= lim.per_client:
                after = max(1, math.ceil(asks[0] + lim.window_seconds - now))
                self._counts["rate_limited"] += 1
                return Refusal(429, "rate_limited",
                               f"too many fresh dumps from {client}: at most {lim.per_client} "
                               f"per {lim.window_seconds:g} s; try again in {after} s",
                               (("Retry-After", str(after)),))
            asks.append(now)
            if job in self._running:
                self._counts["busy"] += 1
                return Refusal(409, "busy", f"a fresh dump of job {job} is running now: its "
                                            "bundle comes when it ends; ask again after that")
            self._running.add(job)
            self._counts["served"] += 1
            return None

    def done(self, job: str) -> None:
        with self._lock:
            self._running.discard(job)

    def _refuse(self, outcome: str) -> Refusal:
        status, message = REFUSALS[outcome]
        with self._lock:
            self._counts[outcome] += 1
        return Refusal(status, outcome, message)
