"""A rank's evidence curve: the time/RSS ring (the curve is the array) and the
flat detail of the newest points, which refers to the record's own tuples; and
the bench's figure for what the job table holds per rank, curves included."""

from __future__ import annotations

import gc

from bench.daemon_ingest import table_memory
from ncclwatch.daemon import heap
from ncclwatch.daemon.curve import CURVE_DETAIL, CURVE_POINTS, CURVE_SPAN, CURVE_STEP, Curve


def test_the_ring_keeps_its_span_and_the_detail_its_recent_points() -> None:
    c = Curve()
    limits = (("host", 5, 10), ("gpu0", 7, 80))
    files = (("/ckpt/a.pt", 100, "", 0, 0, ""),)
    for i in range(200):
        c.add(1000.0 + i, 1 << 40 | i, 10 * i, files if i % 2 else (), limits)
        c.add(1000.0 + i + CURVE_STEP / 2, 0, 0, (), ())   # too close: not a point
    assert len(c) == min(CURVE_POINTS, int(CURVE_SPAN) + 1)
    pts = list(c.rss_points())
    assert pts[-1] == (1199.0, 1 << 40 | 199) and all(isinstance(r, int) for _, r in pts)
    assert pts[0][0] >= 1199.0 - CURVE_SPAN and c.first_rss() == pts[0][1]
    recent = c.recent()
    assert [p.t for p in recent] == [1199.0 - k for k in range(int(CURVE_DETAIL), -1, -1)]
    last = recent[-1]
    assert (last.rss, last.written, last.file, last.file_size) == (1 << 40 | 199, 1990,
                                                                   "/ckpt/a.pt", 100)
    assert last.limits is limits and recent[-2].file == ""   # the record's tuple, not a copy


def test_a_single_point_keeps_its_detail_however_old() -> None:
    c = Curve()
    c.add(10.0, 1, 2, (), ())
    assert [p.t for p in c.recent()] == [10.0] and len(c) == 1


def test_a_steady_rank_holds_one_points_detail_in_one_tuple_and_nothing_else() -> None:
    c = Curve()
    assert not c and len(c) == 0
    limits = (("host", 5, 10),)
    for i in range(10):                       # a full sample every 30 s: steady
        c.add(1000.0 + 30 * i, 100 + i, i, (), limits)
    assert len(c) == int(CURVE_SPAN // 30) + 1 and c
    assert type(c._detail) is tuple and len(c._detail) == 3
    assert [(p.t, p.rss, p.written) for p in c.recent()] == [(1270.0, 109, 9)]
    # Busy (a point a second): a list of the last CURVE_DETAIL seconds' points ...
    for i in range(1, 31):
        c.add(1270.0 + i, 200 + i, 100 + i, (), limits)
    assert type(c._detail) is list
    assert [p.t for p in c.recent()] == [1300.0 - k for k in range(int(CURVE_DETAIL), -1, -1)]
    # ... and one tuple again once the rank is steady, the ring unchanged by it.
    c.add(1360.0, 7, 8, (("/ckpt/b.pt", 9, "", 0, 0, ""),), limits)
    assert type(c._detail) is tuple
    assert [(p.t, p.rss, p.written, p.file, p.file_size) for p in c.recent()] == [
        (1360.0, 7, 8, "/ckpt/b.pt", 9)]
    assert list(c.rss_points())[-2:] == [(1300.0, 230), (1360.0, 7)]
    assert list(c.t) == [t for t, _ in c.rss_points()] and c.rss[-1] == 7


def test_the_heap_policy_gives_free_pages_back_after_a_freeze(monkeypatch) -> None:
    trims = []
    monkeypatch.setattr(heap, "trim", lambda: trims.append(1) or True)
    gc.unfreeze()
    try:
        policy = heap.HeapPolicy(lambda: 1000.0)
        policy.step()
        assert not trims
        gc.collect()   # a full collection: the next step freezes, then trims
        policy.step()
        assert trims == [1]
    finally:
        gc.unfreeze()
    assert heap.trim() in (True, False)   # glibc's malloc_trim, where there is one


def test_the_bench_table_figure_leaves_out_imports_and_the_simulated_agents() -> None:
    """What the first report imports (once a process) and what loadgen's agents
    keep are not the table's (bench/daemon_ingest.py table_memory)."""
    r = table_memory(16, 10)
    assert r["ranks"] == 16 and r["curve_points"] >= 1
    # One import of the first report is about 1 MiB: 64 KiB a rank at 16 ranks.
    assert 0 < r["bytes_per_rank"] < 16 * 1024
    assert not any("importlib" in m or m.endswith("loadgen.py") for m in r["by_module"])
    assert any(m.endswith("ncclwatch/daemon/curve.py") for m in r["by_module"])
