"""What a native dump costs a rank, and how often a healthy job gets one (issue 18).

    flock /tmp/ncclwatch-e2e.lock .venv/bin/python bench/native_pause.py pause --dumps 20
    flock /tmp/ncclwatch-e2e.lock .venv/bin/python bench/native_pause.py healthy --minutes 3

``pause``: a 2-rank gloo job (ncclwatch.demo.job slow-save, rank 1 waiting in
``work.wait()`` of an async all_reduce, a thread spinning in every rank);
``--dumps`` times ``py-spy dump --native`` of rank 1, one a second, as the
agent takes it. Two numbers per dump: py-spy's wall time (what the agent's
ncclwatch_agent_native_dump_seconds records: an upper bound), and the time
the rank's main thread actually sat in ptrace stop ('t' in
/proc/PID/task/TID/stat, polled every ~0.2 ms while py-spy runs).

``healthy``: ``ncclwatch daemon`` + ``ncclwatch agent`` watching a healthy
3-rank DDP job (scenario train, spinning threads) for ``--minutes``; reads
the agent's native dump count and CPU from /metrics at the end.
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
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
MARK = re.compile(r"NCCLWATCH_DEMO phase=(\S+) rank=(\d+) pid=(\d+)")


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")


def _job(world: int, args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([str(BIN / "torchrun"), "--standalone", f"--nproc-per-node={world}",
                             "--max-restarts=0", "-m", "ncclwatch.demo.job", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=_env(), start_new_session=True)


def _wait_marker(p: subprocess.Popen, phase: str, rank: int, timeout: float = 120) -> int:
    end = time.time() + timeout
    while time.time() < end:
        line = p.stdout.readline()
        if not line:
            raise RuntimeError("job ended")
        m = MARK.search(line)
        if m and m.group(1) == phase and int(m.group(2)) == rank:
            return int(m.group(3))
    raise RuntimeError(f"no {phase} marker from rank {rank}")


def _drain(p: subprocess.Popen) -> None:
    threading.Thread(target=lambda: [None for _ in p.stdout], daemon=True).start()


def _stopped_span(pid: int, done: threading.Event) -> float:
    """Seconds the main thread spent in ptrace stop while ``done`` is unset."""
    path, total, since = f"/proc/{pid}/task/{pid}/stat", 0.0, None
    while not done.is_set():
        try:
            with open(path) as f:
                state = f.read().rpartition(")")[2].split()[0]
        except OSError:
            break
        now = time.perf_counter()
        if state in ("t", "T"):
            since = now if since is None else since
        elif since is not None:
            total, since = total + now - since, None
        time.sleep(0.0002)
    if since is not None:
        total += time.perf_counter() - since
    return total


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def pause(dumps: int) -> dict:
    with tempfile.TemporaryDirectory() as ckpt:
        p = _job(2, ["--scenario", "slow-save", "--model-mb", "8", "--save-seconds",
                     str(dumps * 2 + 60), "--busy-thread", "0.6", "--wait-op", "async-wait",
                     "--ckpt-dir", ckpt])
        try:
            pid = _wait_marker(p, "wait_start", 1)
            _drain(p)
            time.sleep(3)
            threads = len(os.listdir(f"/proc/{pid}/task"))
            walls, stops = [], []
            for _ in range(dumps):
                done = threading.Event()
                box: list[float] = []
                watcher = threading.Thread(target=lambda: box.append(_stopped_span(pid, done)))
                watcher.start()
                t0 = time.perf_counter()
                r = subprocess.run([str(BIN / "py-spy"), "dump", "--native", "--json",
                                    "--pid", str(pid)], capture_output=True, timeout=30)
                walls.append(time.perf_counter() - t0)
                done.set()
                watcher.join()
                stops.append(box[0])
                if r.returncode != 0:
                    raise RuntimeError(r.stderr.decode()[-300:])
                time.sleep(1.0)
        finally:
            os.killpg(p.pid, signal.SIGTERM)
            p.wait(30)
    return {"dumps": dumps, "rank_threads": threads,
            "pyspy_wall_p50_s": round(statistics.median(walls), 3),
            "pyspy_wall_p99_s": round(_pct(walls, 0.99), 3),
            "stopped_p50_s": round(statistics.median(stops), 3),
            "stopped_p99_s": round(_pct(stops, 0.99), 3)}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _metric(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") or line.startswith(name + " "))


def healthy(minutes: float) -> dict:
    grpc, http = _port(), _port()
    nw = [str(BIN / "ncclwatch")]
    daemon = subprocess.Popen([*nw, "daemon", "--grpc", f"127.0.0.1:{grpc}", "--http",
                               f"127.0.0.1:{http}"], env=_env(), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    agent = subprocess.Popen([*nw, "agent", "--collector", f"127.0.0.1:{grpc}"], env=_env(),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with tempfile.TemporaryDirectory() as ckpt:
        p = _job(3, ["--scenario", "train", "--save-seconds", str(minutes * 60),
                     "--busy-thread", "0.6", "--ckpt-dir", ckpt])
        try:
            _wait_marker(p, "ready", 0)
            _drain(p)
            t0 = time.time()
            while p.poll() is None and time.time() - t0 < minutes * 60 + 30:
                time.sleep(2)
            elapsed = time.time() - t0
            text = urllib.request.urlopen(f"http://127.0.0.1:{http}/metrics").read().decode()
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
            p.wait(30)
            agent.terminate()
            daemon.terminate()
            agent.wait(10)
            daemon.wait(10)
    cpu = _metric(text, "ncclwatch_agent_cpu_seconds_total")
    return {"minutes": round(elapsed / 60, 2), "ranks": 3,
            "native_dumps": _metric(text, "ncclwatch_agent_native_dumps_total"),
            "pyspy_runs": _metric(text, "ncclwatch_agent_pyspy_runs_total"),
            "agent_cpu_per_rank_percent": round(100 * cpu / elapsed / 3, 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    sub.add_parser("pause").add_argument("--dumps", type=int, default=20)
    sub.add_parser("healthy").add_argument("--minutes", type=float, default=3.0)
    a = ap.parse_args()
    out = pause(a.dumps) if a.mode == "pause" else healthy(a.minutes)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
