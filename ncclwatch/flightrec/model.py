"""The Flight Recorder model: one rank's dump, its ops, per-group progress, the verdict.

Types only (as torch's flight_recorder ``components/types.py``): ``load``
builds them from dumps, ``analyze`` from each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class FlightRecorderError(ValueError):
    """A dump that cannot be read: names the file and what is wrong with it."""


@dataclass(frozen=True, slots=True)
class FrEntry:
    """One recorded op. ``seq`` is ``collective_seq_id`` (``p2p_seq_id`` for p2p)."""

    pg_id: str
    pg_name: str
    seq: int
    is_p2p: bool
    op: str                  # "all_reduce", "broadcast", "barrier", "send", ... (no backend prefix)
    backend: str             # "nccl", "gloo", ... ("" when the name has no prefix)
    state: str               # "scheduled" | "started" | "completed" as recorded
    completed: bool          # by the backend's semantics (module docstring)
    input_sizes: tuple[tuple[int, ...], ...]
    output_sizes: tuple[tuple[int, ...], ...]
    timeout_ms: int | None
    time_created_ns: int | None
    frames: tuple[tuple[str, str, int], ...]   # (name, filename, line), innermost first
    record_id: int | None = None
    retired: bool = False
    pg_desc: str = ""
    thread_name: str = ""


@dataclass(frozen=True, slots=True)
class PgInfo:
    pg_id: str
    name: str
    desc: str
    ranks: tuple[int, ...]   # global ranks of the group; () when the dump does not say


@dataclass(frozen=True, slots=True)
class FrDump:
    rank: int | None
    version: str
    path: str
    pgs: dict[str, PgInfo]                       # by pg_id
    entries: tuple[FrEntry, ...]
    status: dict[str, tuple[int, int, int]]      # pg_id -> (last_enqueued, last_started, last_completed)
    backend: str = ""
    comm_lib_version: str = ""
    configured: dict[str, tuple[int, ...]] = field(default_factory=dict)  # pg name -> ranks (pg_config)
    status_from_entries: bool = False            # no pg_status in this version: derived


@dataclass(frozen=True, slots=True)
class PgProgress:
    """How far one rank got in one process group: what the agent ships."""

    pg_id: str
    pg_name: str
    ranks: tuple[int, ...]          # members as the dump says (() when it does not: gloo)
    last_enqueued: int
    last_started: int
    last_completed: int
    pending_op: str                 # the first collective enqueued and not completed ("" if none)
    pending_seq: int                # its sequence number (0 if none)
    pending_timeout_ms: int | None
    pending_since_ns: int | None    # its time_created_ns (wall clock of the rank)
    pending_sizes: tuple            # its input sizes
    pending_output_sizes: tuple = ()
    pg_desc: str = ""
    backend: str = ""
    timeout_ms: int | None = None   # the group's timeout as last recorded
    last_op: str = ""               # the op of the last collective enqueued ("" if unknown)

    def to_json(self) -> dict[str, Any]:
        return {
            "pg_id": self.pg_id, "pg_name": self.pg_name, "ranks": list(self.ranks),
            "last_enqueued": self.last_enqueued, "last_started": self.last_started,
            "last_completed": self.last_completed, "pending_op": self.pending_op,
            "pending_seq": self.pending_seq, "pending_timeout_ms": self.pending_timeout_ms,
            "pending_since_ns": self.pending_since_ns,
            "pending_sizes": [list(s) for s in self.pending_sizes],
            "pending_output_sizes": [list(s) for s in self.pending_output_sizes],
            "pg_desc": self.pg_desc, "backend": self.backend, "timeout_ms": self.timeout_ms,
            "last_op": self.last_op,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> PgProgress:
        return cls(
            pg_id=str(d["pg_id"]), pg_name=str(d["pg_name"]), ranks=tuple(int(r) for r in d.get("ranks", ())),
            last_enqueued=int(d["last_enqueued"]), last_started=int(d.get("last_started", -1)),
            last_completed=int(d["last_completed"]), pending_op=str(d.get("pending_op", "")),
            pending_seq=int(d.get("pending_seq", 0)), pending_timeout_ms=d.get("pending_timeout_ms"),
            pending_since_ns=d.get("pending_since_ns"),
            pending_sizes=tuple(tuple(int(x) for x in s) for s in d.get("pending_sizes", ())),
            pending_output_sizes=tuple(tuple(int(x) for x in s) for s in d.get("pending_output_sizes", ())),
            pg_desc=str(d.get("pg_desc", "")), backend=str(d.get("backend", "")),
            timeout_ms=d.get("timeout_ms"), last_op=str(d.get("last_op", "")))


@dataclass(frozen=True, slots=True)
class Stuck:
    """The first collective of a group that did not complete on every member."""

    pg_id: str
    pg_name: str
    seq: int
    op: str
    waiting_ranks: tuple[int, ...]     # enqueued it, not completed: blocked in it (collateral)
    missing_ranks: tuple[int, ...]     # members that never enqueued it: the culprits
    timeout_ms: int | None
    unreported_ranks: tuple[int, ...] = ()   # members with no dump: not known, never guessed
    since_ns: int | None = None        # earliest time_created_ns among the waiting ranks
    pg_desc: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"pg_id": self.pg_id, "pg_name": self.pg_name, "pg_desc": self.pg_desc, "seq": self.seq,
                "op": self.op, "waiting_ranks": list(self.waiting_ranks),
                "missing_ranks": list(self.missing_ranks), "unreported_ranks": list(self.unreported_ranks),
                "timeout_ms": self.timeout_ms, "since_ns": self.since_ns}


@dataclass(frozen=True, slots=True)
class Mismatch:
    """Same group and sequence number, different op or sizes across ranks (desync)."""

    pg_id: str
    seq: int
    ops: dict[int, tuple[str, tuple, tuple]]   # rank -> (op, input_sizes, output_sizes)
    pg_name: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"pg_id": self.pg_id, "pg_name": self.pg_name, "seq": self.seq,
                "ops": {str(r): {"op": o, "input_sizes": [list(s) for s in i],
                                 "output_sizes": [list(s) for s in out]}
                        for r, (o, i, out) in sorted(self.ops.items())}}


@dataclass
class FrAnalysis:
    progress: dict[int, list[PgProgress]]
    stuck: list[Stuck]
    mismatches: list[Mismatch]
    timeout_ms: int | None        # the stuck collective's watchdog timeout (else the default group's)
    unreported: tuple[int, ...] = ()   # members of some group that sent no dump

    def missing_ranks(self) -> list[int]:
        return sorted({r for s in self.stuck for r in s.missing_ranks})

    def waiting_ranks(self) -> list[int]:
        return sorted({r for s in self.stuck for r in s.waiting_ranks})

    def to_json(self) -> dict[str, Any]:
        return {
            "progress": {str(r): [p.to_json() for p in ps] for r, ps in sorted(self.progress.items())},
            "stuck": [s.to_json() for s in self.stuck],
            "mismatches": [m.to_json() for m in self.mismatches],
            "timeout_ms": self.timeout_ms,
            "missing_ranks": self.missing_ranks(),
            "waiting_ranks": self.waiting_ranks(),
            "unreported": list(self.unreported),
        }
