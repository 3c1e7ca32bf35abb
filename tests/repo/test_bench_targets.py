"""bench.targets: the Targets table is written from recorded runs, each row
with its command and commit; a target no run measured says so."""

from __future__ import annotations

from bench import targets
from bench.plan import Costs, plan


def _replay(p99: float, measured: int = 6, warm: float = 2.5) -> dict:
    return {"ranks": 100_000, "core_cpu_per_s": 0.7, "late_p50_s": 0.02, "warm_cpu_s": warm,
            "latency": {"trials": 6, "measured": measured, "missed": 6 - measured,
                        "p50_s": p99 / 2, "p99_s": p99}}


def test_a_recorded_run_writes_its_rows_with_command_and_commit(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(targets, "RECORDS", tmp_path / "targets.json")
    monkeypatch.setattr(targets, "commit", lambda: "abc1234")
    table = targets.table()
    assert table.count("no recorded run") == len(targets.TARGETS)   # nothing counts as holding
    targets.record("replay", _replay(0.8), "python -m bench.core_replay --world 100000")
    rows = {line.split(" | ")[0].lstrip("| "): line for line in targets.table().splitlines()}
    big = rows["the same, one job of 100k ranks: the daemon's core, replayed"]
    assert "6 of 6 decided, p99 800 ms" in big and "**holds**" in big
    assert "`python -m bench.core_replay --world 100000`" in big and "abc1234" in big
    first = rows["a 100k-rank job's first two rounds (every rank new)"]
    assert "2.5 CPU-s" in first and "**holds**" in first
    # A later run replaces the record; a missed trial is a miss whatever the p99.
    targets.record("replay", _replay(0.5, measured=5, warm=4.0), "again")
    rows = {line.split(" | ")[0].lstrip("| "): line for line in targets.table().splitlines()}
    assert "**missed**" in rows["the same, one job of 100k ranks: the daemon's core, replayed"]
    assert "**missed**" in rows["a 100k-rank job's first two rounds (every rank new)"]
    assert "no recorded run" in rows["agent CPU per rank, 8 gloo DDP ranks"]


def _costs(**kw) -> Costs:
    c = dict(ingest_us_per_sample=5.0, transport_us_per_sample=9.0, tick_us_per_rank=1.0,
             bytes_per_rank=8192, base_bytes=60 << 20, measured_ranks=2048)
    c.update(kw)
    return Costs(**c)


def test_the_plan_grows_from_one_daemon_to_workers_to_shards() -> None:
    small = plan(2048, 1, 1.0, _costs())
    assert (small.daemons, small.ingest_workers, small.fits) == (1, 0, True)
    mid = plan(40_000, 1, 1.0, _costs())   # 0.28 of a core's ingest, 0.36 of gRPC
    assert (mid.daemons, mid.ingest_workers, mid.fits) == (1, 1, True)
    fleet = plan(400_000, 400, 1.0, _costs())
    assert fleet.daemons > 1 and fleet.fits and fleet.core <= 0.6
    assert fleet.memory_per_daemon < plan(400_000, 1, 1.0, _costs()).memory_per_daemon
    huge = plan(400_000, 1, 1.0, _costs())  # one job: never split
    assert huge.daemons == 1 and not huge.fits and "never split" in huge.note
