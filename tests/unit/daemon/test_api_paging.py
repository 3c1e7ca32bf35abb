"""/api/v1/jobs paging and detail, and /metrics built off the event loop.

Summaries by default, per-rank detail with ``ranks=1``, pages by ``limit``
and ``cursor``; the per-rank walk of both views runs in the HTTP thread,
never on the daemon's event loop. Speed is measured in bench/daemon_ingest.py.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from ncclwatch.daemon import api
from ncclwatch.daemon.core import Daemon, DaemonConfig
from ncclwatch.daemon.export import DaemonCollector, encode, make_registry
from ncclwatch.daemon.server import DaemonServer
from ncclwatch.model import CollectiveOp, RankState
from tests.harness.reports import MB, drive_job, rank0_sample, report, sample

NOW = 1000.5
#: job -> world size; ranks spread over 2 nodes per job.
JOBS = {"a": 5, "b": 12, "c": 3}


def _fill(d: Daemon, now: float = 1000.0) -> None:
    seq = 0
    for job, world in JOBS.items():
        for node in range(2):
            seq += 1
            samples = [sample(job, r, world, RankState.COLLECTIVE, CollectiveOp.BARRIER,
                              seconds=1.0) for r in range(node, world, 2)]
            d.ingest(report(samples, node=f"{job}-n{node}", agent=f"{job}-{node}", seq=1),
                     now=now)


def _samples(text: str) -> set:
    return {(s.name, tuple(sorted(s.labels.items())), s.value)
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_metrics_text_is_what_client_python_writes() -> None:
    """The direct encoder and the client_python registry agree sample for sample."""
    d, _ = drive_job(lambda i: rank0_sample(RankState.SAVING, i, file_size=(i + 1) * MB,
                                   prev=200 * MB, seconds=i), 12)
    ours = DaemonCollector(d).exposition().decode()
    theirs = generate_latest(make_registry(d)).decode()
    a, b = _samples(ours), _samples(theirs)
    # Only the clock-driven gauges may move between the two reads (the budget is
    # aged to the moment it is read: it falls while a rank waits).
    moving = {"ncclwatch_agent_last_report_timestamp_seconds", "ncclwatch_stall_duration_seconds",
              "ncclwatch_watchdog_remaining_seconds"}
    assert {x for x in a if x[0] not in moving} == {x for x in b if x[0] not in moving}
    assert any(n == "ncclwatch_stall_culprit_info" for n, _, _ in a)
    assert len(a) == len(b) > 50
    # Same HELP/TYPE lines too (the families' metadata).
    meta = lambda t: [line for line in t.splitlines() if line.startswith("#")]  # noqa: E731
    assert meta(ours) == meta(theirs)
    assert encode([]) == b""


def test_summaries_by_default_detail_on_request() -> None:
    d = Daemon()
    _fill(d)
    view = api.jobs_view(d, api.JobsQuery(), now=NOW)
    assert [j["job"] for j in view["jobs"]] == ["a", "b", "c"] and view["next_cursor"] is None
    for j in view["jobs"]:
        assert "ranks" not in j
        assert j["rank_states"] == [{"state": "collective", "op": "barrier",
                                     "count": JOBS[j["job"]],
                                     "ranks": f"0-{JOBS[j['job']] - 1}"}]
    one = api.jobs_view(d, api.JobsQuery.parse("job=b&ranks=1"), now=NOW)
    assert [j["job"] for j in one["jobs"]] == ["b"]
    assert [r["rank"] for r in one["jobs"][0]["ranks"]] == list(range(12))
    assert {r["host"] for r in one["jobs"][0]["ranks"]} == {"b-n0", "b-n1"}
    assert api.jobs_view(d, api.JobsQuery.parse("job=nope"), now=NOW)["jobs"] == []


@pytest.mark.parametrize("limit", [1, 4, 5, 7, 20])
def test_rank_pages_cover_every_rank_once(limit: int) -> None:
    d = Daemon()
    _fill(d)
    seen: list[tuple[str, int]] = []
    cursor, pages = "", 0
    while True:
        v = api.jobs_view(d, api.JobsQuery.parse(f"ranks=1&limit={limit}&cursor={cursor}"), now=NOW)
        got = [(j["job"], r["rank"]) for j in v["jobs"] for r in j["ranks"]]
        assert 0 < len(got) <= limit
        seen += got
        pages += 1
        cursor = v["next_cursor"]
        if not cursor:
            break
        assert pages < 100
    assert seen == [(j, r) for j, w in sorted(JOBS.items()) for r in range(w)]
    assert pages == -(-sum(JOBS.values()) // limit)


def test_job_pages_by_limit() -> None:
    d = Daemon()
    _fill(d)
    v1 = api.jobs_view(d, api.JobsQuery.parse("limit=2"), now=NOW)
    assert [j["job"] for j in v1["jobs"]] == ["a", "b"] and v1["next_cursor"]
    v2 = api.jobs_view(d, api.JobsQuery.parse(f"limit=2&cursor={v1['next_cursor']}"), now=NOW)
    assert [j["job"] for j in v2["jobs"]] == ["c"] and v2["next_cursor"] is None


@pytest.mark.parametrize("query,why", [
    ("limit=0", "limit"), ("limit=x", "limit"), ("limit=5000", "limit"),
    ("ranks=2", "ranks"), ("cursor=%%%", "cursor"), ("cursor=bm90anNvbg", "cursor"),
    ("jobs=a", "unknown"),
])
def test_bad_parameters_are_refused_by_name(query: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        api.JobsQuery.parse(query)


def test_per_rank_work_runs_off_the_event_loop() -> None:
    """Over real HTTP: the loop only copies lists; every per-rank freshness
    check of /metrics, /api/v1/jobs and / happens in the HTTP thread."""
    async def go():
        d = Daemon(DaemonConfig(grpc="127.0.0.1:0", http="127.0.0.1:0"))
        _fill(d, now=time.monotonic())
        server = DaemonServer(d)
        await server.start()
        loop_thread = threading.get_ident()
        calls: list[bool] = []
        real, real_tick, ticking = d.table.fresh, d.tick, [False]

        def fresh(rec, now):
            if not ticking[0]:  # detection ticks walk ranks on the loop by design
                calls.append(threading.get_ident() == loop_thread)
            return real(rec, now)

        def tick(*a, **kw):
            ticking[0] = True
            try:
                return real_tick(*a, **kw)
            finally:
                ticking[0] = False
        d.table.fresh, d.tick = fresh, tick
        d.tick()
        base = f"http://127.0.0.1:{server.http_port}"

        def get(path: str) -> tuple[int, str]:
            try:
                with urllib.request.urlopen(base + path, timeout=10) as r:
                    return r.status, r.read().decode()
            except urllib.error.HTTPError as e:
                return e.code, e.read().decode()
        try:
            for path in ("/metrics", "/api/v1/jobs", "/api/v1/jobs?ranks=1&limit=3", "/"):
                n = len(calls)
                code, body = await asyncio.to_thread(get, path)
                assert code == 200, (path, body)
                assert len(calls) > n, path  # it did walk the ranks ...
                assert not any(calls[n:]), f"{path}: per-rank work on the event loop"
            code, body = await asyncio.to_thread(get, "/api/v1/jobs?limit=nope")
            assert code == 400 and "limit" in body
            code, body = await asyncio.to_thread(get, "/healthz")
            assert (code, body) == (200, "ok\n")
            view = json.loads((await asyncio.to_thread(get, "/api/v1/jobs?ranks=1"))[1])
            assert sum(len(j["ranks"]) for j in view["jobs"]) == sum(JOBS.values())
        finally:
            await server.stop(grace=0.1)
    asyncio.run(go())


def test_json_in_chunks_is_the_same_json() -> None:
    from ncclwatch.daemon.http import JSON_CHUNK, json_chunks
    obj = {"a": [{"r": i, "s": "x\"y"} for i in range(3 * JSON_CHUNK + 5)], "b": {}, "c": [],
           "d": {"e": [1.5, None, True], 3: "k"}, "f": list(range(JSON_CHUNK + 1))}
    text = "".join(json_chunks(obj))
    assert json.loads(text) == json.loads(json.dumps(obj))
    assert len(list(json_chunks(obj))) > 6  # the long lists did go in pieces


def test_page_shows_a_large_job_by_state_and_links_its_ranks() -> None:
    from ncclwatch.daemon import page
    d = Daemon()
    _fill(d)
    view = api.finish_jobs(api.collect_jobs(d, api.JobsQuery(), now=NOW, detail_upto=5))
    by_job = {j["job"]: j for j in view["jobs"]}
    assert "ranks" in by_job["a"] and "ranks" not in by_job["b"]  # 5 ranks <= 5 < 12
    html = page.render(view)
    assert "<td>collective / barrier</td><td>12</td><td>0-11</td>" in html
    assert "/api/v1/jobs?job=b&amp;ranks=1" in html


def test_status_follows_every_page() -> None:
    """``ncclwatch status`` reads all jobs however many pages they take."""
    from ncclwatch import status

    async def go():
        d = Daemon(DaemonConfig(grpc="127.0.0.1:0", http="127.0.0.1:0"))
        _fill(d, now=time.monotonic())
        server = DaemonServer(d)
        await server.start()
        old = api.JOBS_LIMIT
        api.JOBS_LIMIT = 1  # one job per page
        try:
            view = await asyncio.to_thread(status.fetch, f"http://127.0.0.1:{server.http_port}")
        finally:
            api.JOBS_LIMIT = old
            await server.stop(grace=0.1)
        assert [j["job"] for j in view["jobs"]] == ["a", "b", "c"]
        text = status.render(view)
        assert "b ranks: collective/barrier: 0-11" in text
    asyncio.run(go())


def test_pages_walk_members_of_unknown_rank_too() -> None:
    """Members keyed -1, -2 (rank unknown) come first in a job's detail; paging by
    one rank at a time visits every member and rank once, then the next job."""
    d = Daemon(DaemonConfig())
    members = [sample("job-u", -1, 4, RankState.COMPUTE, pid=600 + i) for i in range(2)]
    numbered = [sample("job-u", r, 4, RankState.COMPUTE, pid=700 + r) for r in (2, 3)]
    d.ingest(report(members + numbered + [sample("job-v", 0, 1, RankState.COMPUTE)]),
             now=1000.0)
    seen, cursor = [], None
    for _ in range(10):
        q = api.JobsQuery(ranks=True, limit=1, cursor=cursor)
        view = api.jobs_view(d, q, now=1000.5)
        seen += [(j["job"], r["member"]) for j in view["jobs"] for r in j.get("ranks", [])]
        if view["next_cursor"] is None:
            break
        cursor = api.JobsQuery.parse(f"cursor={view['next_cursor']}").cursor
    assert seen == [("job-u", "?2"), ("job-u", "?1"), ("job-u", "2"), ("job-u", "3"),
                    ("job-v", "0")]
    summary = api.jobs_view(d, ranks=False, now=1000.5)["jobs"][0]["rank_states"]
    assert summary == [{"state": "compute", "op": None, "count": 4, "ranks": "2-3,?1,?2"}]


def test_a_member_numbered_later_is_not_also_an_unknown_rank() -> None:
    """A member reported with no number (Ray Train's worker before its log is
    read) and then, the same process, under its number: the job's rank
    states count it once, under the number, and no '?N' stays 'unknown'."""
    from ncclwatch.daemon.api import jobs_view
    from ncclwatch.daemon.core import Daemon, DaemonConfig
    from ncclwatch.jobid import UNKNOWN_RANK
    from ncclwatch.model import RankState
    from ncclwatch.v1 import collector_pb2 as pb
    from tests.harness.reports import report, sample

    d = Daemon(DaemonConfig())
    member = sample("ray:j", UNKNOWN_RANK, 2, RankState.COMPUTE, pid=4242)
    d.ingest(report([sample("ray:j", 0, 2, RankState.COMPUTE, pid=4241), member], seq=1),
             now=100.0)
    later = report([sample("ray:j", 0, 2, RankState.COMPUTE, pid=4241),
                    sample("ray:j", 1, 2, RankState.COMPUTE, pid=4242)], seq=2)
    later.report.exited.append(pb.RankIdentity(job_id="ray:j", rank=UNKNOWN_RANK, pid=4242))
    d.ingest(later, now=101.0)
    (job,) = jobs_view(d, now=101.5)["jobs"]
    assert job["rank_states"] == [{"state": "compute", "op": None, "count": 2,
                                   "ranks": "0-1"}], job["rank_states"]
