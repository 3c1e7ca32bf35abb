"""Each test's time budget: a test that grows past it fails ``make test``.

The suite's wall time is the sum of its slow tests, and a test that quietly
doubles goes unseen in a 30-minute run. Every test has a budget (setup, call
and teardown together): a per-kind default from ``DEFAULTS``, or its own from
``@pytest.mark.budget(seconds)`` where it is known to be slow. Budgets are
about 2-3x the time measured on a loaded 2-core machine (make test runs the unit
tests beside the scenario matrix), so a CPU hog beside the run stays inside them
and a real regression does not.

At the end of the session the tests past their budget are printed with their
time, last before the final count, and the session fails. ``NCCLWATCH_BUDGETS=0`` turns the failure off
(the list is still printed), for a run on a machine much slower than CI's.

Every session also writes what it measured to ``artifacts/test-times-<name>.json``
(each test's seconds and budget, the session's wall time and count), which
``python -m tests.harness.suitetimes`` turns into BENCHMARKS.md's section on
the suite: the only place a time of the suite is stated.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from tests.harness.paths import ARTIFACTS

#: Default budget (seconds) by the kind of test, first match wins: the scenario
#: matrix (one test, every row), an end-to-end test (real jobs), a unit test.
DEFAULTS: tuple[tuple[str, float], ...] = (
    ("scenarios", 1500.0),
    ("e2e", 240.0),
    ("unit", 120.0),
)

_spent: dict[str, float] = {}
_budget: dict[str, float] = {}
_started = time.time()


def _kind(item: pytest.Item) -> str:
    if "tests/scenarios/" in item.nodeid:
        return "scenarios"
    return "e2e" if item.get_closest_marker("e2e") else "unit"


def budget_of(item: pytest.Item) -> float:
    """The item's budget in seconds: its own mark, else its kind's default."""
    mark = item.get_closest_marker("budget")
    if mark is not None:
        return float(mark.args[0])
    return dict(DEFAULTS)[_kind(item)]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "budget(seconds): this test's time budget (tests/harness/budgets.py)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # on the item's reports (user_properties travel from an xdist worker to the
    # controller, which collects nothing itself)
    for item in items:
        item.user_properties.append(("budget_s", budget_of(item)))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _spent[report.nodeid] = _spent.get(report.nodeid, 0.0) + report.duration
    for key, value in report.user_properties:
        if key == "budget_s":
            _budget[report.nodeid] = float(value)


def over_budget() -> list[tuple[str, float, float]]:
    """(test, seconds spent, budget) of every test past its budget, slowest first."""
    over = [(t, s, _budget[t]) for t, s in _spent.items() if t in _budget and s > _budget[t]]
    return sorted(over, key=lambda x: -x[1])


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """Printed after ``--durations``' list, just above the final count: a CI log
    keeps only its tail, and the list above pushed this out of it once (a run
    with every test passed and ``make test`` failed, nothing in its tail saying why)."""
    over = over_budget()
    if not over:
        return
    terminalreporter.section("tests past their time budget (tests/harness/budgets.py)")
    for test, spent, budget in over:
        terminalreporter.line(f"{spent:8.1f}s > {budget:6.0f}s  {test}")


def _write(session: pytest.Session) -> None:
    """This session's times, for tests.harness.suitetimes (the controller's only,
    under xdist: a worker has a ``workerinput``)."""
    name = os.environ.get("NCCLWATCH_TIMES_NAME", "session")  # "": write nothing
    if hasattr(session.config, "workerinput") or not _spent or not name:
        return
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / f"test-times-{name}.json").write_text(json.dumps({
        "wall_s": round(time.time() - _started, 1), "count": len(_spent),
        "workers": getattr(session.config.option, "numprocesses", None) or 0,
        "tests": {t: {"s": round(s, 2), "budget_s": _budget.get(t)}
                  for t, s in sorted(_spent.items(), key=lambda x: -x[1])},
    }, indent=1))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _write(session)
    if over_budget() and os.environ.get("NCCLWATCH_BUDGETS", "1") != "0" \
            and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
