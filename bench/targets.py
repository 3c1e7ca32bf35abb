"""The performance targets, each judged from the run that measures it, and the
table at the top of BENCHMARKS.md, which ``make bench`` writes: no hand-kept row.

A run of a bench command records each target it measured in
``bench/targets.json``: what it measured, holds or missed, the command, the
commit (and whether the tree had uncommitted changes), the date and the
machine's load. The table is written from those records
(``python -m bench.run`` after its runs, ``python -m bench.run --targets``
alone); a target no recorded run measured says so, never counts as holding.

Every daemon figure comes from one run, beside the floors it is judged
against: protobuf decode alone (in process) and the transport floor (a
grpc.aio server with the daemon's own transport step that only parses and
acks).
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
RECORDS = ROOT / "bench" / "targets.json"
HEADING = "## Targets"

#: A target's verdicts.
HOLDS, MISSED, NOT_MEASURED = "holds", "missed", "not measured"


def _k(x: float) -> str:
    return f"{x / 1000:.1f}k"


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 1000:.0f} ms"


def _ok(good: bool) -> str:
    return HOLDS if good else MISSED


Judge = Callable[[dict], "tuple[str, str] | None"]


@dataclass(frozen=True)
class Target:
    id: str
    text: str
    bound: str
    source: str          # the run it is judged from: agent, agent_gpu, daemon, replay, diagnose
    judge: Judge         # that run's result -> (measured, verdict), None: not in this run


# -- the daemon (bench.daemon_ingest) ----------------------------------------------------

def _rate_floor(r: dict) -> tuple[str, str]:
    one, floor = r["single_job"], r["transport_floor"]
    per, fl = (one["saturated"]["samples_per_daemon_cpu_s"],
               floor["saturated"]["samples_per_daemon_cpu_s"])
    return (f"{per / fl:.2f} of the floor ({_k(per)} against {_k(fl)} samples per CPU-second, "
            f"{one['ranks']} ranks)", _ok(per >= r["targets"]["floor_share"] * fl))


def _rate(r: dict) -> tuple[str, str]:
    one, inp = r["single_job"], r["in_process"]
    per = one["saturated"]["samples_per_daemon_cpu_s"]
    return (f"{_k(per)} over gRPC; decode + ingest in process "
            f"{_k(inp['decode_ingest_samples_per_cpu_s'])}", _ok(per >= r["targets"]["rate"]))


def _memory(point: str) -> Judge:
    def judge(r: dict) -> tuple[str, str] | None:
        x = r.get(point)
        if not x:
            return None
        mem = x["memory"]
        full = mem.get("curve_points_min", 1) >= mem.get("curve_points_max", 1)
        b = mem["bytes_per_rank"]
        over = b > r["targets"]["bytes_per_rank"]
        return (f"{b / 1024:.1f} KiB at {x['ranks']} ranks ({x['agents']} gRPC streams; "
                f"{mem.get('grpc_bytes_per_stream', 0) / 1024:.0f} KiB a stream with no daemon "
                "behind it)" + ("" if full or over else ", curves not yet full: a lower bound"),
                _ok(not over) if full or over else NOT_MEASURED)
    return judge


def _decide(r: dict) -> tuple[str, str]:
    one = r["single_job"]
    lat = one["latency"]
    return (f"p99 {_ms(lat['p99_s'])}, p50 {_ms(lat['p50_s'])} ({lat['measured']} of "
            f"{lat['trials']} trials, {one['ranks']} ranks at 1 report/s)",
            _ok(lat["p99_s"] is not None and not lat["missed"]
                and lat["p99_s"] <= r["targets"]["detect_2k_s"]))


def _restart(r: dict) -> tuple[str, str]:
    at = [(x["agents"], x["connect"]["seconds"]) for x in (r["single_job"], r.get("http_scale"))
          if x and x["agents"] >= 2048]
    if not at:
        x = r["single_job"]
        return f"{x['connect']['seconds']:.0f} s for {x['agents']} agents only", NOT_MEASURED
    n, s = at[0]
    return f"{s:.0f} s for {n} agents", _ok(s <= r["targets"]["restart_s"])


def _http(r: dict) -> tuple[str, str] | None:
    hs = r.get("http_scale")
    if not hs:
        return None
    v = hs["views"]
    cpu = max(x["cpu_p99_s"] for x in v.values())
    wall = max(x["p99_s"] for x in v.values())
    return ("CPU p99 " + "; ".join(f"{p} {_ms(x['cpu_p99_s'])}" for p, x in v.items())
            + f" (wall p99 at most {_ms(wall)})", _ok(cpu < r["targets"]["http_s"]))


def _loop(r: dict) -> tuple[str, str] | None:
    share = r.get("http_loop_share")
    if not share:
        return None
    held = max(x["loop_p99_s"] for x in share["views"].values())
    return (f"{_ms(held)} (renders of up to "
            f"{_ms(max(x['render_p50_s'] for x in share['views'].values()))} CPU)",
            _ok(held <= r["targets"]["loop_held_s"]))


# -- the core replay (bench.core_replay) --------------------------------------------------

def _decide_big(r: dict) -> tuple[str, str]:
    lat = r["latency"]
    return (f"{lat['measured']} of {lat['trials']} decided, p99 {_ms(lat['p99_s'])} "
            f"(p50 {_ms(lat['p50_s'])}); the core at {r['core_cpu_per_s']:.2f} of a core, a "
            f"report's wait p50 {_ms(r['late_p50_s'])}",
            _ok(lat["p99_s"] is not None and not lat["missed"] and lat["p99_s"] <= 1.0))


def _first_rounds(r: dict) -> tuple[str, str]:
    return (f"{r['warm_cpu_s']:.1f} CPU-s ({r['ranks']} ranks)",
            _ok(r["warm_cpu_s"] <= 3.0 * r["ranks"] / 100_000))


# -- the agent (bench.agent_overhead) -------------------------------------------------------

def _agent_cpu(r: dict) -> tuple[str, str]:
    runs = [x["observer_pct_core_per_rank"] for x in r["runs"] if x["mode"] == "ncclwatch"]
    med = r["median"]["ncclwatch"]["observer_pct_core_per_rank"]
    return (f"{med:.3f}% (runs {min(runs):.3f}-{max(runs):.3f}%)", _ok(med <= 0.2))


def _agent_throughput(r: dict) -> tuple[str, str]:
    x = r["ncclwatch_steps_vs_none"]
    spread = r.get("steps_spread_none")
    return (f"{x:.3f} of none" + (f" (run-to-run spread without an agent {spread:.1%})"
                                  if spread is not None else ""), _ok(x >= 0.998))


def _gpu_cpu(r: dict) -> tuple[str, str]:
    shapes = r["shapes"]
    return ("; ".join(f"{s['shape']} {s['agent_pct_core_per_rank']:.3f}%" for s in shapes),
            _ok(all(s["holds"]["cpu"] for s in shapes)))


def _gpu_dumps(r: dict) -> tuple[str, str]:
    shapes = r["shapes"]
    return ("; ".join(f"{s['shape']} {s['native_dumps']}" for s in shapes),
            _ok(all(s["holds"]["native_dumps"] for s in shapes)))


# -- diagnose (bench.diagnose_log) -----------------------------------------------------------

def _diagnose(r: dict) -> tuple[str, str]:
    return (f"{r['seconds']:.1f} s for {r['bytes'] / 1e9:.2f} GB ({r['verdict']})",
            _ok(r["verdict_ok"] and r["seconds"] < 60.0 * r["bytes"] / 1e9))


#: Every target, in the table's order.
TARGETS: tuple[Target, ...] = (
    Target("agent_cpu", "agent CPU per rank, 8 gloo DDP ranks", "<= 0.2% of a core", "agent",
           _agent_cpu),
    Target("agent_throughput", "job throughput with the agent", ">= 0.998 of none", "agent",
           _agent_throughput),
    Target("agent_gpu_cpu", "agent CPU per rank, GPU-shaped jobs", "<= 0.2% of a core",
           "agent_gpu", _gpu_cpu),
    Target("agent_gpu_dumps", "native dumps of a healthy GPU-shaped job", "0", "agent_gpu",
           _gpu_dumps),
    Target("daemon_floor", "the daemon over gRPC against the transport floor beside it",
           ">= 0.9 of the floor", "daemon", _rate_floor),
    Target("daemon_rate", "rank-samples per daemon CPU-second, one core, gRPC", ">= 100k",
           "daemon", _rate),
    Target("daemon_memory_2k", "daemon memory per rank, gRPC included, 2,048 ranks",
           "<= 2 KiB", "daemon", _memory("single_job")),
    Target("daemon_memory_16k", "daemon memory per rank, gRPC included, 16,384 ranks",
           "<= 2 KiB", "daemon", _memory("http_scale")),
    Target("decide_2k", "stall decided after the completing report, 2,048 ranks, p99",
           "<= 300 ms", "daemon", _decide),
    Target("decide_100k", "the same, one job of 100k ranks: the daemon's core, replayed",
           "6 of 6, p99 <= 1 s", "replay", _decide_big),
    Target("first_rounds_100k", "a 100k-rank job's first two rounds (every rank new)",
           "<= 3 CPU-s", "replay", _first_rounds),
    Target("restart", "a restart with 2,048 agents: all acknowledged", "<= 10 s", "daemon",
           _restart),
    Target("http", "/api/v1/jobs and /metrics at 16k ranks, the daemon's CPU p99",
           "< 200 ms", "daemon", _http),
    Target("loop", "what a 16k-rank render holds the event loop for, p99", "<= 20 ms",
           "daemon", _loop),
    Target("diagnose", "`ncclwatch diagnose` of a 1 GB log", "< 60 s", "diagnose",
           _diagnose),
)


def commit() -> str:
    """HEAD's short id, and whether the product or bench code had uncommitted changes."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                              capture_output=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no",
                                "--", "ncclwatch", "bench"], cwd=ROOT, text=True,
                               capture_output=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (" (uncommitted changes)" if dirty else "")


def load() -> dict[str, dict]:
    try:
        return json.loads(RECORDS.read_text())
    except (OSError, ValueError):
        return {}


def record(source: str, result: dict, command: str) -> dict[str, dict]:
    """Judge ``result`` of a ``source`` run for each of its targets and keep the
    records (bench/targets.json); return them all."""
    records = load()
    stamp = {"command": command, "commit": commit(),
             "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
             "load": round(os.getloadavg()[0], 1), "cores": os.cpu_count()}
    for t in TARGETS:
        if t.source != source:
            continue
        got = t.judge(result)
        if got is None:
            continue
        measured, verdict = got
        records[t.id] = {"measured": measured, "verdict": verdict, **stamp}
    RECORDS.write_text(json.dumps(records, indent=1, sort_keys=True) + "\n")
    return records


def table(records: dict[str, dict] | None = None) -> str:
    """The Targets section of BENCHMARKS.md, from the records."""
    records = load() if records is None else records
    lines = [HEADING, "",
             "Written by `make bench` (`python -m bench.run`; `python -m bench.run --targets` "
             "writes it alone) from the last recorded run of each target "
             "(`bench/targets.json`, bench/targets.py judges): the command, the commit it "
             "ran on and the machine's load beside each. On this shared 2-core machine "
             "compare ratios within one run.", "",
             "| target | bound | measured | | command | run |", "|---|---|---|---|---|---|"]
    for t in TARGETS:
        rec = records.get(t.id)
        if rec is None:
            lines.append(f"| {t.text} | {t.bound} | no recorded run | {NOT_MEASURED} | | |")
            continue
        mark = rec["verdict"] if rec["verdict"] == NOT_MEASURED else f"**{rec['verdict']}**"
        lines.append(f"| {t.text} | {t.bound} | {rec['measured']} | {mark} | "
                     f"`{rec['command']}` | {rec['date']}, {rec['commit']}, load "
                     f"{rec['load']} |")
    return "\n".join(lines)


#: What the daemon's figures are (BENCHMARKS.md, under "Daemon targets").
MEANING = (
    "**The daemon against the transport floor**: agents (simulated, 8 ranks per stream, "
    "real grpc.aio on loopback) send as fast as they are acked, to the daemon and then to "
    "a server with the daemon's own gRPC options and transport step (`ingest.serve`) that "
    "only parses and acks (`loadgen serve --null`); rank-samples acked per CPU-second of "
    "each. The ratio is what the daemon's work costs above what grpc.aio costs anyway.",
    "**Rank-samples per daemon CPU-second**: the same saturated window, per CPU-second of "
    "the daemon process (on this shared machine it does not get all of its core: it is "
    "what one core would take). Decode + ingest in process is the same without gRPC.",
    "**Memory per rank**: daemon RSS with every rank loaded minus its RSS before any agent "
    "connected, over the ranks, gRPC streams included (one per 8 ranks), read before any "
    "HTTP view is served; beside it what one stream costs a server with no daemon behind "
    "it. At 2,048 ranks after the stall trials, at 16,384 ranks with agents reporting "
    "every 4 s.",
    "**Stall decided**: from the send of the report that completes a checkpoint stall's "
    "evidence to the end of the daemon tick that opened the incident (the first moment "
    "/metrics and the API show it), nearest-rank p99 over the trials (with fewer than 100 "
    "trials, the maximum).",
    "**100k ranks**: 12,500 agent streams need more cores for the load generator than this "
    "machine has, so the 100k-rank point is the daemon's core alone (`bench/core_replay.py`): "
    "the agents' protocol-2 bytes, made beforehand, are parsed and applied at their send "
    "times in real time (late when the core is busy: queueing counts), with ticks as the "
    "server's loop runs them; gRPC runs in ingest workers at this size and is not in it. "
    "The first rounds (every rank new) are applied before the clock starts, their CPU "
    "measured.",
    "**Restart**: every agent connects at once, as after a daemon restart; the time until "
    "each has had a report acknowledged.",
    "**/api/v1/jobs and /metrics**: the views of one 16k-rank job over HTTP while its 2,048 "
    "agents report every 4 s; the daemon's CPU during the request minus its rate without "
    "requests. **Event loop**: in process, the CPU time of a render's step on the loop "
    "against the whole render.",
)


def plain(source: str, result: dict) -> str:
    """One line per target of ``source`` judged from ``result``, for the terminal."""
    out = []
    for t in TARGETS:
        if t.source == source and (got := t.judge(result)) is not None:
            out.append(f"{got[1].upper():>12}  {t.text} ({t.bound}): {got[0]}")
    return "\n".join(out)
