"""``--web-config``: HTTPS and basic auth for the daemon's HTTP side, in the
Prometheus exporter-toolkit web config format (the file node_exporter and
friends take), so one file and one scrape config serve all exporters.

Like exporter-toolkit, unknown keys are an error (a typo must not silently
leave an endpoint open), relative paths are relative to the file, and
passwords are bcrypt hashes with successful checks cached, so a 5 s scrape
does not cost a bcrypt (~0.1-0.3 s of CPU) per request.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re
import secrets
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import bcrypt
import yaml

from ncclwatch.config import ConfigError

#: exporter-toolkit's client_auth_type -> Python's verify mode. Python's ssl
#: verifies every certificate it asks for, so the two "ask but do not verify"
#: modes cannot be served as Go serves them: refused with a reason, not guessed.
CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
CLIENT_AUTH_UNSUPPORTED = ("RequestClientCert", "RequireAnyClientCert")
TLS_VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1,
                "TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}

#: Keys ncclwatch reads, per section; exporter-toolkit keys it does not
#: implement are named apart, so the error says "not supported", not "typo".
TOP_KEYS = {"tls_server_config", "basic_auth_users"}
TOP_UNSUPPORTED = {"http_server_config", "rate_limit"}
TLS_KEYS = {"cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version",
            "max_version"}
TLS_UNSUPPORTED = {"cert", "key", "client_ca", "cipher_suites", "curve_preferences",
                   "prefer_server_cipher_suites", "client_allowed_sans"}

_BCRYPT = re.compile(r"^\$2[abxy]?\$\d\d\$[./A-Za-z0-9]{53}$")
#: A valid hash that matches nothing anyone sends: unknown users cost the same
#: bcrypt as known ones, so timing does not tell which users exist.
_DUMMY_HASH = b"$2b$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DUmpZ/VcEd00UAV/LDeSi"


@dataclass
class BasicAuth:
    """user -> bcrypt hash, with a per-user cache of the last good password."""
    users: dict[str, bytes]
    _good: dict[str, bytes] = field(default_factory=dict)  # user -> keyed digest
    _salt: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    _bcrypt_lock: threading.Lock = field(default_factory=threading.Lock)

    def _digest(self, user: str, password: bytes) -> bytes:
        # Keyed by a per-process secret: the cache never holds a password.
        return hmac.new(self._salt, user.encode() + b"\0" + password, hashlib.sha256).digest()

    def check(self, header: str | None) -> bool:
        """True if ``Authorization: Basic ...`` names a user and their password."""
        if not header or not header[:6].lower() == "basic ":
            return False
        try:
            user_b, sep, password = base64.b64decode(header[6:].strip(), validate=True) \
                .partition(b":")
            user = user_b.decode()
        except (binascii.Error, UnicodeDecodeError):
            return False
        if not sep:
            return False
        digest = self._digest(user, password)
        cached = self._good.get(user)
        if cached is not None and hmac.compare_digest(cached, digest):
            return True
        hashed = self.users.get(user)
        # One bcrypt at a time: a flood of wrong passwords costs one core, not all.
        with self._bcrypt_lock:
            try:
                ok = bcrypt.checkpw(password, hashed or _DUMMY_HASH)
            except ValueError:  # over bcrypt's 72 bytes: no hash can match it
                ok = False
        if ok and hashed is not None:
            self._good[user] = digest  # bounded: one entry per configured user
            return True
        return False


@dataclass
class WebConfig:
    ssl_context: ssl.SSLContext | None = None
    auth: BasicAuth | None = None

    @property
    def scheme(self) -> str:
        return "https" if self.ssl_context else "http"


def _check_keys(section: str, got: Mapping[str, Any], known: set[str],
                unsupported: set[str], path: str) -> None:
    where = f"{path}: " + (f"{section}: " if section else "")
    bad = sorted(set(got) & unsupported)
    if bad:
        raise ConfigError(f"{where}{', '.join(bad)}: not supported by ncclwatch "
                          f"(supported: {', '.join(sorted(known))})")
    unknown = sorted(set(got) - known - unsupported)
    if unknown:
        raise ConfigError(f"{where}unknown key(s) {', '.join(map(str, unknown))} "
                          f"(known: {', '.join(sorted(known))})")


def _file(value: Any, key: str, base: Path, path: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{path}: tls_server_config: {key} must be a file path")
    p = base / value
    if not p.is_file():
        raise ConfigError(f"{path}: tls_server_config: {key} {p}: no such file")
    return str(p)


def _ssl_context(tls: Mapping[str, Any], base: Path, path: str) -> ssl.SSLContext:
    _check_keys("tls_server_config", tls, TLS_KEYS, TLS_UNSUPPORTED, path)
    for key in ("cert_file", "key_file"):
        if key not in tls:
            raise ConfigError(f"{path}: tls_server_config: {key} is required")
    cert, key = _file(tls["cert_file"], "cert_file", base, path), \
        _file(tls["key_file"], "key_file", base, path)
    ca = _file(tls["client_ca_file"], "client_ca_file", base, path) \
        if tls.get("client_ca_file") else None
    # exporter-toolkit: a client CA alone means "verify every client".
    auth_type = tls.get("client_auth_type") or ("RequireAndVerifyClientCert" if ca
                                                else "NoClientCert")
    if auth_type in CLIENT_AUTH_UNSUPPORTED:
        raise ConfigError(f"{path}: client_auth_type {auth_type} is not supported (Python's "
                          f"ssl verifies every client certificate it asks for); use "
                          f"VerifyClientCertIfGiven or RequireAndVerifyClientCert")
    if auth_type not in CLIENT_AUTH:
        raise ConfigError(f"{path}: client_auth_type {auth_type!r} is not one of "
                          f"{', '.join(CLIENT_AUTH)}")
    if CLIENT_AUTH[auth_type] != ssl.CERT_NONE and ca is None:
        raise ConfigError(f"{path}: client_auth_type {auth_type} needs client_ca_file "
                          f"(the CA that signs the clients' certificates)")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2  # exporter-toolkit's default
    for key_name, attr in (("min_version", "minimum_version"), ("max_version", "maximum_version")):
        if key_name in tls:
            v = tls[key_name]
            if v not in TLS_VERSIONS:
                raise ConfigError(f"{path}: tls_server_config: {key_name} {v!r} is not one of "
                                  f"{', '.join(TLS_VERSIONS)}")
            setattr(ctx, attr, TLS_VERSIONS[v])
    try:
        ctx.load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as e:
        raise ConfigError(f"{path}: cannot load cert_file {cert} with key_file {key}: {e}") \
            from None
    ctx.verify_mode = CLIENT_AUTH[auth_type]
    if ca is not None:
        try:
            ctx.load_verify_locations(cafile=ca)
        except (ssl.SSLError, OSError) as e:
            raise ConfigError(f"{path}: cannot load client_ca_file {ca}: {e}") from None
    return ctx


def _users(users: Any, path: str) -> BasicAuth:
    if not isinstance(users, dict):
        raise ConfigError(f"{path}: basic_auth_users must map user names to bcrypt hashes")
    out: dict[str, bytes] = {}
    for user, hashed in users.items():
        if not isinstance(user, str) or ":" in user or not user:
            raise ConfigError(f"{path}: basic_auth_users: {user!r} is not a user name "
                              f"(non-empty, no ':')")
        if not isinstance(hashed, str) or not _BCRYPT.match(hashed):
            raise ConfigError(f"{path}: basic_auth_users: the password of {user!r} is not a "
                              f"bcrypt hash (make one with `htpasswd -nBC 10 \"\" | tr -d ':\\n'` "
                              f"or python -c 'import bcrypt; print(bcrypt.hashpw(b\"PW\", "
                              f"bcrypt.gensalt()).decode())')")
        out[user] = hashed.encode()
    return BasicAuth(out)


def load(path: str) -> WebConfig:
    """Read and check a web config file; ConfigError says what is wrong."""
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except OSError as e:
        raise ConfigError(f"cannot read --web-config {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"--web-config {path} is not valid YAML: {e}") from None
    if data is None:
        return WebConfig()
    if not isinstance(data, dict):
        raise ConfigError(f"--web-config {path}: expected a mapping at the top")
    _check_keys("", data, TOP_KEYS, TOP_UNSUPPORTED, path)
    base = Path(os.path.dirname(os.path.abspath(path)))
    tls = data.get("tls_server_config")
    if tls is not None and not isinstance(tls, dict):
        raise ConfigError(f"{path}: tls_server_config must be a mapping")
    users = data.get("basic_auth_users")  # empty: no auth, as in exporter-toolkit
    return WebConfig(ssl_context=_ssl_context(tls, base, path) if tls else None,
                     auth=_users(users, path) if users else None)
