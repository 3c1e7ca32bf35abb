"""bench/gpu_probe.py without a GPU: a clear refusal (exit 2), nothing started or written.

The probe itself needs NVIDIA GPUs and NCCL (issue 26 item 6); CI never has
them, so this runs its no-GPU path for real: the script, in a child process,
with every CUDA device hidden. And its verdict over a recorded timeline.
"""

from __future__ import annotations

import os
import subprocess
import sys

from bench.gpu_probe import verdict
from tests.harness.paths import ROOT


def test_no_gpu_is_a_clear_exit_2_and_writes_nothing(tmp_path) -> None:
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "bench.gpu_probe", "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(ROOT)})
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "gpu_probe: cannot run here: no NVIDIA GPU" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
    assert not out.exists()


def _point(t: float, stalls: list[dict]) -> dict:
    return {"t": t, "counters": {}, "daemon": {"ranks": [], "stalls": stalls}}


def test_verdict_splits_the_run_at_the_save() -> None:
    marks = [{"phase": "train_start", "rank": 0, "t": 100.0, "extra": ""},
             {"phase": "save_start", "rank": 0, "t": 250.0, "extra": ""}]
    stall = {"kind": "checkpoint_gather", "culprits": [(0, "saving")]}
    timeline = [_point(200.0, []), _point(255.0, []), _point(261.5, [stall])]
    pauses = [{"rank": 1, "t": 180.0, "seconds": 0.4, "tracer": "py-spy --native"},
              {"rank": 2, "t": 258.0, "seconds": 0.5, "tracer": "py-spy --native"}]
    v = verdict(marks, timeline, pauses)
    assert v["healthy_seconds"] == 150.0 and v["healthy_alarms"] == []
    assert (v["healthy_pauses"], v["healthy_paused_seconds"], v["stall_pauses"]) == (1, 0.4, 1)
    assert v["stall_found"] and v["stall_delay_seconds"] == 11.5 and v["stall"] == stall
    alarm = verdict(marks, [_point(200.0, [{"kind": "collective_hang"}])], [])
    assert alarm["healthy_alarms"] == ["collective_hang"] and not alarm["stall_found"]
