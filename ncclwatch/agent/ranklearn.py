"""A rank's number learned after start, from what the job itself already holds.

A member whose environment and process tree name no number (a Ray Train
worker, an ``mp.spawn`` worker across nodes, a rank given on its command
line) is numbered when the job shows it, cheapest first (``SOURCES``),
without pausing the rank or signalling it:

- its Flight Recorder dump (torch names the file by the rank's number);
- Ray Train's own log of the worker (``raytrainlog``);
- a set-up frame's locals in a nonblocking dump the agent takes anyway
  (``ranklocals``; only while unnumbered, at most ``LOCALS_DUMPS`` per rank).

Each number keeps its source (``rank_source``). A rank 0 found as its
TCPStore's server (Ray's, a hand-rolled ``tcp://`` rendezvous's) and a
number from the process's own ``--rank`` (``args:--rank``, discovery's
``rendezvous`` members) are checked against the others too. Two sources
that disagree number nothing: the member stays unnumbered and both are shown
(``rank_conflict``). Nothing a rank supplies is executed: its texts are
parsed as numbers only.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace

from ncclwatch.agent import frpipe, ranklocals, raytrain, raytrainlog, rendezvous
from ncclwatch.agent.discover import RankProcess
from ncclwatch.jobid import UNKNOWN_RANK, UNKNOWN_SOURCE
from ncclwatch.sanitize import for_log

log = logging.getLogger(__name__)

#: The sources, cheapest first (how each is read: the module docstring);
#: ``tcpstore_server``: discovery's rank 0 of a Ray job, checked against Ray's log.
SOURCES = ("tcpstore_server", "args", "flight_recorder", "ray_train_log", "locals")
#: Nonblocking dumps of one unnumbered rank that ask py-spy for locals.
LOCALS_DUMPS = 30
#: Seconds between two reads of a Ray Train worker's log, and for how long.
RAY_LOG_EVERY = 1.0
RAY_LOG_PATIENCE = 600.0


@dataclass(slots=True)
class Learned:
    """The numbers the job showed for one process, by source."""

    claims: dict[str, tuple[int, int]] = field(default_factory=dict)  # source -> (rank, world)
    locals_dumps: int = 0
    ray_log_at: float | None = None
    ray_log_since: float | None = None

    def claim(self, source: str, rank: int, world: int = 0) -> bool:
        """A number shown by ``source``; True when it changed what is known."""
        if rank < 0 or self.claims.get(source, (None,))[0] == rank:
            return False
        self.claims[source] = (rank, max(0, world))
        return True

    def verdict(self) -> tuple[int, int, str, str] | None:
        """(rank, world size, source, conflict): the number every source agrees
        on (source: the cheapest one that showed it), or (-1, 0, "",
        "<source>:<rank> ...") when they disagree; None: none shown."""
        if not self.claims:
            return None
        ranks = {r for r, _ in self.claims.values()}
        order = sorted(self.claims, key=_cost)
        if len(ranks) > 1:
            return (-1, 0, "", " ".join(f"{s}:{self.claims[s][0]}" for s in order))
        world = max(w for _, w in self.claims.values())
        return (ranks.pop(), world, order[0], "")

    def wants_locals(self) -> bool:
        return not self.claims and self.locals_dumps < LOCALS_DUMPS

    def ray_log_due(self, now: float) -> bool:
        if self.claims.get("ray_train_log"):
            return False
        if self.ray_log_since is None:
            self.ray_log_since = now
        if now - self.ray_log_since > RAY_LOG_PATIENCE:
            return False
        return self.ray_log_at is None or now - self.ray_log_at >= RAY_LOG_EVERY


def _checked(source: str) -> bool:
    """A number discovery found from outside that the job's own sources check."""
    return source == raytrain.STORE_SOURCE or source.startswith(f"{rendezvous.ARGS_SOURCE}:")


def _cost(source: str) -> int:
    base = source.split(":", 1)[0]
    return SOURCES.index(base) if base in SOURCES else len(SOURCES)


class RankLearner:
    """The numbers learned for this node's unnumbered members, by process."""

    def __init__(self, proc: str = "/proc") -> None:
        self._proc = proc
        self._by: dict[tuple[int, float], Learned] = {}
        self.learned_total = 0
        self.conflicts_total = 0

    def _of(self, rp: RankProcess) -> Learned:
        key = (rp.pid, rp.create_time)
        got = self._by.get(key)
        if got is None:
            got = self._by[key] = Learned()
        return got

    def apply(self, procs: list[RankProcess], now: float) -> list[RankProcess]:
        """``procs`` with the numbers the job showed: each unnumbered member's
        cheap sources are read (bounded), then every source's verdict applied.
        Processes gone are forgotten."""
        live = {(rp.pid, rp.create_time) for rp in procs}
        for key in self._by.keys() - live:
            del self._by[key]
        out = []
        for rp in procs:
            checked = rp.identity.known and _checked(rp.identity.rank_source)
            if rp.identity.known and not checked:
                out.append(rp)
                continue
            got = self._of(rp)
            if checked:   # discovery's number: the job's own sources must agree
                got.claims.setdefault(rp.identity.rank_source, (rp.identity.rank, 0))
            pipe = frpipe.pipe_rank(rp.pid, rp.local.get("TORCH_NCCL_DEBUG_INFO_PIPE_FILE", "")
                                    or rp.env.get("TORCH_NCCL_DEBUG_INFO_PIPE_FILE", ""),
                                    self._proc) if "flight_recorder" not in got.claims else None
            if pipe is not None:
                self._note(rp, got, "flight_recorder", pipe, 0)
            if rp.identity.job_source == raytrain.JOB_SOURCE and got.ray_log_due(now):
                got.ray_log_at = now
                shown = raytrainlog.world_rank(rp.pid, rp.container.container_pid, self._proc)
                if shown is not None:
                    self._note(rp, got, raytrainlog.SOURCE, *shown)
            out.append(numbered(rp, got.verdict()))
        return out

    def wants_locals(self, rp: RankProcess) -> bool:
        """Ask the next nonblocking dump of ``rp`` for locals (counted)."""
        if rp.identity.known:
            return False
        got = self._of(rp)
        if not got.wants_locals():
            return False
        got.locals_dumps += 1
        return True

    def no_locals(self, rp: RankProcess) -> None:
        """A dump with locals failed: the rank's stacks come without them."""
        self._of(rp).locals_dumps = LOCALS_DUMPS

    def from_locals(self, rp: RankProcess, threads: list) -> None:
        """Numbers a dump with locals showed (``ranklocals``)."""
        got = self._of(rp)
        for source, rank, world in ranklocals.claims(threads):
            self._note(rp, got, source, rank, world)

    def _note(self, rp: RankProcess, got: Learned, source: str, rank: int, world: int) -> None:
        if not got.claim(source, rank, world):
            return
        v = got.verdict()
        if v is not None and v[3]:
            self.conflicts_total += 1
            log.warning("pid %d of job %s: its rank is shown differently (%s): left "
                        "unnumbered", rp.pid, for_log(rp.identity.job_id), for_log(v[3]))
        else:
            self.learned_total += 1
            log.info("pid %d of job %s is rank %d (from %s)", rp.pid,
                     for_log(rp.identity.job_id), rank, for_log(source))


def numbered(rp: RankProcess, verdict: tuple[int, int, str, str] | None) -> RankProcess:
    """``rp`` with a learned number (or the disagreement) in its identity."""
    if verdict is None:
        return rp
    rank, world, source, conflict = verdict
    i = rp.identity
    if conflict:
        return replace(rp, identity=replace(i, rank=UNKNOWN_RANK, rank_source=UNKNOWN_SOURCE,
                                            rank_conflict=conflict))
    if i.known:
        return rp     # confirmed: the rank goes on as it was found
    return replace(rp, identity=replace(i, rank=rank, rank_source=source,
                                        world_size=i.world_size or world))
