"""mTLS between agent and daemon: which flags go together, the credentials,
and the node names a client certificate proves.

Files are read and checked once at startup, so a wrong path or a key that
does not belong to its certificate is a config error (exit 2) with the flag
named, not a handshake failure minutes later.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import grpc

from ncclwatch.config import ConfigError


@dataclass(frozen=True)
class ServerTLS:
    """The daemon's side: its certificate, and the CA its agents' certificates come from."""
    cert: bytes
    key: bytes
    client_ca: bytes

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials([(self.key, self.cert)],
                                           root_certificates=self.client_ca,
                                           require_client_auth=True)


@dataclass(frozen=True)
class ClientTLS:
    """The agent's side: the CA that signed the daemon, and the node's own certificate."""
    ca: bytes
    cert: bytes
    key: bytes
    server_name: str | None = None

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(self.ca, self.key, self.cert)

    def options(self) -> tuple[tuple[str, Any], ...]:
        return (("grpc.ssl_target_name_override", self.server_name),) if self.server_name else ()


def _read(cfg: Mapping[str, Any], name: str) -> bytes:
    path = cfg[name]
    flag = "--" + name.replace("_", "-")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ConfigError(f"{flag} {path}: cannot read it: {e.strerror}") from None
    return data


def _check_pair(cert: bytes, key: bytes, cfg: Mapping[str, Any]):
    """PEM that parses, and a key that belongs to the certificate; the certificate."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    try:
        c = x509.load_pem_x509_certificate(cert)
    except ValueError:
        raise ConfigError(f"--tls-cert {cfg['tls_cert']}: not a PEM certificate") from None
    try:
        k = serialization.load_pem_private_key(key, password=None)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"--tls-key {cfg['tls_key']}: not an unencrypted PEM private key "
                          f"({e})") from None
    pub = serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    if c.public_key().public_bytes(*pub) != k.public_key().public_bytes(*pub):
        raise ConfigError(f"--tls-key {cfg['tls_key']} does not belong to --tls-cert "
                          f"{cfg['tls_cert']}")
    return c


def cert_names(cert) -> set[str]:
    """CN and DNS SANs of a cryptography certificate: what the daemon checks."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    names = {a.value for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)}
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names.update(san.get_values_for_type(x509.DNSName))
    except x509.ExtensionNotFound:
        pass
    return {str(n) for n in names}


def _check_ca(data: bytes, flag: str, path: str) -> None:
    from cryptography import x509

    try:
        x509.load_pem_x509_certificates(data)
    except ValueError:
        raise ConfigError(f"{flag} {path}: not a PEM certificate (bundle)") from None


def server_tls(cfg: Mapping[str, Any]) -> ServerTLS | None:
    """From tls_cert, tls_key, tls_client_ca; None when all are unset (insecure)."""
    given = [k for k in ("tls_cert", "tls_key", "tls_client_ca") if cfg.get(k)]
    if not given:
        return None
    if not (cfg.get("tls_cert") and cfg.get("tls_key")):
        raise ConfigError("TLS needs --tls-cert and --tls-key together (the daemon's "
                          "certificate and its key)")
    if not cfg.get("tls_client_ca"):
        raise ConfigError("--tls-cert/--tls-key without --tls-client-ca: with TLS on, the "
                          "daemon requires every agent to present a client certificate, so "
                          "it needs the CA that signs them (e.g. ca.pem from `ncclwatch certs`)")
    cert, key, ca = _read(cfg, "tls_cert"), _read(cfg, "tls_key"), _read(cfg, "tls_client_ca")
    _check_pair(cert, key, cfg)
    _check_ca(ca, "--tls-client-ca", cfg["tls_client_ca"])
    return ServerTLS(cert=cert, key=key, client_ca=ca)


def client_tls(cfg: Mapping[str, Any], node: str | None = None) -> ClientTLS | None:
    """From tls_ca, tls_cert, tls_key, tls_server_name; None when all are unset.

    With ``node``, the certificate must be for it: else the daemon would
    refuse every report, and the agent would only log that, forever.
    """
    given = [k for k in ("tls_ca", "tls_cert", "tls_key", "tls_server_name") if cfg.get(k)]
    if not given:
        return None
    missing = [k for k in ("tls_ca", "tls_cert", "tls_key") if not cfg.get(k)]
    if missing:
        raise ConfigError(
            f"mTLS to the daemon needs --tls-ca, --tls-cert and --tls-key together; missing "
            f"{', '.join('--' + m.replace('_', '-') for m in missing)} (the daemon requires "
            f"a client certificate for this node)")
    ca, cert, key = _read(cfg, "tls_ca"), _read(cfg, "tls_cert"), _read(cfg, "tls_key")
    _check_ca(ca, "--tls-ca", cfg["tls_ca"])
    names = cert_names(_check_pair(cert, key, cfg))
    if node is not None and node not in names:
        raise ConfigError(f"--tls-cert {cfg['tls_cert']} is for "
                          f"{', '.join(map(repr, sorted(names))) or 'no name'}, but this agent "
                          f"reports as --node {node!r}: the daemon would refuse its reports "
                          f"(make a certificate for the node, or set --node)")
    return ClientTLS(ca=ca, cert=cert, key=key, server_name=cfg.get("tls_server_name") or None)


def peer_names(context: grpc.aio.ServicerContext) -> frozenset[str] | None:
    """Names the client's certificate proves (CN and DNS SANs), or None on a
    connection without TLS (only the daemon's own private socket in ``run``)."""
    auth = context.auth_context() or {}
    if auth.get("transport_security_type") != [b"ssl"]:
        return None
    names: set[str] = set()
    # peer_dns holds the DNS SANs alone; the generic SAN list also has IPs and URIs.
    for key in ("x509_common_name", "peer_dns"):
        names.update(v.decode("utf-8", "replace") for v in auth.get(key, ()))
    return frozenset(names)
