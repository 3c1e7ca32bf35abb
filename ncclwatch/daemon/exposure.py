"""Whether a daemon's ports would listen beyond loopback unprotected.

Without mTLS anything that reaches the gRPC port can report as any node, and
without basic auth anything that reaches the HTTP port reads every job's
stacks, environment and paths (TLS only hides them from the wire).
``ncclwatch daemon`` (and ``run`` given a non-loopback address) therefore
refuses such a listen address unless told ``--insecure``, and then says so
at start and in ``ncclwatch_daemon_unauthenticated_listener``.
"""

from __future__ import annotations

import ipaddress
import ssl
from typing import Any

LOOPBACK_NAMES = frozenset({"localhost", "localhost.", "ip6-localhost"})


def split_host(addr: str) -> str:
    """The host of ``HOST:PORT`` / ``[v6]:PORT`` ("" for ``:PORT``)."""
    if addr.startswith("["):
        return addr[1:].partition("]")[0]
    return addr.rpartition(":")[0]


def is_loopback(host: str) -> bool:
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


#: What a port beyond loopback must have: (port, what, why it matters, what to give).
#: TLS alone does not make HTTP safe: anyone who reaches it still reads every job's
#: stacks, environment and paths; basic auth without TLS sends the password in clear.
NEEDS = (
    ("grpc", "mTLS", "any host that reaches it could report as any node",
     "--tls-cert, --tls-key and --tls-client-ca"),
    ("http", "TLS", "its password and every page cross the network in clear",
     "--web-config with tls_server_config"),
    ("http", "authentication", "anyone who reaches it reads every job's stacks, environment "
     "and paths, over TLS or not", "--web-config with basic_auth_users"),
)


def web_authenticates(web: Any) -> bool:
    """Whether a web config (webconfig.WebConfig or None) asks every HTTP client who
    it is: basic_auth_users, or TLS that requires a verified client certificate."""
    if web is None:
        return False
    ctx = web.ssl_context
    return bool(web.auth) or bool(ctx and ctx.verify_mode == ssl.CERT_REQUIRED)


def beyond_loopback(grpc: str, http: str) -> dict[str, bool]:
    return {"grpc": not is_loopback(split_host(grpc)), "http": not is_loopback(split_host(http))}


def unauthenticated(grpc: str, http: str, *, grpc_tls: bool, http_auth: bool) -> dict[str, bool]:
    """Per port: listening beyond loopback with no one authenticated (gRPC without
    mTLS, HTTP without basic auth); ncclwatch_daemon_unauthenticated_listener."""
    wide = beyond_loopback(grpc, http)
    return {"grpc": wide["grpc"] and not grpc_tls, "http": wide["http"] and not http_auth}


def exposed(grpc: str, http: str, *, grpc_tls: bool, http_tls: bool,
            http_auth: bool) -> list[str]:
    """One sentence per thing a port beyond loopback lacks (NEEDS)."""
    has = {("grpc", "mTLS"): grpc_tls, ("http", "TLS"): http_tls,
           ("http", "authentication"): http_auth}
    addr = {"grpc": grpc, "http": http}
    wide = beyond_loopback(grpc, http)
    return [f"{'gRPC' if port == 'grpc' else 'HTTP'} on {addr[port]} without {what} ({why}): "
            f"give {give}"
            for port, what, why, give in NEEDS if wide[port] and not has[(port, what)]]


def refusal(problems: list[str]) -> str:
    """The message a refused start exits 2 with."""
    return ("refusing to listen beyond loopback unprotected: " + "; ".join(problems)
            + " (docs/security.md). Or listen on 127.0.0.1, or pass --insecure "
            "(NCCLWATCH_INSECURE=1, insecure = true) to serve it so anyway")
