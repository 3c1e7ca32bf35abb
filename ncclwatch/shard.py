"""Which daemon owns a job, when one daemon is not enough.

Jobs are independent (a stall is a condition over one job's ranks), so
daemons shard by job id: every agent sends a job's samples to the same
shard (one daemon, or a highly available pair that each get them all), and
each job's verdicts, incidents and metrics live on exactly one shard.

The owner is chosen by rendezvous (highest random weight) hashing: each
shard scores the job, the highest score wins. Adding a shard at the end of
the list moves only the jobs the new shard wins, about 1/N of them, and
removing the last one moves only its own; every other job keeps its owner.
(``crc32 % n`` would move almost every job.) A shard is known by its place
in the list, so every agent and daemon must list the shards in the same
order; a moved job starts fresh on its new owner, as after a daemon restart.
The score must be stable across processes, hosts and Python versions
(``hash()`` is salted per process): BLAKE2b of the shard's index and the
UTF-8 job id.
"""

from __future__ import annotations

import functools
import hashlib
from typing import Sequence

#: Between shards in a flag or variable (a TOML list of lists in a file).
SHARD_SEP = ";"
#: Between the replicas of one shard (an HA pair): every one gets its jobs.
REPLICA_SEP = ","


def _score(job_id: bytes, index: int) -> int:
    digest = hashlib.blake2b(job_id, digest_size=8, key=str(index).encode(),
                             person=b"ncclwatch-shard").digest()
    return int.from_bytes(digest, "big")


@functools.lru_cache(maxsize=65536)   # job ids repeat every round; a few MiB at most
def shard(job_id: str, n: int) -> int:
    """Index in ``range(n)`` of the shard that owns ``job_id`` (rendezvous hashing)."""
    if n < 1:
        raise ValueError(f"need at least one shard, got {n}")
    if n == 1:
        return 0
    key = job_id.encode("utf-8", "surrogateescape")
    return max(range(n), key=lambda i: _score(key, i))


def _replicas(value: object) -> tuple[str, ...]:
    items = value if isinstance(value, (list, tuple)) else str(value).split(REPLICA_SEP)
    return tuple(str(t).strip() for t in items if str(t).strip())


def shard_list(value: object) -> tuple[tuple[str, ...], ...]:
    """Shards of addresses, each one daemon or an HA pair.

    ``"a:7470"`` (one daemon), ``"a:7470,b:7470"`` (one pair),
    ``"a0:7470,b0:7470;a1:7470,b1:7470"`` (two pairs); in TOML a list of
    strings is one pair (as before shards) and a list of lists (or of
    ``"a,b"`` strings inside a list of lists) is shards."""
    if isinstance(value, (list, tuple)):
        nested = any(isinstance(v, (list, tuple)) for v in value)
        groups: Sequence[object] = value if nested else [value]
    else:
        groups = str(value).split(SHARD_SEP) if str(value).strip() else []
    out = tuple(_replicas(g) for g in groups)
    if not out:
        raise ValueError("no daemon given")
    if any(not g for g in out):   # "a;;b": a shard's place would shift every job
        raise ValueError("a shard without a daemon")
    flat = [t for g in out for t in g]
    twice = sorted({t for t in flat if flat.count(t) > 1})
    if twice:
        raise ValueError(f"daemon given twice: {', '.join(twice)}")
    return out


def shard_text(shards: Sequence[Sequence[str]]) -> str:
    """The flag form of ``shard_list``'s result: ``a,b;c,d``."""
    return SHARD_SEP.join(REPLICA_SEP.join(g) for g in shards)
