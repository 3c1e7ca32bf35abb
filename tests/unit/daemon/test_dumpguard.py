"""The dump guard: only this daemon's page or a client such as ``ncclwatch dump``
makes the daemon ask a job's ranks for fresh evidence, one dump per job at a
time, a few a minute per address; a GET serves what the daemon holds, asking
nothing. Unit tests of the rules, then a real HttpServer with the stalled job
of test_bundle.py, counting the commands queued for its agent."""

from __future__ import annotations

import http.client
import json
import re
import threading
import time
from urllib.parse import urlencode

import pytest

from ncclwatch.daemon import dumpguard
from ncclwatch.daemon.dumpguard import DumpGuard, Limits, same_origin
from ncclwatch.daemon.http import HttpServer, allowed_hosts
from tests.harness.bundles import members, stalled_daemon

HOST = "127.0.0.1:7471"

#: (headers, scheme, same origin?)
ORIGINS = [
    ({"Host": HOST}, "http", True),                                   # curl, ncclwatch dump
    ({"Host": HOST, "Origin": "http://127.0.0.1:7471"}, "http", True),
    ({"Host": "Daemon.Example:7471", "Origin": "http://daemon.example:7471"}, "http", True),
    ({"Host": "daemon.example", "Origin": "https://daemon.example:443"}, "https", True),
    ({"Host": HOST, "Sec-Fetch-Site": "same-origin"}, "http", True),
    ({"Host": HOST, "Sec-Fetch-Site": "none"}, "http", True),
    ({"Host": HOST, "Origin": "http://evil.example"}, "http", False),
    ({"Host": HOST, "Origin": "http://127.0.0.1:8080"}, "http", False),    # another port
    ({"Host": HOST, "Origin": "https://127.0.0.1:7471"}, "http", False),   # another scheme
    ({"Host": HOST, "Origin": "null"}, "http", False),                     # sandboxed, no-referrer
    ({"Host": HOST, "Origin": "http://127.0.0.1:7471/x"}, "http", False),  # not an origin
    ({"Host": HOST, "Origin": "http://127.0.0.1:notaport"}, "http", False),
    ({"Origin": "http://127.0.0.1:7471"}, "http", False),                  # no Host to match
    ({"Host": HOST, "Sec-Fetch-Site": "cross-site"}, "http", False),
    ({"Host": HOST, "Sec-Fetch-Site": "same-site"}, "http", False),        # a sibling host
    ({"Host": HOST, "Origin": "http://127.0.0.1:7471",
      "Sec-Fetch-Site": "cross-site"}, "http", False),
]


@pytest.mark.parametrize("headers,scheme,ok", ORIGINS)
def test_only_this_daemons_own_origin_passes(headers, scheme, ok) -> None:
    assert same_origin(headers, scheme) is ok


def test_a_fresh_ask_needs_the_header_or_this_starts_token() -> None:
    g, other = DumpGuard(), DumpGuard()
    own = {"Host": HOST}
    assert g.token != other.token and len(g.token) >= 40
    assert g.check({**own, "X-Ncclwatch-Request": "dump"}, "http") is None
    assert g.check(own, "http", g.token) is None
    for headers, token in [(own, ""), (own, other.token), (own, g.token[:-1]),
                           ({**own, "X-Ncclwatch-Request": "yes"}, "")]:
        no = g.check(headers, "http", token)
        assert no is not None and (no.status, no.outcome) == (403, "refused_token")
    cross = g.check({**own, "Origin": "http://evil.example", "X-Ncclwatch-Request": "dump"},
                    "http", g.token)
    assert cross is not None and (cross.status, cross.outcome) == (403, "refused_origin")
    assert g.counts() == {"served": 0, "refused_origin": 1, "refused_token": 4, "busy": 0,
                          "rate_limited": 0}


def test_one_dump_per_job_at_a_time() -> None:
    g = DumpGuard()
    assert g.start("10.0.0.1", "job-1") is None
    busy = g.start("10.0.0.2", "job-1")
    assert busy is not None and (busy.status, busy.outcome) == (409, "busy")
    assert "job-1" in busy.message
    assert g.start("10.0.0.2", "job-2") is None      # another job is free
    g.done("job-1")
    assert g.start("10.0.0.2", "job-1") is None
    assert g.counts()["served"] == 3 and g.counts()["busy"] == 1


def test_each_client_address_gets_its_rate_and_is_told_when_to_come_back() -> None:
    now = [1000.0]
    g = DumpGuard(Limits(per_client=3, window_seconds=60.0), clock=lambda: now[0])
    for i in range(3):
        assert g.start("10.0.0.1", f"job-{i}") is None
        g.done(f"job-{i}")
        now[0] += 10
    no = g.start("10.0.0.1", "job-9")
    assert no is not None and (no.status, no.outcome) == (429, "rate_limited")
    assert dict(no.headers) == {"Retry-After": "30"}   # the first ask leaves the window at 1060
    assert g.start("10.0.0.2", "job-9") is None        # another address has its own
    now[0] = 1060.5
    assert g.start("10.0.0.1", "job-8") is None
    assert g.counts()["rate_limited"] == 1


def test_the_clients_remembered_are_bounded() -> None:
    g = DumpGuard(Limits(per_client=1, max_clients=2))
    for c in ("a", "b", "c"):
        assert g.start(c, f"job-{c}") is None
    assert len(g._asks) == 2 and "a" not in g._asks   # the oldest forgotten


# -- against a real daemon HTTP server ---------------------------------------------------

def _request(port: int, method: str, path: str, headers=None, body: bytes | None = None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request(method, path, body=body, headers=headers or {})
    r = c.getresponse()
    out = r.status, dict(r.getheaders()), r.read()
    c.close()
    return out


def _asks(d) -> int:
    """Fresh-ask commands queued for the job's agent (three per ask)."""
    return len(d.table.agents["agent-a"].commands)


def _fresh(body: bytes) -> dict:
    return json.loads(members(body)["bundle.json"])["fresh"]


@pytest.fixture
def served():
    d, _ = stalled_daemon()
    srv = HttpServer(d, "127.0.0.1", 0, lambda fn: fn(), hosts=allowed_hosts("", "127.0.0.1"))
    srv.start()
    try:
        yield d, srv
    finally:
        srv.stop()


def _form(token: str) -> tuple[dict[str, str], bytes]:
    return ({"Content-Type": "application/x-www-form-urlencoded"},
            urlencode({"token": token}).encode())


def _counted(port: int) -> dict[str, float]:
    text = _request(port, "GET", "/metrics")[2].decode()
    return {m[0]: float(m[1]) for m in re.findall(
        r'^ncclwatch_daemon_dump_requests_total\{outcome="(\w+)"\} (\S+)$', text, re.M)}


def test_get_head_and_cross_site_posts_ask_no_rank_anything(served) -> None:
    d, srv = served
    port, own = srv.port, f"127.0.0.1:{srv.port}"
    assert _counted(port) == dict.fromkeys(dumpguard.OUTCOMES, 0.0)
    code, h, body = _request(port, "GET", "/api/v1/dump?job=job-1&wait=5")
    assert code == 200 and h["Content-Type"] == "application/gzip"
    assert _fresh(body) == {"asked": False} and _asks(d) == 0
    assert _request(port, "HEAD", "/api/v1/dump?job=job-1")[0] == 200 and _asks(d) == 0

    token = re.search(r"name='token' value='([^']+)'",
                      _request(port, "GET", "/")[2].decode()).group(1)
    ctype, form = _form(token)
    refused = [
        # another site's page: a form with the token it cannot read, or a fetch
        ({"Origin": "http://evil.example", **ctype}, form, "refused_origin"),
        ({"Sec-Fetch-Site": "cross-site", "X-Ncclwatch-Request": "dump"}, None,
         "refused_origin"),
        # a form whose browser sends no Origin (an old one): no token, no header
        (ctype, urlencode({"token": "guess"}).encode(), "refused_token"),
        ({}, None, "refused_token"),
    ]
    for headers, body, outcome in refused:
        code, _, text = _request(port, "POST", "/api/v1/dump?job=job-1&wait=0.2",
                                 headers, body)
        assert code == 403, (headers, text)
    assert _asks(d) == 0
    assert _counted(port) == {"served": 0, "refused_origin": 2, "refused_token": 2, "busy": 0,
                              "rate_limited": 0}

    # the page's own form (its token, its Origin) and the CLI's header both ask
    code, _, body = _request(port, "POST", "/api/v1/dump?job=job-1&wait=0.2",
                             {"Origin": f"http://{own}", "Sec-Fetch-Site": "same-origin",
                              **ctype}, form)
    assert code == 200 and _fresh(body)["asked"] and _fresh(body)["agents"] == 1
    assert _asks(d) == 3
    code, _, body = _request(port, "POST", "/api/v1/dump?job=job-1&wait=0.2",
                             {"X-Ncclwatch-Request": "dump"})
    assert code == 200 and _fresh(body)["asked"] and _asks(d) == 6
    assert _counted(port)["served"] == 2


def test_a_second_dump_of_a_job_waits_and_a_busy_client_is_slowed(served) -> None:
    d, srv = served
    port, ask = srv.port, {"X-Ncclwatch-Request": "dump"}
    first: list = []
    t = threading.Thread(target=lambda: first.append(
        _request(port, "POST", "/api/v1/dump?job=job-1&wait=2", ask)))
    t.start()
    deadline = time.monotonic() + 10
    while _asks(d) == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    code, _, text = _request(port, "POST", "/api/v1/dump?job=job-1&wait=0.2", ask)
    t.join()
    assert code == 409 and b"running now" in text
    assert first[0][0] == 200 and _asks(d) == 3

    srv.dump_guard.limits = Limits(per_client=2)
    code, h, text = _request(port, "POST", "/api/v1/dump?job=job-1&wait=0", ask)
    assert code == 429 and 1 <= int(h["Retry-After"]) <= 60, text
    assert _counted(port) == {"served": 1, "refused_origin": 0, "refused_token": 0, "busy": 1,
                              "rate_limited": 1}


def test_a_dump_post_is_behind_basic_auth_first(tmp_path) -> None:
    import base64

    from ncclwatch.daemon.webconfig import load
    from tests.harness.credentials import HASH, PASSWORD, write_config

    d, _ = stalled_daemon()
    web = load(write_config(tmp_path / "web.yml", f"basic_auth_users:\n  ops: {HASH}\n"))
    srv = HttpServer(d, "127.0.0.1", 0, lambda fn: fn(), web=web)
    srv.start()
    good = {"Authorization": "Basic " + base64.b64encode(f"ops:{PASSWORD}".encode()).decode()}
    try:
        ask = {"X-Ncclwatch-Request": "dump"}
        assert _request(srv.port, "POST", "/api/v1/dump?job=job-1&wait=0", ask)[0] == 401
        assert srv.dump_guard.counts()["served"] == 0 and _asks(d) == 0
        code, _, body = _request(srv.port, "POST", "/api/v1/dump?job=job-1&wait=0.2",
                                 {**ask, **good})
        assert code == 200 and _fresh(body)["asked"] and _asks(d) == 3
        code, _, _ = _request(srv.port, "POST", "/api/v1/dump?job=job-1&wait=0.2",
                              {**good, "Content-Type": "application/x-www-form-urlencoded"},
                              b"x" * 5000)
        assert code == 413 and _asks(d) == 3
    finally:
        srv.stop()


def test_the_dump_command_posts_with_the_header_and_gets_a_fresh_ask(served, tmp_path) -> None:
    from ncclwatch.cli import main

    d, srv = served
    base = f"http://127.0.0.1:{srv.port}"
    assert main(["dump", "job-1", "--daemon", base, "--wait", "0.2", "--out",
                 str(tmp_path)]) == 0
    [got] = tmp_path.glob("ncclwatch-dump-job-1-*.tar.gz")
    assert _fresh(got.read_bytes())["asked"] and _asks(d) == 3
    got.unlink()
    assert main(["dump", "job-1", "--daemon", base, "--wait", "0", "--out",
                 str(tmp_path)]) == 0      # --wait 0: a GET, what the daemon holds
    [got] = tmp_path.glob("ncclwatch-dump-job-1-*.tar.gz")
    assert _fresh(got.read_bytes()) == {"asked": False} and _asks(d) == 3
    assert srv.dump_guard.counts()["served"] == 1
