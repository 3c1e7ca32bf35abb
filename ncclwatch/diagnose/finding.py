"""What a diagnose rule concludes from the logs, and how it names ranks.

A rule (rules/) reads the Facts and returns a LogFinding or None; the verdict
(verdict.py) takes the first. Apart from facts.py so the shape of a rule's
answer is one small type that the rules, the verdict and the output share.
(The daemon's live ``Finding`` is another thing: daemon/detect/.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from ncclwatch.diagnose.facts import Facts
from ncclwatch.model import rank_ranges


@dataclass
class LogFinding:
    cls: str
    initiating: list[int]
    collateral: list[int]
    root_cause: str
    summary: str
    evidence: list[tuple[str, str]] = field(default_factory=list)  # (where, why)
    notes: list[str] = field(default_factory=list)
    #: Where the initiator is not known: the ranks it must be among (those the
    #: evidence leaves, usually the ones that never reported).
    candidates: list[int] = field(default_factory=list)
    #: What evidence the verdict lacked, and what to collect next time.
    missing: list[str] = field(default_factory=list)
    collect: list[str] = field(default_factory=list)


Rule = Callable[[Facts], "LogFinding | None"]


def who(ranks: Sequence[int], one: str = "", many: str = "") -> str:
    """'rank 0 was' / 'ranks 1-3 were' (verb optional)."""
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}" + (f" {one}" if one else "")
    return f"ranks {rank_ranges(ranks)}" + (f" {many}" if many else "")
