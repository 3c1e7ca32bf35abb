"""Sharding jobs across daemons by a stable hash of the job id."""

from __future__ import annotations

import zlib

import pytest

from ncclwatch.shard import shard


def test_shard_is_crc32_mod_n_and_stable() -> None:
    assert shard("torchelastic:abc", 3) == zlib.crc32(b"torchelastic:abc") % 3
    assert shard("slurm:1234.0", 1) == 0
    # Fixed values: a change here moves every job to another daemon.
    assert [shard(f"job-{i}", 4) for i in range(6)] == [1, 3, 1, 3, 0, 2]


def test_shard_spreads_jobs_and_rejects_zero() -> None:
    counts = [0, 0]
    for i in range(1000):
        counts[shard(f"job-{i}", 2)] += 1
    assert min(counts) > 400
    with pytest.raises(ValueError):
        shard("job", 0)
