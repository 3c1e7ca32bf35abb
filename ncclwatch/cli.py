"""The ``ncclwatch`` command: run, agent, daemon, status, diagnose, certs."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
from typing import Any, Sequence

from ncclwatch import __version__
from ncclwatch.daemon.bounds import bound_options, bounds_from
from ncclwatch.config import (ConfigError, Option, add_options, hostport, hostports,
                              load_file, non_negative_float, positive_float, positive_int,
                              rank_set, resolve, urls)

log = logging.getLogger("ncclwatch")

_LOG = Option("log_level", str, "info", "log level: debug, info, warning, error")
_INTERVAL = Option("interval", positive_float, 1.0, "seconds between sampling rounds",
                   "SECONDS")
_WATCHDOG = Option("watchdog_timeout", positive_float, 600.0,
                   "process-group timeout assumed for jobs that declare none "
                   "(NCCL's default is 600)", "SECONDS")
_THRESHOLD = Option("stall_threshold", positive_float, 5.0,
                    "seconds in a collective before a rank counts as blocked", "SECONDS")
_HANG = Option("hang_threshold", positive_float, 30.0,
               "seconds in a collective, with no checkpoint to explain it, before "
               "collective_hang/desync/rank_lost: the ceiling of each job's learned "
               "threshold", "SECONDS")
_HANG_FLOOR = Option("hang_floor", positive_float, 5.0,
                     "the least a job's learned hang threshold can be (a job's normal "
                     "waits, learned per collective op, set it in between)", "SECONDS")
_STALENESS = Option("staleness", positive_float, 10.0,
                    "seconds without a report before an agent's ranks are unknown", "SECONDS")
_SUSPECT = Option("suspect_stack_interval", positive_float, 2.0,
                  "re-dump a possibly stuck rank this often", "SECONDS")
_SLOW = Option("slow_stack_interval", positive_float, 30.0,
               "re-dump every rank at least this often", "SECONDS")
_NATIVE_AFTER = Option("native_stack_after", non_negative_float, 3.0,
                       "the least stillness before one native stack (py-spy --native, "
                       "which pauses the rank for the unwind) of a rank whose Python stack "
                       "shows no wait; taken only where the rank's own history (its normal "
                       "still periods) or the job's shape (a peer in checkpoint work) says "
                       "the stillness is abnormal; once per still period; 0: never",
                       "SECONDS")
_PAUSE_BUDGET = Option("pause_budget", non_negative_float, 10.0,
                       "seconds per rank per hour that native stacks may pause a rank; "
                       "once spent, none until the hour frees some (said once, and in "
                       "ncclwatch_agent_pause_budget_spent_ranks); 0: no native stacks",
                       "SECONDS")
_NATIVE_CEILING = Option("native_stack_ceiling", positive_float, 60.0,
                         "still this long, a rank that has stepped normally is paused for "
                         "a native stack whatever its history says (its normal is 2x its "
                         "longest normal still period + 2 s, up to this)", "SECONDS")
_PYSPY_TIMEOUT = Option("pyspy_timeout", positive_float, 3.0, "timeout of one py-spy dump",
                        "SECONDS")
_CPU_BUDGET = Option("cpu_budget", positive_float, 0.25,
                     "the agent's own CPU (py-spy included) in cores; above it only the "
                     "stacks the daemon asks for are taken", "CORES")
_MAX_QUEUE = Option("max_queue", positive_int, 32,
                    "reports kept while the collector is unreachable (the oldest are "
                    "dropped and counted)", "N")

#: mTLS for the agents' gRPC (ncclwatch/tls.py says which go together).
_TLS_SERVER = (
    Option("tls_cert", str, None, "the daemon's TLS certificate (PEM); turns on mTLS for "
           "agents", "FILE"),
    Option("tls_key", str, None, "the private key of --tls-cert (PEM)", "FILE"),
    Option("tls_client_ca", str, None, "CA that signs the agents' client certificates "
           "(required with --tls-cert: every agent must present one)", "FILE"),
)
_TLS_AGENT = (
    Option("tls_ca", str, None, "CA that signed the daemon's certificate; turns on mTLS",
           "FILE"),
    Option("tls_cert", str, None, "this node's client certificate (PEM); its CN or a DNS "
           "name must be --node", "FILE"),
    Option("tls_key", str, None, "the private key of --tls-cert (PEM)", "FILE"),
    Option("tls_server_name", str, None, "name to check the daemon's certificate against "
           "(default: the --collector host)", "NAME"),
)
_WEB_CONFIG = Option("web_config", str, None, "web config (YAML, Prometheus exporter-toolkit "
                     "format) for HTTPS and basic auth on /metrics, API and page", "FILE")
_DIAGNOSE_MAX = Option("diagnose_max_bytes", positive_int, 256 << 20,
                       "largest log (after gunzip) the paste page and POST /api/v1/diagnose "
                       "read; a larger one is refused with 413", "BYTES")



def _workers(v: Any) -> int:
    """A whole number >= 0."""
    if isinstance(v, bool) or float(v) != int(float(v)) or float(v) < 0:
        raise ValueError("must be a whole number >= 0")
    return int(float(v))


_INGEST_WORKERS = Option("ingest_workers", _workers, 0,
                         "processes that serve the agents' gRPC on --grpc (SO_REUSEPORT) and "
                         "forward reports to this one, which keeps the job table, detection "
                         "and HTTP: ingest on more than one core (0: serve gRPC here)", "N")

_EXTERNAL_URL = Option("external_url", str, None,
                       "URL operators reach this daemon's page at (behind a proxy or DNS "
                       "name); alerts link to each job's part of it (default: "
                       "http(s)://<this host>:<http port>)", "URL")
_RUNBOOK_URL = Option("runbook_url", str, None,
                      "base URL of the runbooks alerts link to (default: the ones this "
                      "daemon serves at <external-url>/runbooks/)", "URL")


def _allowed_hosts(default: str) -> Option:
    return Option("allowed_hosts", str, default,
                  "Host headers the HTTP side answers, comma-separated (the --http host is "
                  "added); others get 403, so a page that rebinds its DNS name to this "
                  "address cannot read it. Empty: any Host", "HOSTS")


#: The node's word for a rank's pod (a rank's own POD_NAME is only what it declares).
_PODS = Option("pods_log_dir", str, "/var/log/pods", "the kubelet's pod log directories "
               "(<namespace>_<pod>_<uid>), read-only: with the pod UID in a rank's cgroup, "
               "names its Kubernetes pod", "DIR")
_SHARDS = Option("shards", urls, None,
                 "every shard's page when daemons shard jobs, in the agents' --collector "
                 "order: ';' between shards, ',' between the daemons of a pair (TOML: a list "
                 "of lists). The page and API say which shard owns each job and link to it; "
                 "`ncclwatch status` against this daemon asks every shard", "URL[,URL][;URL...]")
_SHARD = Option("shard", _workers, None,
                "this daemon's place in --shards, from 0 (default: the shard whose URLs "
                "hold --external-url)", "N")

DAEMON_OPTIONS = (
    Option("grpc", hostport, "0.0.0.0:7470", "listen address for agents", "HOST:PORT"),
    Option("http", hostport, "0.0.0.0:7471", "listen address for /metrics, API, page",
           "HOST:PORT"),
    _WATCHDOG, _THRESHOLD, _HANG, _HANG_FLOOR, _STALENESS, _INGEST_WORKERS, *_TLS_SERVER,
    _WEB_CONFIG, _DIAGNOSE_MAX, _EXTERNAL_URL, _RUNBOOK_URL, _allowed_hosts(""),
    _SHARDS, _SHARD, *bound_options(), _LOG,
)
AGENT_OPTIONS = (
    Option("collector", hostports, "127.0.0.1:7470", "the daemon's gRPC address; two or more, "
           "comma-separated (TOML: a list), for a highly available pair: every report goes "
           "to each over its own stream and queue. Shards of daemons (or of pairs) "
           "separated by ';' (TOML: a list of lists): each job's ranks go to the shard that "
           "owns the job id (ncclwatch/shard.py), the node's health to every shard",
           "HOST:PORT[,HOST:PORT][;HOST:PORT[,HOST:PORT]...]"),
    _INTERVAL,
    Option("node", str, socket.gethostname(), "node name to report as", "NAME"),
    Option("ranks", rank_set, None, "watch only these global ranks, e.g. 0-3 (default: all; "
           "for splitting one host's ranks between agents)", "RANGES"),
    _PODS,
    _SUSPECT, _SLOW, _NATIVE_AFTER, _PAUSE_BUDGET, _NATIVE_CEILING, _PYSPY_TIMEOUT,
    _MAX_QUEUE, *_TLS_AGENT, _LOG,
)
RUN_OPTIONS = (
    Option("grpc", hostport, "127.0.0.1:7470", "listen address for agents", "HOST:PORT"),
    Option("http", hostport, "127.0.0.1:7471", "listen address for /metrics, API, page",
           "HOST:PORT"),
    _INTERVAL, _WATCHDOG, _THRESHOLD, _HANG, _HANG_FLOOR, _STALENESS, _SUSPECT, _SLOW, _PYSPY_TIMEOUT,
    _NATIVE_AFTER, _PAUSE_BUDGET, _NATIVE_CEILING, _CPU_BUDGET, *_TLS_SERVER, _DIAGNOSE_MAX,
    _allowed_hosts("localhost,127.0.0.1,::1"),
    _PODS, *bound_options(), _LOG,
)

DEFAULT_FILES = {"daemon": "/etc/ncclwatch/daemon.toml", "agent": "/etc/ncclwatch/agent.toml",
                 "run": None}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ncclwatch",
        description="Watch PyTorch distributed jobs; name the rank that will trip the "
                    "NCCL watchdog before it fires.")
    p.add_argument("--version", action="version", version=f"ncclwatch {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, options, text in (
        ("run", RUN_OPTIONS, "daemon and agent in one process on this node, on 127.0.0.1 "
                             "(the embedded default: no configuration)"),
        ("daemon", DAEMON_OPTIONS, "the collector: gRPC ingest, stall detection, /metrics"),
        ("agent", AGENT_OPTIONS, "the per-node sampler: finds ranks, streams reports"),
    ):
        sp = sub.add_parser(name, help=text, description=text)
        add_options(sp, options)
        sp.add_argument("--config", metavar="FILE",
                        help="TOML config file" + (f" (default: {DEFAULT_FILES[name]} if it "
                                                   "exists)" if DEFAULT_FILES[name] else ""))
        if name in ("daemon", "run"):
            sp.add_argument("--job-timeout", action="append", default=[], metavar="GLOB=SECONDS",
                            help="watchdog timeout for jobs whose id matches GLOB (repeatable; "
                                 "config file: [job_timeouts] table)")
    st = sub.add_parser("status", help="show live jobs and stalls from a daemon",
                        description="show live jobs and stalls from a daemon")
    st.add_argument("--daemon", default=None, metavar="URL",
                    help="daemon HTTP address (default: http://127.0.0.1:7471; "
                         "env NCCLWATCH_DAEMON); 'a,b' for an HA pair (the first that "
                         "answers), 'a0,b0;a1,b1' for shards: every shard is asked and "
                         "the jobs merged (a daemon started with --shards is enough)")
    st.add_argument("--json", action="store_true", help="print the raw /api/v1/jobs JSON")
    st.add_argument("--ca", default=None, metavar="FILE",
                    help="CA to verify an https daemon with (basic auth: "
                         "https://user:pass@host:7471 or env NCCLWATCH_DAEMON_AUTH=user:pass)")
    text = ("say what killed a distributed job from its logs and Flight Recorder dumps: "
            "failure class, initiating vs collateral ranks, timeline, evidence, fix")
    dg = sub.add_parser("diagnose", help=text, description=text + ". PATH: log files "
                        "(plain or .gz), directories of them (torchrun --log-dir, Slurm "
                        "output), kernel logs (dmesg), Flight Recorder dumps. Exit status: 0 "
                        "no failure found, 1 a failure found (unknown included), 2 an input "
                        "or usage error.")
    dg.add_argument("paths", nargs="+", metavar="PATH")
    dg.add_argument("--json", action="store_true", help="print the diagnosis as JSON")
    text = ("before the job (or in CI): will a full checkpoint on one rank fit the watchdog "
            "timeout on this storage? Measures the directory's sustained write rate; exit 0 "
            "fits, 1 does not, 3 fits under --margin, 2 usage")
    from ncclwatch import preflight  # noqa: PLC0415 - light: no torch, no grpc
    pf = sub.add_parser("preflight", help=text, description=text)
    preflight.add_arguments(pf)
    text = "make a test CA, a daemon certificate and node certificates for mTLS"
    ce = sub.add_parser("certs", help=text, description=text + " (ECDSA P-256, one year; an "
                        "existing CA in --out is reused, so nodes can be added later)")
    ce.add_argument("--out", required=True, metavar="DIR", help="folder for the PEM files")
    ce.add_argument("--daemon-host", type=_names, default=[], metavar="NAME[,NAME]",
                    help="names (or IPs) agents use to reach the daemon; localhost and "
                         "127.0.0.1 are always added")
    ce.add_argument("--node", action="append", default=[], metavar="NAME",
                    help="a node to make a client certificate for (repeatable); its agent "
                         "must report as this name")
    from ncclwatch import install

    install.add_parser(sub)
    return p


def _names(v: str) -> list[str]:
    return [h.strip() for h in v.split(",") if h.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "status":
            return _status(args)
        if args.command == "diagnose":
            return _diagnose(args)
        if args.command == "preflight":
            from ncclwatch import preflight  # noqa: PLC0415

            return preflight.main(args)
        if args.command == "certs":
            from ncclwatch import certs

            return certs.main(args)
        if args.command == "install":
            from ncclwatch import install

            return install.main(args)
        options = {"run": RUN_OPTIONS, "daemon": DAEMON_OPTIONS, "agent": AGENT_OPTIONS}
        file = load_file(args.config, DEFAULT_FILES[args.command])
        cfg = resolve(options[args.command], args, file)
        if args.command != "agent":
            cfg["job_timeouts"] = _job_timeouts(file.get("job_timeouts", {}), args.job_timeout)
        _security(args.command, cfg)
        if args.command == "daemon":
            cfg["shard_map"] = _shard_map(cfg)
    except ConfigError as e:
        print(f"ncclwatch: {e}", file=sys.stderr)
        return 2
    _setup_logging(cfg["log_level"])
    runner = {"run": _run, "daemon": _daemon, "agent": _agent}[args.command]
    try:
        return asyncio.run(runner(cfg))
    except KeyboardInterrupt:
        return 130
    except OSError as e:
        log.error("%s", e)
        return 1


def _diagnose(args: argparse.Namespace) -> int:
    """Exit 0: no failure found ("none"); 1: a failure found (any other class, "unknown"
    included); 2: an input cannot be read (usage errors exit 2 through argparse)."""
    import json

    from ncclwatch.diagnose import LogInputError, diagnose
    from ncclwatch.diagnose import render

    try:
        d = diagnose(args.paths)
    except LogInputError as e:
        print(f"ncclwatch diagnose: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(d.to_json(), indent=1))
    else:
        sys.stdout.write(render.text(d))
    return 1 if d.failed else 0


def _security(command: str, cfg: dict[str, Any]) -> None:
    """Read and check the TLS files and web config now: errors exit 2, named."""
    from ncclwatch import tls

    if command == "agent":
        cfg["client_tls"] = tls.client_tls(cfg, node=cfg.get("node") or socket.gethostname())
        return
    cfg["server_tls"] = tls.server_tls(cfg)
    cfg["web"] = None
    if cfg.get("web_config"):
        from ncclwatch.daemon import webconfig

        cfg["web"] = webconfig.load(cfg["web_config"])


def _status(args: argparse.Namespace) -> int:
    from ncclwatch import status

    url = args.daemon or os.environ.get("NCCLWATCH_DAEMON") or status.DEFAULT_DAEMON
    try:
        return status.main(url, args.json, ca=args.ca,
                           auth=os.environ.get("NCCLWATCH_DAEMON_AUTH"))
    except status.StatusError as e:
        print(f"ncclwatch status: {e}", file=sys.stderr)
        return 1


def _job_timeouts(from_file: Any, flags: list[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    if not isinstance(from_file, dict):
        raise ConfigError("job_timeouts in the config file must be a table of GLOB = SECONDS")
    items = list(from_file.items())
    for f in flags:
        glob, sep, secs = f.rpartition("=")
        if not sep or not glob:
            raise ConfigError(f"--job-timeout {f!r}: expected GLOB=SECONDS")
        items.append((glob, secs))
    for glob, secs in items:
        try:
            out[glob] = positive_float(secs)
        except (TypeError, ValueError):
            raise ConfigError(f"job timeout for {glob!r}: {secs!r} is not a positive number") from None
    return out


def _setup_logging(level: str) -> None:
    from ncclwatch.sanitize import install_log_escaping

    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    install_log_escaping()   # arguments (job ids, node names, paths): no forged lines


def _daemon_config(cfg: dict[str, Any]):
    from ncclwatch.daemon.core import DaemonConfig

    return DaemonConfig(grpc=cfg["grpc"], http=cfg["http"],
                        watchdog_timeout=cfg["watchdog_timeout"],
                        job_timeouts=cfg.get("job_timeouts", {}),
                        stall_threshold=cfg["stall_threshold"],
                        hang_threshold=cfg["hang_threshold"], hang_floor=cfg["hang_floor"],
                        staleness=cfg["staleness"],
                        ingest_workers=cfg.get("ingest_workers", 0),
                        tls=cfg.get("server_tls"), web=cfg.get("web"),
                        diagnose_max_bytes=cfg.get("diagnose_max_bytes", 256 << 20),
                        external_url=cfg.get("external_url") or "",
                        runbook_url=cfg.get("runbook_url") or "",
                        allowed_hosts=cfg.get("allowed_hosts") or "",
                        bounds=bounds_from(cfg), shards=cfg.get("shard_map"))


def _shard_map(cfg: dict[str, Any]):
    """The daemon's --shards and --shard (ConfigError when they disagree)."""
    from ncclwatch.daemon.links import external_url
    from ncclwatch.daemon.shardmap import ShardMap

    if not cfg.get("shards"):
        if cfg.get("shard") is not None:
            raise ConfigError("shard is set but shards is not: give every shard's URLs")
        return None
    web = cfg.get("web")
    own = external_url(cfg.get("external_url") or "", cfg["http"],
                       bool(web and web.ssl_context))
    try:
        return ShardMap.parse(cfg["shards"], cfg.get("shard"), own)
    except ValueError as e:
        raise ConfigError(f"shards: {e}") from None


def _agent_config(cfg: dict[str, Any], collector: str | None = None):
    from ncclwatch.agent.agent import AgentConfig
    from ncclwatch.agent.pausing import PausePolicy
    from ncclwatch.agent.policy import StackPolicy

    return AgentConfig(
        collector=collector or cfg["collector"], interval=cfg["interval"],
        node=cfg.get("node") or socket.gethostname(),
        policy=StackPolicy(suspect_interval=cfg["suspect_stack_interval"],
                           slow_interval=cfg["slow_stack_interval"],
                           cpu_budget=cfg.get("cpu_budget", 0.25),
                           native_after=cfg.get("native_stack_after", 3.0),
                           pause=PausePolicy(budget=cfg.get("pause_budget", 10.0),
                                             ceiling=cfg.get("native_stack_ceiling", 60.0))),
        pyspy_timeout=cfg["pyspy_timeout"], max_queue=cfg.get("max_queue", 32),
        tls=None if collector else cfg.get("client_tls"))


def _stop_on_signals(stop, notifier=None) -> None:
    """SIGINT/SIGTERM call ``stop``; systemd hears STOPPING=1 first."""
    def on_signal() -> None:
        if notifier is not None:
            notifier.stopping()
        stop()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)


async def _daemon(cfg: dict[str, Any]) -> int:
    from ncclwatch.daemon.core import Daemon
    from ncclwatch.daemon.server import DaemonServer
    from ncclwatch.sdnotify import Notifier

    notifier = Notifier()
    server = DaemonServer(Daemon(_daemon_config(cfg)), notifier)
    done = asyncio.Event()
    _stop_on_signals(done.set, notifier)
    await server.start()
    await done.wait()
    log.info("shutting down")
    await server.stop()
    return 0


async def _agent(cfg: dict[str, Any]) -> int:
    from ncclwatch.agent.agent import Agent

    from ncclwatch.agent.discover import Discovery
    from ncclwatch.sdnotify import Notifier

    config = _agent_config(cfg)
    notifier = Notifier()
    agent = Agent(config, discovery=Discovery(config.node, ranks=cfg["ranks"],
                                              pods_root=cfg["pods_log_dir"]),
                  notifier=notifier)
    _stop_on_signals(agent.stop, notifier)
    _warn_ptrace()
    log.info("ncclwatch agent on %s: reporting to %s every %.1fs", agent.config.node,
             agent.config.collector, agent.config.interval)
    await agent.run()
    return 0


async def _run(cfg: dict[str, Any]) -> int:
    from ncclwatch.agent.agent import Agent
    from ncclwatch.agent.discover import Discovery
    from ncclwatch.daemon.core import Daemon
    from ncclwatch.daemon.server import DaemonServer
    from ncclwatch.sdnotify import Notifier

    # With mTLS on the TCP port, the own agent (which has no client certificate)
    # reports over a unix socket in a folder only this user can open.
    private = tempfile.mkdtemp(prefix="ncclwatch-") if cfg.get("server_tls") else None
    local = os.path.join(private, "grpc.sock") if private else None
    # One process, one voice to systemd: the daemon side's (ports, ticks).
    notifier = Notifier()
    server = DaemonServer(Daemon(_daemon_config(cfg)), notifier, local_socket=local)
    try:
        await server.start()
        host = cfg["grpc"].rpartition(":")[0] or "127.0.0.1"
        agent_cfg = _agent_config(cfg, collector=f"unix:{local}" if local
                                  else f"{host}:{server.grpc_port}")
        agent = Agent(agent_cfg, discovery=Discovery(agent_cfg.node,
                                                     pods_root=cfg["pods_log_dir"]))
        _stop_on_signals(agent.stop, notifier)
        _warn_ptrace()
        print(f"ncclwatch {__version__}: watching this node; open http://"
              f"{cfg['http'].rpartition(':')[0]}:{server.http_port}/ or run `ncclwatch status`",
              file=sys.stderr, flush=True)
        try:
            await agent.run()
        finally:
            await server.stop()
    finally:
        if private:
            shutil.rmtree(private, ignore_errors=True)
    return 0


def _warn_ptrace() -> None:
    from ncclwatch.agent.pyspy import can_trace, find_pyspy

    why = can_trace()
    if why:
        log.warning("py-spy will fail (%s): ranks will show as 'unknown'", why)
    if find_pyspy() is None:
        log.warning("py-spy is not installed: ranks will show as 'unknown'")


if __name__ == "__main__":
    sys.exit(main())
