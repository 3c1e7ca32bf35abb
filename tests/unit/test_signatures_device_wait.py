"""NCCL-shaped waits: ranks blocked at a device sync instead of a c10d frame.

No GPU here, so the dumps are GPU-shaped: a real py-spy fixture of a gloo
rank waiting in barrier, with the c10d frames replaced by what an NCCL rank
shows once its CPU has run ahead of the stuck collective (DESIGN.md,
torch-signals.md): ``torch.cuda.synchronize``, ``Event.synchronize``.
"""

from __future__ import annotations

import json

import pytest

from ncclwatch.daemon.core import Daemon, DaemonConfig
from ncclwatch.model import CollectiveOp, RankState, StallKind
from ncclwatch.signatures import classify
from ncclwatch.stacks import Frame
from tests.harness import paths
from tests.harness.reports import report, sample

DATA = paths.DATA / "pyspy"
TORCH = "/usr/lib/python3.11/site-packages/torch"

#: (name, frames replacing the c10d ones, expected state)
GPU_SHAPES = [
    ("torch.cuda.synchronize", [("synchronize", f"{TORCH}/cuda/__init__.py", 1085)],
     RankState.DEVICE_WAIT),
    ("Event.synchronize", [("Event.synchronize", f"{TORCH}/cuda/streams.py", 227)],
     RankState.DEVICE_WAIT),
    ("Stream.synchronize", [("Stream.synchronize", f"{TORCH}/cuda/streams.py", 112)],
     RankState.DEVICE_WAIT),
    # .item() is C++: no Python frame, the user line is on top. Without a
    # native dump this reads as compute; only the time it stays there tells.
    ("loss.item()", [], RankState.COMPUTE),
]


def _waiting_rank_frames() -> list[Frame]:
    threads = json.loads((DATA / "slow-save__rank1.json").read_text())
    frames = [Frame(f["name"], f["filename"], f["line"]) for f in threads[0]["frames"]]
    assert frames[0].name == "barrier", "fixture changed: expected a rank in barrier"
    return frames


@pytest.mark.parametrize("name, top, state", GPU_SHAPES, ids=[g[0] for g in GPU_SHAPES])
def test_gpu_shaped_waits_classify(name, top, state) -> None:
    real = _waiting_rank_frames()
    assert classify(real).op is CollectiveOp.BARRIER  # the real gloo dump
    user = [f for f in real if "distributed" not in f.filename]
    shaped = [Frame(n, f, line) for n, f, line in top] + user
    assert classify(shaped).state is state


def test_device_wait_ranks_count_as_waiting_for_the_saver() -> None:
    d = Daemon(DaemonConfig())
    samples = [sample("job-1", 0, 4, RankState.SAVING, seconds=20, timeout=600)]
    samples += [sample("job-1", r, 4, RankState.DEVICE_WAIT, seconds=20, timeout=600)
                for r in (1, 2, 3)]
    d.ingest(report(samples), now=100.0)
    d.tick(now=100.0, wall=100.0)
    inc = d.incidents.active[("job-1", StallKind.CHECKPOINT_GATHER)]
    assert [c.rank for c in inc.finding.culprits] == [0]
    assert inc.finding.waiting == (1, 2, 3)
    assert inc.finding.waiting_ops == (CollectiveOp.WAIT,)
    assert d.budgets["job-1"].blocked_seconds == pytest.approx(20)


def test_device_wait_mixed_with_one_collective_is_not_a_desync() -> None:
    d = Daemon(DaemonConfig())
    samples = [sample("job-1", 0, 3, RankState.COLLECTIVE, CollectiveOp.BARRIER, seconds=40)]
    samples += [sample("job-1", r, 3, RankState.DEVICE_WAIT, seconds=40) for r in (1, 2)]
    d.ingest(report(samples), now=100.0)
    d.tick(now=100.0, wall=100.0)
    assert not d.incidents.active
