"""Jobs placed on shards of daemons: ids chosen so that each shard owns one."""

from __future__ import annotations

from ncclwatch.shard import shard


def jobs_on(n: int, prefix: str = "job-") -> list[str]:
    """One job id per shard of ``n``, the first ``<prefix><i>`` that hash there."""
    out: dict[int, str] = {}
    i = 0
    while len(out) < n:
        out.setdefault(shard(f"{prefix}{i}", n), f"{prefix}{i}")
        i += 1
    return [out[k] for k in range(n)]
