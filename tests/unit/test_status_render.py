"""``ncclwatch status`` on a view recorded from ``make demo``: ncclwatch's own
multi-line fixes print as lines; what a job chose stays escaped.

``tests/data/status/demo_view.json`` is the daemon's ``/api/v1/jobs`` as
``python -m ncclwatch.demo`` had it when it printed its alert (rank 0 saving,
ranks 1-3 in barrier, the PyTorch fixes). To record it again: run the demo and
``curl http://127.0.0.1:7471/api/v1/jobs`` while it prints the budget.
"""

from __future__ import annotations

import json

from ncclwatch import status
from tests.harness.statusview import DAEMON, VIEW, assert_snippets_as_lines


def test_demo_status_prints_each_snippet_line_on_its_own_line() -> None:
    view = json.loads(VIEW.read_text())
    text = status.render(view, DAEMON)
    assert assert_snippets_as_lines(view, text) >= 10
    assert "\\x0a" not in text, text
    assert text.count("  fix for PyTorch: ") == 3, text


def test_snippets_are_split_before_escaping_and_job_text_stays_escaped() -> None:
    view = json.loads(VIEW.read_text())
    job = view["jobs"][0]
    job["job"] = "evil\n\x1b[2Jjob"
    job["stalls"][0]["diagnosis"]["fixes"][0]["snippet"] = "a = 1\nb = '\x1b[2J'"
    text = status.render(view, DAEMON)
    assert "\x1b" not in text
    assert "evil\\x0a\\x1b[2Jjob" in text  # what the job chose: one line, inert
    assert "      a = 1\n      b = '\\x1b[2J'\n" in text  # ours: lines, each escaped
