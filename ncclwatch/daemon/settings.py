"""The daemon's settings, each declared once on the field that holds it.

Flags, ``NCCLWATCH_*`` variables and TOML keys of ``ncclwatch daemon`` (and
the daemon side of ``ncclwatch run``) derive from these fields
(``config.options_of``). Light to import: the CLI builds its parser from them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ncclwatch.config import (boolean, hostport, non_negative_int, option, positive_float, positive_int,
                              urls)
from ncclwatch.contract.bounds import Bounds
from ncclwatch.timeoutsource import TORCH_DEFAULT

if TYPE_CHECKING:
    from ncclwatch.daemon.webconfig import WebConfig
    from ncclwatch.shard import ShardMap
    from ncclwatch.tls import ServerTLS

#: The process-group timeout NCCL (and gloo) apply when a job sets none (seconds).
NCCL_DEFAULT_TIMEOUT = TORCH_DEFAULT

_SECONDS = {"type": positive_float, "metavar": "SECONDS"}
#: A job whose ranks are all gone is forgotten after this long (seconds).
GONE_JOB_TTL = 120.0


@dataclass
class DaemonConfig:
    grpc: str = option("0.0.0.0:7470", "listen address for agents", hostport, "HOST:PORT",
                       run="127.0.0.1:7470")
    http: str = option("0.0.0.0:7471", "listen address for /metrics, API, page", hostport,
                       "HOST:PORT", run="127.0.0.1:7471")
    watchdog_timeout: float = option(
        NCCL_DEFAULT_TIMEOUT, "process-group timeout assumed for jobs that declare none "
        f"(NCCL's default is {NCCL_DEFAULT_TIMEOUT:g}); said to be assumed wherever shown", **_SECONDS)
    #: Job id glob -> watchdog timeout (seconds): the [job_timeouts] table of
    #: the config file and the --job-timeout flags (cli._job_timeouts).
    job_timeouts: dict[str, float] = option(
        default_factory=dict, help="watchdog timeout for jobs whose id matches GLOB",
        type=dict, metavar="GLOB=SECONDS", table=True)
    stall_threshold: float = option(5.0, "seconds in a collective before a rank counts as "
                                    "blocked", **_SECONDS)
    hang_threshold: float = option(
        30.0, "seconds in a collective, with no checkpoint to explain it, before "
        "collective_hang/desync/rank_lost: the ceiling of each job's learned threshold",
        **_SECONDS)
    hang_floor: float = option(5.0, "the least a job's learned hang threshold can be (a job's "
                               "normal waits, learned per collective op, set it in between)",
                               **_SECONDS)
    staleness: float = option(10.0, "seconds without a report before an agent's ranks are "
                              "unknown", **_SECONDS)
    gone_job_ttl: float = option(
        GONE_JOB_TTL, "seconds a job whose ranks are all gone (or silent) stays in the job table "
        "before it is forgotten; its ended incidents, with their outcome, stay on the page "
        "and in the API for a day", **_SECONDS)
    tick: float = 0.5
    tls: ServerTLS | None = None  # mTLS for the agents' gRPC (None: insecure)
    web: WebConfig | None = None  # HTTPS and basic auth for HTTP (None: plain)
    #: Worker processes that serve the agents' gRPC and forward reports here
    #: (ingestpool.py); 0: this process serves gRPC itself.
    ingest_workers: int = option(
        0, "processes that serve the agents' gRPC on --grpc (SO_REUSEPORT) and forward "
        "reports to this one, which keeps the job table, detection and HTTP: ingest on more "
        "than one core (0: serve gRPC here)", non_negative_int, "N")
    #: The largest log ``POST /api/v1/diagnose`` reads (after gunzip), bytes.
    diagnose_max_bytes: int = option(
        256 << 20, "largest log (after gunzip) the paste page and POST /api/v1/diagnose read; "
        "a larger one is refused with 413", positive_int, "BYTES")
    #: How operators reach the daemon's page (alerts link to it; "": this host).
    external_url: str = option(
        "", "URL operators reach this daemon's page at (behind a proxy or DNS name); alerts "
        "link to each job's part of it (default: http(s)://<this host>:<http port>)",
        metavar="URL")
    #: Base of the runbook pages alerts link to ("": <external_url>/runbooks/).
    runbook_url: str = option(
        "", "base URL of the runbooks alerts link to (default: the ones this daemon serves "
        "at <external-url>/runbooks/)", metavar="URL")
    #: Host headers HTTP serves (http.allowed_hosts: comma list; "": the
    #: default; "*": any).
    allowed_hosts: str = option(
        "", "Host headers the HTTP side answers, comma-separated (the --http host is added); "
        "others get 403, so a page that rebinds its DNS name to this address cannot read "
        "it. Empty: the --external-url host, this machine's names, localhost and IP "
        "addresses; '*': any Host", metavar="HOSTS", run="localhost,127.0.0.1,::1")
    #: Listen beyond loopback unprotected (exposure.py): gRPC without mTLS, HTTP
    #: without the web config's TLS or authentication.
    insecure: bool = option(
        False, "listen beyond loopback unprotected anyway: gRPC without mTLS (any host that "
        "reaches it can report as any node) and HTTP without the web config's TLS or basic "
        "auth (anyone can read every job's stacks, environment and paths). Without it such "
        "a daemon refuses to start; with it, ncclwatch_daemon_unauthenticated_listener is 1",
        boolean)
    #: What one report, agent or job may cost (bounds.py).
    bounds: Bounds = field(default_factory=Bounds)
    #: Every shard's page when daemons shard jobs (None: this daemon is all).
    shards: ShardMap | None = None


@dataclass(frozen=True)
class ServerTLSFiles:
    """mTLS for the agents' gRPC: read into DaemonConfig.tls (tls.server_tls,
    which says which go together)."""

    tls_cert: str | None = option(None, "the daemon's TLS certificate (PEM); turns on mTLS "
                                  "for agents", metavar="FILE")
    tls_key: str | None = option(None, "the private key of --tls-cert (PEM)", metavar="FILE")
    tls_client_ca: str | None = option(None, "CA that signs the agents' client certificates "
                                       "(required with --tls-cert: every agent must present "
                                       "one)", metavar="FILE")


@dataclass(frozen=True)
class DaemonInputs:
    """What ``ncclwatch daemon`` reads into DaemonConfig.web and .shards."""

    web_config: str | None = option(None, "web config (YAML, Prometheus exporter-toolkit "
                                    "format) for HTTPS and basic auth on /metrics, API and "
                                    "page", metavar="FILE")
    shards: str | None = option(
        None, "every shard's page when daemons shard jobs, in the agents' --collector order: "
        "';' between shards, ',' between the daemons of a pair (TOML: a list of lists). The "
        "page and API say which shard owns each job and link to it; `ncclwatch status` "
        "against this daemon asks every shard", urls, "URL[,URL][;URL...]")
    shard: int | None = option(None, "this daemon's place in --shards, from 0 (default: the "
                               "shard whose URLs hold --external-url)", non_negative_int, "N")
