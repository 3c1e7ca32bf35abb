"""``ncclwatch certs``: a test CA and the certificates mTLS needs.

For trying mTLS out and for tests, not a PKI: one CA, one daemon server
certificate, one client certificate per node (CN and DNS SAN = the node name
the agent reports as, which the daemon checks). An existing CA in the output
folder is reused, so nodes can be added later. ECDSA P-256, valid one year.

With the daemon certificate comes what its HTTP side needs beyond loopback
(exposure.py): a random password for user ``ncclwatch`` and web configs with
its bcrypt hash, one for this folder's files and one as the Kubernetes
layout's Secret ``ncclwatch-daemon-web`` holds it (deploy/kubernetes).
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import re
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import bcrypt
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_DAYS = 365
#: Names that would overwrite the CA's or the daemon's files.
RESERVED = {"ca", "ca-key", "daemon", "daemon-key"}
_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
#: The basic auth user of the web configs written here: Prometheus and people.
WEB_USER = "ncclwatch"
#: The Kubernetes layout's Secret for the daemons' HTTP side (deploy/kubernetes/daemon.yaml,
#: podmonitor.yaml): its keys are the files of this folder under kubernetes/.
WEB_SECRET = "ncclwatch-daemon-web"
#: Where the layout mounts the daemon certificate's Secret (ncclwatch-daemon-tls).
K8S_TLS = "/etc/ncclwatch-tls"


class CertsError(ValueError):
    pass


@dataclass
class Issued:
    cert: Path
    key: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    data = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), 0o600)  # an older file may have had other bits
        f.write(data)


def _write_secret(path: Path, data: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(data)


def web_config(cert: str, key: str, hashed: str) -> str:
    """An exporter-toolkit web config: HTTPS with cert/key, basic auth for WEB_USER."""
    return yaml.safe_dump({"tls_server_config": {"cert_file": cert, "key_file": key},
                           "basic_auth_users": {WEB_USER: hashed}}, sort_keys=False)


def web_auth(out: Path, daemon: Issued) -> list[str]:
    """A fresh password for WEB_USER: web.yml and web-password here (0600), and the
    Secret WEB_SECRET's keys (web.yml with the pods' paths, username, password)
    under kubernetes/, for ``kubectl create secret generic --from-file=DIR``."""
    password = secrets.token_urlsafe(24)       # 192 bits; no newline: Prometheus reads it as is
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt()).decode()
    _write_secret(out / "web.yml", web_config(str(daemon.cert.resolve()),
                                              str(daemon.key.resolve()), hashed))
    _write_secret(out / "web-password", password)
    k8s = out / "kubernetes" / WEB_SECRET
    k8s.mkdir(parents=True, exist_ok=True)
    os.chmod(out / "kubernetes", 0o700)
    _write_secret(k8s / "web.yml", web_config(f"{K8S_TLS}/tls.crt", f"{K8S_TLS}/tls.key", hashed))
    _write_secret(k8s / "username", WEB_USER)
    _write_secret(k8s / "password", password)
    return [f"wrote web    {out / 'web.yml'} (HTTPS with the daemon certificate, basic auth "
            f"user {WEB_USER}, password in {out / 'web-password'})",
            f"wrote Secret {k8s}/ (web.yml, username, password: kubectl -n ncclwatch create "
            f"secret generic {WEB_SECRET} --from-file={k8s})"]


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _builder(subject: str, issuer: x509.Name | None, public_key) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.timezone.utc)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    return (x509.CertificateBuilder()
            .subject_name(name).issuer_name(issuer or name).public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))  # clock skew
            .not_valid_after(now + datetime.timedelta(days=VALID_DAYS)))


def _san(names: Sequence[str]) -> x509.SubjectAlternativeName:
    out: list[x509.GeneralName] = []
    for n in names:
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(n)))
        except ValueError:
            out.append(x509.DNSName(n))
    return x509.SubjectAlternativeName(out)


def load_or_make_ca(out: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey, bool]:
    """The CA in ``out`` if there is one (True: made now)."""
    cert_path, key_path = out / "ca.pem", out / "ca-key.pem"
    if cert_path.exists() and key_path.exists():
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise CertsError(f"{key_path} is not an ECDSA key made by `ncclwatch certs`")
        return cert, key, False
    key = _key()
    cert = (_builder("ncclwatch test CA", None, key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .sign(key, hashes.SHA256()))
    _write_key(key_path, key)
    _write_cert(cert_path, cert)
    return cert, key, True


def issue(out: Path, stem: str, cn: str, names: Sequence[str], server: bool,
          ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey) -> Issued:
    key = _key()
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    cert = (_builder(cn, ca.subject, key.public_key())
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_san(names), critical=False)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    issued = Issued(out / f"{stem}.pem", out / f"{stem}-key.pem")
    _write_key(issued.key, key)
    _write_cert(issued.cert, cert)
    return issued


def check_node(name: str) -> str:
    if not _NODE_NAME.match(name) or name in RESERVED:
        raise CertsError(f"--node {name!r}: a node name is letters, digits, '.', '_', '-' "
                         f"(and not {', '.join(sorted(RESERVED))}): it names the files")
    return name


def make(out: Path, daemon_hosts: Sequence[str], nodes: Sequence[str]) -> list[str]:
    """Write the files; return the lines to print."""
    for n in nodes:
        check_node(n)
    out.mkdir(parents=True, exist_ok=True)
    os.chmod(out, 0o700)  # keys inside; the files themselves are 0600 too
    ca, ca_key, made = load_or_make_ca(out)
    lines = [f"{'wrote CA    ' if made else 'using existing CA'} {out / 'ca.pem'} "
             f"(key {out / 'ca-key.pem'})"]
    ca_pem = out.resolve() / "ca.pem"
    if daemon_hosts:
        names = list(dict.fromkeys([*daemon_hosts, "localhost", "127.0.0.1"]))
        d = issue(out, "daemon", daemon_hosts[0], names, True, ca, ca_key)
        lines.append(f"wrote daemon {d.cert} (key {d.key}; names {', '.join(names)})")
        lines += web_auth(out, d)
    issued = {}
    for n in nodes:
        issued[n] = issue(out, n, n, [n], False, ca, ca_key)
        lines.append(f"wrote node   {issued[n].cert} (key {issued[n].key})")
    lines.append("(private keys are mode 0600; keep ca-key.pem off the nodes)")
    lines.append("")
    if daemon_hosts:
        d_abs = out.resolve()
        lines.append("daemon (ncclwatch daemon or run):")
        lines.append(f"  --tls-cert {d_abs / 'daemon.pem'} --tls-key {d_abs / 'daemon-key.pem'} "
                     f"--tls-client-ca {ca_pem}")
        lines.append(f"  HTTPS and basic auth for /metrics, the API and the page: --web-config "
                     f"{d_abs / 'web.yml'} (user {WEB_USER}, password in "
                     f"{d_abs / 'web-password'})")
    target = daemon_hosts[0] if daemon_hosts else "DAEMON-HOST"
    for n, i in issued.items():
        lines.append(f"agent on {n} (reports as --node {n}):")
        lines.append(f"  --collector {target}:7470 --tls-ca {ca_pem} "
                     f"--tls-cert {i.cert.resolve()} --tls-key {i.key.resolve()}")
    return lines


def main(args: argparse.Namespace) -> int:
    if not args.daemon_host and not args.node:
        print("ncclwatch certs: nothing to make: give --daemon-host and/or --node",
              file=sys.stderr)
        return 2
    try:
        lines = make(Path(args.out), args.daemon_host, args.node)
    except (CertsError, OSError, ValueError) as e:
        print(f"ncclwatch certs: {e}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0
