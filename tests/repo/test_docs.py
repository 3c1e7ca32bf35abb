"""README.md, BENCHMARKS.md and docs/ are reference: no tracker references
("issue 26", "(#12)": history belongs in git and bench/HISTORY.md), and every
relative link names a file that is there."""

from __future__ import annotations

import re
from pathlib import Path

from tests.harness.paths import ROOT

PAGES = sorted([ROOT / "README.md", ROOT / "BENCHMARKS.md", *(ROOT / "docs").rglob("*.md")])
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


def test_benchmark_commands_are_in_the_repo() -> None:
    """Every `python -m bench.X ...` / `bench/X.py ...` that BENCHMARKS.md
    names is a script under bench/, and each of its flags is one the script
    takes (figures from scripts not in the repository are marked ad hoc)."""
    text = (ROOT / "BENCHMARKS.md").read_text()
    wrong = []
    for m in re.finditer(r"(?:-m bench\.(\w+)|bench/(\w+)\.py)((?: [^`\n]*)?)", text):
        name = m.group(1) or m.group(2)
        script = ROOT / "bench" / f"{name}.py"
        if not script.exists():
            wrong.append(f"bench/{name}.py is not in the repo")
            continue
        source = script.read_text()
        for flag in re.findall(r"(?<!\S)(--[a-z][\w-]*)", m.group(3)):
            if f'"{flag}"' not in source:
                wrong.append(f"bench/{name}.py takes no {flag}")
    assert not wrong, "\n".join(sorted(set(wrong)))
