"""One clock for one incident: every duration shown at one moment, from named anchors.

"ALERT 7s after torch.save began", "saving for 12s", "wait in barrier for
6s", "stalled 6s" are all true and all measured from different moments,
unnamed. Here each duration is ``now`` (one reading, the same for the whole
view) minus one of three anchors, and says which:

- ``culprit_began``: the culprit entered what it is doing (torch.save began);
- ``first_wait``: the first rank began to wait for it (the stall's start);
- ``opened``: ncclwatch opened the incident.
"""

from __future__ import annotations

from typing import Any

#: Anchor id -> how the page and status name it ({state}: the culprit's state).
WORDS = {
    "culprit_began": "rank {rank} began {state}",
    "first_wait": "the first rank began to wait",
    "opened": "ncclwatch opened the incident",
}


def anchors(inc, job) -> list[tuple[str, float, str]]:
    """(id, daemon-monotonic time, words), oldest first."""
    out = []
    lead = inc.finding.culprits[0] if inc.finding.culprits else None
    rec = job.ranks.get(lead.rank) if job is not None and lead is not None else None
    if rec is not None and rec.since > 0:
        out.append(("culprit_began", rec.since, WORDS["culprit_began"].format(
            rank=lead.rank, state=lead.state.value.replace("_", " "))))
    out.append(("first_wait", inc.started_at, WORDS["first_wait"]))
    out.append(("opened", inc.detected_at, WORDS["opened"]))
    out.sort(key=lambda a: a[1])
    return out


def view(inc, job, now: float) -> dict[str, Any]:
    """The anchors with their wall time and the seconds since each, all at ``now``."""
    wall = lambda t: inc.started_wall + (t - inc.started_at)  # noqa: E731
    return {"now": round(wall(now), 3), "anchors": [
        {"id": aid, "what": words, "at": round(wall(t), 3),
         "seconds_ago": round(max(0.0, now - t), 1)} for aid, t, words in anchors(inc, job)]}


def since(inc, job, now: float, anchor: str) -> float | None:
    for aid, t, _ in anchors(inc, job):
        if aid == anchor:
            return max(0.0, now - t)
    return None
