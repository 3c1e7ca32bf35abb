"""Where a watchdog timeout came from, and how an operator is told.

The budget is only as true as its timeout. A timeout the job showed (its
Flight Recorder, its environment, its command line, its set-up frames) or
one the operator set for it (the daemon's per-job timeouts) is stated; the
daemon's default is a guess: torch's 600 s, or the site's
``--watchdog-timeout``. Most training scripts set their timeout in code,
out of sight, so a guess says it is one wherever it is read (status, page,
API, alerts, runbook) and the advice under a guess must be safe for any
timeout the job could have: take the evidence now, never "let it run".

Shared by the daemon (budget, diagnosis, API, metrics) and ``ncclwatch
status``, which also reads views from daemons that predate the note.
"""

from __future__ import annotations

#: torch's default process-group timeout for NCCL (and, from 2.x, gloo), seconds.
TORCH_DEFAULT = 600.0

#: Budget sources that are the daemon's guess, not the job's or the operator's word.
ASSUMED = frozenset({"default"})

#: Where an operator states a timeout the daemon cannot learn (docs/limits.md).
HOW_TO_STATE = ("state it: NCCLWATCH_PG_TIMEOUT_S=<seconds> in the job's environment, "
                "or a per-job timeout in the daemon's config")


def assumed(source: str) -> bool:
    """True when the timeout is the daemon's guess."""
    return source in ASSUMED


def _s(t: float) -> str:
    return f"{t:.0f} s"


def origin(timeout: float) -> str:
    """What an assumed value is: torch's default, or the site's own default."""
    return ("torch's default" if timeout == TORCH_DEFAULT
            else "this daemon's --watchdog-timeout")


def note(timeout: float, source: str) -> str:
    """One clause for status, page, API and alerts; empty when the timeout is stated."""
    if not assumed(source):
        return ""
    return (f"assumed {_s(timeout)} ({origin(timeout)}); set in code? "
            "the job may time out sooner")


def budget_words(remaining: str, timeout: float, source: str) -> str:
    """The time left as a root-cause sentence says it: "9m41s", or under a guess
    "9m41s (of an assumed 600 s)" so no sentence states a guessed deadline as fact."""
    return f"{remaining} (of an assumed {_s(timeout)})" if assumed(source) else remaining
