"""Whether a daemon's ports would serve plaintext beyond loopback.

Without TLS anything that reaches the gRPC port can report as any node, and
anything that reaches the HTTP port reads every job's stacks, environment and
paths. ``ncclwatch daemon`` (and ``run`` given a non-loopback address)
therefore refuses such a listen address unless told ``--insecure``.
"""

from __future__ import annotations

import ipaddress

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


def plaintext(grpc: str, http: str, *, grpc_tls: bool, http_tls: bool) -> list[str]:
    """One sentence per port that would listen beyond loopback without TLS."""
    out = []
    if not grpc_tls and not is_loopback(split_host(grpc)):
        out.append(f"gRPC on {grpc} without mTLS (any host that reaches it could report as "
                   "any node): give --tls-cert, --tls-key and --tls-client-ca")
    if not http_tls and not is_loopback(split_host(http)):
        out.append(f"HTTP on {http} without TLS (anyone who reaches it reads every job's "
                   "stacks, environment and paths): give --web-config with "
                   "tls_server_config")
    return out


def refusal(problems: list[str]) -> str:
    """The message a refused start exits 2 with."""
    return ("refusing to listen beyond loopback in plain text: " + "; ".join(problems)
            + " (docs/security.md). Or listen on 127.0.0.1, or pass --insecure "
            "(NCCLWATCH_INSECURE=1, insecure = true) to serve plaintext anyway")
