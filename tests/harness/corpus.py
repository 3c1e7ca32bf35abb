"""The diagnose corpus as tests use it: its cases, the healthy ones, a case's input
files, and a case copied with lines put into its largest log."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.harness.paths import DATA

#: tests/data/diagnose: ``cases/`` made here, ``public/`` pasted in public issues.
DIAGNOSE = DATA / "diagnose"


def cases(root: Path) -> list[Path]:
    """The case folders under ``root`` (each holds an expected.json)."""
    return sorted(p for p in root.iterdir() if (p / "expected.json").exists())


#: Every case of both corpora whose verdict is "none".
HEALTHY = [c for c in cases(DIAGNOSE / "cases") + cases(DIAGNOSE / "public")
           if json.loads((c / "expected.json").read_text())["class"] == "none"]


def inputs(case: Path) -> list[Path]:
    """A case's logs and dumps, as ``diagnose`` is given them."""
    return sorted(p for p in case.rglob("*")
                  if p.is_file() and p.name not in ("expected.json", "README.md"))


def target(case: Path) -> Path:
    """The file a line goes into: the case's largest plain-text log."""
    texts = [p for p in inputs(case) if p.suffix != ".gz" and not p.name.startswith("nccl_trace")]
    return max(texts, key=lambda p: p.stat().st_size)


def with_lines(tmp: Path, case: Path, lines: list[str], at: float) -> tuple[list[Path], Path, int]:
    """The case copied to tmp with ``lines`` inserted at fraction ``at`` of its target
    file; returns the inputs, the target and the 1-based number of the first new line."""
    dst = tmp / case.name
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(case, dst)
    dest = dst / target(case).relative_to(case)
    old = dest.read_text(errors="replace").splitlines()
    i = round(at * len(old))
    dest.write_text("\n".join(old[:i] + lines + old[i:]) + "\n")
    return inputs(dst), dest, i + 1


def right(d, want: dict) -> bool:
    """A diagnosis ``d`` says what a case's expected.json ``want`` says: its class and
    initiating ranks, and where stated the initiator's candidates and the collateral."""
    ok = (d.cls, d.initiating) == (want["class"], sorted(want.get("initiating_ranks", [])))
    if "initiator_among" in want:
        ok = ok and d.candidates == sorted(want["initiator_among"])
    if "collateral_ranks" in want:
        ok = ok and d.collateral == sorted(want["collateral_ranks"])
    return ok
