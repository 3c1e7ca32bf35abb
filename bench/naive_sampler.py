"""The naive baseline: py-spy every rank every second (ByteRobust-style periodic stacks).

Finds the ranks like the agent does (RANK in /proc/PID/environ) and dumps
each of them once per second, nonblocking, whatever they do.
"""

from __future__ import annotations

import subprocess
import sys
import time

from ncclwatch.agent.discover import Discovery
from ncclwatch.agent.pyspy import dump_argv, find_pyspy


def main() -> int:
    interval = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0
    binary = find_pyspy()
    discovery = Discovery("bench")
    next_at = time.monotonic()
    while True:
        for rank in discovery.scan():
            subprocess.run(dump_argv(binary, rank.pid), capture_output=True, timeout=5)
        next_at += interval
        time.sleep(max(0.0, next_at - time.monotonic()))


if __name__ == "__main__":
    sys.exit(main())
