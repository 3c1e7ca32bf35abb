"""--web-config: HTTPS and basic auth on the daemon's HTTP side, in the
Prometheus exporter-toolkit format, with a certificate from ``ncclwatch certs``."""

from __future__ import annotations

import base64
import os
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import bcrypt
import pytest

from ncclwatch.cli import main
from ncclwatch.config import ConfigError
from ncclwatch.daemon import webconfig
from tests.harness.credentials import HASH, PASSWORD, make_certs, write_config
from tests.harness.daemons import serving
from tests.harness.procs import Proc, free_port
from tests.harness.tools import need


def get(port: int, path: str, ca: Path, auth: tuple[str, str] | None = None,
        client: tuple[Path, Path] | None = None) -> tuple[int, dict, bytes]:
    ctx = ssl.create_default_context(cafile=str(ca))
    if client:
        ctx.load_cert_chain(str(client[0]), str(client[1]))
    req = urllib.request.Request(f"https://127.0.0.1:{port}{path}")
    if auth:
        req.add_header("Authorization",
                       "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=10, context=ctx) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def test_https_and_basic_auth(web_pki, tmp_path) -> None:
    # Relative paths are relative to the file, as in exporter-toolkit.
    cfg = write_config(web_pki / "web.yml", f"""
tls_server_config:
  cert_file: daemon.pem
  key_file: daemon-key.pem
  min_version: TLS12
basic_auth_users:
  prometheus: {HASH}
""")
    web = webconfig.load(cfg)
    with serving(web) as port:
        ca = web_pki / "ca.pem"
        code, headers, _ = get(port, "/metrics", ca)
        assert code == 401 and headers["WWW-Authenticate"].startswith("Basic ")
        assert get(port, "/metrics", ca, ("prometheus", "wrong"))[0] == 401
        assert get(port, "/metrics", ca, ("nobody", PASSWORD))[0] == 401
        for path in ("/metrics", "/api/v1/jobs", "/api/v1/incidents", "/"):
            assert get(port, path, ca, ("prometheus", PASSWORD))[0] == 200, path
        code, _, body = get(port, "/healthz", ca)  # liveness: no credentials
        assert code == 200 and body == b"ok\n"
        code, _, body = get(port, "/metrics", ca, ("prometheus", PASSWORD))
        assert b"ncclwatch_daemon_" in body
        # Plain HTTP to the HTTPS port gets no answer; HTTPS with another CA fails.
        with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5).read()
        other = tmp_path / "other"
        make_certs(other)
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
            get(port, "/healthz", other / "ca.pem")


def test_good_passwords_are_cached_bad_ones_are_not(monkeypatch) -> None:
    auth = webconfig.BasicAuth({"prometheus": HASH.encode()})
    calls = []
    real = bcrypt.checkpw
    monkeypatch.setattr(bcrypt, "checkpw", lambda pw, h: calls.append(pw) or real(pw, h))

    def header(user, pw):
        return "Basic " + base64.b64encode(f"{user}:{pw}".encode()).decode()

    for _ in range(5):  # five scrapes: one bcrypt
        assert auth.check(header("prometheus", PASSWORD))
    assert len(calls) == 1
    for _ in range(2):  # a wrong password is checked every time, never cached as good
        assert not auth.check(header("prometheus", "nope"))
    assert len(calls) == 3
    assert not auth.check(header("ghost", PASSWORD))  # unknown user: same bcrypt cost
    assert len(calls) == 4
    assert PASSWORD.encode() not in b"".join(auth._good.values())  # no password kept
    for bad in (None, "", "Bearer x", "Basic !!!", "Basic " + base64.b64encode(b"nocolon")
                .decode(), header("prometheus", "x" * 100)):
        assert not auth.check(bad)


def test_client_certificate_required(web_pki) -> None:
    cfg = write_config(web_pki / "mtls.yml", f"""
tls_server_config:
  cert_file: {web_pki / 'daemon.pem'}
  key_file: {web_pki / 'daemon-key.pem'}
  client_auth_type: RequireAndVerifyClientCert
  client_ca_file: {web_pki / 'ca.pem'}
""")
    with serving(webconfig.load(cfg)) as port:
        ca = web_pki / "ca.pem"
        with pytest.raises((urllib.error.URLError, ConnectionError, ssl.SSLError)):
            get(port, "/metrics", ca)
        code, _, _ = get(port, "/metrics", ca, client=(web_pki / "scraper.pem",
                                                       web_pki / "scraper-key.pem"))
        assert code == 200


BAD_CONFIGS = [
    ("unknown top key", "basic_auth_user:\n  a: b\n", "unknown key(s) basic_auth_user"),
    ("unknown tls key", "tls_server_config:\n  cert_file: daemon.pem\n  key_file: "
     "daemon-key.pem\n  cert_fil: x\n", "tls_server_config: unknown key(s) cert_fil"),
    ("unsupported key", "tls_server_config:\n  cert_file: daemon.pem\n  key_file: "
     "daemon-key.pem\n  cipher_suites: [x]\n", "cipher_suites: not supported"),
    ("key file missing", "tls_server_config:\n  cert_file: daemon.pem\n", "key_file is required"),
    ("no such file", "tls_server_config:\n  cert_file: nope.pem\n  key_file: daemon-key.pem\n",
     "nope.pem: no such file"),
    ("verify without CA", "tls_server_config:\n  cert_file: daemon.pem\n  key_file: "
     "daemon-key.pem\n  client_auth_type: RequireAndVerifyClientCert\n", "needs client_ca_file"),
    ("unservable auth type", "tls_server_config:\n  cert_file: daemon.pem\n  key_file: "
     "daemon-key.pem\n  client_auth_type: RequestClientCert\n", "is not supported"),
    ("bad auth type", "tls_server_config:\n  cert_file: daemon.pem\n  key_file: "
     "daemon-key.pem\n  client_auth_type: Maybe\n", "'Maybe' is not one of"),
    ("bad version", "tls_server_config:\n  cert_file: daemon.pem\n  key_file: "
     "daemon-key.pem\n  min_version: TLS9\n", "min_version 'TLS9'"),
    ("plain password", "basic_auth_users:\n  prometheus: hunter2\n", "not a bcrypt hash"),
    ("not yaml", "a: [\n", "not valid YAML"),
]


@pytest.mark.parametrize("name,text,message", BAD_CONFIGS, ids=[b[0] for b in BAD_CONFIGS])
def test_config_errors_say_what_is_wrong(web_pki, name, text, message) -> None:
    path = write_config(web_pki / "bad.yml", text)
    with pytest.raises(ConfigError) as ei:
        webconfig.load(path)
    assert message in str(ei.value) and path in str(ei.value), str(ei.value)


def test_cli_exits_2_on_a_bad_web_config(web_pki, capsys) -> None:
    path = write_config(web_pki / "bad-cli.yml", "basic_auth_users:\n  prometheus: hunter2\n")
    assert main(["daemon", "--web-config", path]) == 2
    assert "not a bcrypt hash" in capsys.readouterr().err
    assert webconfig.load(write_config(web_pki / "empty.yml", "")).ssl_context is None


def test_status_talks_to_a_secured_daemon_process(web_pki, tmp_path) -> None:
    """The real `ncclwatch daemon --web-config` and `ncclwatch status --ca`."""
    cfg = write_config(web_pki / "status.yml", f"""
tls_server_config:
  cert_file: daemon.pem
  key_file: daemon-key.pem
basic_auth_users:
  ops: {HASH}
""")
    grpc_port, http_port = free_port(), free_port()
    daemon = Proc([need("ncclwatch"), "daemon", "--grpc", f"127.0.0.1:{grpc_port}", "--http",
                   f"127.0.0.1:{http_port}", "--web-config", cfg], name="ncclwatch-daemon-web")
    ca = str(web_pki / "ca.pem")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCLWATCH_")}

    def status(url: str, *extra: str, **more_env: str) -> subprocess.CompletedProcess:
        return subprocess.run([need("ncclwatch"), "status", "--daemon", url, *extra],
                              capture_output=True, text=True, timeout=60,
                              env={**env, **more_env})
    try:
        base = f"localhost:{http_port}"
        deadline = time.time() + 20
        while not _up(http_port) and time.time() < deadline:
            assert daemon.alive(), daemon.output()
            time.sleep(0.1)
        assert get(http_port, "/healthz", web_pki / "ca.pem")[0] == 200
        assert "HTTP on https://" in daemon.output() and "(basic auth)" in daemon.output()
        ok = status(f"https://ops:{PASSWORD}@{base}", "--ca", ca)
        assert ok.returncode == 0 and "no training jobs seen" in ok.stdout, ok.stderr
        via_env = status(f"https://{base}", "--ca", ca, "--json",
                         NCCLWATCH_DAEMON_AUTH=f"ops:{PASSWORD}")
        assert via_env.returncode == 0 and '"jobs"' in via_env.stdout, via_env.stderr
        no_auth = status(f"https://{base}", "--ca", ca)
        assert no_auth.returncode == 1 and "needs basic auth" in no_auth.stderr
        wrong = status(f"https://ops:nope@{base}", "--ca", ca)
        assert wrong.returncode == 1 and "rejected the credentials of user 'ops'" in wrong.stderr
        assert "nope" not in wrong.stderr  # the password is never printed
        no_ca = status(f"https://ops:{PASSWORD}@{base}")
        assert no_ca.returncode == 1 and "--ca" in no_ca.stderr
        assert PASSWORD not in no_ca.stderr
    finally:
        daemon.stop()


def _up(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _readme_scrape_config() -> dict:
    """The HTTPS + basic auth scrape config from docs/deploy-systemd.md, as printed."""
    import yaml

    from tests.harness.paths import ROOT

    section = (ROOT / "docs" / "deploy-systemd.md").read_text()
    blocks = [b.split("```", 1)[0] for b in section.split("```yaml")[1:]]
    [block] = [b for b in blocks if "scheme: https" in b]
    return yaml.safe_load(block)


def test_real_prometheus_scrapes_with_the_readme_config(web_pki, tmp_path) -> None:
    import json
    import shutil

    prometheus = shutil.which("prometheus")
    if prometheus is None:
        pytest.fail("prometheus not found: install Debian's `prometheus` package "
                    "(make test does it)")
    cfg = write_config(web_pki / "prom-web.yml", f"""
tls_server_config:
  cert_file: daemon.pem
  key_file: daemon-key.pem
basic_auth_users:
  ncclwatch: {HASH}
""")
    scrape = _readme_scrape_config()
    job = scrape["scrape_configs"][0]
    (tmp_path / "password").write_text(PASSWORD)
    job["tls_config"]["ca_file"] = str(web_pki / "ca.pem")
    job["basic_auth"]["password_file"] = str(tmp_path / "password")
    with serving(webconfig.load(cfg)) as port:
        job["static_configs"] = [{"targets": [f"localhost:{port}"]}]
        job["scrape_interval"] = "1s"
        (tmp_path / "prometheus.yml").write_text(json.dumps(scrape))
        prom_port = free_port()
        prom = Proc([prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
                     f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                     f"--web.listen-address=127.0.0.1:{prom_port}"], name="prometheus")
        try:
            deadline, target = time.time() + 60, None
            while time.time() < deadline:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{prom_port}/api/v1/targets",
                                                timeout=2) as r:
                        targets = json.load(r)["data"]["activeTargets"]
                except OSError:
                    targets = []
                target = targets[0] if targets else None
                if target and target["health"] == "up":
                    break
                assert prom.alive(), prom.output()[-3000:]
                time.sleep(0.5)
            assert target and target["health"] == "up", (target, prom.output()[-3000:])
            assert target["scrapeUrl"].startswith("https://")
        finally:
            prom.stop()
