"""Every shard's page, as one daemon is told it: owner links for the page and API.

The hash that picks a job's shard lives in ``ncclwatch.shard`` (agents use
it too); the URLs of each shard's page are the daemon's business, and the
links it builds to a job's page on its owner need ``links.job_anchor``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ncclwatch.daemon.links import job_anchor
from ncclwatch.shard import shard, shard_list


@dataclass(frozen=True)
class ShardMap:
    """Every shard's page (its daemons' URLs), as one daemon is told it.

    With it a daemon says which shard owns each of its jobs, links to the
    owner's page, and shows a job it does not own (agents with another map,
    mid-move) for what it is; ``ncclwatch status`` asks every shard."""

    urls: tuple[tuple[str, ...], ...]
    #: This daemon's shard (None: not told, and its own URL is in none).
    index: int | None = None

    @classmethod
    def parse(cls, urls: object, index: int | None, own_url: str = "") -> "ShardMap":
        groups = tuple(tuple(u.rstrip("/") for u in g) for g in shard_list(urls))
        if index is None:
            index = next((k for k, g in enumerate(groups) if own_url.rstrip("/") in g), None)
        elif not 0 <= index < len(groups):
            raise ValueError(f"shard {index} is not in the {len(groups)} shard(s) given")
        return cls(groups, index)

    def owner(self, job_id: str) -> int:
        return shard(job_id, len(self.urls))

    def view(self) -> dict[str, Any]:
        return {"count": len(self.urls), "self": self.index, "urls": [list(g) for g in self.urls]}

    def job_view(self, job_id: str) -> dict[str, Any]:
        """The owner of a job and its page there (one link per replica)."""
        k = self.owner(job_id)
        return {"index": k, "owned": None if self.index is None else k == self.index,
                "pages": [f"{u}/#{job_anchor(job_id)}" for u in self.urls[k]]}
