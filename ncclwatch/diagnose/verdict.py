"""From evidence to a verdict: what failed, which rank started it, which only waited.

The NCCL watchdog makes every rank report a timeout, and torchrun names the
first rank that exited as the "root cause": in a checkpoint stall both point
at ranks that were only waiting. The rules here invert that: a rank that
timed out waiting is collateral; the initiating rank is the one the waiting
ranks waited for (the Flight Recorder's missing ranks, the watchdog's "last
enqueued work" numbers, monitored_barrier's list, or simply the rank that did
not time out), and what it was doing (its traceback's frames, classified
with the same signature table as live stacks; its checkpoint log lines)
names the failure class. The classes are a table, first match wins.

The parts: facts.py (what the logs say, rank by rank), waiting.py (who waited
for whom), crashes.py (who failed on its own), rules/ (one module per failure
class, registered in rules.RULES, each returning a finding.LogFinding), this
module (the classes, the decision, the timeline); render.py prints it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ncclwatch.diagnose.facts import Facts, gather_facts, time_order
from ncclwatch.diagnose.finding import LogFinding, who
from ncclwatch.diagnose.logsigns import SIGNS
from ncclwatch.diagnose.logwords import NETWORK_FAILURES
from ncclwatch.diagnose.rules import RULES
from ncclwatch.diagnose.scanresult import Evidence
from ncclwatch.diagnose.signtypes import Event
from ncclwatch.diagnose.waiting import timeout_seconds
from ncclwatch.model import rank_ranges
from ncclwatch.remediation import ALL_BY_ID, RootCause

#: The public names other modules (the CLI, the paste page, tests) import from here.
__all__ = ["CLASSES", "CLASS_BY_ID", "Facts", "LogFinding", "RULES", "decide", "failure_signs",
           "gather_facts", "root_cause", "specificity", "timeline", "timeout_seconds", "who"]


@dataclass(frozen=True)
class FailureClass:
    id: str
    title: str
    #: How much of the cause the class names (headline): where two readings of one
    #: job meet (logs and a bundle's live verdict), the higher leads and the other
    #: supports it. A hang says only that a rank did not join; a checkpoint stall,
    #: a crash, a desync or a transport error says why; an OOM in the save, why the
    #: save failed.
    specificity: int = 0


CLASSES: tuple[FailureClass, ...] = (
    FailureClass("gather_oom", "Out of memory while gathering or saving the checkpoint", 4),
    FailureClass("desync", "Ranks ran different collectives (desync)", 3),
    FailureClass("network_error", "Network / NCCL transport error", 3),
    FailureClass("rank_crash", "A rank crashed", 3),
    FailureClass("checkpoint_gather_timeout",
                 "Checkpoint gather/save outlasted the process-group timeout", 3),
    FailureClass("collective_hang", "A rank never joined a collective (hang)", 2),
    FailureClass("none", "No failure found", 0),
    FailureClass("unknown", "Failure evidence without a recognised pattern", 1),
)


CLASS_BY_ID = {c.id: c for c in CLASSES}


def specificity(cls: str, initiating: Sequence[int]) -> tuple[int, bool]:
    """The headline rule's key: the class's specificity, then whether the
    reading names the initiating rank (not only the ranks it must be among).
    A tie keeps the logs' reading (they may have seen the end)."""
    c = CLASS_BY_ID.get(cls)
    return (c.specificity if c else 0, bool(initiating))


SIGN_BY_ID = {s.id: s for s in SIGNS}


def _torchrun_note(facts: Facts, finding: LogFinding) -> str | None:
    roots = [fe for fe in facts.scan.failures if fe.root and fe.rank is not None]
    if not roots:
        return None
    root = roots[0]
    if root.rank in finding.initiating:
        return f"torchrun's summary names rank {root.rank} as the root cause too ({root.where})."
    if root.rank in finding.collateral and finding.initiating:
        return (f"torchrun's summary names rank {root.rank} as the root cause "
                f"(first observed failure, {root.where}): it only failed first, after "
                f"waiting for rank(s) {rank_ranges(finding.initiating)}.")
    if root.rank in finding.collateral:
        return (f"torchrun's summary names rank {root.rank} as the root cause "
                f"(first observed failure, {root.where}): it only failed first, after waiting.")
    return None


#: Evidence to collect where a verdict rests on an inference.
_COLLECT_PREFIX = ("every rank's log with its rank prefix (torchrun --tee 3 or --log-dir), so "
                   "lines carry the rank instead of a GPU index")


def decide(facts: Facts) -> LogFinding:
    for _name, rule in RULES:
        finding = rule(facts)
        if finding is not None:
            note = _torchrun_note(facts, finding)
            if note:
                finding.notes.append(note)
            if any(r in facts.inferred for r in finding.initiating) \
                    and _COLLECT_PREFIX not in finding.collect:
                finding.missing.append("a rank prefix on the failing line")
                finding.collect.append(_COLLECT_PREFIX)
            if finding.cls in ("collective_hang", "checkpoint_gather_timeout", "desync") \
                    and facts.fr is None and not any("Flight Recorder" in c
                                                     for c in finding.collect):
                finding.collect.append("Flight Recorder dumps (TORCH_NCCL_TRACE_BUFFER_SIZE=2000, "
                                       "TORCH_NCCL_DUMP_ON_TIMEOUT=1) to confirm which rank "
                                       "never started the collective")
            return finding
    failing = failure_signs(facts)
    if failing or (facts.ranks and any(rf.tracebacks or rf.failure or rf.timeouts
                                       for rf in facts.ranks.values())):
        # Recall first: a log with any failure sign is never "no failure found".
        ev = [(where, f"{sid}: {text[:200]}") for sid, (where, text) in failing[:6]]
        named = ", ".join(f"{sid} ({facts.scan.hit_counts.get(sid, 1)} line(s))"
                          for sid, _h in failing[:6])
        ids = {sid for sid, _h in failing}
        ranks = sorted({e.rank for e in facts.scan.evidence
                        if e.sign in ids and e.rank is not None})
        return LogFinding("unknown", [], [], "", "failure evidence found, but no known pattern "
                          "explains it" + (f": {named}" if named else "")
                          + (f"; the failing lines are {who(ranks)}'s" if ranks else "")
                          + "; see the evidence lines.", ev,
                          missing=["a line that points at a rank or a cause"],
                          collect=["every rank's log (torchrun --log-dir DIR --tee 3)",
                                "Flight Recorder dumps (TORCH_NCCL_DUMP_ON_TIMEOUT=1)"])
    finished = [e for e in facts.scan.evidence if e.event is Event.FINISHED]
    return LogFinding("none", [], [], "", "no failure found"
                      + (" (the job says it finished)" if finished else "") + ".",
                      [(e.where, e.text[:200]) for e in finished[:1]])


def failure_signs(facts: Facts) -> list[tuple[str, tuple[str, str]]]:
    """The failure signs the scan met (logsigns.LogSign.failure), first line of each, in
    table order; NCCL warnings count only where they name a transport failing."""
    out = [(sid, hit) for sid, hit in facts.scan.hits.items()
           if SIGN_BY_ID[sid].failure]
    warn = facts.scan.hits.get("nccl_warn")
    if warn is not None and any(t in warn[1] for t in NETWORK_FAILURES):
        out.append(("nccl_warn", warn))
    order = {s.id: i for i, s in enumerate(SIGNS)}
    return sorted(out, key=lambda kv: order[kv[0]])


def root_cause(finding: LogFinding) -> RootCause | None:
    return ALL_BY_ID.get(finding.root_cause)


def timeline(facts: Facts, finding: LogFinding, limit: int = 40) -> list[dict]:
    """Key moments, in time order where the logs have times (else file order)."""
    keep: list[tuple[tuple, dict]] = []
    interesting = set(finding.initiating)

    def add(order: tuple, rank: int | None, where: str, what: str,
            stamp: float | None = None) -> None:
        # The line's own stamp, never one inherited from an earlier line.
        keep.append((order, {"rank": rank, "where": where, "what": what[:240], "time": stamp}))

    for r, rf in sorted(facts.ranks.items()):
        firsts: Sequence[Evidence] = [*rf.timeouts[:1], *rf.progress[:1], *rf.oom[:1],
                                      *rf.network[:1], *rf.aborted[:2], *rf.peer_closed[:1]]
        if r in interesting:
            firsts = [*firsts, *rf.checkpoint[-2:], *rf.checkpoint_done[-1:]]
        for e in firsts:
            add(time_order(e), r, e.where, e.text, e.stamp)
        for tb in rf.tracebacks[:1] + rf.tracebacks[-1:] if rf.tracebacks else []:
            add(time_order(tb), r, tb.where, f"traceback ending in {tb.exception}", tb.stamp)
    for e in facts.all_evidence(Event.MISSING_RANKS)[:3] + facts.all_evidence(Event.MISMATCH)[:3] \
            + facts.all_evidence(Event.HEARTBEAT)[:2] + facts.all_evidence(Event.FR_DUMP)[:2]:
        add(time_order(e), e.rank, e.where, e.text, e.stamp)
    for e in facts.unattributed:
        if e.event in (Event.OOM, Event.NETWORK):
            add(time_order(e), None, e.where, e.text, e.stamp)
    for fe in facts.scan.failures:
        sig = f" {fe.signame}" if fe.signame else ""
        add((True, 0.0, fe.file, fe.line), fe.rank, fe.where,
            f"torchrun: rank {fe.rank} exitcode {fe.exitcode}{sig}"
            + (" (named root cause)" if fe.root else ""), fe.stamp)
    for e in facts.all_evidence(Event.EXIT)[:4]:
        add(time_order(e), e.rank, e.where, e.text, e.stamp)
    seen = set()
    out = []
    for _o, item in sorted(keep, key=lambda x: x[0]):
        key = (item["where"], item["what"])
        if key in seen:
            continue
        seen.add(key)
        out.append(item)
    return out[:limit]
