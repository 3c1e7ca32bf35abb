"""Run the scenario matrix against one real ``ncclwatch run`` (``make scenarios``).

Every scenario is a real multi-process gloo job; a few run at once under the
same agent and daemon, as jobs share a node. For each, the API is polled and
the verdict recorded: first stall kind, culprits, root cause, at-risk, the
detection delay (from the scenario's start marker) and the lead time (the
watchdog deadline of the first waiting rank minus the detection time). The
table is printed and saved under artifacts/; the test fails on any wrong
kind, wrong culprit, wrong root cause or false alarm.

NCCLWATCH_SCENARIOS=name,glob* runs only the scenarios whose names match.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from fnmatch import fnmatch
from typing import Callable

import pytest

from tests.harness.artifacts import record
from tests.harness.paths import ARTIFACTS
from tests.harness.scenariorun import Outcome, run_scenario, table
from tests.harness.scenarios import SCENARIOS, Scenario
from tests.harness.tools import need

pytestmark = [pytest.mark.e2e, pytest.mark.matrix]

#: Rows run at once, at most, and the cores their ranks may keep busy together
#: (``Scenario.cores``): rows that wait (slow storage, gloo waits) share the
#: machine four at a time, rows that spin (busy threads, a computing rank, a
#: GPU-shaped job) never starve each other. Two at a time regardless of shape
#: once took 15-18 minutes; three spinning rows at a time starved a computing
#: rank (read as idle) and pushed detection delays past their bounds.
#: NCCLWATCH_MATRIX_ROWS and NCCLWATCH_MATRIX_CORES override them (measuring).
ROWS_AT_ONCE = int(os.environ.get("NCCLWATCH_MATRIX_ROWS", "4"))
CORES = float(os.environ.get("NCCLWATCH_MATRIX_CORES", str(2.0 * (os.cpu_count() or 2))))


def run_all(run: Callable[[Scenario], Outcome], rows: list[Scenario]) -> list[Outcome]:
    """Every row, the longest first: a row starts when fewer than ROWS_AT_ONCE run
    and its cores fit beside theirs within CORES (a row too big for that starts
    alone); a shorter row that fits goes ahead of a longer one that does not."""
    pending, running, done = list(rows), {}, []
    cond = threading.Condition()

    def one(s: Scenario) -> None:
        try:
            out = run(s)
        except Exception as e:  # noqa: BLE001 - run_scenario catches; this is the last net
            out = Outcome(s, error=f"{type(e).__name__}: {e}")
        with cond:
            done.append(out)
            del running[s.name]
            cond.notify_all()

    with cond:
        while pending or running:
            used = sum(s.cores for s in running.values())
            fits = next((s for s in pending if len(running) < ROWS_AT_ONCE
                         and (not running or used + s.cores <= CORES)), None)
            if fits is None:
                cond.wait()
                continue
            pending.remove(fits)
            running[fits.name] = fits
            threading.Thread(target=one, args=(fits,), name=fits.name, daemon=True).start()
    return done


def selected() -> tuple[Scenario, ...]:
    """NCCLWATCH_SCENARIOS=fw-*,desync runs only those rows (names, * globs); all by default."""
    pats = [p for p in os.environ.get("NCCLWATCH_SCENARIOS", "").split(",") if p]
    return tuple(s for s in SCENARIOS if not pats or any(fnmatch(s.name, p) for p in pats))


def test_scenario_matrix(ncclwatch_run) -> None:
    need("torchrun")
    mon = ncclwatch_run()
    chosen = selected()
    assert chosen, f"NCCLWATCH_SCENARIOS={os.environ.get('NCCLWATCH_SCENARIOS')} matches no row"
    order = sorted(chosen, key=lambda s: -s.limit)
    outcomes = run_all(lambda s: run_scenario(mon, s), order)
    outcomes.sort(key=lambda o: SCENARIOS.index(o.scenario))
    text = table(outcomes)
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "scenarios.md").write_text(text + "\n")
    (ARTIFACTS / "scenarios.json").write_text(json.dumps([{
        "scenario": o.scenario.name, "launcher": o.scenario.launcher, "job": o.job_id,
        "job_source": o.job_source, "expected": o.scenario.kind, "detected": o.first_kind,
        "kinds_seen": o.kinds_seen, "culprits": list(o.culprits),
        "culprit_states": list(o.states), "waiting_evidence": list(o.evidence),
        "waiting_evidence_seen": list(o.evidence_seen), "waiting_ops_seen": list(o.ops_seen),
        "waiting_ops": list(o.ops), "root_cause": o.root_cause,
        "framework": o.framework, "advice": o.advice,
        "at_risk_after_s": o.flag_delay, "overrun_at_flag_s": o.overrun_at_flag,
        "detection_delay_s": o.delay, "lead_time_s": o.lead,
        "overrun_forecast_after_s": o.forecast_delay, "goal_s": o.scenario.goal,
        "pauses": o.pauses, "problems": o.problems(), "row_s": o.wall,
        "ended": [dict(zip(("kind", "outcome", "forecast_verdict", "forecast_right",
                            "forecast_error_s"), x)) for x in o.scored],
    } for o in outcomes], indent=1))
    record("scenario_matrix", {o.scenario.name: {"delay_s": o.delay, "lead_s": o.lead}
                               for o in outcomes})
    print("\n" + text, file=sys.__stdout__, flush=True)
    failed = {o.scenario.name: o.problems() for o in outcomes if o.problems()}
    log = mon.output()
    if failed:
        (ARTIFACTS / "monitor.log").write_text(log)
    # A pause is the one thing a healthy row must never show: every pause the
    # agent logged, with its reason and job, whatever row it was (few lines).
    pauses = "\n".join(line for line in log.splitlines() if "native dump of" in line)
    assert not failed, (f"{len(failed)} scenario(s) wrong:\n{text}\nnative dumps:\n"
                        f"{pauses[-4000:]}\n{log[-3000:]}")
