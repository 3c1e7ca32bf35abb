"""Sharding jobs across daemons: a stable rendezvous hash of the job id."""

from __future__ import annotations

import pytest

from ncclwatch.config import hostports, urls
from ncclwatch.shard import shard, shard_list, shard_text

JOBS = [f"torchelastic:job-{i}" for i in range(3000)]
FIXED = [0, 1, 1, 1, 3, 2, 1, 0]


def test_shard_is_stable_across_processes() -> None:
    assert shard("slurm:1234.0", 1) == 0
    # Fixed values: a change here moves jobs to other daemons on upgrade.
    assert [shard(f"job-{i}", 4) for i in range(8)] == FIXED
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", "from ncclwatch.shard import shard; "
                          "print([shard(f'job-{i}', 4) for i in range(8)])"],
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == str(FIXED)


def test_shard_spreads_jobs_and_rejects_zero() -> None:
    for n in (2, 3, 5):
        counts = [0] * n
        for j in JOBS:
            counts[shard(j, n)] += 1
        assert min(counts) > 0.8 * len(JOBS) / n, (n, counts)
    with pytest.raises(ValueError):
        shard("job", 0)


@pytest.mark.parametrize("n", [1, 2, 3, 7])
def test_adding_a_shard_moves_only_the_jobs_it_wins(n: int) -> None:
    """Rendezvous hashing: about 1/(n+1) of the jobs move, each to the new shard;
    removing the last shard again moves only its own jobs back."""
    before = {j: shard(j, n) for j in JOBS}
    after = {j: shard(j, n + 1) for j in JOBS}
    moved = [j for j in JOBS if before[j] != after[j]]
    assert all(after[j] == n for j in moved)
    share = len(moved) / len(JOBS)
    assert 0.6 / (n + 1) < share < 1.4 / (n + 1), share
    assert {j for j in JOBS if after[j] == n} == set(moved)


def test_shards_parse_from_flag_env_and_toml() -> None:
    assert shard_list("a:1") == (("a:1",),)
    assert shard_list("a:1, b:1") == (("a:1", "b:1"),)  # an HA pair, as before shards
    assert shard_list("a0:1,b0:1; a1:1,b1:1") == (("a0:1", "b0:1"), ("a1:1", "b1:1"))
    assert shard_list(["a:1", "b:1"]) == (("a:1", "b:1"),)  # TOML list: one pair
    assert shard_list([["a0:1", "b0:1"], ["a1:1"]]) == (("a0:1", "b0:1"), ("a1:1",))
    assert shard_text(shard_list("a0:1,b0:1;a1:1")) == "a0:1,b0:1;a1:1"
    assert hostports([["a0:1", "b0:1"], ["a1:1", "b1:1"]]) == "a0:1,b0:1;a1:1,b1:1"
    for bad in ("", ";", "a:1;;b:1", "a:1,b:1;a:1", "a:1;b"):
        with pytest.raises(ValueError):
            hostports(bad)
    assert urls("http://a:7471;https://b:7471,https://c:7471") == \
        "http://a:7471;https://b:7471,https://c:7471"
    with pytest.raises(ValueError, match="URL"):
        urls("a:7471")


def test_the_agent_takes_shards_from_flag_env_and_toml(tmp_path) -> None:
    import argparse

    from ncclwatch.cli import AGENT_OPTIONS, build_parser
    from ncclwatch.config import load_file, resolve
    args = build_parser().parse_args(["agent", "--collector", "a:1,b:1;c:1,d:1"])
    assert resolve(AGENT_OPTIONS, args, {}, {})["collector"] == "a:1,b:1;c:1,d:1"
    none = argparse.Namespace(collector=None)
    env = {"NCCLWATCH_COLLECTOR": "a:1;c:1"}
    assert resolve(AGENT_OPTIONS, none, {}, env)["collector"] == "a:1;c:1"
    toml = tmp_path / "agent.toml"
    toml.write_text('collector = [["a:1", "b:1"], ["c:1", "d:1"]]\n')
    assert resolve(AGENT_OPTIONS, none, load_file(str(toml), None), {})["collector"] == \
        "a:1,b:1;c:1,d:1"
