"""The agent's liveness as a file, for a probe that cannot talk to systemd.

Under systemd the agent pings ``WATCHDOG=1`` after every healthy round (a
wedged loop stops the pings: ``WatchdogSec=30s``). In a pod the same moment
touches ``--alive-file``, and the kubelet's exec probe
``python -m ncclwatch.agent.alive FILE SECONDS`` fails once the file is older
than SECONDS: a loop that stopped going round is restarted, a slow collector
is not (reports queue while it is away). No port, no credentials; the check
imports nothing but the standard library.
"""

from __future__ import annotations

import os
import sys
import time

#: The probe's default: the unit's WatchdogSec.
MAX_AGE = 30.0


def touch(path: str) -> None:
    """Mark the loop alive now (creates the file; errors are the probe's to see)."""
    try:
        with open(path, "a"):
            pass
        os.utime(path)
    except OSError:
        pass


def age(path: str, now: float | None = None) -> float | None:
    """Seconds since the last mark; None when there is none."""
    try:
        mtime = os.stat(path).st_mtime
    except OSError:
        return None
    return max(0.0, (time.time() if now is None else now) - mtime)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not 1 <= len(args) <= 2:
        print("usage: python -m ncclwatch.agent.alive FILE [MAX_AGE_SECONDS]", file=sys.stderr)
        return 2
    limit = float(args[1]) if len(args) == 2 else MAX_AGE
    seconds = age(args[0])
    if seconds is None:
        print(f"not alive: {args[0]} missing (no healthy round yet)", file=sys.stderr)
        return 1
    if seconds > limit:
        print(f"not alive: last healthy round {seconds:.0f}s ago (> {limit:g}s)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
