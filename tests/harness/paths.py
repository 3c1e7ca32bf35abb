"""Where things are: the checkout, the venv's programs, the test data, the workloads, artifacts/."""

from __future__ import annotations

import os
import sys
from pathlib import Path

#: The checkout (the repository's root).
ROOT = Path(__file__).resolve().parents[2]
#: The running venv's bin/: ncclwatch, torchrun and py-spy as ``make test`` installs them.
BIN = Path(sys.executable).parent
#: Recordings and corpora the tests read (tests/data).
DATA = ROOT / "tests" / "data"
#: Programs the tests run as jobs (tests/workloads).
WORKLOADS = ROOT / "tests" / "workloads"
#: What a run keeps for people and CI logs: process logs, screenshots, measurements.
ARTIFACTS = Path(os.environ.get("NCCLWATCH_ARTIFACTS") or ROOT / "artifacts")
