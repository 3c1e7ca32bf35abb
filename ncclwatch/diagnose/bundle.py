"""An evidence bundle (``ncclwatch dump``, daemon/bundle.py) read back by ``diagnose``.

The bundle holds the daemon's live verdict, made while the job still ran,
from every rank's stacks: stronger evidence than logs written before the
watchdog fired, which name no culprit of a stall. Its stall becomes the
verdict when the logs given beside it find no failure (or none they can
name); logs that do name one (a crash after the dump) keep theirs, and the
live verdict is added as a note.
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
#: The member that marks a tar as a bundle, and the format it must state.
MARKER, FORMAT = "bundle.json", "ncclwatch-bundle/1"
#: Bytes read of any one member (the daemon writes far less).
MAX_MEMBER = 64 << 20


@dataclass(frozen=True)
class LiveVerdict:
    path: str
    job: str
    stall: dict[str, Any] | None   # incident_view: the active stall, else the newest ended

    @property
    def cls(self) -> str:
        return CLASS_OF_KIND.get(self.stall["kind"], "unknown") if self.stall else "none"


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
                if m.isfile() and base in (MARKER, "verdict.json") and m.size <= MAX_MEMBER:
                    f = tar.extractfile(m)
                    docs[base] = json.loads(f.read()) if f else None
    except (tarfile.TarError, OSError, ValueError):
        return None
    head = docs.get(MARKER)
    if not isinstance(head, dict) or head.get("format") != FORMAT:
        return None
    stalls = (docs.get("verdict.json") or {}).get("stalls") or []
    active = [s for s in stalls if s.get("active")]
    return LiveVerdict(str(path), str(head.get("job", "")), (active or stalls or [None])[0])


def ranks(items: list) -> list[int]:
    """Rank numbers of a view's rank list (members of unknown rank left out)."""
    return [r for r in items if isinstance(r, int)]


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
    return out
