"""Which daemon owns a job, when one daemon is not enough.

Jobs are independent (a stall is a condition over one job's ranks), so
daemons shard by job id: every agent sends a job's samples to the same
daemon, and each job's verdicts, incidents and metrics live on exactly one
daemon. The hash must be stable across processes, hosts and Python versions
(``hash()`` is salted per process), so it is CRC-32 of the UTF-8 job id.
Changing ``n`` moves jobs between daemons; a moved job starts fresh there
(the same as after a daemon restart).
"""

from __future__ import annotations

import zlib


def shard(job_id: str, n: int) -> int:
    """Index in ``range(n)`` of the daemon that owns ``job_id``: ``crc32(job_id) % n``."""
    if n < 1:
        raise ValueError(f"need at least one shard, got {n}")
    return zlib.crc32(job_id.encode("utf-8", "surrogateescape")) % n
