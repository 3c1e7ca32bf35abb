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

import gzip
import json
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from ncclwatch.diagnose.logfiles import LogInputError
from ncclwatch.sanitize import escape

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


@dataclass(frozen=True)
class Caps:
    """What reading one bundle may cost: a bundle is an untrusted file (a tar.gz
    of 400k empty members once took 224 MiB and 7 s). The daemon writes its
    documents first and one stack per rank after them, so the walk stops as
    soon as the READ documents are in; the caps bound an archive re-packed in
    another order, or a hostile one. Passing one is an error (exit 2), not a
    partial reading."""

    #: Members looked at before the READ documents are all found (a bundle
    #: re-packed in any order fits up to 16,000 ranks; about 2 s of one core).
    members: int = 16384
    #: Bytes of any one member (the daemon writes far less).
    member_bytes: int = 64 << 20
    #: Bytes of the archive read, decompressed, headers and skipped members
    #: included.
    total_bytes: int = 128 << 20


CAPS = Caps()
#: Names that say "a tar archive" of a path given by name, and whether its
#: bytes must be gzip: such a path is read as a bundle whatever it holds
#: (a path named otherwise is one only when its bytes are a tar).
ARCHIVE_NAMES = ((".tar.gz", True), (".tgz", True), (".tar", False))
#: The ustar magic of a tar header (POSIX and GNU), at its offset in the block.
_USTAR, _USTAR_AT = b"ustar", 257


class BundleError(LogInputError):
    """A bundle that cannot be read within CAPS, or is malformed: the CLI says
    it in one line and exits 2."""


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


def read(path: str | Path, caps: Caps = CAPS) -> LiveVerdict | None:
    """The live verdict of a bundle; None: the file is no bundle (a log, a dump,
    a tar without ``bundle.json``, or one whose ``bundle.json`` states another
    tool's format). BundleError: an archive that is not
    gzip where its name says so, truncated, or with a member over a cap, a
    path that climbs (``..``) or is absolute, or a link."""
    p = Path(path)
    if not p.is_file():
        return None
    gz = _archive(p)
    if gz is None:
        return None
    try:
        with open(p, "rb") as raw:
            docs = _documents(p, raw, gz, caps)
    except BundleError:
        raise
    except (tarfile.TarError, OSError, EOFError, zlib.error) as e:
        raise _bad(p, f"cannot read the archive ({_why(e)})") from None
    if docs is None:
        return None
    head = docs.get(MARKER)
    if isinstance(head, dict) and isinstance(head.get("format"), str) \
            and head["format"] != FORMAT:
        return None   # another tool's archive with a bundle.json: not ours to read
    if not isinstance(head, dict) or head.get("format") != FORMAT:
        raise _bad(p, f"{MARKER} does not state the format {FORMAT}")
    stalls = [s for s in (_dict(docs.get("verdict.json")).get("stalls") or [])
              if isinstance(s, dict)]
    active = [s for s in stalls if s.get("active")]
    taken = head.get("created_at")
    return LiveVerdict(str(path), str(head.get("job", "")), (active or stalls or [None])[0],
                       float(taken) if isinstance(taken, (int, float)) else None,
                       _dict(_dict(docs.get("job.json")).get("watchdog")) or None)


def _archive(p: Path) -> bool | None:
    """Whether the path is read as a bundle, and gzip (True) or a plain tar
    (False); None: it is not an archive (its name does not say so and its
    bytes are no tar), so a log or a dump."""
    with open(p, "rb") as f:
        head = f.read(_USTAR_AT + len(_USTAR))
        if head[:2] == b"\x1f\x8b":
            f.seek(0)
            try:
                with gzip.GzipFile(fileobj=f) as g:
                    head = g.read(_USTAR_AT + len(_USTAR))
            except (OSError, EOFError, zlib.error):
                head = b""
            if head[_USTAR_AT:] == _USTAR:
                return True
        elif head[_USTAR_AT:] == _USTAR:
            return False
    name = p.name.lower()
    return next((gz for end, gz in ARCHIVE_NAMES if name.endswith(end)), None)


class _Counted:
    """The archive's bytes as tarfile reads them, cut at ``limit``: no header
    (a PAX record, a GNU long name) or skipped member makes it read more."""

    def __init__(self, f: BinaryIO, p: Path, limit: int) -> None:
        self.f, self.p, self.limit, self.left = f, p, limit, limit

    def read(self, n: int = -1) -> bytes:
        b = self.f.read(n if n >= 0 else self.left + 1)
        self.left -= len(b)
        if self.left < 0:
            raise _bad(self.p, f"more than {_size(self.limit)} in all, over the cap "
                               "of a bundle")
        return b


def _documents(p: Path, raw: BinaryIO, gz: bool, caps: Caps) -> dict[str, Any] | None:
    """The READ documents, walking members as they come (never the whole list
    first); None: no ``bundle.json`` among them."""
    if gz and raw.read(2) != b"\x1f\x8b":
        raise _bad(p, "its name says tar.gz but it is not gzip")
    raw.seek(0)
    stream: Any = gzip.GzipFile(fileobj=raw) if gz else raw
    docs: dict[str, Any] = {}
    with tarfile.open(fileobj=_Counted(stream, p, caps.total_bytes), mode="r|") as tar:
        for n, m in enumerate(tar, 1):
            if n > caps.members:
                raise _bad(p, f"more than {caps.members} members before "
                              f"{', '.join(READ)} were all found")
            _check(p, m, caps)
            base = m.name.rpartition("/")[2]
            if m.isfile() and base in READ and base not in docs:
                f = tar.extractfile(m)
                docs[base] = _json(p, base, f.read() if f else b"")
                if len(docs) == len(READ):
                    break
            tar.members.clear()        # a stream is read once: keep no header behind
    return docs if MARKER in docs else None


#: Member kinds a bundle holds; any other (links, devices, fifos) is refused.
_KINDS = {tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.DIRTYPE}


def _check(p: Path, m: tarfile.TarInfo, caps: Caps) -> None:
    why = ("is a link" if m.issym() or m.islnk() else
           "is neither a file nor a folder" if m.type not in _KINDS else
           "is an absolute path or one with '..'"
           if m.name.startswith("/") or ".." in m.name.replace("\\", "/").split("/") else
           f"holds {_size(m.size)}, over the cap of {_size(caps.member_bytes)} a member"
           if m.size > caps.member_bytes else None)
    if why:
        raise _bad(p, f"member {escape(m.name, 200)} {why}")


def _json(p: Path, base: str, data: bytes) -> Any:
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as e:
        raise _bad(p, f"{base} is not JSON ({_why(e)})") from None


def _bad(p: Path, why: str) -> BundleError:
    return BundleError(f"{escape(str(p), 300)}: not a readable evidence bundle: {why}")


def _why(e: BaseException) -> str:
    """An exception's words on one line."""
    return escape(" ".join(str(e).split()) or type(e).__name__, 200)


def _size(n: int) -> str:
    return f"{n / (1 << 20):.0f} MiB" if n >= 1 << 20 else f"{n} bytes"


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
