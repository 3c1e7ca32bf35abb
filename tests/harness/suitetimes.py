"""BENCHMARKS.md's section on the test suite, written from a run's own times.

``make test`` runs sessions (the unit tests beside the scenario matrix, then
the end-to-end tests); each leaves ``artifacts/test-times-<name>.json``
(tests/harness/budgets.py). ``python -m tests.harness.suitetimes`` writes
the section "The test suite": each session's wall time,
test count and slowest tests with their budgets, and the run's total. Times of
the suite are stated there and nowhere else (tests/repo/test_budgets.py checks
the docs), so no page can go stale by hand.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

from tests.harness.paths import ARTIFACTS, ROOT

HEADING = "## The test suite"
BENCHMARKS = ROOT / "BENCHMARKS.md"
#: The slowest tests listed per session.
SLOWEST = 8


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                              capture_output=True, timeout=10).stdout.strip() or "?"
    except OSError:
        return "?"


def section(runs: dict[str, dict], note: str) -> str:
    """The section's markdown for ``runs`` (session name -> its times JSON)."""
    lines = [HEADING, "",
             f"Written by `python -m tests.harness.suitetimes` from the times a `make test` "
             f"run left in artifacts/ (commit {_commit()}; {note}). Each test's budget "
             "(tests/harness/budgets.py) fails the run when passed.", "",
             "| session | tests | workers | wall |", "|---|---|---|---|"]
    for name, r in runs.items():
        lines.append(f"| {name} | {r['count']} | {r['workers'] or 1} | "
                     f"{r['wall_s'] / 60:.1f} min |")
    lines += ["", "Slowest tests (seconds, budget):", ""]
    for name, r in runs.items():
        for test, t in list(r["tests"].items())[:SLOWEST]:
            lines.append(f"- {name}: `{test}` {t['s']:.0f} s (budget {t['budget_s']:.0f})")
    return "\n".join(lines) + "\n"


def replaced(text: str, new: str) -> str:
    """``text`` with its section swapped for ``new`` (appended when absent)."""
    m = re.search(rf"^{re.escape(HEADING)}\n.*?(?=^## |\Z)", text, flags=re.M | re.S)
    if m is None:
        return text.rstrip("\n") + "\n\n" + new
    return text[:m.start()] + new + ("\n" if m.end() < len(text) else "") + text[m.end():]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--note", default="a fresh clone on the 2-core CI machine",
                   help="where the run was made")
    p.add_argument("--from", dest="source", type=Path, default=ARTIFACTS)
    a = p.parse_args(argv)
    runs = {f.stem.removeprefix("test-times-"): json.loads(f.read_text())
            for f in sorted(a.source.glob("test-times-*.json"))}
    if not runs:
        print(f"no test-times-*.json in {a.source}: run make test first", file=sys.stderr)
        return 2
    BENCHMARKS.write_text(replaced(BENCHMARKS.read_text(), section(runs, a.note)))
    print(f"wrote {HEADING!r} of {BENCHMARKS} from {', '.join(runs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
