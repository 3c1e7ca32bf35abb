"""Will a save fit the watchdog budget: the arithmetic and the words, in one place.

The live forecast (daemon/forecast.py, daemon/diagnosis.py) and the
prevention check (``ncclwatch preflight``) say the same thing the same way:
"needs 470s, has 410s: 60s too late". A save's time is the bytes left over
the sustained write rate; it fits when that is within the budget left.
"""

from __future__ import annotations

from dataclasses import dataclass


def save_seconds(expected_bytes: float | None, written_bytes: float,
                 rate_bytes_per_second: float) -> float | None:
    """Seconds the save still needs (0: done; None: size or rate unknown)."""
    if expected_bytes is None:
        return None
    if expected_bytes <= written_bytes:
        return 0.0
    if rate_bytes_per_second <= 0:
        return None
    return (expected_bytes - written_bytes) / rate_bytes_per_second


@dataclass(frozen=True)
class Fit:
    """A save time against the budget left: margin > 0 fits, < 0 overruns."""

    needs_seconds: float
    budget_seconds: float

    @property
    def margin_seconds(self) -> float:
        return self.budget_seconds - self.needs_seconds

    @property
    def fits(self) -> bool:
        return self.margin_seconds >= 0

    @property
    def overrun_seconds(self) -> float:
        return -self.margin_seconds

    def words(self) -> str:
        head = f"needs {seconds(self.needs_seconds)}, the watchdog allows {seconds(self.budget_seconds)}"
        if self.fits:
            return f"{head}: fits with {seconds(self.margin_seconds)} to spare"
        return f"{head}: {seconds(self.overrun_seconds)} too late"


def seconds(x: float) -> str:
    x = max(0.0, x)
    if x < 120:
        return f"{x:.0f}s"
    if x < 7200:
        return f"{x / 60:.1f}min"
    return f"{x / 3600:.1f}h"


def size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return f"{n:.1f}TiB"
