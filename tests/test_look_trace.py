"""bench/look_trace.py names the trigger of each look as the stack policy decides it."""

from __future__ import annotations

from bench.look_trace import reason
from ncclwatch.agent.policy import StackPolicy
from ncclwatch.model import RankState
from ncclwatch.signatures import Classification
from tests.test_pausing import Rank

POLICY = StackPolicy()
COMPUTE = Classification(RankState.COMPUTE)


def test_each_look_of_a_gpu_shaped_step_is_named_by_its_trigger() -> None:
    r = Rank(StackPolicy(native_after=0))  # no native dumps in the way
    t = r.t
    assert reason(t, r.now, POLICY) == "first look"
    t.observe_stack(COMPUTE, "compute", r.now)
    r.step(8)  # the batch, then still
    assert t.still and reason(t, r.now, POLICY) == "became still"
    assert t in POLICY.due([t], r.now)
    t.observe_stack(COMPUTE, "compute", r.now)
    r.step(1, reads=20)  # the next batch: it moves again
    assert not t.still and reason(t, r.now, POLICY) == "resumed"
    t.observe_stack(COMPUTE, "compute", r.now)
    assert POLICY.due([t], r.now) == []
    assert reason(t, r.now + POLICY.slow_interval, POLICY) == "slow round"
