"""A real torch job as the tests see it: its launcher's process, its ranks' marker lines."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

import pytest

from tests.harness.procs import Proc

#: The line ``ncclwatch.demo.job`` (and every workload) prints at each phase of a rank.
MARKER = re.compile(r"NCCLWATCH_DEMO phase=(\S+) rank=(\d+) pid=(\d+) t=([\d.]+)(.*)")


@dataclass
class Job:
    proc: Proc
    world: int

    def markers(self, phase: str) -> list[dict]:
        out = []
        for _, line in self.proc.lines:
            m = MARKER.search(line)
            if m and m.group(1) == phase:
                extra = dict(kv.split("=", 1) for kv in m.group(5).split() if "=" in kv)
                out.append({"rank": int(m.group(2)), "pid": int(m.group(3)),
                            "t": float(m.group(4)), **extra})
        return out

    def wait_marker(self, phase: str, timeout: float, count: int = 1) -> list[dict]:
        deadline = time.time() + timeout
        while time.time() < deadline:
            found = self.markers(phase)
            if len(found) >= count:
                return found
            if not self.proc.alive():
                break
            time.sleep(0.1)
        pytest.fail(f"job never reached phase {phase!r} (x{count}) within {timeout}s; "
                    f"output:\n{self.proc.output()[-4000:]}")

    def pids(self) -> set[int]:
        return {m["pid"] for m in self.markers("ready")}
