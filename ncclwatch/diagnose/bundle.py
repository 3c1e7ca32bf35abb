"""An evidence bundle (``ncclwatch dump``, daemon/bundle.py) read back by ``diagnose``.

The bundle holds the daemon's live verdict, made while the job still ran,
from every rank's stacks: stronger evidence than logs written before the
watchdog fired, which name no culprit of a stall. It is read as what it was
when taken: the stall, its culprit and root cause, the watchdog budget then
(``N s of the T s timeout left when taken``, the timeout learned from the
job or assumed), the daemon's advice then, and how the stall ended where
that is known (the incident's ``outcome``, or logs given beside it that show
the waiters' watchdog fired). A stall still live when taken has not
outlasted the timeout: its headline says so (LIVE_TITLES), never the failure
class's "outlasted the process-group timeout". Whether it or the logs' own
finding leads is verdict.SPECIFICITY's call (diagnose/__init__.py).
"""

from __future__ import annotations

import json
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The daemon's stall kinds (model.StallKind) as diagnose's failure classes.
CLASS_OF_KIND = {
    "checkpoint_gather": "checkpoint_gather_timeout",
    "checkpoint_restore": "collective_hang",
    "collective_hang": "collective_hang",
    "desync": "desync",
    "rank_lost": "rank_crash",
}
#: The headline of a live verdict whose end the evidence does not show (a
#: failure class's title says how such a stall ends: "outlasted the timeout").
LIVE_TITLES = {
    "checkpoint_gather": "A rank's checkpoint gather/save held the other ranks in a collective",
    "checkpoint_restore": "A rank's checkpoint restore held the other ranks in a collective",
    "collective_hang": "A rank had not joined a collective the others waited in (hang)",
    "desync": "Ranks waited in different collectives (desync)",
    "rank_lost": "A rank was lost while the others waited for it",
}
#: How an incident ended (its ``outcome``), in words; only killed_by_watchdog
#: makes the failure class's own title (the timeout was outlasted) true.
OUTCOMES = {
    "killed_by_watchdog": "the watchdog fired",
    "completed": "it completed before the watchdog fired",
    "rank_lost": "a rank was lost",
    "lost_sight": "the daemon lost sight of the job before it ended",
}
#: A live root cause that the outcome proved wrong, and the one that then applies
#: (its fix, not "nothing to do now").
OVERTAKEN = {
    ("save_within_budget", "killed_by_watchdog"): "save_overruns_watchdog",
    ("save_within_assumed_timeout", "killed_by_watchdog"): "save_overruns_watchdog",
}
#: Where the budget's timeout came from (the daemon's budget.source), in words.
TIMEOUT_SOURCES = {
    "flight_recorder": "learned from the job's Flight Recorder",
    "job": "learned from the job",
    "config": "set for this job in the daemon's config",
    "default": "assumed: the daemon's default, the job did not say",
}
#: The member that marks a tar as a bundle, and the format it must state.
MARKER, FORMAT = "bundle.json", "ncclwatch-bundle/1"
#: The members read (the rest, stacks and Flight Recorder, are for people).
READ = (MARKER, "verdict.json", "job.json")
#: Bytes read of any one member (the daemon writes far less).
MAX_MEMBER = 64 << 20


@dataclass(frozen=True)
class LiveVerdict:
    path: str
    job: str
    stall: dict[str, Any] | None   # incident_view: the active stall, else the newest ended
    #: Wall time the bundle was taken (bundle.json ``created_at``).
    taken_at: float | None = None
    #: The job's watchdog view when taken (job.json): the timeout's source for
    #: bundles whose stall does not carry it.
    job_watchdog: dict[str, Any] | None = None

    @property
    def cls(self) -> str:
        return CLASS_OF_KIND.get(self.stall["kind"], "unknown") if self.stall else "none"

    @property
    def outcome(self) -> str | None:
        """How the stall ended, where the incident says (``outcome``: the daemon's
        object with its ``outcome`` word, or the word); None: not known."""
        o = (self.stall or {}).get("outcome")
        if isinstance(o, dict):
            o = o.get("outcome")
        return o if isinstance(o, str) and o else None

    @property
    def outcome_sentence(self) -> str | None:
        """The daemon's own sentence of the outcome, where it wrote one."""
        o = (self.stall or {}).get("outcome")
        t = o.get("sentence") if isinstance(o, dict) else None
        return t if isinstance(t, str) and t else None

    def budget(self) -> dict[str, Any]:
        """The watchdog budget as the bundle holds it: as it stood when taken for
        a live stall, as it stood when last seen live for an ended one."""
        w = dict((self.stall or {}).get("watchdog") or {})
        src = w.get("timeout_source")
        if src is None and (self.stall or {}).get("active"):
            src = (self.job_watchdog or {}).get("timeout_source")  # the same budget
        assumed = w.get("timeout_assumed")
        return {"timeout_seconds": w.get("timeout_seconds"),
                "remaining_seconds": w.get("remaining_seconds"),
                "timeout_source": src or "unknown",
                "timeout_assumed": bool(assumed if assumed is not None else src == "default"),
                "as_of": "taken" if (self.stall or {}).get("active") else "last seen live"}


def read(path: str | Path) -> LiveVerdict | None:
    """The live verdict of a bundle; None: the file is no bundle (a log, a dump)."""
    p = Path(path)
    if not p.is_file() or not tarfile.is_tarfile(p):
        return None
    try:
        with tarfile.open(p, "r:*") as tar:
            docs = {}
            for m in tar.getmembers():
                base = m.name.rpartition("/")[2]
                if m.isfile() and base in READ and m.size <= MAX_MEMBER:
                    f = tar.extractfile(m)
                    docs[base] = json.loads(f.read()) if f else None
    except (tarfile.TarError, OSError, ValueError):
        return None
    head = docs.get(MARKER)
    if not isinstance(head, dict) or head.get("format") != FORMAT:
        return None
    stalls = [s for s in (_dict(docs.get("verdict.json")).get("stalls") or [])
              if isinstance(s, dict)]
    active = [s for s in stalls if s.get("active")]
    taken = head.get("created_at")
    return LiveVerdict(str(path), str(head.get("job", "")), (active or stalls or [None])[0],
                       float(taken) if isinstance(taken, (int, float)) else None,
                       _dict(_dict(docs.get("job.json")).get("watchdog")) or None)


def _dict(x: Any) -> dict:
    return x if isinstance(x, dict) else {}


def ranks(items: list) -> list[int]:
    """Rank numbers of a view's rank list (members of unknown rank left out)."""
    return [r for r in items if isinstance(r, int)]


def title(v: LiveVerdict, class_title: str, outcome: str | None) -> str:
    """The headline: the class's own title only where the watchdog did fire;
    else what the stall was, and where it stood (live with N s left, or how it ended)."""
    if outcome == "killed_by_watchdog":
        return class_title
    s = v.stall or {}
    head = LIVE_TITLES.get(s.get("kind", ""), class_title)
    if outcome in OUTCOMES:
        return f"{head}; {OUTCOMES[outcome]}"
    b = v.budget()
    if b["as_of"] == "taken":
        return f"{head}: live when the bundle was taken, {budget_words(b)}"
    return f"{head}; it ended before the bundle was taken"


def budget_words(b: dict[str, Any]) -> str:
    """"81 s of the 90 s timeout left" (a budget of ``LiveVerdict.budget``)."""
    t, left = b["timeout_seconds"], b["remaining_seconds"]
    if t is None or left is None:
        return "the watchdog budget is not in the bundle"
    return f"{max(left, 0):.0f} s of the {t:.0f} s timeout left"


def root_cause_id(v: LiveVerdict, outcome: str | None) -> tuple[str, str | None]:
    """The live root cause, and the one that replaces it where the outcome
    proved the live forecast wrong (OVERTAKEN); None: it stands."""
    rc = str(((v.stall or {}).get("diagnosis") or {}).get("root_cause") or "")
    return rc, OVERTAKEN.get((rc, outcome or ""))


def view(v: LiveVerdict, outcome: str | None, outcome_from: str | None, led: bool) -> dict:
    """The live verdict as ``diagnose --json``'s ``live`` and the text's "Live
    verdict" block: what the daemon said when the bundle was taken."""
    s = v.stall or {}
    dx, adv = s.get("diagnosis") or {}, s.get("advice") or {}
    b = v.budget()
    return {
        "bundle": v.path, "job": v.job, "taken_at": v.taken_at, "led": led,
        "kind": s.get("kind"), "active": bool(s.get("active")), "summary": s.get("summary"),
        "culprits": [{"rank": c.get("rank"), "state": c.get("state"), "host": c.get("host"),
                      "for_seconds": c.get("for_seconds")} for c in s.get("culprits") or []],
        "waiting_ranks": ranks((s.get("waiting") or {}).get("ranks") or []),
        "root_cause": dx.get("root_cause"), "cause": dx.get("cause") or s.get("cause"),
        "at_risk": s.get("at_risk"),
        "watchdog": {**b, "words": f"{budget_words(b)} when {b['as_of']}",
                     "timeout_from": TIMEOUT_SOURCES.get(b["timeout_source"],
                                                         "of unknown source")},
        "advice": {k: adv.get(k) for k in ("action", "headline", "text")} if adv else None,
        "outcome": outcome, "outcome_from": outcome_from,
        "outcome_words": OUTCOMES.get(outcome or ""),
        "outcome_sentence": v.outcome_sentence if outcome_from == "bundle" else None,
    }


def timeline(v: LiveVerdict) -> list[dict]:
    """The stall's moments as diagnose's timeline entries."""
    s = v.stall
    where = f"{Path(v.path).name}:verdict.json"
    out = [{"rank": None, "where": where, "what": f"{s['kind']} stall began",
            "time": s["started_at"]},
           {"rank": None, "where": where, "what": f"detected: {s['summary']}"[:240],
            "time": s["detected_at"]}]
    for c in s["culprits"]:
        out.append({"rank": c["rank"], "where": where,
                    "what": f"culprit {c['state']} for {c['for_seconds']}s on {c['host']}",
                    "time": None})
    if s.get("ended_at"):
        out.append({"rank": None, "where": where, "what": "the stall ended", "time": s["ended_at"]})
    if s.get("active") and v.taken_at is not None:
        out.append({"rank": None, "where": where, "time": v.taken_at,
                    "what": f"bundle taken, the stall live: {budget_words(v.budget())}"})
    return out
