"""The stack policy's looks at a GPU-shaped rank (issue 26: the agent's CPU on
such jobs is its py-spy looks), and bench/look_trace.py naming each trigger."""

from __future__ import annotations

from bench.look_trace import reason
from ncclwatch.agent.policy import StackPolicy
from ncclwatch.model import CollectiveOp, RankState
from ncclwatch.signatures import Classification
from ncclwatch.stillness import WARMUP
from tests.harness.trackers import Rank

POLICY = StackPolicy()
COMPUTE = Classification(RankState.COMPUTE)
ALL_REDUCE = Classification(RankState.COLLECTIVE, CollectiveOp.ALL_REDUCE)


def _looked(r: Rank, policy: StackPolicy = POLICY) -> list[str]:
    """Round by round as the agent does: the looks the policy takes, by trigger."""
    t, why = r.t, []
    if t in policy.due([t], r.now):
        why.append(reason(t, r.now, policy))
        t.observe_stack(COMPUTE, "compute", r.now)
    return why


class Looked(Rank):
    """A GPU-shaped rank whose every look is the policy's (Rank looks at each
    still period itself, as the pausing tests need)."""

    def __init__(self, policy: StackPolicy = StackPolicy(native_after=0)) -> None:
        self.looks: list[tuple[float, str]] = []
        super().__init__(policy)

    def _round(self, events: int) -> None:
        self.events += events
        self.cpu += 1.0
        from ncclwatch.agent.sample import ProcessSample
        self.t.observe_process(ProcessSample(pid=self.t.pid, cpu_seconds=self.cpu, rss_bytes=1,
                                             io_read_bytes=0, io_write_bytes=0, num_threads=8,
                                             files_writing=(), progress_events=self.events),
                               self.now)
        for why in _looked(self):
            self.looks.append((self.now, why))
        self.now += 1.0


def test_a_healthy_gpu_shaped_rank_is_looked_at_on_the_slow_round_only() -> None:
    """8 s steps: once its history warmed up, neither going still at each step
    nor moving again at the next batch is worth a look (it was two a step)."""
    r = Looked()
    for _ in range(40):
        r.step(8)
    # The history counts after WARMUP.rounds rounds of progress (one a step),
    # then the pause rule's still periods that ended.
    warmed = (WARMUP.rounds + POLICY.pause.rule.periods) * 8 + 8
    warm = [(at, why) for at, why in r.looks if at >= warmed]
    assert warm, "not even the slow round looked"
    assert {why for _, why in warm} == {"slow round"}, warm
    # One look per slow round, not two a step: 260 s of steps, 30 s slow round.
    assert len(warm) <= (r.now - warmed) / POLICY.slow_interval + 1
    before = [why for at, why in r.looks if at < 20]
    assert "still past its normal" in before  # no history yet: every still period is news


def test_a_still_period_past_the_ranks_normal_is_looked_at() -> None:
    r = Looked()
    for _ in range(20):
        r.step(8)
    longest = r.t.history.longest
    r.t.observe_stack(COMPUTE, "compute", r.now - 0.5)  # (no slow round due soon)
    r.step(1)  # the next batch...
    r.looks.clear()
    r.still(int(longest) + 3)  # ...and the step does not end: a wait, perhaps
    whys = [(round(at - r.t.still_since), why) for at, why in r.looks]
    assert ("still past its normal" in [w for _, w in whys]), whys
    first = min(s for s, w in whys if w == "still past its normal")
    assert longest <= first <= longest + 1


def test_a_stall_shape_seen_by_the_daemon_is_looked_at_within_the_normal() -> None:
    """The daemon saw a peer in checkpoint work (its ask for native dumps):
    the still rank is looked at at once, however long its normal steps."""
    r = Looked()
    for _ in range(20):
        r.step(8)
    r.step(2)  # the next step began: still for 1 s, well within 8 s
    t = r.t
    assert t.still and POLICY.within_normal(t, r.now)
    assert POLICY.due([t], r.now) == []
    t.native_asked = r.now
    assert not POLICY.within_normal(t, r.now)
    assert POLICY.due([t], r.now) == [t]
    assert reason(t, r.now, POLICY) == "still past its normal"


def test_a_rank_seen_waiting_is_looked_at_when_it_moves_again() -> None:
    """Resuming from a wait its stack showed ends that wait: worth a look."""
    r = Rank(StackPolicy(native_after=0))
    t = r.t
    t.observe_stack(COMPUTE, "compute", r.now - 0.5)
    r.step(4)
    t.observe_stack(ALL_REDUCE, "ar", r.now - 0.5)
    r.step(1, reads=20)
    assert not t.still and reason(t, r.now, POLICY) == "resumed from a wait"
    assert POLICY.suspect_wait(t, r.now) == POLICY.suspect_interval
    assert t in POLICY.due([t], t.stack_at + POLICY.suspect_interval)
    t.observe_stack(COMPUTE, "compute", r.now - 0.5)
    r.step(1, reads=20)
    assert POLICY.due([t], r.now) == []
    assert reason(t, r.now + POLICY.slow_interval, POLICY) == "slow round"


def test_a_computing_rank_that_moves_again_is_not_looked_at() -> None:
    r = Rank(StackPolicy(native_after=0))
    t = r.t
    assert reason(t, r.now, POLICY) == "first look"
    t.observe_stack(COMPUTE, "compute", r.now - 0.5)
    r.step(8)
    assert t.still and t.stack_at >= t.still_since  # Rank looked in the still period
    r.step(1, reads=20)
    assert not t.still and t.still_at_last_dump
    assert POLICY.due([t], r.now) == []
