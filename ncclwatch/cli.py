"""The ``ncclwatch`` command: run, agent, daemon, status, dump, diagnose, certs, install, render."""

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
from dataclasses import dataclass
from typing import Any, Sequence

from ncclwatch import __version__
from ncclwatch.agent.settings import AGENT_SIDE, AgentConfig, ClientTLSFiles, stack_policy
from ncclwatch.config import (ConfigError, add_options, build, load_file, option, options_of,
                              positive_float, resolve)
from ncclwatch.contract.bounds import Bounds
from ncclwatch.daemon.settings import DaemonConfig, DaemonInputs, ServerTLSFiles

log = logging.getLogger("ncclwatch")


@dataclass(frozen=True)
class LogSettings:
    log_level: str = option("info", "log level: debug, info, warning, error")


#: Every command's settings, derived from the dataclasses that hold them
#: (daemon/settings.py, agent/settings.py, contract/bounds.py).
_LOG = options_of(LogSettings)
DAEMON_OPTIONS = (*options_of(DaemonConfig), *options_of(ServerTLSFiles),
                  *options_of(DaemonInputs), *options_of(Bounds), *_LOG)
AGENT_OPTIONS = (*options_of(AgentConfig, exclude=[o.name for o in AGENT_SIDE]), *AGENT_SIDE,
                 *options_of(ClientTLSFiles), *_LOG)
#: The daemon side on loopback (no ingest workers, no links to elsewhere) and
#: the agent side, as `ncclwatch agent` takes it.
RUN_OPTIONS = (*options_of(DaemonConfig, run=True,
                           exclude=("ingest_workers", "external_url", "runbook_url")),
               *AGENT_SIDE, *options_of(ServerTLSFiles), *options_of(Bounds), *_LOG)

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
        for t in (o for o in options if o.table):   # [job_timeouts]: --job-timeout
            sp.add_argument("--" + t.name.rstrip("s").replace("_", "-"), action="append",
                            default=[], metavar=t.metavar,
                            help=f"{t.help} (repeatable; config file: [{t.name}] table)")
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
                        "output), kernel logs (dmesg), Flight Recorder dumps, evidence bundles "
                        "(`ncclwatch dump`). Exit status: 0 "
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
    text = ("a stalled job's evidence in one tar.gz, before it is stopped: every rank's "
            "stacks, the live Flight Recorder, the environment, the verdict and its timeline "
            "(`ncclwatch diagnose FILE` reads it back)")
    from ncclwatch import dump  # noqa: PLC0415 - light: no grpc

    du = sub.add_parser("dump", help=text, description=text)
    dump.add_arguments(du)
    from ncclwatch import install
    from ncclwatch.agent import viewhelper

    install.add_parser(sub)
    from ncclwatch import kuberender

    rk = sub.add_parser("render", help=kuberender.HELP, description=kuberender.HELP)
    kuberender.add_arguments(rk)
    vh = sub.add_parser("view-helper", help=viewhelper.HELP, description=viewhelper.HELP)
    viewhelper.add_arguments(vh)
    return p


def _names(v: str) -> list[str]:
    return [h.strip() for h in v.split(",") if h.strip()]


#: The exit status of a command whose reader closed its stdout, as a shell reports
#: one killed by SIGPIPE (128 + 13).
EXIT_PIPE = 128 + signal.SIGPIPE


def _stdout_closed() -> bool:
    """Whether stdout is a pipe or socket whose reader has gone (poll says POLLERR
    or POLLHUP): a BrokenPipeError of one of the command's own sockets is not this."""
    import select

    try:
        p = select.poll()
        p.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in p.poll(0))
    except (AttributeError, OSError, ValueError):   # no real file (a test's capture)
        return False


def main(argv: Sequence[str] | None = None) -> int:
    """Every verb: a reader that stops early (`ncclwatch install all | head -1`)
    ends the command quietly, as SIGPIPE ends a Unix tool: no traceback, exit 141.
    SIGPIPE itself stays ignored (Python's default): the daemon's and agent's
    sockets see EPIPE as an error of that connection, never as their death."""
    try:
        try:
            code = _main(argv)
        except SystemExit:      # argparse's help and usage: their text is flushed here too
            sys.stdout.flush()
            raise
        sys.stdout.flush()      # what is still buffered fails here, not at exit
        return code
    except BrokenPipeError:
        if not _stdout_closed():
            raise
        # Python flushes stdout again at exit: let that write go nowhere, quietly.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_PIPE


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "status":
            return _status(args)
        if args.command == "diagnose":
            return _diagnose(args)
        if args.command == "dump":
            from ncclwatch import dump  # noqa: PLC0415

            return dump.main(args)
        if args.command == "preflight":
            from ncclwatch import preflight  # noqa: PLC0415

            return preflight.main(args)
        if args.command == "certs":
            from ncclwatch import certs

            return certs.main(args)
        if args.command == "view-helper":
            from ncclwatch.agent import viewhelper

            return viewhelper.main(args)
        if args.command == "install":
            from ncclwatch import install

            return install.main(args)
        if args.command == "render":
            from ncclwatch import kuberender

            return kuberender.main(args)
        options = {"run": RUN_OPTIONS, "daemon": DAEMON_OPTIONS, "agent": AGENT_OPTIONS}
        file = load_file(args.config, DEFAULT_FILES[args.command])
        cfg = resolve(options[args.command], args, file)
        if "job_timeouts" in cfg:
            cfg["job_timeouts"] = _job_timeouts(cfg["job_timeouts"], args.job_timeout)
        _security(args.command, cfg)
        if args.command == "daemon":
            cfg["shard_map"] = _shard_map(cfg)
        _refuse_plaintext(cfg)
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
        cfg["client_tls"] = tls.client_tls(cfg, node=cfg["node"] or socket.gethostname())
        return
    cfg["server_tls"] = tls.server_tls(cfg)
    cfg["web"] = None
    if cfg.get("web_config"):
        from ncclwatch.daemon import webconfig

        cfg["web"] = webconfig.load(cfg["web_config"])


def _refuse_plaintext(cfg: dict[str, Any]) -> None:
    """A daemon side beyond loopback without mTLS, TLS or authentication: ConfigError,
    unless --insecure; then a loud warning (and the gauge, export.py)."""
    if "server_tls" not in cfg:  # the agent serves nothing
        return
    from ncclwatch.daemon import exposure

    web = cfg["web"]
    problems = exposure.exposed(cfg["grpc"], cfg["http"], grpc_tls=bool(cfg["server_tls"]),
                                http_tls=bool(web and web.ssl_context),
                                http_auth=exposure.web_authenticates(web))
    if problems and not cfg.get("insecure"):
        raise ConfigError(exposure.refusal(problems))
    if problems:
        log.warning("INSECURE (--insecure): listening beyond loopback unprotected: %s. "
                    "Anyone who reaches these ports can do what is named",
                    "; ".join(problems))


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


def _daemon_config(cfg: dict[str, Any]) -> DaemonConfig:
    return build(DaemonConfig, cfg, tls=cfg["server_tls"], web=cfg["web"],
                 bounds=build(Bounds, cfg), shards=cfg.get("shard_map"))


def _shard_map(cfg: dict[str, Any]):
    """The daemon's --shards and --shard (ConfigError when they disagree)."""
    from ncclwatch.daemon.links import external_url
    from ncclwatch.daemon.shardmap import ShardMap

    if not cfg.get("shards"):
        if cfg.get("shard") is not None:
            raise ConfigError("shard is set but shards is not: give every shard's URLs")
        return None
    web = cfg.get("web")
    own = external_url(cfg["external_url"], cfg["http"],
                       bool(web and web.ssl_context))
    try:
        return ShardMap.parse(cfg["shards"], cfg.get("shard"), own)
    except ValueError as e:
        raise ConfigError(f"shards: {e}") from None


def _agent_config(cfg: dict[str, Any], collector: str | None = None) -> AgentConfig:
    """The agent's config; ``collector``: the own daemon of ``ncclwatch run``
    (no TLS: it reports over loopback or a private unix socket)."""
    given: dict[str, Any] = {"collector": collector, "tls": None} if collector else {
        "tls": cfg.get("client_tls")}
    return build(AgentConfig, cfg, node=cfg["node"] or socket.gethostname(),
                 policy=stack_policy(cfg), **given)


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
    from ncclwatch.sdnotify import Notifier

    config = _agent_config(cfg)
    notifier = Notifier()
    agent = Agent(config, notifier=notifier)
    _stop_on_signals(agent.stop, notifier)
    _warn_ptrace()
    log.info("ncclwatch agent on %s: reporting to %s every %.1fs", agent.config.node,
             agent.config.collector, agent.config.interval)
    await agent.run()
    return 0


async def _run(cfg: dict[str, Any]) -> int:
    from ncclwatch.agent.agent import Agent
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
        agent = Agent(agent_cfg)
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
