"""Jobs across shards, as people see them: the page, the API and ``ncclwatch status``.

Two real daemons (HTTP on loopback), each told the shard map. Each holds the
job it owns; shard 0 also holds a job shard 1 owns (an agent with an old map).
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request

from ncclwatch import status
from ncclwatch.cli import main
from ncclwatch.daemon import api, page
from ncclwatch.daemon.core import Daemon, DaemonConfig
from ncclwatch.daemon.server import DaemonServer
from ncclwatch.daemon.shardmap import ShardMap
from ncclwatch.model import CollectiveOp, RankState
from tests.harness.procs import free_port
from tests.harness.reports import report, sample
from tests.harness.shards import jobs_on


def _feed(d: Daemon, jobs: list[str], agent: str) -> None:
    d.ingest(report([sample(j, r, 2, RankState.COLLECTIVE, CollectiveOp.BARRIER,
                            pid=10 * k + r + 1) for k, j in enumerate(jobs) for r in range(2)],
                    agent=agent), now=time.monotonic())


def test_the_page_api_and_status_span_shards(capsys) -> None:
    j0, j1 = jobs_on(2)
    ports = [free_port(), free_port()]
    urls = [f"http://127.0.0.1:{p}" for p in ports]

    async def go():
        servers = []
        for k, p in enumerate(ports):
            shards = ShardMap.parse(";".join(urls), None, urls[k])  # found by its own URL
            assert shards.index == k
            servers.append(DaemonServer(Daemon(DaemonConfig(
                grpc="127.0.0.1:0", http=f"127.0.0.1:{p}", shards=shards))))
        _feed(servers[0].daemon, [j0, j1], "agent-old-map")   # j1 is misrouted here
        _feed(servers[1].daemon, [j1], "agent-new-map")
        for s in servers:
            await s.start()
        try:
            return await asyncio.to_thread(_check)
        finally:
            for s in servers:
                await s.stop(grace=0.1)

    def _check():
        view = status.fetch(urls[0])
        assert view["shards"] == {"count": 2, "self": 0, "urls": [[urls[0]], [urls[1]]]}
        by = {j["job"]: j["shard"] for j in view["jobs"]}
        assert by[j0]["index"] == 0 and by[j0]["owned"] is True
        assert by[j1] == {"index": 1, "owned": False,
                          "pages": [f"{urls[1]}/#job-{j1}"]}
        html = urllib.request.urlopen(urls[0] + "/").read().decode()
        assert f"shards: 0 (this) · <a class='shard' href='{urls[1]}/'>1</a>" in html
        assert f"owned by shard 1: <a href='{urls[1]}/#job-{j1}'>{urls[1]}</a>" in html
        assert "not this daemon&#x27;s" in html or "not this daemon's" in html
        assert "shard 0 (this daemon&#x27;s)" in html or "shard 0 (this daemon's)" in html
        # An alert's link to a job on another shard: the page asks who owns it.
        owner = json.loads(urllib.request.urlopen(f"{urls[0]}/api/v1/shard?job={j1}").read())
        assert owner["index"] == 1 and owner["owned"] is False
        assert owner["pages"] == [f"{urls[1]}/#job-{j1}"]
        assert "<script id='owner'>" in html and "/api/v1/shard?job=" in html
        # One daemon that knows the map is enough: status asks the other shard too.
        merged, errors = status.fetch_shards(urls[1])
        assert not errors and [j["job"] for j in merged["jobs"]] == sorted([j0, j1])
        shown = {j["job"]: j["shard"] for j in merged["jobs"]}
        assert shown[j1]["owned"] and shown[j1]["reported_by"] == [0, 1]
        assert shown[j0]["reported_by"] == [0]
        # j1 from its owner: one agent's ranks there, not the misrouted copy.
        assert {a["agent_id"] for a in merged["agents"]} == {"agent-old-map", "agent-new-map"}
        text = status.render(merged)
        assert "SHARD" in text and "1 (also seen on 0)" in text
        # Shards given by hand (daemons without --shards would do too), one pair each.
        dead = f"http://127.0.0.1:{free_port()}"
        merged2, errors = status.fetch_shards(f"{dead},{urls[0]};{urls[1]}")
        assert not errors and [j["job"] for j in merged2["jobs"]] == sorted([j0, j1])
        # A shard that cannot be asked: the others are shown, and status says so (exit 1).
        rc = main(["status", "--daemon", f"{urls[0]};{dead}"])
        out, err = capsys.readouterr()
        assert rc == 1 and j0 in out and f"shard 1: cannot reach the ncclwatch daemon at {dead}" in err
        return True

    assert asyncio.run(go())
    # A DumpStacks call for a job to the wrong shard names the owner.
    from ncclwatch.daemon.validate import ReportError
    d = Daemon(DaemonConfig(shards=ShardMap.parse(";".join(urls), 1)))
    try:
        d.operator_request_stacks(j0, "test", None)
    except ReportError as e:
        assert f"shard 0 owns it, ask a daemon of it ({urls[0]})" in e.message
    else:
        raise AssertionError("a job this daemon does not hold was accepted")


def test_a_daemon_checks_its_shard_settings(capsys) -> None:
    assert main(["daemon", "--shard", "1"]) == 2
    assert "shard is set but shards is not" in capsys.readouterr().err
    assert main(["daemon", "--shards", "http://a:7471;http://b:7471", "--shard", "2"]) == 2
    assert "shard 2 is not in the 2 shard(s)" in capsys.readouterr().err
    try:  # argparse names the flag and exits 2
        main(["daemon", "--shards", "a:7471"])
    except SystemExit as e:
        assert e.code == 2 and "--shards" in capsys.readouterr().err
    else:
        raise AssertionError("a shard without a URL scheme was accepted")
    m = ShardMap.parse("http://a:7471/,http://b:7471;http://c:7471", 1)
    assert m.view()["urls"] == [["http://a:7471", "http://b:7471"], ["http://c:7471"]]
    j0, j1 = jobs_on(2)
    assert m.job_view(j1)["owned"] is True and m.job_view(j0)["owned"] is False
    assert ShardMap.parse("http://a:7471;http://c:7471", None, "http://x:1").index is None
    assert api.API_VERSION  # the API keeps its version: "shards" is an added key
    assert page  # imported for the page test above
