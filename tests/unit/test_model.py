"""model: the progress test every window the agent judges goes through."""

from __future__ import annotations

from ncclwatch.model import STILL_EVENTS_PER_S, progressed


def test_progress_is_at_least_the_still_rate_over_the_window() -> None:
    assert progressed(STILL_EVENTS_PER_S * 3.0, 3.0)        # at the rate: progress
    assert not progressed(STILL_EVENTS_PER_S * 3.0 - 1, 3.0)  # below it: still
    assert not progressed(0, 0.0) and not progressed(0, 0.5)  # nothing is never progress
    assert progressed(1, 0.0)                                   # the window of a stack read at once
