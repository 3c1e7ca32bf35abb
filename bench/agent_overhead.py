"""Agent overhead: CPU per monitored rank, and what it costs the training job.

A real 8-rank DDP job (gloo, CPU, ``ncclwatch.demo.job --scenario train``)
runs once per mode: (a) the ncclwatch agent with its adaptive sampling,
(b) a naive sampler that py-spy-dumps every rank every second, (c) nothing.
The modes are interleaved over ``repeats`` so drift of this noisy machine
hits all of them alike. Measured: the observer's CPU (its py-spy children
included) per rank per second after a warm-up, and the job's steps/s.

The window is 60 s by default, a multiple of the agent's slow stack round
(30 s): most of a healthy rank's dumps are that round's, and a window
holding one round more or less than the steady rate misreads the cost.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
WORLD = 8


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cpu(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system + t.children_user + t.children_system


def _observer(mode: str, collector: str) -> subprocess.Popen | None:
    if mode == "none":
        return None
    if mode == "ncclwatch":
        argv = [str(BIN / "ncclwatch"), "agent", "--collector", collector, "--log-level",
                "warning"]
    else:
        argv = [sys.executable, "-m", "bench.naive_sampler", "1.0"]
    return subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def _ranks_watched(http: str | None) -> int | None:
    """Ranks the agent watched (the machine may run other jobs it sees too)."""
    if not http:
        return None
    import urllib.request
    try:
        with urllib.request.urlopen(f"http://{http}/api/v1/jobs", timeout=5) as r:
            agents = json.load(r)["agents"]
    except (OSError, ValueError, KeyError):
        return None
    return max((a["ranks_watched"] for a in agents if a.get("connected")), default=None)


def run_once(mode: str, seconds: float, warmup: float, collector: str,
             http: str | None = None) -> dict:
    job = subprocess.Popen(
        [str(BIN / "torchrun"), "--standalone", f"--nproc-per-node={WORLD}", "--max-restarts=0",
         "-m", "ncclwatch.demo.job", "--scenario", "train", "--model-mb", "1",
         "--save-seconds", str(seconds + warmup + 15), "--pg-timeout", "600"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"},
        start_new_session=True)
    lines: list[tuple[float, str]] = []

    def read() -> None:  # timestamps as the lines arrive
        for line in job.stdout:
            lines.append((time.time(), line))

    threading.Thread(target=read, daemon=True).start()
    deadline = time.time() + 180
    while sum(1 for _, x in lines if "phase=train_start" in x) < WORLD:
        if job.poll() is not None or time.time() > deadline:
            raise RuntimeError("job never trained:\n" + "".join(x for _, x in lines[-50:]))
        time.sleep(0.1)
    obs = _observer(mode, collector)
    try:
        time.sleep(warmup)
        p = psutil.Process(obs.pid) if obs else None
        c0, t0 = (_cpu(p) if p else 0.0), time.monotonic()
        w0 = time.time()
        time.sleep(seconds)
        c1, t1 = (_cpu(p) if p else 0.0), time.monotonic()
        watched = _ranks_watched(http) if mode == "ncclwatch" else None
        w1 = time.time()
        rate = _step_rate(lines, w0, w1)
    finally:
        if obs:
            obs.send_signal(signal.SIGTERM)
            obs.wait(20)
        os.killpg(job.pid, signal.SIGTERM)
        job.wait(30)
    wall = t1 - t0
    return {"mode": mode, "seconds": round(wall, 2),
            "observer_cores": (c1 - c0) / wall,
            "observer_pct_core_per_rank": 100 * (c1 - c0) / wall / WORLD,
            "steps_per_s": rate, "ranks_watched": watched,
            "load_1min": os.getloadavg()[0]}


def _step_rate(lines: list, w0: float, w1: float) -> float:
    """Training steps/s of rank 0 inside [w0, w1], from its timestamped step lines.

    The job logs every 20th step; the rate between the first and the last such
    line inside the window avoids counting a partial interval.
    """
    pts = [(t, int(m.group(1))) for t, x in list(lines)
           if w0 <= t <= w1 and (m := re.search(r"\[rank 0\] train step (\d+)", x))]
    if len(pts) < 2 or pts[-1][0] <= pts[0][0]:
        return 0.0
    return (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0])


def measure(seconds: float = 60.0, warmup: float = 10.0, repeats: int = 2) -> dict:
    dport, hport = _port(), _port()
    daemon = subprocess.Popen([str(BIN / "ncclwatch"), "daemon", "--grpc", f"127.0.0.1:{dport}",
                               "--http", f"127.0.0.1:{hport}", "--log-level", "warning"],
                              cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    runs: list[dict] = []
    try:
        time.sleep(2)
        for _ in range(repeats):
            for mode in ("none", "ncclwatch", "naive"):
                r = run_once(mode, seconds, warmup, f"127.0.0.1:{dport}", f"127.0.0.1:{hport}")
                print(json.dumps(r), file=sys.stderr, flush=True)
                runs.append(r)
    finally:
        daemon.terminate()
        daemon.wait(20)
    by = {m: [r for r in runs if r["mode"] == m] for m in ("none", "ncclwatch", "naive")}
    med = {m: {k: statistics.median(r[k] for r in rs) for k in
               ("observer_pct_core_per_rank", "steps_per_s", "observer_cores")}
           for m, rs in by.items()}
    a, b, c = med["ncclwatch"], med["naive"], med["none"]
    return {
        "world": WORLD, "seconds_per_run": seconds, "warmup": warmup, "repeats": repeats,
        "cores": os.cpu_count(), "runs": runs, "median": med,
        "naive_over_ncclwatch_cpu": (b["observer_cores"] / a["observer_cores"]
                                     if a["observer_cores"] else None),
        "ncclwatch_steps_vs_none": a["steps_per_s"] / c["steps_per_s"] if c["steps_per_s"] else None,
        "naive_steps_vs_none": b["steps_per_s"] / c["steps_per_s"] if c["steps_per_s"] else None,
        "steps_spread_none": _spread([r["steps_per_s"] for r in by["none"]]),
    }


def _spread(xs: list[float]) -> float | None:
    return (max(xs) - min(xs)) / statistics.mean(xs) if len(xs) > 1 and statistics.mean(xs) else None


def render(r: dict) -> str:
    m = r["median"]
    rows = [f"| {mode} | {m[mode]['observer_pct_core_per_rank']:.3f}% | "
            f"{m[mode]['observer_cores'] * 100:.2f}% | {m[mode]['steps_per_s']:.2f} |"
            for mode in ("none", "ncclwatch", "naive")]
    ratio = r["naive_over_ncclwatch_cpu"]
    spread = r["steps_spread_none"]
    return "\n".join([
        f"{r['world']} real DDP ranks (gloo, CPU) on {r['cores']} cores; {r['repeats']} interleaved "
        f"runs per mode of {r['seconds_per_run']:.0f} s after a {r['warmup']:.0f} s warm-up; "
        "medians.", "",
        "| observer | CPU per rank (% of one core) | CPU in all | job steps/s |",
        "|---|---|---|---|", *rows, "",
        f"- naive / ncclwatch CPU: **{ratio:.1f}x**" if ratio else "- naive / ncclwatch CPU: n/a",
        f"- job throughput with ncclwatch: {r['ncclwatch_steps_vs_none']:.3f} of no agent; "
        f"with the naive sampler: {r['naive_steps_vs_none']:.3f}"
        + (f" (run-to-run spread without any agent: {spread:.1%})" if spread is not None else ""),
    ])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=60.0,
                    help="the measured window: a multiple of the slow stack round (30 s)")
    ap.add_argument("--warmup", type=float, default=10.0)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    r = measure(a.seconds, a.warmup, a.repeats)
    print(json.dumps(r, indent=1) if a.json else render(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
