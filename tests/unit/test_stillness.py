"""One rule for a rank's stillness (ncclwatch/stillness.py): the agent pauses
by it, the daemon counts stillness as evidence by it.

The agent's side is the tracker fed round by round (tests/harness/trackers.py's
``Rank``); the daemon's is fed the same readings as reports. A healthy GPU
rank that first loads its weights (reads every round for seconds) and then
trains with no syscall per step is never paused, at any step length, and a
rank whose first step is long is never judged on its own history: only a
history that ended still periods after it warmed up has a normal."""

from __future__ import annotations

import ast

import pytest

from ncclwatch.agent.pausing import PausePolicy
from ncclwatch.agent.policy import StackPolicy
from ncclwatch.daemon.waits import WaitPolicy
from ncclwatch.model import RankState
from ncclwatch.signatures import Classification
from ncclwatch.stillness import EVIDENCE, PAUSE, WARMUP, StillHistory, StillRule, clamp
from tests.harness.paths import ROOT
from tests.harness.reports import report, sample
from tests.harness.trackers import Rank

LOADING = Classification(RankState.LOADING)


def _load(r: Rank, seconds: int, stack: Classification | None = None) -> None:
    """``seconds`` rounds of reads (a weights file), its stack ``stack`` if given."""
    for _ in range(seconds):
        if stack is not None:
            r.t.observe_stack(stack, "torch.load", r.now)
        r._round(40)


@pytest.mark.parametrize("load", [5, 12, 19])
@pytest.mark.parametrize("step", [5, 12, 30])
def test_weights_loaded_then_steps_without_syscalls_are_never_paused(load: int, step: int) -> None:
    """Batches on the device: after its reads the rank is still for good."""
    r = Rank()
    _load(r, load)
    r.still(max(300, 10 * step))
    assert r.due_at == [], f"paused a healthy rank after {load}s of loading at {r.due_at}"


@pytest.mark.parametrize("step", [5, 12, 30])
def test_weights_loaded_then_steps_with_a_batch_each_are_never_paused(step: int) -> None:
    r = Rank()
    _load(r, 15)
    for _ in range(max(20, 600 // step)):
        r.step(step)
    assert r.due_at == []


@pytest.mark.parametrize("load", [30, 90])
@pytest.mark.parametrize("seen_loading", [True, False])
def test_a_long_load_is_no_step(load: int, seen_loading: bool) -> None:
    """However long the start-up's progress, a history without still periods
    that ended after it has no normal: the first long step is not judged.
    Progress while the stack showed checkpoint work is not even a round."""
    r = Rank()
    _load(r, load, stack=LOADING if seen_loading else None)
    assert r.t.history.rounds == (0 if seen_loading else load)
    assert not PAUSE.stepped(r.t.history)
    r.still(200)
    assert r.due_at == []


def test_a_rank_that_stepped_fast_and_stopped_is_not_judged_on_its_own() -> None:
    """Progress every round, then still: from /proc the same as weights loaded
    then a long step. The agent waits for the daemon (a stall's shape)."""
    r = Rank()
    for _ in range(40):
        r.step(1)
    r.still(60)
    assert r.due_at == []
    r.t.native_asked = r.now
    r.still(2)
    assert len(r.due_at) == 1


def test_start_up_still_periods_do_not_count_as_steps() -> None:
    """Imports, rendezvous and a calibration end short still periods before
    the rank warms: they raise its longest, never its periods."""
    r = Rank()
    for _ in range(3):
        r.step(3)     # three 3 s still periods in start-up (2 s of stillness each)
    _load(r, 20)      # then 20 s of reads: warm by rounds and seconds
    assert r.t.history.warm and r.t.history.periods == 0
    r.still(200)
    assert r.due_at == []


def test_a_long_first_step_is_not_judged_until_the_rank_stepped() -> None:
    r = Rank()
    r.step(2)
    r.step(2)
    r.still(120)  # the first real step: 2 minutes
    assert r.due_at == []
    assert PAUSE.threshold(r.t.history, r.now, 3.0) is None


def test_the_rule_in_numbers() -> None:
    h = StillHistory()
    for k in range(10):
        h.moved(100.0 + 3 * k, 2.0 if k else None)
    assert h.rounds == 10 and h.last_at - h.first_at == 27.0 and h.longest == 2.0
    # Warm: the daemon's evidence counts; the agent's pause wants 3 periods more.
    assert h.warm and h.periods == 0 and EVIDENCE.stepped(h) and not PAUSE.stepped(h)
    for k in range(3):
        assert not PAUSE.stepped(h)
        h.moved(130.0 + 3 * k, 2.0)
    assert h.periods == 3 and PAUSE.stepped(h)
    assert PAUSE.limit(h, 3.0) == 3 * 2.0 + 2.0
    assert EVIDENCE.limit(h, 3.0) == 2 * 2.0 + 2.0
    assert PAUSE.limit(h, 3.0, ceiling=5.0) == 5.0 and PAUSE.limit(h, 30.0) == 30.0
    assert PAUSE.within_normal(h, 1.9) and not PAUSE.within_normal(h, 2.0)
    # Watched 36 s: a span of 4 x 8 s is enough, 5 x 8 s is not.
    assert PAUSE.threshold(h, h.last_at, 3.0, span=4.0) == 8.0
    assert PAUSE.threshold(h, h.last_at, 3.0, span=5.0) is None
    # The rolling longest forgets: two buckets of 16.
    for _ in range(32):
        h.moved(200.0, 1.0)
    assert h.longest == 1.0
    assert clamp(10.0, 2.0, 2.0, 5.0, 30.0) == 22.0 and clamp(0.0, 2.0, 2.0, 5.0, 3.0) == 5.0


def test_the_agent_and_the_daemon_keep_the_same_history() -> None:
    """The same readings (loading, then 8 s steps) leave the agent's tracker
    and the daemon's rank record with the same history, judged by the same
    functions (the daemon with EVIDENCE, the agent with PAUSE)."""
    from ncclwatch.daemon.core import Daemon, DaemonConfig

    d = Daemon(DaemonConfig())
    r = Rank()
    seq, t0 = 0, 1000.0

    def both(events: int, stack: RankState = RankState.COMPUTE) -> None:
        nonlocal seq
        if stack is RankState.LOADING:
            r.t.observe_stack(LOADING, "torch.load", r.now)
        r._round(events)
        seq += 1
        s = sample("j", 1, 3, r.t.state, seconds=1.0, stack="s")
        s.stack_age_seconds = 0.5
        s.still_seconds = r.t.still_seconds(r.now - 1.0)
        d.ingest(report([s], seq=seq), now=t0 + r.now - 1.0)

    for _ in range(8):
        both(40, RankState.LOADING)
    for _ in range(16):
        both(20)
        for _ in range(7):
            both(0)
    agent, daemon = r.t.history, d.table.jobs["j"].ranks[1].history
    assert daemon.rounds == agent.rounds > 0
    assert daemon.longest == agent.longest > 5.0
    assert daemon.last_at - daemon.first_at == agent.last_at - agent.first_at
    assert WaitPolicy().rank is EVIDENCE and PausePolicy().rule is PAUSE
    assert StackPolicy().pause.rule.stepped(agent) == EVIDENCE.stepped(daemon) is True


def _formula_sites() -> list[str]:
    """``factor * <x> + slack``-shaped expressions outside stillness.py."""
    out = []
    for path in (ROOT / "ncclwatch").rglob("*.py"):
        if path.name == "stillness.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add)
                    and isinstance(node.left, ast.BinOp) and isinstance(node.left.op, ast.Mult)
                    and "factor" in ast.unparse(node.left)):
                out.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    return out


def test_the_formula_has_one_home() -> None:
    assert _formula_sites() == []
    assert StillRule().factor == PAUSE.factor  # the dataclass default is the pause rule's
    assert StillHistory().warmup is WARMUP


def test_the_docs_state_the_rule_as_the_code_has_it() -> None:
    """docs/architecture.md and docs/limits.md say the numbers; a change of
    the constants without the docs fails here (the help derives them)."""
    arch = (ROOT / "docs" / "architecture.md").read_text()
    limits = (ROOT / "docs" / "limits.md").read_text()
    w = WARMUP
    said = (f"{PAUSE.factor:g} x the longest + {PAUSE.slack:g} s",
            f"{w.rounds} rounds of progress over {w.seconds:g} s",
            f"then {PAUSE.periods} still periods that ended",
            f"evidence uses {EVIDENCE.factor:g} x")
    text = " ".join(arch.split())
    assert all(s in text for s in said), [s for s in said if s not in text]
    # The user guide says the same numbers as the help (PAUSE.describe()).
    guide = " ".join((ROOT / "docs" / "user-guide.md").read_text().split())
    said_guide = (f"{w.rounds} rounds of progress over {w.seconds:g} s",
                  f"then {PAUSE.periods} still periods that ended",
                  f"past {PAUSE.factor:g} x the longest + {PAUSE.slack:g} s",
                  f"evidence uses {EVIDENCE.factor:g} x the longest + {EVIDENCE.slack:g} s")
    assert all(s in guide for s in said_guide), [s for s in said_guide if s not in guide]
    text = " ".join(limits.split())
    assert f"{w.rounds} rounds of progress spread over {w.seconds:g} s" in text
    assert f"then {PAUSE.periods} still periods that ended" in text
