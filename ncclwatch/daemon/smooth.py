"""Forecasts that count down steadily instead of jumping between refreshes.

A least-squares rate over 15 s is noisy when a rank's writes or memory come
in bursts: the raw "time left" jumped 877 s -> 2616 s -> 1988 s between two
refreshes of the page. A forecast is a countdown: between readings it falls
one second per second, and each new reading pulls it toward itself with a
time constant of ``TAU`` seconds. A steady process reads the same as raw; a
first reading, a finished write (0) and an unknown (None) are taken as they
are, so nothing waits on the smoothing. diagnosis.stall_evidence smooths memory
forecasts, and write forecasts once their rate is a least-squares fit (the
first seconds' estimates are what call an overrun early).
"""

from __future__ import annotations

import math

#: Seconds for the smoothed forecast to move 63% of the way to a new reading.
TAU = 10.0
#: A value last updated longer ago than this is forgotten (a new stall).
FORGET = 30.0


class Smoother:
    def __init__(self, tau: float = TAU) -> None:
        self.tau = tau
        self._last: dict[tuple, tuple[float, float]] = {}

    def update(self, key: tuple, raw: float | None, now: float) -> float | None:
        last = self._last.get(key)
        if raw is None:
            self._last.pop(key, None)
            return None
        if raw <= 0 or last is None or now - last[1] > FORGET or now < last[1]:
            value = raw
        else:
            dt = now - last[1]
            predicted = max(0.0, last[0] - dt)
            value = predicted + (1 - math.exp(-dt / self.tau)) * (raw - predicted)
        self._last[key] = (value, now)
        return value

    def forget(self, job_id: str) -> None:
        """Drop a job's values (its keys start with the job id)."""
        for k in [k for k in self._last if k and k[0] == job_id]:
            del self._last[k]
