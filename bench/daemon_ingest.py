"""Daemon scale (issue 6): ingest rate and cost, memory per rank, detection latency,
/metrics and /api/v1/jobs at scale, and sharding jobs across daemons.

    python -m bench.daemon_ingest --quick   # ~2 min: 2k-rank job, 10 x 160 ranks
    python -m bench.daemon_ingest --full    # 16k-rank job, 100 x 160 ranks, 100k ranks

Everything runs over real gRPC on loopback against real ``DaemonServer``
processes (``bench/loadgen.py``): the daemon is pinned to one CPU, so its
process's CPU time is "one core"; simulated agents (one stream and one TCP
connection each, 8 ranks per node, interned stacks, 1% of samples change
stack per round) run in a few client processes. Ratios are taken within one
run, because this machine is small and noisy.

- Throughput: every agent sends its next report as soon as the previous one
  is acknowledged, so the daemon is saturated whenever the clients keep up
  (the daemon's measured CPU share says whether they did). Rates are also
  given per daemon CPU-second, which is what "on one core" means when the
  daemon does not get all of its core.
- Transport floor: the same server and handler shape that only parses and
  acks (``serve --null``): what any Python daemon on grpc.aio pays.
- Decode-only: ``ReportRequest.FromString`` over the very bytes the agents
  send, in this process; and decode + ``Daemon.ingest`` without gRPC.
- Detection latency, in-process tick latency: from the send of the report
  that completes a checkpoint stall's evidence (the culprit's first stack
  taken after the waiters passed the stall threshold) to the end of the
  daemon tick that opened the incident, i.e. the first moment /metrics and
  the API can show ``stall_active 1`` (they read the state on the daemon's
  event loop). Both ends are CLOCK_MONOTONIC, shared by the processes.
  Measured with the job's agents reporting every second and every 2 s, to
  tell the cost of detecting from the queueing of a loaded daemon.
- Memory: daemon RSS after the ranks are loaded and every rank's evidence
  curve is full (and before any HTTP view was served), minus its RSS before
  any agent connected; so it includes the gRPC connections (one per 8
  ranks). The job table alone is measured in-process with tracemalloc.
- Agents behave like the real one where it matters to the daemon: a stream
  that fails is reopened with the agent's backoff, and its stacks resent.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import random
import statistics
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass

from bench.loadgen import (
    PROTOCOL,
    RANKS_PER_NODE,
    Clients,
    DaemonProc,
    JobSpec,
    Pool,
    SimAgent,
    check_assembly,
    fleet,
)
from ncclwatch.agent.delta import SNAPSHOT_EVERY
from ncclwatch.daemon.curve import CURVE_POINTS, CURVE_SPAN, CURVE_STEP
from ncclwatch.shard import shard
from ncclwatch.v1 import collector_pb2 as pb

#: Benchmark daemons judge a wait after 1 s (the default is 5 s) so that a
#: stall trial takes seconds; the detection work per tick is the same.
STALL_THRESHOLD = 1.0
INTERVAL = 1.0       # seconds between an agent's rounds (the agent's default)
#: Agents that only need to be there (HTTP views, before saturating) report
#: this often: 16k ranks at 1 Hz is about all one daemon core takes.
QUIET_INTERVAL = 4.0
#: Stall trials also run at this report interval: detection at less load.
SLOW_INTERVAL = 2.0
HOLD = 2.0           # a trial's stall lasts this long after the completing report
STACK_CHANGE = 0.01  # share of samples that change stack per round
CLIENT_PROCESSES = 2
CORES = os.cpu_count() or 1
#: One daemon gets CPU 0 and the clients the others; two shards get CPU 0
#: and 1, and the clients float.
DAEMON_CPUS = [0, 1] if CORES >= 2 else [None, None]
CLIENT_CPUS = list(range(1, CORES)) if CORES >= 2 else None
TARGETS = {"rate": 100_000, "floor_share": 0.9, "detect_s": 1.0, "detect_2k_s": 0.3,
           "bytes_per_rank": 2048, "http_s": 0.2,
           "loop_held_s": 0.02, "restart_s": 10.0}
#: Ranks of the job the HTTP views are timed at (issue 15: 16k), in both profiles.
HTTP_RANKS = 16384
#: The views timed there: summaries by default, a page of per-rank detail, and the
#: largest render (every rank's detail in one response) during which the loop is probed.
HTTP_PATHS = ("/metrics", "/api/v1/jobs", "/api/v1/jobs?ranks=1")
BIG_RENDER = "/api/v1/jobs?ranks=1&limit=20000"


@dataclass(frozen=True)
class Profile:
    name: str
    world: int                       # ranks of the single big job
    trials: int                      # stall trials on it, at 1 Hz
    trials_slow: int                 # and at SLOW_INTERVAL
    steady_seconds: float            # its daemon runs this long before RSS is read
    saturate_seconds: float
    warmup: float
    many: tuple[int, int]            # jobs x ranks: many jobs; also the sharding fleet
    big: tuple[int, int] | None      # jobs x ranks: ~100k ranks
    http_repeats: int
    http_scale_repeats: int = 10
    replay_trials: int = 6           # stall trials of the 100k-rank core replay


QUICK = Profile("quick", world=2048, trials=4, trials_slow=2, steady_seconds=0.0,
                saturate_seconds=6, warmup=3, many=(10, 160), big=None, http_repeats=3,
                http_scale_repeats=10)
FULL = Profile("full", world=16384, trials=12, trials_slow=8,
               steady_seconds=CURVE_SPAN + 8, saturate_seconds=15, warmup=5,
               many=(100, 160), big=(100, 1000), http_repeats=5, http_scale_repeats=20,
               replay_trials=12)


# -- measuring ----------------------------------------------------------------

def rate_window(cl: Clients, daemons: list[DaemonProc], seconds: float) -> dict:
    """Samples acked per second over ``seconds``, and what they cost the daemon(s)."""
    t0, s0, f0 = cl.count()
    c0 = [(d.core_cpu_seconds(), d.worker_cpu_seconds()) for d in daemons]
    k0 = cl.cpu_seconds()
    time.sleep(seconds)
    t1, s1, f1 = cl.count()
    c1 = [(d.core_cpu_seconds(), d.worker_cpu_seconds()) for d in daemons]
    k1 = cl.cpu_seconds()
    wall = t1 - t0
    each = [b - a for a, b in zip(s0, s1)]
    core = [b[0] - a[0] for a, b in zip(c0, c1)]
    workers = [b[1] - a[1] for a, b in zip(c0, c1)]
    cpu = [c + w for c, w in zip(core, workers)]  # a daemon's CPU: core + ingest workers
    n = sum(each)
    return {"seconds": round(wall, 2), "samples": n, "samples_per_s": n / wall,
            "daemon_cores": [round(c / wall, 3) for c in cpu],
            "core_cores": [round(c / wall, 3) for c in core],
            "worker_cores": [round(w / wall, 3) for w in workers],
            "samples_per_core_cpu_s": n / sum(core) if sum(core) else 0.0,
            "samples_per_daemon_cpu_s": n / sum(cpu) if sum(cpu) else 0.0,
            "each_samples_per_s": [x / wall for x in each],
            "each_samples_per_cpu_s": [x / c if c else 0.0 for x, c in zip(each, cpu)],
            "daemon_cpu_us_per_sample": 1e6 * sum(cpu) / n if n else None,
            "client_cores": round((k1 - k0) / wall, 3), "stream_failures": f1 - f0}


def settled_rss(d: DaemonProc) -> int:
    time.sleep(1.0)  # a few ticks, imports done
    return d.rss()


def http_get(url: str) -> tuple[float, bytes]:
    t0 = time.perf_counter()
    with urllib.request.urlopen(url, timeout=120) as r:
        body = r.read()
    return time.perf_counter() - t0, body


def series_scopes(text: str) -> dict:
    """/metrics series by what they are per: rank, node, job, or the daemon itself."""
    from prometheus_client.parser import text_string_to_metric_families

    scopes = {"per_rank": 0, "per_node": 0, "per_job": 0, "global": 0, "total": 0,
              "stall_active": {}}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            scope = ("per_rank" if "rank" in s.labels else "per_node" if "node" in s.labels
                     else "per_job" if "job_id" in s.labels else "global")
            scopes[scope] += 1
            scopes["total"] += 1
            if s.name == "ncclwatch_stall_active" and s.value:
                scopes["stall_active"][s.labels["job_id"]] = s.labels["kind"]
    return scopes


def http_point(d: DaemonProc, repeats: int, jobs: int, nodes: int) -> dict:
    """Response time and size of /metrics and /api/v1/jobs; the series' cardinality."""
    out: dict = {}
    for path in ("/metrics", "/api/v1/jobs"):
        times, body = [], b""
        for _ in range(repeats):
            dt, body = http_get(d.http + path)
            times.append(dt)
        out[path] = {"seconds_median": statistics.median(times), "seconds_max": max(times),
                     "bytes": len(body)}
        if path == "/metrics":
            out["series"] = series_scopes(body.decode())
    s = out["series"]
    out["series_per_job"] = s["per_job"] / jobs
    out["series_per_node"] = s["per_node"] / nodes
    return out


def loop_probe(d: DaemonProc, repeats: int) -> dict:
    """/healthz (a round trip through the daemon's event loop) every 10 ms, idle and
    while ``BIG_RENDER`` and /metrics are served: does a large render hold the loop?"""
    import threading

    def probe(stop: threading.Event, out: list[float]) -> None:
        while not stop.is_set():
            out.append(http_get(d.http + "/healthz")[0])
            time.sleep(0.01)

    def probed(fn) -> tuple[list[float], list[float]]:
        stop, lat = threading.Event(), []
        th = threading.Thread(target=probe, args=(stop, lat), daemon=True)
        th.start()
        renders = fn()
        stop.set()
        th.join()
        return lat, renders

    idle, _ = probed(lambda: time.sleep(2.0))
    busy, renders = probed(lambda: [http_get(d.http + path)[0] for _ in range(repeats)
                                    for path in (BIG_RENDER, "/metrics")])
    return {"idle_p50_s": _pct(idle, 50), "idle_p99_s": _pct(idle, 99),
            "idle_max_s": max(idle, default=None),
            "render_p50_s": _pct(busy, 50), "render_p99_s": _pct(busy, 99),
            "render_max_s": max(busy, default=None), "probes": len(busy),
            "big_render_p50_s": _pct(renders[::2], 50), "big_render_max_s": max(renders[::2])}


def http_loop_share(world: int, repeats: int) -> dict:
    """In process, no gRPC: how long each render holds the event loop (the step
    run there: list copies, job heads) against the whole render's CPU time."""
    from ncclwatch.daemon import api
    from ncclwatch.daemon.core import Daemon
    from ncclwatch.daemon.export import DaemonCollector, capture
    from ncclwatch.daemon.http import json_chunks

    job = fleet(1, world)[0]
    pool = Pool.build()
    agents = [SimAgent(job, n, pool, random.Random(n), STACK_CHANGE, 0.0)
              for n in range(job.nodes)]
    d = Daemon()
    now = time.monotonic()
    for r in range(3):
        for a in agents:
            d.ingest(pb.ReportRequest.FromString(a.report(1000.0 + r)), now=now)
        d.tick(now=now)
    # As a running daemon holds its tables: frozen out of the collector's way
    # (ncclwatch/daemon/heap.py, once a minute), so renders meet no full collection.
    gc.collect()
    gc.freeze()
    coll = DaemonCollector(d)
    detail = api.JobsQuery(ranks=True)
    views = {
        "/metrics": (lambda: capture(d), lambda c: coll.exposition()),
        "/api/v1/jobs": (lambda: api.collect_jobs(d, api.JobsQuery()),
                         lambda c: "".join(json_chunks(api.finish_jobs(c)))),
        "/api/v1/jobs?ranks=1": (lambda: api.collect_jobs(d, detail),
                                 lambda c: "".join(json_chunks(api.finish_jobs(c)))),
    }
    out = {}
    for path, (on_loop, rest) in views.items():
        loop_t, total_t = [], []
        for _ in range(repeats):
            c0 = time.process_time()
            c = on_loop()
            c1 = time.process_time()
            rest(c)
            loop_t.append(c1 - c0)
            total_t.append(time.process_time() - c0)
        out[path] = {"loop_p99_s": _pct(loop_t, 99), "render_p50_s": _pct(total_t, 50),
                     "render_p99_s": _pct(total_t, 99)}
    gc.unfreeze()
    return {"ranks": world, "repeats": repeats, "views": out}


def http_scale(p: Profile) -> dict:
    """The HTTP views of one ``HTTP_RANKS``-rank job over real gRPC: p50/p99 of each,
    and the loop's responsiveness during the largest render. Its agents all connect at
    once, as after a daemon restart: the time until each is acknowledged is measured."""
    jobs = fleet(1, HTTP_RANKS)
    d = DaemonProc(cpu=DAEMON_CPUS[0], stall_threshold=STALL_THRESHOLD)
    try:
        rss0 = settled_rss(d)
        cl = Clients(jobs, [d.grpc], processes=CLIENT_PROCESSES, interval=QUIET_INTERVAL,
                     stack_change=STACK_CHANGE, cpus=CLIENT_CPUS)
        try:
            connect = cl.wait_ready(600)
            loaded = time.monotonic()
            time.sleep(QUIET_INTERVAL)
            # Memory per rank at this size, before any view is served (renders
            # leave their high-water mark behind).
            rss1, held = d.rss(), time.monotonic() - loaded
            # The daemon's CPU rate without requests (ingest, ticks), to subtract.
            c0, t0 = d.cpu_seconds(), time.perf_counter()
            time.sleep(2 * QUIET_INTERVAL)
            base = (d.cpu_seconds() - c0) / (time.perf_counter() - t0)
            views = {}
            for path in HTTP_PATHS:
                times, cpus, body = [], [], b""
                for _ in range(p.http_scale_repeats):
                    c0 = d.cpu_seconds()
                    dt, body = http_get(d.http + path)
                    times.append(dt)
                    cpus.append(max(0.0, d.cpu_seconds() - c0 - base * dt))
                views[path] = {"p50_s": _pct(times, 50), "p99_s": _pct(times, 99),
                               "cpu_p50_s": _pct(cpus, 50), "cpu_p99_s": _pct(cpus, 99),
                               "bytes": len(body), "n": len(times)}
            loop = loop_probe(d, max(3, p.http_scale_repeats // 4))
        finally:
            answers = cl.stop()
    finally:
        final = d.stop()
    memory = _memory(rss0, rss1, HTTP_RANKS, held, final)
    memory["curve_points_max"] = steady_curve_points(interval=QUIET_INTERVAL)
    return {"ranks": HTTP_RANKS, "agents": jobs[0].nodes, "connect": connect, "views": views,
            "memory": memory, "daemon_base_cores": round(base, 3),
            "loop": loop, "stream_failures": sum(a["failures"] for a in answers),
            "daemon": _brief(final)}


def stall_trials(cl: Clients, d: DaemonProc, job: JobSpec, n: int, *,
                 read_metrics: bool = False) -> tuple[list, dict | None]:
    """Schedule ``n`` checkpoint stalls in ``job`` (rank 0 saves, the rest wait in barrier).

    Fleet agent 0 hosts rank 0. Each stall starts so that the waiters pass
    the threshold half a round before that agent's next report, which thus
    completes the evidence. With ``read_metrics``, /metrics is read once
    during the last stall: the verdict must show there, with per-rank series
    only for the culprit.
    """
    interval = cl.interval
    windows = []
    t = time.monotonic() + 1.0
    for _ in range(n):
        tc = cl.send_times(0, t + STALL_THRESHOLD + interval / 2)
        start = tc - STALL_THRESHOLD - interval / 2
        windows.append((start, tc + HOLD))
        t = tc + HOLD + interval + 1.0
    cl.ask(cmd="stalls", job=job.job_id, windows=windows)
    during = None
    if read_metrics:
        _sleep_until(windows[-1][1] - 0.4)
        _, body = http_get(d.http + "/metrics")
        during = series_scopes(body.decode())
    _sleep_until(windows[-1][1] + interval + 1.0)
    return windows, during


def latencies(windows: list, culprit_sends: list[float], opened: list[dict],
              job_id: str) -> dict:
    """Per trial: completing report sent -> end of the tick that opened the incident.

    The completing report is the culprit's first report after the waiters
    passed the threshold. Under load the daemon receives reports late and
    anchors durations at receive time, so it can judge the evidence
    complete one report earlier ("early"); then that earlier report, the
    culprit's last one before the deciding tick, is the completing one.
    """
    sends = sorted(culprit_sends)
    incs = sorted((o for o in opened if o["job"] == job_id and o["kind"] == "checkpoint_gather"),
                  key=lambda o: o["tick_start"])
    lat, wait, tick, missed, early = [], [], [], 0, 0
    for start, end in windows:
        inc = next((o for o in incs if start <= o["tick_start"] < end + 1.0), None)
        complete = next((t for t in sends if start + STALL_THRESHOLD <= t < end), None)
        if inc is not None and (complete is None or inc["tick_start"] < complete):
            complete = next((t for t in reversed(sends) if start <= t < inc["tick_start"]), None)
            early += complete is not None
        if complete is None or inc is None:
            missed += 1
            continue
        lat.append(inc["tick_end"] - complete)
        wait.append(inc["tick_start"] - complete)
        tick.append(inc["tick_end"] - inc["tick_start"])
    return {"trials": len(windows), "measured": len(lat), "missed": missed, "early": early,
            "p50_s": _pct(lat, 50), "p99_s": _pct(lat, 99), "max_s": max(lat, default=None),
            "wait_for_tick_p50_s": _pct(wait, 50), "tick_p50_s": _pct(tick, 50),
            "tick_max_s": max(tick, default=None), "each_s": [round(x, 4) for x in lat]}


def _windows(point: dict) -> list[dict]:
    return [point[k] for k in ("at_1hz", "at_slow", "saturated") if k in point]


def _pct(xs: list[float], p: float) -> float | None:
    """Nearest-rank percentile (for n < 100, p99 is the maximum)."""
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, -(-len(xs) * p // 100) - 1))]


def _sleep_until(t: float) -> None:
    time.sleep(max(0.0, t - time.monotonic()))


# -- the points ------------------------------------------------------------------------

def single_job(p: Profile) -> dict:
    """One job of ``p.world`` ranks: stall trials at two report rates, memory, HTTP, saturation."""
    jobs = fleet(1, p.world)
    d = DaemonProc(cpu=DAEMON_CPUS[0], stall_threshold=STALL_THRESHOLD)
    final, answers = {}, []
    try:
        rss0 = settled_rss(d)
        cl = Clients(jobs, [d.grpc], processes=CLIENT_PROCESSES, interval=INTERVAL,
                     stack_change=STACK_CHANGE, cpus=CLIENT_CPUS)
        try:
            connect = cl.wait_ready(300)
            loaded = time.monotonic()
            time.sleep(3.0)
            at_1hz = rate_window(cl, [d], 5.0)
            fast, during = stall_trials(cl, d, jobs[0], p.trials, read_metrics=True)
            cl.set_interval(SLOW_INTERVAL)
            time.sleep(SLOW_INTERVAL)
            at_slow = rate_window(cl, [d], SLOW_INTERVAL)
            slow, _ = stall_trials(cl, d, jobs[0], p.trials_slow)
            _sleep_until(loaded + p.steady_seconds)
            rss1, held = d.rss(), time.monotonic() - loaded
            cl.set_interval(QUIET_INTERVAL)
            time.sleep(QUIET_INTERVAL)
            http = http_point(d, p.http_repeats, 1, jobs[0].nodes)
            rss_http = d.rss()
            cl.ask(cmd="mode", mode="saturate")
            time.sleep(p.warmup)
            saturated = rate_window(cl, [d], p.saturate_seconds)
        finally:
            answers = cl.stop()
    finally:
        final = d.stop()
    sends = [t for a in answers for t in a["culprit_sends"]]
    memory = _memory(rss0, rss1, p.world, held, final)
    memory["rss_after_http_bytes"] = rss_http
    return {"jobs": 1, "ranks": p.world, "agents": jobs[0].nodes, "at_1hz": at_1hz,
            "at_slow": at_slow, "saturated": saturated, "http": http, "during_stall": during,
            "latency": latencies(fast, sends, final["opened"], jobs[0].job_id),
            "latency_slow": latencies(slow, sends, final["opened"], jobs[0].job_id),
            "memory": memory, "connect": connect,
            "stream_failures": sum(a["failures"] for a in answers), "daemon": _brief(final)}


def workers_point(p: Profile, workers: int, world: int) -> dict:
    """One ``world``-rank job on a daemon with ``workers`` ingest workers (0: gRPC in the
    daemon process): stall decision latency at 1 report/s, then the saturated rate.
    The core is pinned to one CPU; its workers float over every CPU."""
    jobs = fleet(1, world)
    d = DaemonProc(cpu=DAEMON_CPUS[0], stall_threshold=STALL_THRESHOLD, ingest_workers=workers)
    final, answers = {}, []
    try:
        cl = Clients(jobs, [d.grpc], processes=CLIENT_PROCESSES, interval=INTERVAL,
                     stack_change=STACK_CHANGE, cpus=CLIENT_CPUS)
        try:
            connect = cl.wait_ready(600)
            time.sleep(3.0)
            at_1hz = rate_window(cl, [d], 5.0)
            fast, _ = stall_trials(cl, d, jobs[0], p.trials)
            cl.ask(cmd="mode", mode="saturate")
            time.sleep(p.warmup)
            saturated = rate_window(cl, [d], p.saturate_seconds)
        finally:
            answers = cl.stop()
    finally:
        final = d.stop()
    sends = [t for a in answers for t in a["culprit_sends"]]
    return {"workers": workers, "ranks": world, "agents": jobs[0].nodes, "connect": connect,
            "at_1hz": at_1hz, "saturated": saturated,
            "latency": latencies(fast, sends, final["opened"], jobs[0].job_id),
            "stream_failures": sum(a["failures"] for a in answers),
            "worker_restarts": final.get("worker_restarts", 0),
            "worker_reports": final.get("worker_reports", []), "daemon": _brief(final)}


def compare_workers(p: Profile, workers: int, world: int) -> dict:
    """The same job with gRPC in the daemon process and with ``workers`` ingest workers."""
    t0 = time.monotonic()
    points = [workers_point(p, n, world) for n in (0, workers)]
    return {"profile": p.name, "cores": CORES, "daemon_pinned": DAEMON_CPUS[0] is not None,
            "client_processes": CLIENT_PROCESSES, "stall_threshold_s": STALL_THRESHOLD,
            "seconds": round(time.monotonic() - t0), "points": points}


def render_workers(r: dict) -> str:
    """The BENCHMARKS.md lines for ``compare_workers``."""
    rows = []
    for x in r["points"]:
        sat, slow, lat = x["saturated"], x["at_1hz"], x["latency"]
        rows.append(
            f"| {x['workers']} | {sat['samples_per_s'] / 1000:.1f}k | "
            f"{sat['core_cores'][0]:.2f} + {sat['worker_cores'][0]:.2f} | "
            f"**{sat['samples_per_daemon_cpu_s'] / 1000:.1f}k** | "
            f"{sat['samples_per_core_cpu_s'] / 1000:.1f}k | {sat['client_cores']:.2f} | "
            f"{slow['core_cores'][0]:.2f} + {slow['worker_cores'][0]:.2f} | "
            f"{_ms(lat['p50_s'])} / {_ms(lat['p99_s'])} ({lat['measured']} of {lat['trials']}) "
            f"| {x['connect']['seconds']:.0f} s |")
    one = r["points"][0]
    return "\n".join([
        f"{r['profile']} profile on {r['cores']} cores, {r['seconds']} s: one job of "
        f"{one['ranks']} ranks ({one['agents']} agent streams) against a daemon without and "
        f"with ingest workers; the core pinned to one CPU, workers floating, "
        f"{r['client_processes']} client processes. Daemon CPU = core + workers (psutil).", "",
        "| ingest workers | samples/s saturated | daemon cores (core + workers) | per daemon "
        "CPU-second | per core CPU-second | client cores | cores at 1 report/s | stall "
        "decision p50 / p99 at 1 report/s | all agents acked after |",
        "|---|---|---|---|---|---|---|---|---|", *rows])


def transport_floor(p: Profile) -> dict:
    """The same fleet against a server that only parses and acks."""
    jobs = fleet(1, p.world)
    d = DaemonProc(cpu=DAEMON_CPUS[0], null=True)
    try:
        rss0 = settled_rss(d)
        cl = Clients(jobs, [d.grpc], processes=CLIENT_PROCESSES, stack_change=STACK_CHANGE,
                     cpus=CLIENT_CPUS)
        try:
            connect = cl.wait_ready(300)
            time.sleep(2.0)
            rss1 = d.rss()  # the streams and connections, at 1 Hz
            cl.ask(cmd="mode", mode="saturate")
            time.sleep(p.warmup)
            saturated = rate_window(cl, [d], p.saturate_seconds)
        finally:
            answers = cl.stop()
    finally:
        d.stop()
    return {"ranks": p.world, "agents": jobs[0].nodes, "saturated": saturated,
            "bytes_per_stream": (rss1 - rss0) / jobs[0].nodes,
            "connect": connect, "stream_failures": sum(a["failures"] for a in answers)}


def saturated_rate(p: Profile, null: bool) -> dict:
    """One job of ``p.world`` ranks, every agent sending as fast as it is acked:
    against the daemon, or (``null``) against the transport floor's server."""
    jobs = fleet(1, p.world)
    d = DaemonProc(cpu=DAEMON_CPUS[0], null=null, stall_threshold=STALL_THRESHOLD)
    try:
        cl = Clients(jobs, [d.grpc], processes=CLIENT_PROCESSES, stack_change=STACK_CHANGE,
                     cpus=CLIENT_CPUS)
        try:
            cl.wait_ready(300)
            time.sleep(2.0)
            cl.ask(cmd="mode", mode="saturate")
            time.sleep(p.warmup)
            return rate_window(cl, [d], p.saturate_seconds)
        finally:
            cl.stop()
    finally:
        d.stop()


def rate_pairs(p: Profile, repeats: int) -> dict:
    """The daemon's saturated rate per CPU-second against the transport floor's,
    measured alternately ``repeats`` times each (the ratio within each pair is
    what this shared machine can tell)."""
    pairs = []
    for _ in range(repeats):
        daemon = saturated_rate(p, null=False)["samples_per_daemon_cpu_s"]
        floor = saturated_rate(p, null=True)["samples_per_daemon_cpu_s"]
        pairs.append({"daemon": daemon, "floor": floor, "ratio": daemon / floor})
    return {"ranks": p.world, "pairs": pairs,
            "ratio_median": statistics.median(x["ratio"] for x in pairs)}


def many_jobs(jobs_n: int, world: int, p: Profile, *, http: bool = True,
              streams_per_channel: int = 1, interval: float = QUIET_INTERVAL) -> dict:
    """Many jobs on one daemon: saturated rate, memory, and the HTTP views."""
    jobs = fleet(jobs_n, world)
    nodes = sum(j.nodes for j in jobs)
    d = DaemonProc(cpu=DAEMON_CPUS[0], stall_threshold=STALL_THRESHOLD)
    try:
        rss0 = settled_rss(d)
        cl = Clients(jobs, [d.grpc], processes=CLIENT_PROCESSES, stack_change=STACK_CHANGE,
                     streams_per_channel=streams_per_channel, cpus=CLIENT_CPUS,
                     interval=interval)
        try:
            connect = cl.wait_ready(600)
            loaded = time.monotonic()
            out: dict = {}
            if http:
                time.sleep(2.0)
                out["http"] = http_point(d, p.http_repeats, jobs_n, nodes)
            cl.ask(cmd="mode", mode="saturate")
            time.sleep(p.warmup)
            out["saturated"] = rate_window(cl, [d], p.saturate_seconds)
            rss1, held = d.rss(), time.monotonic() - loaded
        finally:
            answers = cl.stop()
    finally:
        final = d.stop()
    out.update(jobs=jobs_n, ranks=jobs_n * world, agents=nodes,
               connections=-(-nodes // streams_per_channel),
               memory=_memory(rss0, rss1, jobs_n * world, held, final),
               connect=connect, stream_failures=sum(a["failures"] for a in answers),
               daemon=_brief(final))
    return out


def sharded(jobs_n: int, world: int, p: Profile) -> dict:
    """The many-jobs fleet over two daemons, jobs placed by ``shard(job_id, 2)``
    (rendezvous hashing: what the agent's router uses)."""
    jobs = fleet(jobs_n, world)
    ds = [DaemonProc(cpu=c, stall_threshold=STALL_THRESHOLD) for c in DAEMON_CPUS]
    finals = []
    try:
        cl = Clients(jobs, [d.grpc for d in ds], processes=CLIENT_PROCESSES,
                     stack_change=STACK_CHANGE, interval=QUIET_INTERVAL)
        try:
            connect = cl.wait_ready(600)
            cl.ask(cmd="mode", mode="saturate")
            time.sleep(p.warmup)
            saturated = rate_window(cl, ds, p.saturate_seconds)
        finally:
            answers = cl.stop()
    finally:
        finals = [d.stop() for d in ds]
    placed = [set(f["jobs"]) for f in finals]
    expect = [{j.job_id for j in jobs if shard(j.job_id, 2) == k} for k in range(2)]
    return {"daemons": 2, "jobs": jobs_n, "ranks": jobs_n * world, "saturated": saturated,
            "jobs_per_daemon": [len(x) for x in placed],
            "jobs_on_both": len(placed[0] & placed[1]),
            "placed_by_shard": placed == expect,
            "connect": connect, "stream_failures": sum(a["failures"] for a in answers),
            "daemons_final": [_brief(f) for f in finals]}


def _memory(rss0: int, rss1: int, ranks: int, held: float, final: dict) -> dict:
    return {"rss_before_bytes": rss0, "rss_after_bytes": rss1,
            "bytes_per_rank": (rss1 - rss0) / ranks,
            "kib_per_1k_ranks": (rss1 - rss0) / (ranks / 1000) / 1024,
            "seconds_loaded": round(held, 1), "curve_points_min": final["curve_points_min"],
            "curve_points_max": steady_curve_points()}


def steady_curve_points(protocol: int = PROTOCOL, interval: float = INTERVAL) -> int:
    """Points a steady rank's curve holds once full: one per full sample within
    CURVE_SPAN (protocol 2 sends a steady rank in full once a snapshot), and
    at least the newest."""
    every = interval * (SNAPSHOT_EVERY if protocol >= 2 else 1)
    return max(1, min(CURVE_POINTS, int(CURVE_SPAN // max(every, CURVE_STEP))))


def _brief(final: dict) -> dict:
    return {k: final[k] for k in ("samples_total", "reports_total", "duplicates_total",
                                  "rejected", "ticks", "detect_seconds", "ranks")}


def in_process(world: int, rounds: int, protocol: int = PROTOCOL) -> dict:
    """Decode-only and decode + ingest (no gRPC) over the bytes the agents send.

    The first round (stack frames, job info) warms the daemon and is not
    timed; the rest are steady-state reports (protocol 2: one in
    SNAPSHOT_EVERY all full samples, the others briefs for unchanged ranks).
    CPU time of this process.
    """
    job = fleet(1, world)[0]
    pool = Pool.build()
    agents = [SimAgent(job, n, pool, random.Random(n), STACK_CHANGE, 0.0, protocol=protocol)
              for n in range(job.nodes)]
    t = 1000.0
    msgs = []
    for _ in range(rounds + 1):
        for a in agents:
            msgs.append(a.report(t))
        t += INTERVAL
    warm, timed = msgs[:len(agents)], msgs[len(agents):]
    samples = len(timed) * RANKS_PER_NODE
    from ncclwatch.daemon.core import Daemon

    parse = pb.ReportRequest.FromString
    gc.collect()
    c0 = time.process_time()
    for m in timed:
        parse(m)
    decode = time.process_time() - c0
    d = Daemon()
    now = time.monotonic()
    for m in warm:
        d.ingest(parse(m), now=now)
    gc.collect()
    c0 = time.process_time()
    for i, m in enumerate(timed):
        d.ingest(parse(m), now=now + 1.0 + i // len(agents))
    ingest = time.process_time() - c0
    return {"ranks": world, "reports": len(timed), "samples": samples, "protocol": protocol,
            "bytes_per_report": sum(map(len, timed)) / len(timed),
            "decode_samples_per_cpu_s": samples / decode,
            "decode_ingest_samples_per_cpu_s": samples / ingest}


def table_memory(world: int, rounds: int) -> dict:
    """The job table's own memory per rank with every curve full (in-process, no gRPC).

    Counted with tracemalloc (the Python allocations the daemon holds on
    to), not RSS, which moves by allocator arenas at this size. A throwaway
    daemon ingests a small job first, so that what the first report imports
    (modules, protobuf descriptors: about 1 MiB, once a process) is not
    counted per rank; what the simulated agents themselves keep
    (bench/loadgen.py) is left out too.
    """
    import tracemalloc

    from ncclwatch.daemon.core import Daemon

    pool = Pool.build()

    def agents_of(job: JobSpec) -> list[SimAgent]:
        return [SimAgent(job, n, pool, random.Random(n), STACK_CHANGE, 0.0)
                for n in range(job.nodes)]

    warm, t = Daemon(), 1000.0
    for _ in range(3):
        for a in agents_of(fleet(1, 2 * RANKS_PER_NODE)[0]):
            warm.ingest(pb.ReportRequest.FromString(a.report(t)), now=t)
        t += INTERVAL
        warm.tick(now=t)
    del warm
    agents = agents_of(fleet(1, world)[0])
    d = Daemon()
    gc.collect()
    tracemalloc.start()
    ours = (tracemalloc.Filter(False, tracemalloc.__file__),
            tracemalloc.Filter(False, "*/bench/loadgen.py"))
    before = tracemalloc.take_snapshot().filter_traces(ours)
    t = 1000.0
    for _ in range(rounds):
        for a in agents:
            d.ingest(pb.ReportRequest.FromString(a.report(t)), now=t)
        t += INTERVAL
        d.tick(now=t)
    gc.collect()
    after = tracemalloc.take_snapshot().filter_traces(ours)
    tracemalloc.stop()
    diff = after.compare_to(before, "filename")
    held = sum(x.size_diff for x in diff)
    by_module = {os.path.relpath(x.traceback[0].filename): round(x.size_diff / world, 1)
                 for x in sorted(diff, key=lambda x: -x.size_diff)[:12]}
    ranks = [r for j in d.table.jobs.values() for r in j.ranks.values()]
    return {"ranks": world, "rounds": rounds, "bytes_per_rank": held / world,
            "by_module": by_module,
            "curve_points": min(len(r.curve) for r in ranks)}


# -- the whole run -------------------------------------------------------------------------

def measure(p: Profile) -> dict:
    """Every point of profile ``p``, one after the other (never two loads at once)."""
    check_assembly()
    t0 = time.monotonic()
    r: dict = {"profile": p.name, "cores": CORES, "daemon_pinned": DAEMON_CPUS[0] is not None,
               "client_processes": CLIENT_PROCESSES, "stall_threshold_s": STALL_THRESHOLD,
               "interval_s": INTERVAL, "stack_change": STACK_CHANGE, "targets": TARGETS,
               "config": asdict(p)}

    def step(name: str, fn, *args, **kw):
        s = time.monotonic()
        print(f"[daemon_ingest] {name} ...", file=sys.stderr, flush=True)
        r[name] = fn(*args, **kw)
        print(f"[daemon_ingest] {name}: {time.monotonic() - s:.0f}s", file=sys.stderr,
              flush=True)

    # A whole snapshot cycle of protocol 2 (one report in SNAPSHOT_EVERY all full).
    step("in_process", in_process, p.world, SNAPSHOT_EVERY)
    step("in_process_v1", in_process, p.world, SNAPSHOT_EVERY, protocol=1)
    step("table_memory", table_memory, 256, CURVE_POINTS + 5)
    step("single_job", single_job, p)
    step("transport_floor", transport_floor, p)
    step("http_scale", http_scale, p)
    step("http_loop_share", http_loop_share, HTTP_RANKS, p.http_scale_repeats)
    step("many_jobs", many_jobs, *p.many, p)
    step("sharded", sharded, *p.many, p)
    if p.big:
        step("big", many_jobs, *p.big, p, http=False, streams_per_channel=8, interval=10.0)
    from bench import core_replay
    step("core_replay", core_replay.run, 100_000, p.replay_trials)
    # What one agent's stream costs the gRPC server alone, beside each memory figure.
    for point in ("single_job", "http_scale"):
        r[point]["memory"]["grpc_bytes_per_stream"] = r["transport_floor"]["bytes_per_stream"]
    r["seconds"] = round(time.monotonic() - t0)
    r["checks"] = checks(r)
    return r


def checks(r: dict) -> dict:
    """What must hold for the numbers to mean anything (and the cardinality contract)."""
    one, many, sh = r["single_job"], r["many_jobs"], r["sharded"]
    points = [one, many, sh, r["transport_floor"]] + ([r["big"]] if "big" in r else [])
    during = one["during_stall"]
    return {
        "no_stream_failures_while_measuring": all(
            w["stream_failures"] == 0 for x in points for w in _windows(x)),
        "no_rejected_reports": all(not x["daemon"]["rejected"] for x in (one, many)),
        "every_trial_detected": one["latency"]["missed"] == 0
                                and one["latency_slow"]["missed"] == 0,
        "stall_visible_in_metrics": during["stall_active"].get(
            fleet(1, one["ranks"])[0].job_id) == "checkpoint_gather",
        "no_per_rank_series_without_stall": (one["http"]["series"]["per_rank"] == 0
                                             and many["http"]["series"]["per_rank"] == 0),
        "per_rank_series_only_culprit": 0 < during["per_rank"] <= 8,
        "series_per_job_independent_of_ranks":
            one["http"]["series_per_job"] == many["http"]["series_per_job"],
        "no_job_on_both_shards": sh["jobs_on_both"] == 0 and sh["placed_by_shard"],
    }


# -- the report ------------------------------------------------------------------------------

def render(r: dict) -> str:
    """The BENCHMARKS.md section for one run (``measure``'s result)."""
    one, floor, inp = r["single_job"], r["transport_floor"], r["in_process"]
    many, sh, tm = r["many_jobs"], r["sharded"], r["table_memory"]
    sat = one["saturated"]
    lat, slow, mem = one["latency"], one["latency_slow"], one["memory"]
    per_core = sat["samples_per_daemon_cpu_s"]
    t = r["targets"]

    def k(x: float) -> str:
        return f"{x / 1000:.1f}k"

    def ok(good: bool) -> str:
        return "**holds**" if good else "**missed**"

    steady = mem["curve_points_min"] >= mem["curve_points_max"]
    rows = [
        ("rank-samples/s, one daemon core (saturated; per daemon CPU-second)",
         f"{k(sat['samples_per_s'])}/s at {_cores(sat)} of its core; **{k(per_core)}** per "
         f"CPU-second", f">= {k(t['rate'])}", ok(per_core >= t["rate"])),
        ("daemon CPU per sample", f"{sat['daemon_cpu_us_per_sample']:.1f} us", "", ""),
        _latency_row(one, "latency", "at_1hz", "1 report/s", t["detect_s"]),
        _latency_row(one, "latency_slow", "at_slow",
                     f"1 report/{SLOW_INTERVAL:.0f} s", t["detect_s"]),
        (f"RSS per rank, {one['ranks']} ranks" + ("" if steady else " (curves not yet full)"),
         f"{mem['bytes_per_rank'] / 1024:.1f} KiB ({mem['kib_per_1k_ranks'] / 1024:.1f} MiB "
         "per 1k ranks)", f"<= {t['bytes_per_rank'] // 1024} KiB",
         ok(mem["bytes_per_rank"] <= t["bytes_per_rank"]) if steady else "n/a"),
        ("ingest / decode-only (samples per CPU-second)",
         f"{per_core / inp['decode_samples_per_cpu_s']:.3f} "
         f"({k(per_core)} vs {k(inp['decode_samples_per_cpu_s'])})", "", ""),
    ]
    out = [
        f"{r['profile']} run on {r['cores']} cores, {r['seconds']} s. Real gRPC on loopback; "
        f"the daemon is a real `DaemonServer` in its own process"
        + (" pinned to one CPU (the clients to the others)" if r["daemon_pinned"] else "")
        + f"; agents are simulated by {r['client_processes']} client processes, one grpc.aio "
        "stream and TCP connection per agent (8 ranks per node), interned stacks, "
        f"{r['stack_change']:.0%} of samples change stack per round. The machine also runs "
        "the load generator (and whatever else is running), so rates are also given per "
        "daemon CPU-second.", "",
        "| measure | result | target | |", "|---|---|---|---|",
        *[f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows], "",
        "Where one core goes (samples per CPU-second):", "",
        "| layer | samples/CPU-s | us/sample |", "|---|---|---|",
        _layer("protobuf decode only (`FromString`, same bytes)", inp["decode_samples_per_cpu_s"]),
        _layer("decode + `Daemon.ingest`, no gRPC", inp["decode_ingest_samples_per_cpu_s"]),
        *([_layer("the same with protocol 1 (full samples every round)",
                  r["in_process_v1"]["decode_ingest_samples_per_cpu_s"])]
          if "in_process_v1" in r else []),
        _layer("gRPC server that only parses and acks (transport floor)",
               floor["saturated"]["samples_per_daemon_cpu_s"]),
        _layer("the daemon over gRPC", per_core), "",
        f"- Reports are {inp['bytes_per_report']:.0f} bytes (8 ranks, protocol "
        f"{inp.get('protocol', 1)}"
        + (f"; {r['in_process_v1']['bytes_per_report']:.0f} bytes with protocol 1"
           if "in_process_v1" in r else "") + "); at 1 report/s per "
        f"agent the {one['ranks']}-rank job is {k(one['at_1hz']['samples_per_s'])} samples/s "
        f"and costs the daemon {_cores(one['at_1hz'])} of a core.",
        f"- Connecting all {one['agents']} agents at once (a daemon restart) took "
        f"{one['connect']['seconds']:.0f} s until each had its first report acknowledged"
        + (f"; {one['connect']['failures']} streams failed meanwhile (gRPC cancels calls "
           "the busy grpc.aio server has not accepted in time) and reconnected with the "
           "agent's backoff." if one["connect"]["failures"] else "; no stream failed."),
        f"- Detection latency is in-process tick latency: completing report sent -> end of "
        f"the tick that opened the incident (ticks 0.5 s apart; stall threshold "
        f"{r['stall_threshold_s']:.0f} s for the benchmark). From the report to the start of "
        f"that tick (the report's queueing, then the wait for the tick): median "
        f"{_ms(lat['wait_for_tick_p50_s'])} at 1 report/s, "
        f"{_ms(slow['wait_for_tick_p50_s'])} at 1/{SLOW_INTERVAL:.0f} s; the tick itself "
        f"{_ms(lat['tick_p50_s'])} (max {_ms(lat['tick_max_s'])}). Trials the daemon decided "
        f"one culprit report early (late receipt under load): {lat['early']} and "
        f"{slow['early']}. Percentiles are nearest-rank: with fewer than 100 trials, p99 is "
        "the maximum. HTTP adds the /metrics response time below.",
        f"- Memory: {_mib(mem['rss_after_bytes'] - mem['rss_before_bytes'])} for "
        f"{one['ranks']} ranks after {mem['seconds_loaded']:.0f} s (curves "
        f"{mem['curve_points_min']}/{mem['curve_points_max']} points), gRPC included. Of "
        f"that, the job table alone (in-process, {tm['ranks']} ranks, curves "
        f"{tm['curve_points']} points) is {tm['bytes_per_rank'] / 1024:.1f} KiB per rank; "
        f"one agent's stream and connection cost the gRPC server "
        f"{floor['bytes_per_stream'] / 1024:.0f} KiB with no daemon behind it "
        f"({floor['bytes_per_stream'] / RANKS_PER_NODE / 1024:.1f} KiB per rank). Serving "
        f"/api/v1/jobs then raised RSS by a further "
        f"{_mib(mem['rss_after_http_bytes'] - mem['rss_after_bytes'])} (the response's "
        "high-water mark stays with the process).",
        "", f"/metrics and /api/v1/jobs (median of {r['config']['http_repeats']} reads while the "
        f"agents report every {QUIET_INTERVAL:.0f} s):", "",
        "| daemon holds | /metrics | series (per job / per node / per rank) | /api/v1/jobs |",
        "|---|---|---|---|",
        _http_row(f"1 job x {one['ranks']} ranks", one["http"]),
        _http_row(f"{many['jobs']} jobs x {many['ranks'] // many['jobs']} ranks", many["http"]),
        "",
        *(_http_scale_lines(r["http_scale"]) if "http_scale" in r else []),
        *(_loop_share_lines(r["http_loop_share"]) if "http_loop_share" in r else []),
        f"- Cardinality: {one['http']['series_per_job']:.0f} series per job and "
        f"{one['http']['series_per_node']:.0f} per node (agent health) whatever the ranks; "
        f"per-rank series only for culprits: {one['during_stall']['per_rank']} during a stall "
        f"of {one['ranks']} ranks, 0 otherwise.",
        "", *_shard_lines(r),
    ]
    if "big" in r:
        b = r["big"]
        out += ["", f"{b['ranks'] // 1000}k ranks ({b['jobs']} jobs x {b['ranks'] // b['jobs']},"
                f" {b['agents']} agent streams over {b['connections']} connections): "
                f"{k(b['saturated']['samples_per_s'])} samples/s at "
                f"{_cores(b['saturated'])} of a core "
                f"({k(b['saturated']['samples_per_daemon_cpu_s'])} per CPU-second); RSS "
                f"{b['memory']['bytes_per_rank'] / 1024:.1f} KiB per rank after "
                f"{b['memory']['seconds_loaded']:.0f} s (curves "
                f"{b['memory']['curve_points_min']}/{b['memory']['curve_points_max']} points)."]
    if "core_replay" in r:
        from bench import core_replay
        out += ["", core_replay.render(r["core_replay"])]
    failed = [name for name, good in r["checks"].items() if not good]
    out += ["", "Checks: " + ("all hold (" + ", ".join(r["checks"]) + ")." if not failed
                               else "FAILED: " + ", ".join(failed) + ".")]
    return "\n".join(out)


def _loop_share_lines(h: dict) -> list[str]:
    return [
        f"The same views in process (no gRPC; CPU time, {h['repeats']} renders each at "
        f"{h['ranks']} ranks): how long each holds the daemon's event loop against the "
        "whole render:", "",
        "| view | on the event loop, p99 | whole render p50 / p99 |", "|---|---|---|",
        *[f"| {path} | {_ms(x['loop_p99_s'])} | {_ms(x['render_p50_s'])} / "
          f"{_ms(x['render_p99_s'])} |" for path, x in h["views"].items()], ""]


def _http_scale_lines(h: dict) -> list[str]:
    v, lp = h["views"], h["loop"]
    names = {"/metrics": "/metrics", "/api/v1/jobs": "/api/v1/jobs (summaries, the default)",
             "/api/v1/jobs?ranks=1": "/api/v1/jobs?ranks=1 (first page: 1000 ranks' detail)"}
    n = next(iter(v.values()))["n"]
    return [
        f"At {h['ranks']} ranks in one job ({h['agents']} agent streams reporting every "
        f"{QUIET_INTERVAL:.0f} s; {n} reads of each, nearest-rank percentiles):", "",
        "| view | wall p50 | wall p99 | daemon CPU p50 | daemon CPU p99 | size |",
        "|---|---|---|---|---|---|",
        *[f"| {names.get(path, path)} | {_ms(x['p50_s'])} | {_ms(x['p99_s'])} | "
          f"{_ms(x['cpu_p50_s'])} | {_ms(x['cpu_p99_s'])} | {x['bytes'] / 1024:.0f} KiB |"
          for path, x in v.items()], "",
        "- Wall: the response time the client saw. Daemon CPU: the daemon process's CPU "
        "time during the request minus its rate without requests "
        f"({h['daemon_base_cores']:.2f} of a core for ingest and ticks), i.e. what the "
        "request costs the daemon's core; on this shared machine the wall time also "
        "contains the waits for that core behind other processes.",
        f"- The event loop during renders: a /healthz round trip through the loop took "
        f"p50 {_ms(lp['render_p50_s'])}, p99 {_ms(lp['render_p99_s'])}, max "
        f"{_ms(lp['render_max_s'])} ({lp['probes']} probes) while `{BIG_RENDER}` (every "
        f"rank's detail in one response: p50 {_ms(lp['big_render_p50_s'])}, max "
        f"{_ms(lp['big_render_max_s'])}) and /metrics were served back to back; idle p50 "
        f"{_ms(lp['idle_p50_s'])}, p99 {_ms(lp['idle_p99_s'])}. The loop only copies lists "
        "for a render; the per-rank walk, encoding and JSON run in the HTTP thread, which "
        "shares the GIL (and here the daemon's one CPU) with the loop.",
        f"- These {h['agents']} agents connected at once (as after a daemon restart) and were "
        f"all acknowledged within {h['connect']['seconds']:.0f} s "
        f"({h['connect']['failures']} streams failed and reconnected meanwhile).", ""]


def _latency_row(one: dict, key: str, load: str, rate: str, target: float) -> tuple:
    lat = one[key]
    good = lat["p99_s"] is not None and lat["p99_s"] <= target
    return (f"stall decision latency, {one['ranks']} ranks at {rate} (daemon at "
            f"{_cores(one[load])} of its core; p50 / p99 of {lat['measured']})",
            f"{_ms(lat['p50_s'])} / {_ms(lat['p99_s'])}", f"<= {target:.0f} s",
            "**holds**" if good else "**missed**")


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 1000:.0f} ms"


def _shard_lines(r: dict) -> list[str]:
    many, sh = r["many_jobs"], r["sharded"]
    return [
        "Sharding (jobs by rendezvous hashing of the job id, `ncclwatch/shard.py`), "
        f"{sh['jobs']} jobs x {sh['ranks'] // sh['jobs']} ranks, saturated:", "",
        "| daemons | samples/s | per daemon | daemon cores | per daemon CPU-second | "
        "client cores |", "|---|---|---|---|---|---|",
        _shard_row(1, many["saturated"]), _shard_row(2, sh["saturated"]), "",
        f"- 2 daemons / 1: **{sh['saturated']['samples_per_s'] / many['saturated']['samples_per_s']:.2f}x**"
        f" samples/s. The {r['cores']} cores also run the load generator, whose clients "
        "need about as much CPU per report as a daemon: daemons and clients together used "
        f"{_used(many['saturated']):.2f} cores with one daemon and "
        f"{_used(sh['saturated']):.2f} with two, so two daemons can only split what is left, "
        "not double it. Shards are independent (no shared state, no cross-talk), so with "
        "cores to spare capacity is the sum of each daemon's rate per CPU-second. Jobs per "
        f"daemon {sh['jobs_per_daemon']}, jobs on both: {sh['jobs_on_both']}, every job on "
        f"the daemon `shard()` names: {sh['placed_by_shard']}.",
    ]


def compare_shards(p: Profile) -> dict:
    """Only the sharding point: the many-jobs fleet on one daemon, then on two."""
    check_assembly()
    t0 = time.monotonic()
    r: dict = {"profile": p.name, "cores": CORES, "config": asdict(p)}
    r["many_jobs"] = many_jobs(*p.many, p, http=False)
    r["sharded"] = sharded(*p.many, p)
    r["seconds"] = round(time.monotonic() - t0)
    return r


def _shard_row(n: int, w: dict) -> str:
    each = " + ".join(f"{x / 1000:.1f}k" for x in w["each_samples_per_s"])
    per_cpu = " / ".join(f"{x / 1000:.1f}k" for x in w["each_samples_per_cpu_s"])
    return (f"| {n} | {w['samples_per_s'] / 1000:.1f}k | {each} | {_cores(w)} | {per_cpu} | "
            f"{w['client_cores']:.2f} |")


def _used(w: dict) -> float:
    return sum(w["daemon_cores"]) + w["client_cores"]


def _cores(w: dict) -> str:
    return " + ".join(f"{c:.2f}" for c in w["daemon_cores"])


def _layer(name: str, rate: float) -> str:
    return f"| {name} | {rate / 1000:.1f}k | {1e6 / rate:.1f} |"


def _mib(n: float) -> str:
    return f"{n / (1 << 20):.0f} MiB"


def _http_row(name: str, h: dict) -> str:
    m, j, s = h["/metrics"], h["/api/v1/jobs"], h["series"]
    return (f"| {name} | {m['seconds_median'] * 1000:.0f} ms, {m['bytes'] / 1024:.0f} KiB | "
            f"{s['total']} ({s['per_job']} / {s['per_node']} / {s['per_rank']}) | "
            f"{j['seconds_median'] * 1000:.0f} ms, {j['bytes'] / (1 << 20):.1f} MiB |")


def run(full: bool = False) -> dict:
    """One run (the aggregator's entry point); ``render`` turns it into markdown."""
    return measure(FULL if full else QUICK)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.daemon_ingest", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_true", help="smaller N, about two minutes")
    g.add_argument("--full", action="store_true", help="the 16k-rank and 100k-rank points")
    ap.add_argument("--json", metavar="FILE", help="also write the results here")
    ap.add_argument("--ingest-workers", type=int, default=0, metavar="N",
                    help="instead of the whole run: one job, daemon with 0 and with N ingest "
                         "workers (saturated rate per daemon CPU-second, stall decision "
                         "latency at 1 report/s)")
    ap.add_argument("--world", type=int, default=None, metavar="RANKS",
                    help="with --ingest-workers: the job's ranks (default: the profile's)")
    ap.add_argument("--trials", type=int, default=None, metavar="N",
                    help="with --ingest-workers: stall trials per daemon (default: the "
                         "profile's)")
    ap.add_argument("--plan", type=int, default=0, metavar="RANKS",
                    help="instead of the whole run: the cores and memory a collector needs "
                         "for RANKS ranks (one job, or --jobs of them), from this machine's "
                         "measured costs (bench/plan.py), with the sharded layout when one "
                         "daemon is not enough")
    ap.add_argument("--jobs", type=int, default=1, metavar="N",
                    help="with --plan: the ranks are N jobs (default: one job)")
    ap.add_argument("--interval", type=float, default=INTERVAL, metavar="SECONDS",
                    help="with --plan: each agent's report interval (default: %(default)s)")
    ap.add_argument("--rate", type=int, default=0, metavar="PAIRS",
                    help="instead of the whole run: the daemon's saturated rate per CPU-second "
                         "and the transport floor's, alternately, PAIRS times")
    ap.add_argument("--memory", type=int, default=0, metavar="RANKS",
                    help="instead of the whole run: the job table's own memory per rank "
                         "(tracemalloc, in process, every curve full) for one job of RANKS "
                         "ranks, by module")
    ap.add_argument("--shards", action="store_true",
                    help="instead of the whole run: the many-jobs fleet on one daemon and "
                         "on two shards (saturated rates, placement)")
    a = ap.parse_args(argv)
    if a.plan:
        from bench import plan
        costs = plan.measure()
        lay = plan.plan(a.plan, a.jobs, a.interval, costs)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(plan.to_json(lay, costs), f, indent=1)
        print(plan.render(lay, costs))
        return 0 if lay.fits else 1
    if a.rate:
        r = rate_pairs(FULL if a.full else QUICK, a.rate)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(r, f, indent=1)
        for x in r["pairs"]:
            print(f"daemon {x['daemon'] / 1000:.1f}k, transport floor {x['floor'] / 1000:.1f}k "
                  f"samples per CPU-second: {x['ratio']:.2f} of the floor")
        print(f"median {r['ratio_median']:.2f} of the floor ({r['ranks']} ranks)")
        return 0
    if a.memory:
        r = table_memory(a.memory, CURVE_POINTS + 5)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(r, f, indent=1)
        print(f"the job table's own memory: {r['bytes_per_rank']:.0f} B per rank at "
              f"{r['ranks']} ranks, {r['rounds']} rounds (curves {r['curve_points']} points)")
        for mod, b in r["by_module"].items():
            print(f"  {b:8.1f} B  {mod}")
        return 0
    if a.shards:
        r = compare_shards(FULL if a.full else QUICK)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(r, f, indent=1)
        print("\n".join(_shard_lines(r)))
        sh = r["sharded"]
        return 0 if sh["placed_by_shard"] and sh["jobs_on_both"] == 0 and all(
            x["stream_failures"] == 0 for x in (sh, r["many_jobs"])) else 1
    if a.ingest_workers:
        p = FULL if a.full else QUICK
        if a.trials:
            p = dataclasses.replace(p, trials=a.trials)
        r = compare_workers(p, a.ingest_workers, a.world or p.world)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(r, f, indent=1)
        print(render_workers(r))
        return 0 if all(x["latency"]["missed"] == 0 and x["saturated"]["stream_failures"] == 0
                        for x in r["points"]) else 1
    r = run(full=a.full)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(r, f, indent=1)
    print(render(r))
    record(r, "python -m bench.daemon_ingest " + ("--full" if a.full else "--quick"))
    return 0 if all(r["checks"].values()) else 1


def record(r: dict, command: str) -> None:
    """Keep this run's verdicts for the Targets table (bench/targets.py), and say them."""
    from bench import targets

    targets.record("daemon", r, command)
    targets.record("replay", r["core_replay"], command)
    print("\n" + targets.plain("daemon", r) + "\n" + targets.plain("replay", r["core_replay"]))


if __name__ == "__main__":
    sys.exit(main())
