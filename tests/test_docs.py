"""README.md, BENCHMARKS.md and docs/ are reference: no tracker references
("issue 26", "(#12)": history belongs in git and bench/HISTORY.md), and every
relative link names a file that is there."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import ROOT

PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
TRACKER = re.compile(r"\bissues?\s+#?\d+|\(#\d+\)", re.I)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _rel(p: Path) -> str:
    return p.relative_to(ROOT).as_posix()


def test_no_tracker_references() -> None:
    found = [f"{_rel(p)}:{n}: {m.group(0)}" for p in PAGES
             for n, line in enumerate(p.read_text().splitlines(), 1)
             for m in TRACKER.finditer(line)]
    assert not found, "say what is, not which issue did it:\n" + "\n".join(found)


def test_relative_links_resolve() -> None:
    broken = []
    for p in PAGES:
        for m in LINK.finditer(p.read_text()):
            target = m.group(1).split("#")[0]
            if not target or re.match(r"[a-z]+:", target):
                continue
            if not (p.parent / target).exists():
                broken.append(f"{_rel(p)}: {m.group(1)}")
    assert not broken, "\n".join(broken)
