"""The incident's clock: when the culprit began is known only as a span when
its previous stack is old (the earliest the evidence allows, and the first
report that showed the state), and the page and ``ncclwatch status`` say the
span ("rank 0 began saving 6-12s ago"), never the early end alone as if sure."""

from __future__ import annotations

from ncclwatch import status
from ncclwatch.daemon import clock
from ncclwatch.daemon.api import jobs_view
from ncclwatch.daemon.core import Daemon, DaemonConfig
from ncclwatch.daemon import page
from ncclwatch.model import CollectiveOp, RankState
from tests.harness.reports import SAVE, report, sample, stack_pb

JOB, WORLD = "job-1", 3


def _run(save_estimate_back: float) -> dict:
    """Rank 0 trains, then its first stack in torch.save arrives with the
    agent's estimate ``save_estimate_back`` s before that report; ranks 1-2
    wait in a barrier. Rounds go on until the stall opens, then 2 s more."""
    d = Daemon(DaemonConfig())
    t, seq, saving_for, opened_at = 1000.0, 0, None, None
    for _ in range(40):
        seq += 1
        if seq <= 5:
            samples = [sample(JOB, r, WORLD, RankState.COMPUTE, seconds=seq) for r in range(3)]
        else:
            saving_for = save_estimate_back if saving_for is None else saving_for + 1.0
            samples = [sample(JOB, 0, WORLD, RankState.SAVING, seconds=saving_for,
                              stack=stack_pb(SAVE).id)]
            samples += [sample(JOB, r, WORLD, RankState.COLLECTIVE, CollectiveOp.BARRIER,
                               seconds=seq - 6) for r in (1, 2)]
            for s in samples:
                s.stack_age_seconds = 0.2
        d.ingest(report(samples, seq=seq, stacks=[stack_pb(SAVE)]), now=t)
        d.tick(now=t)
        if opened_at is None and d.incidents.active:
            opened_at = t
        if opened_at is not None and t >= opened_at + 2:
            break
        t += 1.0
    assert opened_at is not None, "the stall never opened"
    return jobs_view(d, now=t)


def _began(view: dict) -> dict:
    [stall] = view["jobs"][0]["stalls"]
    return next(a for a in stall["clock"]["anchors"] if a["id"] == "culprit_began")


def test_an_old_previous_stack_makes_the_start_a_span() -> None:
    view = _run(save_estimate_back=6.0)
    began = _began(view)
    # At most 6 s earlier than the first report that showed it: both ends kept.
    assert began["seconds_ago"] - began["by_seconds_ago"] == 6.0, began
    assert clock.ago(began) == f"{began['by_seconds_ago']:.0f}-{began['seconds_ago']:.0f}s ago"
    text = status.render(view, "http://127.0.0.1:7471")
    assert f"rank 0 began saving {clock.ago(began)}" in text, text
    assert f"rank 0 began saving {clock.ago(began)}" in page.render(view)
    # The culprit's duration says the same span, in the verdict and its line.
    [stall] = view["jobs"][0]["stalls"]
    [c] = stall["culprits"]
    assert c["for_seconds"] - c["for_seconds_min"] == 6.0, c
    lasting = clock.span(c["for_seconds_min"], c["for_seconds"])
    assert "-" in lasting and f"saving for {lasting}" in text, text
    assert "is saving for " in stall["summary"] and "-" in stall["summary"].split(
        "saving for ")[1].split()[0], stall["summary"]


def test_a_start_the_evidence_pins_is_one_moment() -> None:
    view = _run(save_estimate_back=0.5)
    began = _began(view)
    assert "by" not in began and "by_seconds_ago" not in began, began
    [stall] = view["jobs"][0]["stalls"]
    assert "for_seconds_min" not in stall["culprits"][0]
    assert clock.ago(began) == f"{began['seconds_ago']:.0f}s ago"


def test_span_words() -> None:
    from ncclwatch.savefit import seconds
    assert clock.span(None, 12.4) == "12s"
    assert clock.span(6.2, 12.4) == "6-12s"
    assert clock.span(11.8, 12.4) == "12s"            # the same once rounded
    assert clock.span(90, 150, seconds) == "90s-2.5min"
