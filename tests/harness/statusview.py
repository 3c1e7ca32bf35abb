"""``ncclwatch status`` on the view recorded from ``make demo`` (tests/data/status/demo_view.json).

The view is the daemon's ``/api/v1/jobs`` as ``python -m ncclwatch.demo`` had it
when it printed its alert (rank 0 saving, ranks 1-3 in barrier, the PyTorch fixes).
"""

from __future__ import annotations

import json

from ncclwatch import status
from tests.harness.paths import DATA

VIEW = DATA / "status" / "demo_view.json"
DAEMON = "http://127.0.0.1:7471"


def demo_text() -> str:
    """What ``ncclwatch status`` prints for the recorded view."""
    return status.render(json.loads(VIEW.read_text()), DAEMON)


def assert_snippets_as_lines(view: dict, text: str) -> int:
    """Every line of every fix's snippet is a line of ``text`` (indented 6),
    in order. Returns how many snippet lines."""
    lines = text.splitlines()
    n = 0
    for job in view["jobs"]:
        for stall in job["stalls"]:
            for fx in (stall.get("diagnosis") or {}).get("fixes", []):
                want = [f"      {ln}" if ln else "" for ln in fx["snippet"].splitlines()]
                start = next((i for i in range(len(lines))
                              if lines[i:i + len(want)] == want), None)
                assert start is not None, f"snippet of {fx['remedy']} not as lines:\n{text}"
                n += len(want)
    return n
