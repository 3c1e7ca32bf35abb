"""A reader that stops early: `ncclwatch install all | head -1` ends quietly.

The command runs as installed (the venv's ``ncclwatch`` script) with its stdout a
real pipe into ``head -1``. The pipe is made one page small and the command's
output (one line per file, each naming the long --root) many pages long, so
``head`` has taken its line and gone while the command still writes: every run
meets the closed pipe, none can finish first.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
from pathlib import Path

from ncclwatch.cli import EXIT_PIPE
from tests.harness.tools import need, need_system


def test_a_verb_piped_into_head_exits_quietly(tmp_path: Path) -> None:
    head_bin = need_system("head", "coreutils")
    root = tmp_path.joinpath(*["r" * 200] * 4)          # ~800 characters in every line
    read, write = os.pipe()
    fcntl.fcntl(write, fcntl.F_SETPIPE_SZ, 4096)
    head = subprocess.Popen([head_bin, "-1"], stdin=read, stdout=subprocess.PIPE)
    os.close(read)
    try:
        verb = subprocess.run([need("ncclwatch"), "install", "all", "--root", str(root)],
                              stdout=write, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write)
    first, _ = head.communicate(timeout=30)
    assert first.decode().startswith("units run "), first      # the verb's own first line
    assert verb.stderr == "", verb.stderr
    assert verb.returncode == EXIT_PIPE                        # it met the closed pipe
    # What it wrote before the closed pipe is in place (it stops there, as SIGPIPE would).
    assert (root / "etc" / "systemd" / "system" / "ncclwatch-agent.service").is_file()
