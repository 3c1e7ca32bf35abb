"""``ncclwatch diagnose`` on the corpus: every case's class and initiating ranks.

tests/data/diagnose/cases/<case>/ holds a failed (or healthy) job's logs and
Flight Recorder dumps as they were written, and expected.json with the
verdict a careful human reaches from them. Real cases come from gloo jobs
run here (tests/data/diagnose/make_corpus.py); the others are NCCL-era
excerpts written from the torch sources and public issue reports, each
naming its origin. The table of verdicts is printed with the test output.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ncclwatch.diagnose import diagnose
from ncclwatch.diagnose.logscan import scan
from ncclwatch.diagnose.logsigns import SIGNS
from ncclwatch.diagnose.verdict import CLASS_BY_ID

CORPUS = Path(__file__).parent / "data" / "diagnose" / "cases"
CASES = sorted(p for p in CORPUS.iterdir() if (p / "expected.json").exists()) \
    if CORPUS.is_dir() else []
#: Signs no case of the corpus shows yet (each says why).
UNCOVERED: dict[str, str] = {}


def _inputs(case: Path) -> list[Path]:
    return sorted(p for p in case.rglob("*")
                  if p.is_file() and p.name not in ("expected.json", "README.md"))


def _verdict(case: Path):
    return diagnose(_inputs(case)), json.loads((case / "expected.json").read_text())


def test_corpus_is_there():
    assert CASES, f"no cases under {CORPUS}: the corpus is part of the repository"
    classes = {json.loads((c / "expected.json").read_text())["class"] for c in CASES}
    missing = set(CLASS_BY_ID) - classes - {"unknown"}
    assert not missing, f"no corpus case of class {sorted(missing)}"


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_case(case):
    d, want = _verdict(case)
    assert want["class"] in CLASS_BY_ID, f"{case.name}: unknown class {want['class']!r}"
    got = (d.cls, d.initiating)
    assert got == (want["class"], sorted(want.get("initiating_ranks", []))), (
        f"{case.name}: got {got}, expected {want['class']} {want.get('initiating_ranks')}\n"
        f"summary: {d.summary}\nevidence: {d.evidence}")
    if "collateral_ranks" in want:
        assert d.collateral == sorted(want["collateral_ranks"]), case.name
    if d.cls not in ("none", "unknown"):
        assert d.evidence, f"{case.name}: a verdict without evidence lines"
        assert d.root_cause is not None and d.root_cause.fix


def test_corpus_table(capsys):
    """Print the verdict of every case (the acceptance table) and check them all."""
    rows, wrong = [], []
    for case in CASES:
        d, want = _verdict(case)
        ok = (d.cls, d.initiating) == (want["class"], sorted(want.get("initiating_ranks", [])))
        wrong += [] if ok else [case.name]
        rows.append(f"| {case.name} | {want['class']} {want.get('initiating_ranks', [])} | "
                    f"{d.cls} {d.initiating} | {'ok' if ok else 'WRONG'} | "
                    f"{want.get('origin', '')[:60]} |")
    with capsys.disabled():
        print("\n\n| case | expected | diagnosed | | origin |\n|---|---|---|---|---|")
        print("\n".join(rows))
    assert not wrong, f"wrong verdicts: {wrong}"


def test_every_sign_is_seen_in_the_corpus():
    """Each row of the sign table matches some line of the corpus (no dead rows)."""
    seen: set[str] = set()
    for case in CASES:
        r = scan(_inputs(case))
        seen |= {e.sign for e in r.evidence}
        if r.tracebacks:
            seen.add("traceback")
        if r.failures:
            seen |= {"summary_host", "summary_rank", "summary_exitcode"}
            if any(f.signame for f in r.failures):
                seen.add("summary_signal")
            if any(f.root for f in r.failures):
                seen.add("summary_root")
        if r.world_sizes:
            seen.add("world_size")
    dead = {s.id for s in SIGNS} - seen - set(UNCOVERED)
    assert not dead, f"signs no corpus line matches: {sorted(dead)}"
