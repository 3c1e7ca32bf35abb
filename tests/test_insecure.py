"""A daemon refuses to serve plaintext beyond loopback unless told ``--insecure``.

The real CLI in a subprocess: on 0.0.0.0 without TLS it exits 2 and says what
to pass; with --insecure it starts (and its default Host allowlist still
refuses a foreign name); on loopback it starts as before.
"""

from __future__ import annotations

import http.client
import subprocess
import time

import pytest

from ncclwatch.daemon import exposure
from tests.conftest import Proc, free_port, need


def _refused(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([need("ncclwatch"), *argv], capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize("listen", [
    ["--grpc", "0.0.0.0:{g}", "--http", "0.0.0.0:{h}"],
    ["--grpc", "127.0.0.1:{g}", "--http", "0.0.0.0:{h}"],
    ["--grpc", "[::]:{g}", "--http", "127.0.0.1:{h}"],
])
def test_daemon_beyond_loopback_without_tls_exits_2_saying_what_to_pass(listen) -> None:
    g, h = free_port(), free_port()
    r = _refused("daemon", *(a.format(g=g, h=h) for a in listen))
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "refusing to listen beyond loopback" in r.stderr
    assert "--insecure" in r.stderr
    if "0.0.0.0:{g}" in listen or "[::]:{g}" in listen:
        assert "--tls-client-ca" in r.stderr
    if "0.0.0.0:{h}" in listen:
        assert "--web-config" in r.stderr


def test_the_default_daemon_refuses() -> None:
    r = _refused("daemon")
    assert r.returncode == 2 and "0.0.0.0:7470" in r.stderr and "0.0.0.0:7471" in r.stderr


def _get(port: int, path: str, host: str) -> tuple[int, bytes]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.putrequest("GET", path, skip_host=True)
        c.putheader("Host", host)
        c.endheaders()
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


@pytest.mark.parametrize("how", ["flag", "env"])
def test_insecure_starts_and_still_guards_the_host(how: str) -> None:
    g, h = free_port(), free_port()
    argv = [need("ncclwatch"), "daemon", "--grpc", f"0.0.0.0:{g}", "--http", f"0.0.0.0:{h}"]
    import os
    env = dict(os.environ)
    if how == "flag":
        argv.append("--insecure")
    else:
        env["NCCLWATCH_INSECURE"] = "1"
    proc = Proc(argv, env=env, name="daemon-insecure")
    try:
        deadline = time.time() + 30
        while True:
            try:
                code, _ = _get(h, "/healthz", f"127.0.0.1:{h}")
                break
            except OSError:
                assert time.time() < deadline and proc.alive(), proc.output()
                time.sleep(0.3)
        assert code == 200
        assert "--insecure" in proc.output() or "plaintext" in proc.output()
        assert _get(h, "/api/v1/jobs", "rebind.attacker.example")[0] == 403
        assert _get(h, "/api/v1/jobs", f"localhost:{h}")[0] == 200
    finally:
        proc.stop()


def test_loopback_names() -> None:
    for host in ("127.0.0.1", "127.5.0.1", "::1", "localhost"):
        assert exposure.is_loopback(host), host
    for host in ("0.0.0.0", "::", "", "10.0.0.1", "collector.example"):
        assert not exposure.is_loopback(host), host
    assert exposure.plaintext("127.0.0.1:1", "[::1]:2", grpc_tls=False, http_tls=False) == []
    assert exposure.plaintext("0.0.0.0:1", "0.0.0.0:2", grpc_tls=True, http_tls=True) == []
    assert len(exposure.plaintext(":1", "host:2", grpc_tls=False, http_tls=False)) == 2
