"""``ncclwatch diagnose``: what killed a distributed job, from its logs and dumps.

After the fact an operator has logs (torchrun's console, per-rank files,
Slurm output, the kernel log) and maybe Flight Recorder dumps. ``diagnose``
streams them once (logscan.py, with the sign table of logsigns.py, undoing
what pasting did to a line with paste.py), reads the dumps
(ncclwatch/flightrec.py), and decides (verdict.py) the failure class, the
initiating ranks versus the collateral ones (or, where the logs name no
initiator, the ranks it must be among), a timeline, the evidence lines, what
evidence was missing and what to collect next time, and the fix from the
remediation table the live daemon uses. An evidence bundle (``ncclwatch
dump``) given by name brings the daemon's live verdict (bundle.py); where
logs come with it, the more specific reading leads (verdict.specificity)
and the other supports it.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Iterable

from ncclwatch import flightrec
from ncclwatch.diagnose import advice, bundle
from ncclwatch.diagnose.logfiles import LogInputError
from ncclwatch.diagnose.logscan import Scanner, scan
from ncclwatch.diagnose.scanresult import ScanResult
from ncclwatch.diagnose.verdict import (
    CLASS_BY_ID,
    decide,
    gather_facts,
    root_cause,
    specificity,
    timeline,
    timeout_seconds,
    who,
)
from ncclwatch.model import rank_ranges
from ncclwatch.remediation import ALL_BY_ID, RootCause

__all__ = ["Diagnosis", "LogInputError", "diagnose", "diagnose_stream"]


@dataclass
class Diagnosis:
    cls: str
    title: str
    summary: str
    initiating: list[int]
    collateral: list[int]
    root_cause: RootCause | None
    evidence: list[tuple[str, str]]
    notes: list[str]
    timeline: list[dict]
    timeout_s: float | None
    flight_recorder: dict | None
    inputs: dict[str, Any] = field(default_factory=dict)
    #: Where the initiator is not known: the ranks it must be among.
    candidates: list[int] = field(default_factory=list)
    #: What evidence the verdict lacked, and what to collect next time.
    missing_evidence: list[str] = field(default_factory=list)
    collect_next_time: list[str] = field(default_factory=list)
    #: The ncclwatch metric and alert that would have caught it live (advice.py).
    alert_next_time: list[dict[str, str]] = field(default_factory=list)
    #: Failures that leave the same traces, and how to tell them apart.
    rule_out: list[dict[str, str]] = field(default_factory=list)
    #: Ranks whose own watchdog fired in the logs (they timed out waiting).
    timed_out: list[int] = field(default_factory=list)
    #: Where the process-group timeout came from ("the logs", or the bundle's words).
    timeout_from: str = ""
    #: A bundle's live verdict as it stood when taken (bundle.view); None: no bundle.
    live: dict[str, Any] | None = None

    @property
    def failed(self) -> bool:
        """Whether a failure was found (the CLI's exit code 1; "none" is 0)."""
        return self.cls != "none"

    def to_json(self) -> dict[str, Any]:
        rc = self.root_cause
        return {
            "class": self.cls, "title": self.title, "summary": self.summary,
            "initiating_ranks": self.initiating, "collateral_ranks": self.collateral,
            "initiator_among": self.candidates,
            "root_cause": None if rc is None else {
                "id": rc.id, "title": rc.title, "fix": rc.fix, "example": rc.example},
            "evidence": [{"where": w, "why": y} for w, y in self.evidence],
            "notes": self.notes, "timeline": self.timeline, "timeout_seconds": self.timeout_s,
            "flight_recorder": self.flight_recorder, "inputs": self.inputs,
            "missing_evidence": self.missing_evidence, "collect_next_time": self.collect_next_time,
            "alert_next_time": self.alert_next_time, "rule_out": self.rule_out,
            "timeout_from": self.timeout_from, "timed_out_ranks": self.timed_out,
            "live": self.live,
        }


def _flight_recorder(result: ScanResult) -> tuple[flightrec.FrAnalysis | None, dict | None]:
    if not result.fr_dumps:
        return None, None
    # One dump per rank: a rank rewrites its dump in place, so two files for one
    # rank are two runs, or an on-demand dump and the one written at the timeout.
    # The newest (by the last entry it recorded, then the file's time: copies
    # lose file times) is the rank's last word; the others are named as skipped.
    newest: dict[int, tuple[tuple[int, float], flightrec.FrDump]] = {}
    unranked = []
    for path in result.fr_dumps:
        try:
            dump = flightrec.load_dump(path)
            age = (max((e.time_created_ns or 0 for e in dump.entries), default=0),
                   os.stat(path).st_mtime)
        except (flightrec.FlightRecorderError, OSError, ValueError) as e:
            result.skipped.append((path, str(e)))
            continue
        if dump.rank is None:
            unranked.append(dump)
            continue
        cur, prev = (age, dump), newest.get(dump.rank)
        if prev is not None:
            old, cur = sorted([prev, cur], key=lambda t: t[0])
            result.skipped.append((old[1].path, f"an older dump of rank {dump.rank} "
                                                f"than {cur[1].path}"))
        newest[dump.rank] = cur
    for d in unranked:
        result.skipped.append((d.path, "the dump does not say its rank"))
    if not newest:
        return None, None
    try:
        analysis = flightrec.analyze(d for _, d in newest.values())
    except flightrec.FlightRecorderError as e:
        result.skipped.extend((d.path, str(e)) for _, d in newest.values())
        return None, None
    return analysis, analysis.to_json()


def diagnose(paths: Iterable[str | os.PathLike],
             streams: Iterable[tuple[str, BinaryIO]] = ()) -> Diagnosis:
    """The verdict for log files, directories of them and Flight Recorder dumps;
    ``streams``: (name, binary stream) logs read as files are (the paste page)."""
    t0 = time.perf_counter()
    paths, live = list(paths), []
    for p in list(paths):                 # evidence bundles (ncclwatch dump): by name only
        v = bundle.read(p)
        if v is not None:
            live.append(v)
            paths.remove(p)
    result = scan(paths)
    for name, f in streams:
        Scanner(result).scan_stream(name, f)
    return _with_live(_verdict(result, t0), live)


def _with_live(d: Diagnosis, live: list[bundle.LiveVerdict]) -> Diagnosis:
    """The bundle's live verdict and the logs' reading, the more specific one
    leading (verdict.specificity): a live checkpoint stall explains the logs'
    generic hang, whose watchdog lines then say how it ended; logs that name a
    cause as specific (a crash after the dump) keep theirs, the live one a note."""
    for v in live:
        d.inputs.setdefault("bundles", []).append(v.path)
    v = next((v for v in live if v.stall), None)
    if v is None:
        return d
    s = v.stall
    culprits = bundle.ranks([c["rank"] for c in s["culprits"]])
    waiting = bundle.ranks(s["waiting"]["ranks"])
    outcome, outcome_from = v.outcome, ("bundle" if v.outcome else None)
    if outcome is None and d.timed_out and set(d.timed_out) <= {*culprits, *waiting}:
        outcome, outcome_from = "killed_by_watchdog", "logs"   # the waiters' watchdog fired
    led = specificity(v.cls, culprits) > specificity(d.cls, d.initiating)
    d.live = bundle.view(v, outcome, outcome_from, led)
    said = (f"the daemon's live verdict: {s['kind']}, culprit rank(s) "
            f"{rank_ranges(culprits) or '-'}: {s['summary']}")
    if not led:
        d.notes.append(f"{said} ({v.path})")
        return d
    notes = []
    if d.cls not in ("none", "unknown"):     # the logs' own reading supports the live one
        apart = bool(d.initiating) and not set(d.initiating) & set(culprits)
        notes.append(_supporting(d, v, "the logs" if apart else "the logs agree"))
        if apart:
            notes.append(f"the logs point at {who(d.initiating)} instead of the live "
                         f"culprit(s) {rank_ranges(culprits)}: check both.")
    rc_id, instead = bundle.root_cause_id(v, outcome)
    if instead:
        notes.append(f"the live verdict forecast {rc_id}, but {bundle.OUTCOMES[outcome]}: "
                     f"the fix of {instead} applies.")
    d.cls = v.cls
    d.title = bundle.title(v, CLASS_BY_ID[v.cls].title, outcome)
    d.summary = s["summary"]
    d.initiating, d.candidates = culprits, []
    d.collateral = sorted(set(waiting) | (set(d.collateral) - set(culprits)))
    d.root_cause = ALL_BY_ID.get(instead or rc_id) or d.root_cause
    d.evidence = [(v.path, said), *d.evidence]
    d.notes = notes + d.notes
    d.timeline = bundle.timeline(v) + d.timeline
    if d.timeout_s is None and d.live["watchdog"]["timeout_seconds"] is not None:
        d.timeout_s = d.live["watchdog"]["timeout_seconds"]
        d.timeout_from = f"the bundle: {d.live['watchdog']['timeout_from']}"
    d.alert_next_time, d.rule_out = advice.fingerprints(v.cls), advice.siblings(v.cls)
    d.missing_evidence = []
    return d


def _supporting(d: Diagnosis, v: bundle.LiveVerdict, lead: str) -> str:
    """The logs' finding as the live verdict's supporting evidence."""
    if d.timed_out:
        s = v.stall or {}
        overtaken = bundle.root_cause_id(v, "killed_by_watchdog")[1]
        how = (", as forecast" if s.get("at_risk") else
               ", though the live verdict forecast it to end in time" if overtaken else "")
        return (f"{lead}: the waiters' watchdog fired{how} "
                f"({who(d.timed_out, 'timed out', 'timed out')}); the logs alone read "
                f"{d.cls}: {d.summary}")
    return f"{lead}: alone they read {d.cls}: {d.summary}"


def diagnose_stream(stream: BinaryIO, name: str = "pasted log") -> Diagnosis:
    """The verdict for one log read from a binary stream (``read(n)``), plain or gzip:
    a paste or an upload, read once in chunks and never held whole or written out."""
    t0 = time.perf_counter()
    return _verdict(Scanner().scan_stream(name, stream), t0)


def _verdict(result: ScanResult, t0: float) -> Diagnosis:
    fr, fr_json = _flight_recorder(result)
    facts = gather_facts(result, fr)
    finding = decide(facts)
    inputs = {"files": result.files, "flight_recorder_dumps": result.fr_dumps,
              "skipped": [{"path": p, "why": w} for p, w in result.skipped],
              "bytes": result.bytes_read, "lines": result.lines_read,
              "bounded": list(result.bounded),
              "ranks_seen": rank_ranges(result.ranks_seen) if result.ranks_seen else "",
              "seconds": round(time.perf_counter() - t0, 3)}
    timeout = timeout_seconds(facts)
    return Diagnosis(finding.cls, CLASS_BY_ID[finding.cls].title, finding.summary,
                     finding.initiating, finding.collateral, root_cause(finding),
                     finding.evidence, finding.notes, timeline(facts, finding),
                     timeout, fr_json, inputs, finding.candidates,
                     finding.missing, finding.collect, advice.fingerprints(finding.cls),
                     advice.siblings(finding.cls),
                     sorted(r for r, rf in facts.ranks.items() if rf.timeouts),
                     "the logs" if timeout is not None else "")
