"""What to do with the running job now, from the forecast (a table, first match wins).

The fix in remediation.py is for the next run; this is for tonight. Four
answers, each with the time left to decide and what that time runs to:

- the save fits the budget: let it run (until it should end);
- it will overrun the watchdog: stop the job cleanly now and keep the dump,
  before the watchdog kills it and the nodes' state is lost;
- a rank will run out of memory: stop it now, before the OOM killer does;
- nothing is forecast: take the Flight Recorder dump now, while it exists.

Under an assumed timeout (timeoutsource: the job stated none) no deadline is
certain, so the answer is the one that is safe for any timeout the job could
have: take the evidence now. Never "let it run" on a guess.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ncclwatch.savefit import seconds


@dataclass(frozen=True)
class Advice:
    action: str                   # stop_now | stop_cleanly | let_it_run | dump_now
    text: str
    #: Seconds left to act (None: not known), and what they run out at.
    decide_within_seconds: float | None
    until: str                    # memory_runs_out | watchdog_fires | save_ends


#: Dump before anything else: a stopped or killed job keeps no trace.
DUMP = ("Take the Flight Recorder dump first (on each rank's node: "
        "`echo 1 > $TORCH_NCCL_DEBUG_INFO_PIPE_FILE<rank>.pipe`; the daemon page keeps the "
        "stacks)")

#: (action, applies, sentence, seconds to decide, what they run to). The
#: evidence is diagnosis.StallEvidence; ``words`` its formatted facts.
Rule = tuple[str, Callable, str, Callable, str]

RULES: tuple[Rule, ...] = (
    ("stop_now", lambda e: e.memory_runs_out is not None,
     "Stop the job now: rank {rank} runs out of {device} memory in {mem_eta}, before the "
     "watchdog ({remaining}); the OOM killer would take its node down with it. " + DUMP
     + ", then restart from the last complete checkpoint with the fix below.",
     lambda e: e.memory_runs_out.eta_seconds, "memory_runs_out"),
    ("dump_now", lambda e: e.overrun is not None and e.budget.assumed,
     "Take the evidence now: the save should end in {eta}, but this job's watchdog "
     "timeout is not known ({timeout_note}). " + DUMP + ". Then check the job's timeout "
     "(init_process_group(timeout=...), or its framework's setting): if it is longer than "
     "the save, let it finish; if not, stop the job cleanly before the watchdog does "
     "(scancel, or SIGTERM to the launcher) and restart with the fix below.",
     lambda e: None, "watchdog_fires"),
    ("stop_cleanly", lambda e: e.overrun is not None and e.overrun > 0,
     "Stop the job cleanly now: the save needs {eta} more, the watchdog fires in "
     "{remaining} ({overrun} too late) and the job dies with this checkpoint half-written. "
     + DUMP + ", then stop it (scancel, or SIGTERM to the launcher) "
     "and restart from the previous checkpoint with the fix below.",
     lambda e: e.budget.remaining, "watchdog_fires"),
    ("let_it_run", lambda e: e.overrun is not None,
     "Let it run: the save should end in {eta}, {margin} before the watchdog fires. "
     "Apply the fix below before the next run; this forecast says so if it turns.",
     lambda e: e.write.eta_seconds, "save_ends"),
    ("dump_now", lambda e: True,
     "Take the Flight Recorder dump now, before the watchdog (in {remaining}) ends the job "
     "and the trace with it: " + DUMP.removeprefix("Take the Flight Recorder dump first ")
     + ". Nothing forecasts the end of this stall.",
     lambda e: None if e.budget.assumed else e.budget.remaining, "watchdog_fires"),
)


def advise(e, words: dict[str, str]) -> Advice:
    """The first rule that applies to the evidence ``e``."""
    for action, applies, text, within, until in RULES:
        if applies(e):
            left = within(e)
            return Advice(action, text.format_map(words),
                          None if left is None else max(0.0, left), until)
    raise AssertionError("the last rule always applies")


def headline(a: Advice) -> str:
    """One line: the action and the time left to take it."""
    verb = {"stop_now": "STOP THE JOB NOW", "stop_cleanly": "STOP THE JOB CLEANLY NOW",
            "let_it_run": "LET IT RUN", "dump_now": "TAKE THE FLIGHT RECORDER DUMP NOW"}
    until = {"memory_runs_out": "before memory runs out", "watchdog_fires":
             "before the watchdog fires", "save_ends": "until the save should end"}
    left = "" if a.decide_within_seconds is None else \
        f" ({seconds(a.decide_within_seconds)} left {until[a.until]})"
    return verb[a.action] + left


def view(a: Advice | None, runbook: str = "", commands: list | None = None) -> dict | None:
    """The advice as ``/api/v1/jobs`` shows it (``runbook``: the kind's page;
    ``commands``: how to take each step where the job runs, actions.py)."""
    if a is None:
        return None
    return {"action": a.action, "headline": headline(a), "text": a.text,
            "decide_within_seconds": (None if a.decide_within_seconds is None
                                      else round(a.decide_within_seconds, 1)),
            "until": a.until,
            "runbook_url": f"{runbook}#what-to-do-now" if runbook else None,
            "commands": commands or []}
