"""Rule: what a crash, a kill or the watchdog's own frames say when no rule above did.

The sign table will always trail the field (issue 28): a paste may hold only a
segmentation fault, a process killed by SIGKILL, or the NCCL watchdog's C++
frames without the lines above them. Those still name a class, if not a rank.
The shapes are a table, first match wins; a line shaped like a failure that
none of them reads leaves the verdict to verdict.decide, which says
``unknown`` with the line quoted.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

from ncclwatch.diagnose.crashes import anyone_waited
from ncclwatch.diagnose.facts import Facts
from ncclwatch.diagnose.finding import LogFinding, who
from ncclwatch.diagnose.logwords import (
    CRASH_WORDS,
    NETWORK_EXCEPTIONS,
    PEER_EXCEPTIONS,
    SIGNAL_EXIT_BASE,
    SIGNAL_MEANING,
    TEARDOWN_EXCEPTIONS,
    TIMEOUT_EXCEPTIONS,
)
from ncclwatch.diagnose.scanresult import Evidence
from ncclwatch.diagnose.signtypes import Event


@dataclass(frozen=True)
class Shape:
    """What one kind of death line means: the class, its root cause, the sentence."""

    #: SIGNAL_MEANING's word ("crashed", "killed", "aborted") or "watchdog".
    meaning: str
    cls: str
    root_cause: str
    says: str
    #: Counts only where no rank timed out waiting (an abort after a watchdog timeout is
    #: the watchdog's own, not a cause).
    alone: bool = False
    #: Counts only on lines that name their rank (an exception line without one could be
    #: any process's, the launcher's included).
    ranked: bool = False


SHAPES: tuple[Shape, ...] = (
    Shape("killed", "rank_crash", "rank_exited",
          "a process was killed (SIGKILL: the kernel's OOM killer is its usual sender, then a "
          "scheduler's kill)"),
    Shape("crashed", "rank_crash", "rank_exited",
          "a process crashed (a segmentation fault or another fatal signal or error)"),
    Shape("watchdog", "collective_hang", "rank_never_joined",
          "the NCCL watchdog took a process down (its own frames are in the log): a "
          "collective timed out or failed on that rank, waiting for another"),
    Shape("aborted", "rank_crash", "rank_exited", "a process aborted (SIGABRT)", alone=True),
    Shape("raised", "rank_crash", "rank_exited",
          "a rank raised an exception of its own (not a timeout, a lost peer or a teardown)",
          alone=True, ranked=True),
)


def meaning_of(e: Evidence) -> str | None:
    """What a death line says happened to the process, or None."""
    if e.event in (Event.WATCHDOG_ABORT, Event.HEARTBEAT) and e.sign.endswith("_frame"):
        return "watchdog"
    if e.sign in ("crash_signal", "error_line"):
        for word, sig in CRASH_WORDS:
            if word in e.text:
                return SIGNAL_MEANING.get(sig, sig)
        num = e.fields.get("signum")
        if num:
            return _signal_meaning(int(num))
        return "crashed" if e.sign == "crash_signal" else None
    if e.sign == "exception_line" and e.fields.get("exc"):
        waits = TIMEOUT_EXCEPTIONS + PEER_EXCEPTIONS + TEARDOWN_EXCEPTIONS + NETWORK_EXCEPTIONS
        return None if any(w in e.text for w in waits) else "raised"
    if e.sign == "exit_status":
        if e.fields.get("signal"):
            s = e.fields["signal"].upper()
            return _signal_meaning(int(s)) if s.isdigit() else SIGNAL_MEANING.get(s)
        if "code" not in e.fields:
            return None  # torchrun killing its own workers after a failure: not the cause
        code = int(e.fields["code"])
        if code < 0:
            return _signal_meaning(-code)
        if code > SIGNAL_EXIT_BASE:
            return _signal_meaning(code - SIGNAL_EXIT_BASE)
    return None


def _signal_meaning(num: int) -> str | None:
    try:
        return SIGNAL_MEANING.get(signal.Signals(num).name)
    except ValueError:
        return None


def rule_fallback(facts: Facts) -> LogFinding | None:
    lines = [e for e in facts.scan.evidence
             if e.event in (Event.CRASH, Event.ERROR, Event.WATCHDOG_ABORT, Event.HEARTBEAT)]
    by_meaning: dict[str, list[Evidence]] = {}
    for e in lines:
        m = meaning_of(e)
        if m is not None:
            by_meaning.setdefault(m, []).append(e)
    waited = anyone_waited(facts)
    for shape in SHAPES:
        hits = by_meaning.get(shape.meaning)
        if hits and shape.ranked:
            hits = [e for e in hits if e.rank is not None]
        if not hits or (shape.alone and (waited or "watchdog" in by_meaning)):
            continue
        ranks = sorted({e.rank for e in hits if e.rank is not None})
        if shape.cls == "collective_hang":
            # The ranks whose watchdog fired only waited; the one they waited for is unnamed.
            initiating, collateral = [], ranks
            candidates = [r for r in facts.world if r not in ranks] if ranks else []
        else:
            initiating, collateral, candidates = ranks, [], []
        return LogFinding(
            shape.cls, initiating, collateral, shape.root_cause,
            shape.says + (f": {who(ranks)}" if ranks and initiating else "")
            + ("; no line names the rank" if not initiating else "") + ".",
            [(e.where, e.text[:240]) for e in hits[:4]],
            candidates=candidates,
            missing=[] if initiating else ["the rank of the process (a rank prefix on its lines)"],
            collect=[] if initiating else [
                "every rank's log with its rank prefix (torchrun --log-dir DIR --tee 3, or "
                "srun --label)", "the kernel log of the node (dmesg -T): the OOM killer's "
                "'Killed process P', a segfault's 'segfault at'"])
    return None
