"""How an incident ended for the job: the daemon's own table fed built reports.

Each case plays the order of events a real job goes through (the waiters
killed by the watchdog, the culprit dying first, the agents going silent,
the save finishing) and checks the outcome decided when the incident ends,
and that a lost job stays on the page, the API and /metrics after it left
the table.
"""

from __future__ import annotations

import pytest

from ncclwatch import status
from ncclwatch.daemon import api, export, page
from ncclwatch.daemon.core import Daemon, DaemonConfig
from ncclwatch.daemon.incidents import SETTLE
from ncclwatch.daemon.outcome import Forecast, Outcome, score
from ncclwatch.model import CollectiveOp, RankState, StallKind
from tests.harness.reports import BARRIER, SAVE, report, sample, stack_pb
from ncclwatch.stacks import stack_id

S, Op = RankState, CollectiveOp
GATHER, LOST = StallKind.CHECKPOINT_GATHER, StallKind.RANK_LOST


def _round(states: dict[int, tuple[RankState, float]], seq: int, *, world: int = 4,
           timeout: float = 30.0):
    """One full round: ``states`` rank -> (state, seconds in it); ranks left
    out are gone (their processes exited)."""
    samples = []
    for r, (st, secs) in sorted(states.items()):
        op = Op.BARRIER if st is S.COLLECTIVE else Op.NONE
        sid = stack_id(BARRIER) if st is S.COLLECTIVE else stack_id(SAVE) if st is S.SAVING else ""
        samples.append(sample("job-1", r, world, st, op, seconds=secs, stack=sid,
                              timeout=timeout))
    return report(samples, seq=seq, stacks=[stack_pb(SAVE), stack_pb(BARRIER)])


def _stalled(world: int = 4, wait: float = 10.0, *, timeout: float = 30.0):
    return _round({0: (S.SAVING, wait), **{r: (S.COLLECTIVE, wait) for r in range(1, world)}},
                  1, world=world, timeout=timeout)


def _daemon(**kw) -> Daemon:
    kw.setdefault("hang_threshold", 10.0)
    return Daemon(DaemonConfig(**kw))


def _feed(d: Daemon, req, now: float) -> None:
    req.report.agent_monotonic_seconds = now   # the agent's clock keeps the daemon's pace
    d.ingest(req, now=now)
    d.tick(now=now, wall=1e6 + now)


def _ended(d: Daemon) -> dict[StallKind, str | None]:
    return {i.kind: i.outcome.outcome if i.outcome else None for i in d.incidents.ended}


def _settle(d: Daemon, now: float) -> None:
    d.tick(now=now + SETTLE + 0.1, wall=1e6 + now + SETTLE + 0.1)


def test_the_save_finishes_and_the_ranks_go_on_completed() -> None:
    d = _daemon()
    _feed(d, _stalled(), 100.0)
    assert (("job-1", GATHER)) in d.incidents.active
    _feed(d, _round({r: (S.COMPUTE, 0.5) for r in range(4)}, 2), 104.0)
    assert _ended(d) == {GATHER: None}          # settling: an exit shows a round later
    _settle(d, 104.0)
    inc = d.incidents.ended[0]
    assert inc.outcome.outcome == "completed" and not inc.outcome.lost
    assert inc.outcome.waited_seconds is None
    assert d.incidents.outcomes_total[("checkpoint_gather", "completed")] == 1


def test_a_job_that_saves_last_then_exits_is_not_killed() -> None:
    """The ranks left their wait (the stall ended) before they exited: a job's last save."""
    d = _daemon()
    _feed(d, _stalled(), 100.0)
    _feed(d, _round({r: (S.COMPUTE, 0.5) for r in range(4)}, 2), 104.0)
    _feed(d, _round({}, 3), 106.0)              # every process exited, none in a wait
    _settle(d, 106.0)
    assert _ended(d) == {GATHER: "completed"}


def test_waiters_gone_as_the_budget_runs_out_killed_by_watchdog() -> None:
    d = _daemon()
    _feed(d, _stalled(world=2, wait=10.0), 100.0)
    # 20 s later the waiter's 30 s are up: its process is gone, rank 0 still saves.
    _feed(d, _round({0: (S.SAVING, 30.0)}, 2, world=2), 120.0)
    rec = d.table.jobs["job-1"].ranks[1]
    assert rec.gone_at == 120.0 and rec.gone_waiting
    _settle(d, 120.0)
    o = d.incidents.ended[0].outcome
    assert o.outcome == "killed_by_watchdog" and o.lost
    assert o.waited_seconds == pytest.approx(30.0, abs=1.0)
    assert "died 30s into their wait, as the 30s (job) watchdog budget ran out" in o.sentence


def test_waiters_gone_long_before_an_assumed_timeout_say_what_the_real_one_is() -> None:
    d = _daemon(watchdog_timeout=600)
    _feed(d, _stalled(world=2, wait=10.0, timeout=0.0), 100.0)
    _feed(d, _round({0: (S.SAVING, 25.0)}, 2, world=2, timeout=0.0), 115.0)
    _settle(d, 115.0)
    o = d.incidents.ended[0].outcome
    assert o.outcome == "killed_by_watchdog"
    assert o.waited_seconds == pytest.approx(25.0, abs=1.0)
    assert "before the 10.0min assumed budget ran out: the job's real timeout is likely " \
           "about 25s" in o.sentence
    # The measured wait is the job id's timeout from now on (its restart's budget).
    _settle(d, 116.0)                      # the next tick's budget
    b = d.budget_of("job-1", 116.0 + SETTLE + 0.1)
    assert b.source == "observed_kill" and b.timeout == pytest.approx(25.0, abs=1.0)
    assert not b.assumed


def test_the_first_waiter_killed_turns_the_stall_into_rank_lost_still_killed_by_watchdog() -> None:
    """The watchdog fires on each waiter a little apart: the first one gone makes
    the others' wait a rank_lost stall before they go too. A rank gone in its wait
    is a waiter the watchdog took, not a rank that died first."""
    d = _daemon()
    _feed(d, _stalled(wait=10.0), 100.0)
    _feed(d, _round({0: (S.SAVING, 29.0), 2: (S.COLLECTIVE, 29.0), 3: (S.COLLECTIVE, 29.0)}, 2),
          119.0)
    assert ("job-1", LOST) in d.incidents.active      # rank 1 gone, 2 and 3 still wait
    _feed(d, _round({0: (S.SAVING, 31.0)}, 3), 121.0)
    _settle(d, 121.0)
    assert _ended(d) == {GATHER: "killed_by_watchdog", LOST: "killed_by_watchdog"}


def test_the_culprit_dies_first_rank_lost_then_the_waiters() -> None:
    d = _daemon()
    _feed(d, _stalled(wait=10.0), 100.0)
    # Rank 0 is OOM-killed while it saves; the others keep waiting for it.
    _feed(d, _round({r: (S.COLLECTIVE, 20.0) for r in range(1, 4)}, 2), 110.0)
    _settle(d, 110.0)
    first = d.incidents.ended[0]
    assert first.kind is GATHER and first.outcome.outcome == "rank_lost"
    assert first.outcome.lost_rank == 0
    assert "rank 0 on node-a (saving) died 20s into the stall, before the waiters" \
           in first.outcome.sentence
    assert ("job-1", LOST) in d.incidents.active
    # 10 s later the watchdog takes the waiters: the rank_lost stall ends, rank 0 went first.
    _feed(d, _round({}, 3), 120.0)
    _settle(d, 120.0)
    assert _ended(d) == {GATHER: "rank_lost", LOST: "rank_lost"}
    assert d.incidents.ended[1].outcome.sentence == (
        "rank lost: rank 0 on node-a died 20s into the stall, before the waiters; the "
        "waiters died 30s into their wait, as the 30s (job) watchdog budget ran out")


def test_the_agent_goes_silent_lost_sight() -> None:
    d = _daemon(staleness=10.0)
    _feed(d, _stalled(), 100.0)
    d.tick(now=130.0, wall=1e6 + 130.0)           # no report for 30 s
    _settle(d, 130.0)
    assert _ended(d) == {GATHER: "lost_sight"}
    assert "went silent" in d.incidents.ended[0].outcome.sentence


def test_a_lost_job_stays_on_the_page_api_and_metrics_after_it_left_the_table() -> None:
    d = _daemon(gone_job_ttl=20.0)
    _feed(d, _stalled(world=2), 100.0)
    _feed(d, _round({0: (S.SAVING, 30.0)}, 2, world=2), 120.0)
    _feed(d, _round({}, 3, world=2), 122.0)       # rank 0 goes too (the launcher stops it)
    for t in (130.0, 150.0):
        d.tick(now=t, wall=1e6 + t)
    assert "job-1" not in d.table.jobs            # expired: 20 s after its last update
    assert "job-1" in d.kept_bundles              # its evidence bundle, as it left
    view = api.jobs_view(d, now=150.0)
    assert view["jobs"] == []
    (e,) = view["ended"]
    assert (e["job"], e["kind"], e["outcome"]["outcome"]) == (
        "job-1", "checkpoint_gather", "killed_by_watchdog")
    assert e["culprits"] == [{"rank": "0", "host": "node-a", "state": "saving"}]
    assert e["evidence_bundle"] == "/api/v1/dump?job=job-1"
    html = page.render(view)
    assert "id='job-job-1'" in html and "LOST" in html and "killed by the watchdog" in html
    assert "href='/api/v1/dump?job=job-1'" in html
    said = status.render(view)
    assert said.startswith("no training jobs seen"), said
    assert "LOST job-1: checkpoint_gather ended" in said and "job killed by the watchdog" in said
    assert "culprit: rank 0 on node-a (saving)" in said
    assert "evidence bundle: /api/v1/dump?job=job-1" in said
    text = export.encode(export.build(export.capture(d, now=150.0))).decode()
    assert ('ncclwatch_job_lost{job_id="job-1",kind="checkpoint_gather",'
            'outcome="killed_by_watchdog",rank="0",host="node-a"} 1.0') in text
    assert ('ncclwatch_incident_outcomes_total{kind="checkpoint_gather",'
            'outcome="killed_by_watchdog"} 1.0') in text
    # A day later it is gone from every surface.
    d.tick(now=150.0 + 86400 + 60, wall=1e6 + 150.0 + 86400 + 60)
    assert api.jobs_view(d, now=150.0 + 86400 + 60)["ended"] == []
    assert "ncclwatch_job_lost{" not in export.encode(export.build(export.capture(d))).decode()


def test_an_incident_still_open_when_its_job_leaves_is_lost_sight() -> None:
    d = _daemon(gone_job_ttl=20.0, staleness=10.0)
    _feed(d, _stalled(), 100.0)
    d.tick(now=125.0, wall=1e6 + 125.0)            # silent past staleness and the ttl
    assert _ended(d) == {GATHER: "lost_sight"}


@pytest.mark.parametrize("made, outcome, ended, expected", [
    # said in time, the save completed 5 s after its predicted end: right, 5 s off
    (Forecast(10.0, 40.0, 70.0), "completed", 45.0, ("ends_in_time", True, -5.0)),
    # said in time, the watchdog killed the job: wrong, the save's end unseen
    (Forecast(10.0, 40.0, 70.0), "killed_by_watchdog", 70.0, ("ends_in_time", False, None)),
    (Forecast(10.0, 90.0, 70.0), "killed_by_watchdog", 70.0, ("overruns", True, None)),
    (Forecast(10.0, 90.0, 70.0), "completed", 60.0, ("overruns", False, 30.0)),
])
def test_the_forecast_is_scored_against_the_outcome(made, outcome, ended, expected) -> None:
    s = score(made, Outcome(outcome, "", None), ended)
    assert (s.verdict, s.right, s.error_seconds) == expected
    assert score(made, Outcome("rank_lost", "", None), ended) is None  # says nothing of the save
