"""What a run keeps under artifacts/: logs of the processes it started, and measurements."""

from __future__ import annotations

import json

from tests.harness.paths import ARTIFACTS


def keep(name: str, text: str) -> None:
    """Write ``text`` as artifacts/NAME (a log, a table) for people and CI."""
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / name).write_text(text)


def record(name: str, data: dict) -> None:
    """Keep a measurement of an e2e run under artifacts/ (for notes and CI logs)."""
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / "e2e-measurements.json"
    current = json.loads(path.read_text()) if path.exists() else {}
    current[name] = data
    path.write_text(json.dumps(current, indent=1))
    print(f"\n[measurement] {name}: {json.dumps(data)}")


def stop_keeping_logs(procs) -> None:
    """Stop each process (``procs.Proc``), the last started first, keeping its output
    as artifacts/NAME.log."""
    for p in reversed(procs):
        p.stop()
        keep(f"{p.name}.log", p.output())
