"""HTTP against hostile clients (issue 20, item 7): DNS rebinding, bad cursors, HEAD.

Reproductions: the unauthenticated ``run`` daemon served any Host header (a
page whose DNS name rebinds to 127.0.0.1 could read the API), a paging
cursor of ``Infinity`` gave 500, HEAD gave 501. Real HTTP against a real
daemon server; the last test runs the real ``ncclwatch run``.
"""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import time

import pytest

from ncclwatch.cli import DAEMON_OPTIONS, RUN_OPTIONS, build_parser
from ncclwatch.config import resolve
from ncclwatch.daemon.core import Daemon, DaemonConfig
from ncclwatch.daemon.http import allowed_hosts, host_of
from ncclwatch.daemon.server import DaemonServer
from tests.harness.procs import Proc, free_port
from tests.harness.reports import checkpoint_job
from tests.harness.tools import need

LOOPBACK = "localhost,127.0.0.1,::1"


def _request(port: int, method: str, path: str, host: str | None = None
             ) -> tuple[int, dict[str, str], bytes]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.putrequest(method, path, skip_host=host is not None)
        if host is not None:
            c.putheader("Host", host)
        c.endheaders()
        r = c.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        c.close()


class Served:
    """A real DaemonServer (gRPC and HTTP threads) with one job in it."""

    def __init__(self, hosts: str = "") -> None:
        self.hosts = hosts

    def __enter__(self) -> "Served":
        self.loop = asyncio.new_event_loop()
        d = Daemon(DaemonConfig(grpc="127.0.0.1:0", http="127.0.0.1:0", allowed_hosts=self.hosts))
        d.ingest(checkpoint_job())
        self.server = DaemonServer(d)
        import threading
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            self.loop.run_until_complete(self.server.start())
            ready.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert ready.wait(30)
        self.port = self.server.http_port
        return self

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(grace=0.1), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def test_host_allowlist_refuses_a_rebound_name() -> None:
    with Served(LOOPBACK) as s:
        for host in ("attacker.example", f"attacker.example:{s.port}", "127.0.0.1.evil.com",
                     "localhost.attacker.example"):
            for path in ("/api/v1/jobs", "/metrics", "/", "/healthz", "/api/v1/dump?job=job-1"):
                code, _, body = _request(s.port, "GET", path, host)
                assert code == 403 and b"allowed_hosts" in body, (host, path, code)
                assert b"job-1" not in body
        for host in (f"localhost:{s.port}", "127.0.0.1", f"[::1]:{s.port}", "LOCALHOST",
                     "localhost."):
            code, _, body = _request(s.port, "GET", "/api/v1/jobs", host)
            assert code == 200 and b"job-1" in body, host
        assert s.server._http.hosts_refused_total == 20


def test_star_serves_any_host() -> None:
    with Served("*") as s:
        code, _, body = _request(s.port, "GET", "/api/v1/jobs", "prometheus.internal:7471")
        assert code == 200 and b"job-1" in body


@pytest.mark.parametrize("payload", [
    '["job-1", Infinity]', '["job-1", -Infinity]', '["job-1", NaN]', '["job-1", 1e999]',
    '["job-1", 1.5]', '["job-1", ' + "9" * 40 + "]", '["job-1", true]', '{"a": 1, "b": 2}',
    '["job-1"]', '[1, 2]', "[" * 5000 + "]" * 5000, '"job-1"', "null",
])
def test_bad_cursors_are_400_not_500(payload) -> None:
    cursor = base64.urlsafe_b64encode(payload.encode()).decode()
    with Served() as s:
        code, _, body = _request(s.port, "GET", f"/api/v1/jobs?ranks=1&cursor={cursor}")
        assert code == 400, (payload[:40], code, body[:200])
        assert b"cursor: not one this API gave out" in body


def test_a_cursor_the_api_gave_out_still_works() -> None:
    with Served() as s:
        code, _, body = _request(s.port, "GET", "/api/v1/jobs?ranks=1&limit=2")
        nxt = json.loads(body)["next_cursor"]
        assert code == 200 and nxt
        code, _, body = _request(s.port, "GET", f"/api/v1/jobs?ranks=1&limit=2&cursor={nxt}")
        assert code == 200 and [r["rank"] for r in json.loads(body)["jobs"][0]["ranks"]] == [2, 3]


@pytest.mark.parametrize("path", ["/", "/metrics", "/api/v1/jobs", "/api/v1/incidents",
                                  "/healthz", "/nope"])
def test_head_is_answered_for_every_get_route(path) -> None:
    with Served(LOOPBACK) as s:
        g_code, g_headers, g_body = _request(s.port, "GET", path)
        h_code, h_headers, h_body = _request(s.port, "HEAD", path)
        assert h_code == g_code and h_body == b""
        assert h_headers["Content-Type"] == g_headers["Content-Type"]
        if path in ("/healthz", "/nope"):  # the others hold clock-driven numbers
            assert int(h_headers["Content-Length"]) == len(g_body)
        else:
            assert int(h_headers["Content-Length"]) > 0
        code, _, body = _request(s.port, "HEAD", path, "attacker.example")
        assert code == 403 and body == b""


def test_allowlist_parsing() -> None:
    assert host_of("[::1]:7471") == "::1" and host_of("Example.COM.:80") == "example.com"
    assert host_of("::1") == "::1"  # a bare IPv6 address (no brackets): kept whole
    assert allowed_hosts("*", "127.0.0.1") is None
    assert allowed_hosts(" * ", "0.0.0.0") is None
    assert allowed_hosts("localhost", "10.1.2.3") == {"localhost", "10.1.2.3"}
    assert allowed_hosts(["a", "b"], "0.0.0.0") == {"a", "b"}
    assert allowed_hosts("localhost", "fd00::5") == {"localhost", "fd00::5"}


def test_the_default_allowlist_is_the_external_host_this_machine_and_loopback() -> None:
    """Empty means the default, not "any Host": the external URL's host, this
    machine's names and loopback's names; IP addresses always (no DNS name to rebind)."""
    import socket

    for empty in ("", " , "):
        hosts = allowed_hosts(empty, "0.0.0.0", "https://ncclwatch.example:7471")
        assert hosts is not None
        for ok in ("ncclwatch.example", "localhost", "127.0.0.1", "::1", "10.1.2.3",
                   "fd00::5", socket.gethostname().lower()):
            assert ok in hosts, ok
        for bad in ("attacker.example", "127.0.0.1.evil.com", "localhost.attacker.example",
                    "10.1.2.3.nip.io"):
            assert bad not in hosts, bad
    # a list of one's own stays that list (and the listen host), IP addresses served
    own = allowed_hosts("mon.example", "0.0.0.0")
    assert "mon.example" in own and "10.9.9.9" in own
    assert "localhost" not in own and "other.example" not in own


def test_daemon_default_refuses_a_foreign_host() -> None:
    with Served("") as s:
        code, _, body = _request(s.port, "GET", "/api/v1/jobs", "rebind.attacker.example")
        assert code == 403 and b"allowed_hosts" in body and b"job-1" not in body
        for host in (f"localhost:{s.port}", f"127.0.0.1:{s.port}", f"10.0.0.7:{s.port}"):
            code, _, body = _request(s.port, "GET", "/api/v1/jobs", host)
            assert code == 200 and b"job-1" in body, host


def test_run_and_daemon_have_the_allowlist_on_by_default() -> None:
    run = resolve(RUN_OPTIONS, build_parser().parse_args(["run"]), {}, env={})
    assert run["allowed_hosts"] == LOOPBACK
    daemon = resolve(DAEMON_OPTIONS, build_parser().parse_args(["daemon"]), {}, env={})
    assert daemon["allowed_hosts"] == ""  # the default list, not any Host
    set_ = resolve(DAEMON_OPTIONS, build_parser().parse_args(
        ["daemon", "--allowed-hosts", "mon.example"]), {}, env={})
    assert set_["allowed_hosts"] == "mon.example"


def test_real_run_refuses_a_foreign_host() -> None:
    grpc_port, http_port = free_port(), free_port()
    proc = Proc([need("ncclwatch"), "run", "--grpc", f"127.0.0.1:{grpc_port}",
                 "--http", f"127.0.0.1:{http_port}"])
    try:
        deadline = time.time() + 30
        while True:
            try:
                code, _, _ = _request(http_port, "GET", "/healthz", f"localhost:{http_port}")
                break
            except OSError:
                assert time.time() < deadline and proc.alive(), proc.output()
                time.sleep(0.3)
        assert code == 200
        assert _request(http_port, "GET", "/api/v1/jobs", "rebind.attacker.example")[0] == 403
        assert _request(http_port, "HEAD", "/api/v1/jobs", f"127.0.0.1:{http_port}")[0] == 200
    finally:
        proc.stop()


def _post(port: int, path: str, host: str, body: bytes, method: str = "POST"
          ) -> tuple[int, bytes]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        c.putrequest(method, path, skip_host=True)
        c.putheader("Host", host)
        c.putheader("Content-Length", str(len(body)))
        c.endheaders()
        try:
            c.send(body)
        except (BrokenPipeError, ConnectionResetError):
            pass                     # refused before the body was read: the answer is there
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def test_host_allowlist_guards_every_method() -> None:
    """Issue 29, item 3: do_POST had no Host check, so a rebound page could make the
    unauthenticated daemon parse pastes; every method is refused the same way."""
    from ncclwatch.daemon import pastepage
    log = b"[rank3]:[E ProcessGroupNCCL.cpp:616] Watchdog caught collective operation timeout\n"
    with Served(LOOPBACK) as s:
        before = s.server._http.hosts_refused_total
        code, body = _post(s.port, pastepage.API_PATH, "rebind.attacker.example", log)
        assert code == 403 and b"allowed_hosts" in body and b"verdict" not in body
        # a big body is never parsed: refused on the header, the body dropped or cut off
        code, body = _post(s.port, pastepage.API_PATH, "rebind.attacker.example",
                           b"x" * (8 << 20))
        assert code == 403 and b"allowed_hosts" in body
        for method in ("PUT", "DELETE", "PATCH", "OPTIONS"):
            code, body = _post(s.port, "/api/v1/jobs", "attacker.example", b"", method)
            assert code == 403, (method, code)
        assert _request(s.port, "HEAD", "/api/v1/jobs", "attacker.example")[0] == 403
        assert s.server._http.hosts_refused_total == before + 7
        # the allowed Host still gets its diagnosis
        code, body = _post(s.port, pastepage.API_PATH, f"127.0.0.1:{s.port}", log)
        assert code == 200 and b"rank" in body, body[:300]


def test_the_page_sends_the_paste_pages_security_headers() -> None:
    """``/`` as the paste page: a CSP that allows exactly its own inline
    scripts and style (hashes of what it serves), no framing, nosniff, no
    Referer to another origin; every other answer is nosniff too."""
    import re

    from ncclwatch.daemon.pageheaders import csp_hash

    with Served(LOOPBACK) as s:
        code, headers, body = _request(s.port, "GET", "/")
        _, paste_headers, _ = _request(s.port, "GET", "/diagnose")
        _, api_headers, _ = _request(s.port, "GET", "/api/v1/jobs")
    html = body.decode()
    assert code == 200 and "job-1" in html
    assert set(headers) >= set(paste_headers) >= {
        "Content-Security-Policy", "X-Content-Type-Options", "Referrer-Policy"}
    assert headers["X-Content-Type-Options"] == "nosniff"
    # the page's dump forms post with its real Origin (same-origin), never a Referer elsewhere
    assert headers["Referrer-Policy"] == "same-origin"
    assert paste_headers["Referrer-Policy"] == "no-referrer"
    assert api_headers["X-Content-Type-Options"] == "nosniff"
    csp = dict(d.strip().split(" ", 1) for d in headers["Content-Security-Policy"].split(";"))
    assert csp["frame-ancestors"] == "'none'" and csp["default-src"] == "'none'"
    assert csp["connect-src"] == "'self'" and "unsafe-inline" not in headers[
        "Content-Security-Policy"]
    scripts = re.findall(r"<script[^>]*>(.*?)</script>", html, re.S)
    styles = re.findall(r"<style>(.*?)</style>", html, re.S)
    assert scripts and styles and " style=" not in html and " on" not in html.split("<main")[0]
    for text in scripts:
        assert csp_hash(text) in csp["script-src"].split()
    for text in styles:
        assert csp_hash(text) in csp["style-src"].split()
