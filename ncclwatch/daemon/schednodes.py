"""Which nodes the scheduler put a job on: evidence for who owns its ranks.

A node's certificate proves which node speaks, never which ranks run there;
a process age is the claimant's word. The scheduler's node list is what can
corroborate a claim (ownership.py): Slurm's ``SLURM_JOB_NODELIST`` (or
``SLURM_NODELIST``, ``SLURM_STEP_NODELIST``) in a job's allowlisted
environment, in Slurm's hostlist form (``gpu[001-004,010],login1``), as the
job's other nodes state it. The daemon does not ask Slurm itself; a node
that took one unreported rank states the job's environment too, so only a
list stated alike by nodes other than the claimant counts (``agreed``).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping

NODELIST_VARS = ("SLURM_JOB_NODELIST", "SLURM_STEP_NODELIST", "SLURM_NODELIST")
#: A list naming more nodes than this is no evidence (and no unbounded work).
MAX_NODES = 65536
_BRACKET = re.compile(r"\[([^\[\]]*)\]")


def _split_top(text: str) -> list[str]:
    """Split at the commas outside brackets."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(text[start:i])
            start = i + 1
    out.append(text[start:])
    return out


def _range(spec: str) -> list[str] | None:
    out: list[str] = []
    for part in spec.split(","):
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            return None
        if not sep:
            out.append(lo)
            continue
        a, b = int(lo), int(hi)
        if b < a or len(out) + b - a + 1 > MAX_NODES:
            return None
        out += [str(n).zfill(len(lo)) for n in range(a, b + 1)]
    return out


def expand(hostlist: str) -> frozenset[str] | None:
    """The names a Slurm hostlist names; None if it is not one (or too long)."""
    names: set[str] = set()
    for item in _split_top(hostlist.strip()):
        item = item.strip()
        if not item:
            continue
        parts = [""]
        pos = 0
        for m in _BRACKET.finditer(item):
            alts = _range(m.group(1))
            if alts is None or len(parts) * len(alts) > MAX_NODES:
                return None
            prefix = item[pos:m.start()]
            parts = [p + prefix + a for p in parts for a in alts]
            pos = m.end()
        rest = item[pos:]
        if "[" in rest or "]" in rest:
            return None
        names.update(p + rest for p in parts)
        if len(names) > MAX_NODES:
            return None
    return frozenset(names) if names else None


def node_list(env: Mapping[str, str]) -> frozenset[str] | None:
    """The scheduler's node list in a job's environment; None: none there."""
    for var in NODELIST_VARS:
        value = env.get(var)
        if value:
            return expand(value)
    return None


#: Nodes other than the claimant that must state the same list.
MIN_WITNESSES = 2


def agreed(stated: Mapping[str, frozenset[str] | None], claimant: str) -> frozenset[str] | None:
    """The node list the job's other nodes agree on, or None.

    ``stated``: node -> the list that node's ranked members of the job state
    (None: none). The claimant's own word never counts: the list must be
    stated alike by at least MIN_WITNESSES other nodes and by more than half
    of the other nodes that state one.
    """
    votes: dict[frozenset[str], int] = {}
    for node, nodes in stated.items():
        if node != claimant and nodes is not None:
            votes[nodes] = votes.get(nodes, 0) + 1
    total = sum(votes.values())
    for nodes, n in votes.items():
        if n >= MIN_WITNESSES and 2 * n > total:
            return nodes
    return None


def corroborates(stated: Mapping[str, frozenset[str] | None], claimant: str,
                 owners: Collection[str]) -> bool:
    """The scheduler puts ``claimant`` in the job and none of ``owners``, as
    the job's other nodes agree (``agreed``); what the claimant states,
    with a claim or with ranks it took first, is its own word."""
    nodes = agreed(stated, claimant)
    return nodes is not None and claimant in nodes and not any(o in nodes for o in owners)
