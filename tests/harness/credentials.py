"""What tests authenticate with: certificates from the real ``ncclwatch certs``, a
basic-auth password and its bcrypt hash for ``--web-config``."""

from __future__ import annotations

import subprocess
from pathlib import Path

import bcrypt

from ncclwatch.tls import ClientTLS
from tests.harness.tools import need

#: The basic-auth password of the web configs the tests write.
PASSWORD = "s3cret-scrape"
#: Cost 4 keeps the test fast; production hashes use 10-12.
HASH = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()


def make_certs(out: Path, *nodes: str, daemon_host: str = "localhost") -> str:
    """Run the real CLI, as a user would; return what it printed."""
    argv = [need("ncclwatch"), "certs", "--out", str(out), "--daemon-host", daemon_host]
    for n in nodes:
        argv += ["--node", n]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


def make_pki(base: Path) -> Path:
    """``base/ca``: a CA, the daemon's and node-a's and node-b's certificates;
    ``base/other``: node-a again under another CA (same names, not trusted)."""
    make_certs(base / "ca", "node-a", "node-b")
    make_certs(base / "other", "node-a")  # same names, another CA
    return base


def client(pki: Path, node: str = "node-a", ca_dir: str = "ca") -> ClientTLS:
    """An agent's TLS for ``node``, its certificate from ``pki/ca_dir``, trusting ``pki/ca``."""
    d = pki / ca_dir
    return ClientTLS(ca=(pki / "ca" / "ca.pem").read_bytes(), cert=(d / f"{node}.pem").read_bytes(),
                     key=(d / f"{node}-key.pem").read_bytes())


def write_config(path: Path, text: str) -> str:
    """A config file (a web config, a TOML) written; its path as a string for a flag."""
    path.write_text(text)
    return str(path)
