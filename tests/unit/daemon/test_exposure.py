"""A daemon refuses to listen beyond loopback unprotected unless told ``--insecure``.

The real CLI in a subprocess: on 0.0.0.0 without TLS, or with HTTPS but no
users, it exits 2 and says what to pass; with ``ncclwatch certs``' web config it
starts and asks for the password; with --insecure it starts, says so loudly and
exports ncclwatch_daemon_unauthenticated_listener (and its default Host
allowlist still refuses a foreign name); on loopback it starts as before.
"""

from __future__ import annotations

import base64
import http.client
import os
import ssl
import subprocess
import time
from pathlib import Path

import pytest

from ncclwatch.daemon import exposure
from tests.harness.credentials import make_certs
from tests.harness.procs import Proc, free_port
from tests.harness.tools import need


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


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    """The real `ncclwatch certs`: CA, daemon certificate, web.yml and its password."""
    out = tmp_path_factory.mktemp("insecure") / "certs"
    make_certs(out)
    return out


def _tls_only(pki: Path) -> str:
    """A web config with HTTPS and no users: TLS alone, which is not enough."""
    path = pki / "tls-only.yml"
    path.write_text(f"tls_server_config:\n  cert_file: {pki / 'daemon.pem'}\n"
                    f"  key_file: {pki / 'daemon-key.pem'}\n")
    return str(path)


def test_https_without_users_beyond_loopback_exits_2(pki) -> None:
    """TLS hides the page from the wire, not from whoever reaches the port."""
    g, h = free_port(), free_port()
    r = _refused("daemon", "--grpc", f"127.0.0.1:{g}", "--http", f"0.0.0.0:{h}",
                 "--web-config", _tls_only(pki))
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "without authentication" in r.stderr and "basic_auth_users" in r.stderr
    assert "without TLS" not in r.stderr      # it has TLS: only the missing part is named
    # On loopback the same config starts (the refusal is about reach, not the file).
    assert exposure.exposed(f"127.0.0.1:{g}", f"127.0.0.1:{h}", grpc_tls=False,
                            http_tls=True, http_auth=False) == []


def _https_get(port: int, path: str, pki: Path, auth: str | None = None) -> tuple[int, str]:
    c = http.client.HTTPSConnection("localhost", port, timeout=10,
                                    context=ssl.create_default_context(
                                        cafile=str(pki / "ca.pem")))
    try:
        headers = {"Authorization": "Basic " + base64.b64encode(auth.encode()).decode()} \
            if auth else {}
        c.request("GET", path, headers=headers)
        r = c.getresponse()
        return r.status, r.read().decode()
    finally:
        c.close()


def _wait_up(port: int, proc: Proc, get) -> None:
    deadline = time.time() + 30
    while True:
        try:
            get(port, "/healthz")
            return
        except OSError:
            assert time.time() < deadline and proc.alive(), proc.output()
            time.sleep(0.3)


def test_the_web_config_ncclwatch_certs_writes_starts_and_asks_for_the_password(pki) -> None:
    g, h = free_port(), free_port()
    proc = Proc([need("ncclwatch"), "daemon", "--grpc", f"127.0.0.1:{g}", "--http",
                 f"0.0.0.0:{h}", "--web-config", str(pki / "web.yml")], name="daemon-auth")
    try:
        _wait_up(h, proc, lambda p, path: _https_get(p, path, pki))
        password = (pki / "web-password").read_text()
        assert _https_get(h, "/healthz", pki)[0] == 200          # the probes need nothing
        assert _https_get(h, "/api/v1/jobs", pki)[0] == 401
        assert _https_get(h, "/metrics", pki, "ncclwatch:wrong")[0] == 401
        status, metrics = _https_get(h, "/metrics", pki, f"ncclwatch:{password}")
        assert status == 200
        assert 'ncclwatch_daemon_unauthenticated_listener{port="http"} 0.0' in metrics
        assert "INSECURE" not in proc.output()
    finally:
        proc.stop()


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
        assert "INSECURE (--insecure)" in proc.output()
        assert "without authentication" in proc.output()
        assert _get(h, "/api/v1/jobs", "rebind.attacker.example")[0] == 403
        assert _get(h, "/api/v1/jobs", f"localhost:{h}")[0] == 200
        code, metrics = _get(h, "/metrics", f"localhost:{h}")
        for port in ("grpc", "http"):
            assert (f'ncclwatch_daemon_unauthenticated_listener{{port="{port}"}} 1.0'
                    in metrics.decode()), metrics[-3000:]
    finally:
        proc.stop()


def test_loopback_names() -> None:
    for host in ("127.0.0.1", "127.5.0.1", "::1", "localhost"):
        assert exposure.is_loopback(host), host
    for host in ("0.0.0.0", "::", "", "10.0.0.1", "collector.example"):
        assert not exposure.is_loopback(host), host
    none = dict(grpc_tls=False, http_tls=False, http_auth=False)
    assert exposure.exposed("127.0.0.1:1", "[::1]:2", **none) == []
    assert exposure.exposed("0.0.0.0:1", "0.0.0.0:2", grpc_tls=True, http_tls=True,
                            http_auth=True) == []
    assert len(exposure.exposed(":1", "host:2", **none)) == 3
    # TLS on both, no users: HTTP is still refused, for want of authentication alone.
    [only] = exposure.exposed("0.0.0.0:1", "0.0.0.0:2", grpc_tls=True, http_tls=True,
                              http_auth=False)
    assert only.startswith("HTTP on 0.0.0.0:2 without authentication"), only
    assert exposure.unauthenticated("0.0.0.0:1", "127.0.0.1:2", grpc_tls=False,
                                    http_auth=False) == {"grpc": True, "http": False}
