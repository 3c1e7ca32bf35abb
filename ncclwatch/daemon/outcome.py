"""How an incident ended for the job: its outcome, and the forecast scored against it.

A stall ends when its finding goes away, and that happens both when the
culprit finishes and when the watchdog kills the waiters: without an
outcome every surface says "ok" about a dead job. The outcome is decided
once, when the incident ends, from what the table knows then: which of the
incident's ranks are gone and when (``RankRecord.gone_at``), whether each
was waiting when it went (``gone_waiting``), which agents went silent, and
the budget. The rules are a table, first match wins.

Order of events matters: when the waiters die the detector may first turn
the stall into ``rank_lost`` (the first waiter gone, the others still
waiting); a rank that went while it was waiting is a waiter the watchdog
took, never "a rank that died first".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ncclwatch import timeoutsource
from ncclwatch.savefit import seconds

#: Deaths this close are one moment: an exit shows on the agent's next round,
#: and the watchdog fires on each waiter a little apart.
SAME_MOMENT = 5.0
#: A wait that ends within this much of the timeout (seconds, or this share
#: of it if larger) ended as the budget ran out.
WATCHDOG_SLACK, WATCHDOG_SHARE = 5.0, 0.1
#: The verdicts a forecast gives: the save's ETA against the budget.
VERDICTS = ("ends_in_time", "overruns")


@dataclass(frozen=True)
class EndFacts:
    """What the table knew of an incident's ranks when it ended (daemon clock)."""

    blocked_at: float                   # when the first waiter blocked
    ended_at: float
    timeout: float
    timeout_source: str                 # budget.timeout_for's source
    waiters: int                        # ranks the incident saw waiting
    waiter_deaths: tuple[float, ...]    # gone_at of those gone (while waiting), sorted
    #: The first rank that went while not waiting (a culprit, a rank at
    #: work): (rank, host, state it was last seen in, gone_at); None: none went.
    first_lost: tuple[int, str, str, float] | None
    silent: int                         # incident ranks not gone whose agent is silent
    job_known: bool = True

    @property
    def waiters_died(self) -> bool:
        """All or most of the waiters went."""
        return self.waiters > 0 and 2 * len(self.waiter_deaths) > self.waiters

    @property
    def waited(self) -> float | None:
        """How long the first-blocked waiters had waited when they died."""
        return self.waiter_deaths[0] - self.blocked_at if self.waiters_died else None

    @property
    def lost_first(self) -> bool:
        """A rank that was not waiting went before the waiters did."""
        if self.first_lost is None:
            return False
        return not self.waiters_died or self.first_lost[3] < self.waiter_deaths[0] - SAME_MOMENT


@dataclass(frozen=True)
class Outcome:
    outcome: str           # OUTCOMES
    sentence: str
    #: The waiters' wait when they died (seconds): evidence of the real timeout.
    waited_seconds: float | None
    #: The rank that went first ("rank_lost"), else None.
    lost_rank: int | None = None
    lost_host: str = ""

    @property
    def lost(self) -> bool:
        """The job did not survive the stall (alerted: NCCLWatchJobLost)."""
        return self.outcome in LOST


Rule = tuple[str, Callable[[EndFacts], bool]]

#: Outcome by the facts at the end, first match wins; the last always matches.
RULES: tuple[Rule, ...] = (
    ("rank_lost", lambda e: e.lost_first),
    ("killed_by_watchdog", lambda e: e.waiters_died),
    ("lost_sight", lambda e: not e.job_known or e.silent > 0),
    ("completed", lambda e: True),
)
OUTCOMES = tuple(name for name, _ in RULES)
LOST = frozenset({"killed_by_watchdog", "rank_lost", "lost_sight"})


def _budget_note(e: EndFacts, waited: float) -> str:
    """Where the death fell against the budget the daemon assumed."""
    slack = max(WATCHDOG_SLACK, WATCHDOG_SHARE * e.timeout)
    t = (f"{seconds(e.timeout)} assumed" if timeoutsource.assumed(e.timeout_source)
         else f"{seconds(e.timeout)} ({e.timeout_source})")
    if abs(waited - e.timeout) <= slack:
        return f"as the {t} watchdog budget ran out"
    if waited < e.timeout:
        return (f"before the {t} budget ran out: the job's real timeout is likely "
                f"about {seconds(waited)}")
    return f"after the {t} budget ran out"


def _sentence(name: str, e: EndFacts) -> str:
    waited = e.waited
    died = (f"the waiters died {seconds(waited)} into their wait, {_budget_note(e, waited)}"
            if waited is not None else "")
    if name == "completed":
        return (f"completed: the stall cleared after {seconds(e.ended_at - e.blocked_at)} "
                "with its ranks alive")
    if name == "killed_by_watchdog":
        return f"job killed by the watchdog: {died}"
    if name == "rank_lost":
        rank, host, state, at = e.first_lost  # type: ignore[misc]
        doing = f" ({state.replace('_', ' ')})" if state != "unknown" else ""
        lost = (f"rank lost: rank {rank} on {host}{doing} died "
                f"{seconds(max(0.0, at - e.blocked_at))} into the stall, before the waiters")
        return f"{lost}; {died}" if died else lost
    if not e.job_known:
        return "lost sight of the job: it left the job table before the stall ended"
    return ("lost sight of the job: the agents reporting it went silent before the stall "
            "ended; ncclwatch could not see how it ended")


def decide(e: EndFacts) -> Outcome:
    name = next(n for n, applies in RULES if applies(e))
    lost = e.first_lost if name == "rank_lost" else None
    return Outcome(name, _sentence(name, e),
                   None if e.waited is None else round(e.waited, 1),
                   lost[0] if lost else None, lost[1] if lost else "")


@dataclass(frozen=True)
class Forecast:
    """The first save forecast of an incident (daemon clock): what it said."""

    made_at: float
    ends_at: float          # made_at + the save's ETA
    budget_ends_at: float   # made_at + the budget left

    @property
    def verdict(self) -> str:
        return "overruns" if self.ends_at > self.budget_ends_at else "ends_in_time"


@dataclass(frozen=True)
class Score:
    """The forecast against what happened."""

    verdict: str
    happened: str            # VERDICTS: what the outcome says the save did
    right: bool
    #: Predicted minus actual end of the save (seconds), where the end was
    #: seen (the stall completed); None otherwise.
    error_seconds: float | None


#: What each outcome says the save did against the budget (unscored: absent).
HAPPENED = {"completed": "ends_in_time", "killed_by_watchdog": "overruns"}


def score(f: Forecast | None, outcome: Outcome, ended_at: float) -> Score | None:
    happened = HAPPENED.get(outcome.outcome)
    if f is None or happened is None:
        return None
    error = round(f.ends_at - ended_at, 1) if outcome.outcome == "completed" else None
    return Score(f.verdict, happened, f.verdict == happened, error)
