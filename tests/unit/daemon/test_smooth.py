"""Forecasts are countdowns: steady ones read as raw, noisy ones do not jump by minutes."""

from __future__ import annotations

import pytest

from ncclwatch.daemon.smooth import Smoother


def test_a_steady_countdown_is_unchanged() -> None:
    s = Smoother()
    for t in range(20):
        assert s.update(("j", "k", "write"), 100.0 - t, float(t)) == pytest.approx(100.0 - t)


def test_noisy_readings_move_by_seconds_not_minutes_between_refreshes() -> None:
    """The readings the issue saw for a host-memory ETA, a page refresh (2 s) apart."""
    s = Smoother()
    raw = [877, 2616, 1988, 2400, 1500, 2100]
    out = [s.update(("j", "k", "memory", 0, "host"), r, 2.0 * i) for i, r in enumerate(raw)]
    assert out[0] == 877  # the first reading as it is: nothing waits
    steps = [abs(b - a) for a, b in zip(out, out[1:])]
    raw_steps = [abs(b - a) for a, b in zip(raw, raw[1:])]
    assert max(steps) < 0.25 * max(raw_steps), (out, steps)


def test_done_and_unknown_are_taken_at_once_and_jobs_are_forgotten() -> None:
    s = Smoother()
    s.update(("j", "k", "write"), 300.0, 0.0)
    assert s.update(("j", "k", "write"), 0.0, 1.0) == 0.0
    assert s.update(("j", "k", "write"), None, 2.0) is None
    s.update(("j", "k", "write"), 50.0, 3.0)
    s.forget("j")
    assert s.update(("j", "k", "write"), 500.0, 4.0) == 500.0  # a new stall: no memory
