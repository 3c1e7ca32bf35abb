"""The agent's settings, each declared once.

Flags, ``NCCLWATCH_*`` variables and TOML keys of ``ncclwatch agent`` (and
the agent side of ``ncclwatch run``, which takes the same ones but the
connection's: ``AGENT_SIDE``) derive from the fields here
(``config.options_of``) and, for the stack policy, from the defaults of
StackPolicy and PausePolicy (``STACK_OPTIONS``).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

from ncclwatch.agent.container import PODS_LOG_ROOT
from ncclwatch.agent.pausing import PausePolicy
from ncclwatch.agent.policy import StackPolicy
from ncclwatch.agent.pyspy import DEFAULT_VIEW_SOCKET
from ncclwatch.config import (build, hostports, option, options_of, positive_float,
                              positive_int, rank_set)

if TYPE_CHECKING:
    from ncclwatch.tls import ClientTLS


@dataclass
class AgentConfig:
    #: "a:7470,b:7470": an HA pair, each sent every report; "a0,b0;a1,b1":
    #: shards (of pairs), each sent its own jobs' ranks (agent/route.py).
    collector: str = option(
        "127.0.0.1:7470", "the daemon's gRPC address; two or more, comma-separated (TOML: a "
        "list), for a highly available pair: every report goes to each over its own stream "
        "and queue. Shards of daemons (or of pairs) separated by ';' (TOML: a list of lists): "
        "each job's ranks go to the shard that owns the job id (ncclwatch/shard.py), the "
        "node's health to every shard", hostports,
        "HOST:PORT[,HOST:PORT][;HOST:PORT[,HOST:PORT]...]")
    interval: float = option(1.0, "seconds between sampling rounds", positive_float, "SECONDS")
    node: str = option(default_factory=socket.gethostname, help="node name to report as",
                       metavar="NAME")
    #: Only these global ranks (None: all): two agents can split one host's ranks.
    ranks: frozenset[int] | None = option(
        None, "watch only these global ranks, e.g. 0-3 (default: all; for splitting one "
        "host's ranks between agents)", rank_set, "RANGES")
    #: The node's word for a rank's pod (a rank's own POD_NAME is only what it declares).
    pods_log_dir: str = option(
        PODS_LOG_ROOT, "the kubelet's pod log directories (<namespace>_<pod>_<uid>), "
        "read-only: with the pod UID in a rank's cgroup, names its Kubernetes pod", metavar="DIR")
    policy: StackPolicy = field(default_factory=StackPolicy)
    pyspy_timeout: float = option(3.0, "timeout of one py-spy dump", positive_float, "SECONDS")
    pyspy_concurrency: int = 2
    view_helper: str = option(
        DEFAULT_VIEW_SOCKET, "the view helper's socket (ncclwatch view-helper): py-spy of a "
        "rank whose root was changed with chroot runs there, where CAP_SYS_ADMIN and "
        "CAP_SYS_CHROOT are, when the socket exists", metavar="PATH")
    max_queue: int = option(32, "reports kept while the collector is unreachable (the oldest "
                            "are dropped and counted)", positive_int, "N")
    #: Where a probe without systemd reads the loop's liveness (agent/alive.py).
    alive_file: str = option(
        "", "touch this file after every healthy round, for a liveness probe "
        "(python -m ncclwatch.agent.alive FILE SECONDS; default: none)", metavar="FILE")
    tls: ClientTLS | None = None  # mTLS to the daemon (None: insecure)


@dataclass(frozen=True)
class ClientTLSFiles:
    """mTLS to the daemon: read into AgentConfig.tls (tls.client_tls)."""

    tls_ca: str | None = option(None, "CA that signed the daemon's certificate; turns on mTLS",
                                metavar="FILE")
    tls_cert: str | None = option(None, "this node's client certificate (PEM); its CN or a DNS "
                                  "name must be --node", metavar="FILE")
    tls_key: str | None = option(None, "the private key of --tls-cert (PEM)", metavar="FILE")
    tls_server_name: str | None = option(None, "name to check the daemon's certificate "
                                         "against (default: the --collector host)",
                                         metavar="NAME")


#: The stack policy's settings, declared on StackPolicy and PausePolicy.
STACK_OPTIONS = (*options_of(StackPolicy), *options_of(PausePolicy))


#: What `ncclwatch agent` and `ncclwatch run` both take: all but the connection
#: to the daemon (--collector and its TLS), which `run` makes itself.
AGENT_SIDE = (*options_of(AgentConfig, exclude=("collector",)), *STACK_OPTIONS)


def stack_policy(cfg: Mapping[str, Any]) -> StackPolicy:
    """The StackPolicy of a resolved config (STACK_OPTIONS)."""
    return build(StackPolicy, cfg, pause=build(PausePolicy, cfg))
