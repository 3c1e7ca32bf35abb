"""One clock for one incident: every duration shown at one moment, from named anchors.

"ALERT 7s after torch.save began", "saving for 12s", "wait in barrier for
6s", "stalled 6s" are all true and all measured from different moments,
unnamed. Here each duration is ``now`` (one reading, the same for the whole
view) minus one of three anchors, and says which:

- ``culprit_began``: the culprit entered what it is doing (torch.save began);
- ``first_wait``: the first rank began to wait for it (the stall's start);
- ``opened``: ncclwatch opened the incident.

``culprit_began`` is a span where the evidence leaves one: the state's start
as the agent estimates it is the earliest it can be (the rank's previous
stack, which showed something else, may be seconds older), and the first
report that showed it the latest. Where the two are more than
``SPAN_SHOWN`` apart the anchor carries both (``by``).
"""

from __future__ import annotations

from typing import Any, Callable

#: A culprit_began span narrower than this is shown as one moment.
SPAN_SHOWN = 1.0

#: Anchor id -> how the page and status name it ({state}: the culprit's state).
WORDS = {
    "culprit_began": "rank {rank} began {state}",
    "first_wait": "the first rank began to wait",
    "opened": "ncclwatch opened the incident",
}


def anchors(inc, job) -> list[tuple[str, float, str, float | None]]:
    """(id, daemon-monotonic time, words, latest time or None), oldest first."""
    out: list[tuple[str, float, str, float | None]] = []
    lead = inc.finding.culprits[0] if inc.finding.culprits else None
    rec = job.ranks.get(lead.rank) if job is not None and lead is not None else None
    if rec is not None and rec.since > 0:
        by = rec.seen_in_state if _spanned(rec) else None
        out.append(("culprit_began", rec.since, WORDS["culprit_began"].format(
            rank=lead.rank, state=lead.state.value.replace("_", " ")), by))
    out.append(("first_wait", inc.started_at, WORDS["first_wait"], None))
    out.append(("opened", inc.detected_at, WORDS["opened"], None))
    out.sort(key=lambda a: a[1])
    return out


def view(inc, job, now: float) -> dict[str, Any]:
    """The anchors with their wall time and the seconds since each, all at ``now``."""
    wall = lambda t: inc.started_wall + (t - inc.started_at)  # noqa: E731
    out = []
    for aid, t, words, by in anchors(inc, job):
        a = {"id": aid, "what": words, "at": round(wall(t), 3),
             "seconds_ago": round(max(0.0, now - t), 1)}
        if by is not None:   # at the latest: "6-12s ago"
            a["by"] = round(wall(by), 3)
            a["by_seconds_ago"] = round(max(0.0, now - by), 1)
        out.append(a)
    return {"now": round(wall(now), 3), "anchors": out}


def plain(x: float) -> str:
    return f"{max(0.0, x):.0f}s"


def span(at_least: float | None, at_most: float, fmt: Callable[[float], str] = plain) -> str:
    """A duration known as a span: "12s", or "6-12s" (``at_least`` None: one value)."""
    hi = fmt(at_most)
    lo = fmt(at_least) if at_least is not None else hi
    if lo == hi:
        return hi
    if lo[:-1].isdigit() and hi[:-1].isdigit() and lo[-1] == hi[-1] == "s":
        return f"{lo[:-1]}-{hi}"
    return f"{lo}-{hi}"


def ago(anchor: dict) -> str:
    """"12s ago", or "6-12s ago" where the moment is known only as a span."""
    return span(anchor.get("by_seconds_ago"), anchor["seconds_ago"]) + " ago"


def _spanned(rec) -> bool:
    """The rank's estimated start and the first report of its state differ enough to show."""
    return rec.since > 0 and rec.seen_in_state - rec.since > SPAN_SHOWN


def seen_for(rec, now: float) -> float | None:
    """How long at least a rank has been in its state (the first report that
    showed it), where that differs from its estimated start; else None."""
    return max(0.0, now - rec.seen_in_state) if _spanned(rec) else None


def since(inc, job, now: float, anchor: str) -> float | None:
    for aid, t, _, _ in anchors(inc, job):
        if aid == anchor:
            return max(0.0, now - t)
    return None
