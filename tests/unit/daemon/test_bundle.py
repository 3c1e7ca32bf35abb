"""The evidence bundle: what the daemon packs of a stalled job, served as the
other API routes are, and read back by ``ncclwatch diagnose`` with the live verdict."""

from __future__ import annotations

import base64
import http.client
import io
import json
import tarfile

from ncclwatch.daemon import bundle
from ncclwatch.daemon.http import HttpServer, allowed_hosts
from ncclwatch.daemon.webconfig import load
from ncclwatch.diagnose import diagnose
from tests.harness.bundles import members, stalled_daemon
from tests.harness.credentials import HASH, PASSWORD, write_config


def test_bundle_holds_every_rank_and_the_verdict(tmp_path) -> None:
    d, now = stalled_daemon()
    name, body = bundle.archive(bundle.collect(d, "job-1", now=now))
    assert name.startswith("ncclwatch-dump-job-1-") and name.endswith(".tar.gz")
    files = members(body)
    assert {f"stacks/rank-{r}.txt" for r in range(4)} <= set(files)
    assert {"bundle.json", "verdict.json", "job.json", "env.json", "flight_recorder.json"} \
        <= set(files)
    assert "  _save (" in files["stacks/rank-0.txt"].decode()
    rank1 = files["stacks/rank-1.txt"].decode()
    assert "native dump: waits in gloo::Pair::recv" in rank1
    assert "native stack, thread MainThread" in rank1 and "  c10d::ProcessGroupGloo::barrier (" \
        in rank1
    v = json.loads(files["verdict.json"])
    assert v["stalls"][0]["kind"] == "checkpoint_gather" and v["stalls"][0]["trace"]
    assert [c["rank"] for c in v["stalls"][0]["culprits"]] == [0]
    assert json.loads(files["bundle.json"])["format"] == bundle.FORMAT

    path = tmp_path / name
    path.write_bytes(body)
    dx = diagnose([path])
    assert (dx.cls, dx.initiating, dx.collateral) == ("checkpoint_gather_timeout", [0],
                                                      [1, 2, 3]), dx.to_json()
    assert dx.root_cause is not None and dx.timeline[0]["what"] == "checkpoint_gather stall began"


def test_a_tar_that_is_no_bundle_is_not_read_as_one(tmp_path) -> None:
    from ncclwatch.diagnose.bundle import read

    p = tmp_path / "x.tar.gz"
    with tarfile.open(p, "w:gz") as tar:
        info = tarfile.TarInfo("x/bundle.json")
        data = b'{"format": "something-else"}'
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    assert read(p) is None and read(tmp_path) is None


def _get(port: int, path: str, headers: dict[str, str] | None = None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", path, headers=headers or {})
    r = c.getresponse()
    out = r.status, dict(r.getheaders()), r.read()
    c.close()
    return out


def test_api_dump_is_served_under_the_same_auth_and_host_rules(tmp_path) -> None:
    d, _ = stalled_daemon()
    web = load(write_config(tmp_path / "web.yml", f"basic_auth_users:\n  ops: {HASH}\n"))
    srv = HttpServer(d, "127.0.0.1", 0, lambda fn: fn(), web=web,
                     hosts=allowed_hosts("", "127.0.0.1"))
    srv.start()
    good = {"Authorization": "Basic " + base64.b64encode(f"ops:{PASSWORD}".encode()).decode()}
    try:
        assert _get(srv.port, "/api/v1/dump?job=job-1&wait=0")[0] == 401
        assert _get(srv.port, "/api/v1/dump?job=job-1&wait=0",
                    {**good, "Host": "evil.example"})[0] == 403
        assert _get(srv.port, "/api/v1/dump?job=nope&wait=0", good)[0] == 404
        assert _get(srv.port, "/api/v1/dump?job=job-1&wait=99", good)[0] == 400
        code, h, body = _get(srv.port, "/api/v1/dump?job=job-1&wait=0", good)
        assert code == 200 and h["Content-Type"] == "application/gzip"
        assert 'filename="ncclwatch-dump-job-1-' in h["Content-Disposition"]
        assert "stacks/rank-3.txt" in members(body)
        c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
        c.request("HEAD", "/api/v1/dump?job=job-1", headers=good)
        assert c.getresponse().status == 200 and not d.table.agents["agent-a"].commands
        c.close()
        # A GET asks nothing, whatever its wait (test_dumpguard.py: who may ask).
        code, _, body = _get(srv.port, "/api/v1/dump?job=job-1&wait=0.5", good)
        assert json.loads(members(body)["bundle.json"])["fresh"] == {"asked": False}
        assert not d.table.agents["agent-a"].commands
        # A fresh ask (a POST past the dump guard) queues the three commands for
        # the job's agent, then waits (bounded) for reports this test never sends.
        c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
        c.request("POST", "/api/v1/dump?job=job-1&wait=0.5",
                  headers={**good, "X-Ncclwatch-Request": "dump"})
        r = c.getresponse()
        code, body = r.status, r.read()
        c.close()
        fresh = json.loads(members(body)["bundle.json"])["fresh"]
        assert code == 200 and fresh["asked"] and fresh["agents"] == 1
        assert fresh["ranks_not_refreshed"] and 0.5 <= fresh["waited_seconds"] < 2
        cmds = list(d.table.agents["agent-a"].commands)
        assert [c.WhichOneof("command") for c in cmds[-3:]] == \
            ["dump_stacks", "dump_stacks", "dump_flight_recorder"]
        assert cmds[-2].dump_stacks.native and not cmds[-3].dump_stacks.native
    finally:
        srv.stop()


def test_the_page_posts_each_jobs_dump_with_its_token() -> None:
    """A form, not a link: the fresh ask is a POST carrying the daemon's token."""
    from ncclwatch.daemon import api, page

    d, now = stalled_daemon()
    html = page.render(api.jobs_view(d, now=now), "tok-1")
    assert ("<form class='dump' method='post' action='/api/v1/dump?job=job-1'><input "
            "type='hidden' name='token' value='tok-1'><button type='submit'>evidence "
            "bundle</button>") in html
    assert "href='/api/v1/dump" not in html


def test_the_dump_command_fetches_with_the_credentials_given(tmp_path, capsys) -> None:
    from ncclwatch.cli import main

    d, _ = stalled_daemon()
    web = load(write_config(tmp_path / "web.yml", f"basic_auth_users:\n  ops: {HASH}\n"))
    srv = HttpServer(d, "127.0.0.1", 0, lambda fn: fn(), web=web)
    srv.start()
    base = f"http://127.0.0.1:{srv.port}"
    try:
        assert main(["dump", "job-1", "--daemon", base, "--wait", "0",
                     "--out", str(tmp_path)]) == 1
        assert "HTTP 401" in capsys.readouterr().err
        assert main(["dump", "job-1", "--daemon", f"http://ops:{PASSWORD}@127.0.0.1:{srv.port}",
                     "--wait", "0", "--out", str(tmp_path)]) == 0
        [got] = tmp_path.glob("ncclwatch-dump-job-1-*.tar.gz")
        assert f"ncclwatch diagnose {got}" in capsys.readouterr().out
        assert "stacks/rank-0.txt" in members(got.read_bytes())
        assert main(["dump", "nope", "--daemon", f"http://ops:{PASSWORD}@127.0.0.1:{srv.port}",
                     "--wait", "0", "--out", str(tmp_path)]) == 1
        assert "HTTP 404: no such job" in capsys.readouterr().err
    finally:
        srv.stop()
