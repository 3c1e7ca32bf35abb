"""The time budgets (tests/harness/budgets.py) fail a session that runs past them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.harness import suitetimes
from tests.harness.paths import BIN, ROOT

SUITE = '''
import time
import pytest

@pytest.mark.budget(0.2)
def test_slow():
    time.sleep(0.5)

@pytest.mark.budget(30)
def test_within():
    time.sleep(0.5)
'''


def _run(tmp_path: Path, *extra: str, env: dict[str, str] | None = None):
    """The suite in its own pytest. Under a loaded CI run an xdist session's
    start or end once took 73 s (1 in 120 beside a CPU hog) and once over
    120 s: the bound is wide, and a session past it fails with the stacks of
    its processes (py-spy), the evidence the next time it happens."""
    (tmp_path / "test_suite.py").write_text(SUITE)
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.harness.budgets", "-o", "addopts=",
         "-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(tmp_path), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "NCCLWATCH_TIMES_NAME": "", **(env or {})})
    try:
        out, err = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        stacks = _stacks(proc.pid)
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"the inner session ran past 300 s\n{out}\n{err}\n{stacks}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _stacks(pid: int) -> str:
    """py-spy's dump of the session and each of its descendants."""
    try:
        tree = [pid] + [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return ""
    dumps = []
    for p in tree:
        try:
            dumps.append(subprocess.run([str(BIN / "py-spy"), "dump", "--pid", str(p)], capture_output=True,
                                        text=True, timeout=30).stdout)
        except (OSError, subprocess.TimeoutExpired) as e:
            dumps.append(f"pid {p}: {e}")
    return "\n".join(dumps)


def test_a_test_past_its_budget_fails_the_session_with_its_name_and_time(tmp_path) -> None:
    proc = _run(tmp_path, "--durations=5")
    assert proc.returncode == 1, proc.stdout
    assert "2 passed" in proc.stdout
    past = proc.stdout.split("tests past their time budget")[1]
    assert "test_suite.py::test_slow" in past and "test_within" not in past, proc.stdout
    assert "> " in past and "0s" in past
    # below the durations' list, where a log's tail still shows it
    assert proc.stdout.index("slowest 5 durations") < proc.stdout.index("tests past their time budget")


def test_turned_off_the_list_is_still_printed(tmp_path) -> None:
    proc = _run(tmp_path, env={"NCCLWATCH_BUDGETS": "0"})
    assert proc.returncode == 0, proc.stdout
    assert "tests past their time budget" in proc.stdout


@pytest.mark.budget(330)  # past _run's own 300 s bound, so that bound is what fails
def test_under_xdist_the_controller_sees_every_budget(tmp_path) -> None:
    proc = _run(tmp_path, "-n", "2")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "test_suite.py::test_slow" in proc.stdout.split("tests past their time budget")[1]


def test_a_session_leaves_its_times_and_the_section_is_written_from_them(tmp_path) -> None:
    out = tmp_path / "artifacts"
    (tmp_path / "test_suite.py").write_text(SUITE)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.harness.budgets", "-o", "addopts=",
         "-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(tmp_path)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT), "NCCLWATCH_TIMES_NAME": "units",
             "NCCLWATCH_BUDGETS": "0", "NCCLWATCH_ARTIFACTS": str(out)})
    assert proc.returncode == 0, proc.stdout
    times = json.loads((out / "test-times-units.json").read_text())
    assert times["count"] == 2 and times["wall_s"] >= 1.0, times
    slow = next(t for t in times["tests"] if t.endswith("::test_slow"))
    assert times["tests"][slow]["budget_s"] == 0.2 and times["tests"][slow]["s"] >= 0.5

    text = suitetimes.section({"units": times}, "here")
    assert "| units | 2 | 1 |" in text and "::test_slow` " in text, text
    assert "(budget 0)" in text and "(budget 30)" in text, text
    doc = "# B\n\n## A\nx\n\n## The test suite\nold\n\n## Z\nz\n"
    new = suitetimes.replaced(doc, text)
    assert "old" not in new and new.startswith("# B\n\n## A\nx\n\n## The test suite\n")
    assert new.endswith("## Z\nz\n") and new.count("## The test suite") == 1
    assert suitetimes.replaced("# B\n", text).endswith(text)


#: Where a time of the whole suite (or the matrix) may be stated: the generated section.
SUITE_TIME = re.compile(r"(make (test|scenarios)|test suite|the matrix)[^.]{0,120}?"
                        r"\b\d+(\.\d+)?(-\d+)? ?(min|minutes)\b", re.I | re.S)


def test_no_page_states_the_suites_time_by_hand() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    found = [f"{p.relative_to(ROOT)}: {m.group(0)!r}" for p in pages
             for m in SUITE_TIME.finditer(p.read_text())]
    assert not found, ("times of the suite belong to BENCHMARKS.md's generated section "
                       "(python -m tests.harness.suitetimes):\n" + "\n".join(found))


#: "N rows" (of the matrix) and "N tests" (of the suite), as a page or comment states them.
STATED_COUNT = re.compile(r"\b(\d[\d,]*) (matrix rows|rows|scenarios|tests)\b(?![/\w]|\.\w)")


def test_counts_of_rows_and_tests_are_the_real_ones_or_unstated() -> None:
    """A count of the matrix's rows must be len(SCENARIOS); a count of the suite's
    tests belongs to BENCHMARKS.md's generated section only (it changes weekly)."""
    from tests.harness.scenarios import SCENARIOS
    texts = [ROOT / "README.md", ROOT / "Makefile", *sorted((ROOT / "docs").glob("*.md")),
             *sorted(p for p in (ROOT / "tests").rglob("*.py")
                     if "data" not in p.relative_to(ROOT / "tests").parts)]
    wrong = []
    for path in texts:
        for m in STATED_COUNT.finditer(path.read_text()):
            n, what = int(m.group(1).replace(",", "")), m.group(2)
            if what == "tests" or (what != "tests" and n != len(SCENARIOS)):
                wrong.append(f"{path.relative_to(ROOT)}: {m.group(0)!r}")
    # this module's own pattern text names no count
    assert not wrong, (f"the matrix has {len(SCENARIOS)} rows; the suite's count is "
                       "written by python -m tests.harness.suitetimes:\n" + "\n".join(wrong))
