"""Discovery cost per round: ``Discovery.scan()`` over every pid of the node.

Starts N idle Python processes (no rank variables), R ranks (RANK set, torch
loaded), S processes with rank variables that never import torch (a helper
script under srun) and one ``mp.spawn`` job of 2 workers, then times:

- cold: the first scan of a fresh Discovery (every pid looked at once);
- steady: later scans (only new pids and the few still settling);
- the same steady scan of main's discovery (env only), for the ratio.

    python -m bench.discovery [--idle 200 --ranks 4 --no-torch 4]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time

from ncclwatch.agent.discover import Discovery

IDLE = "import time; time.sleep(600)"
RANK = "import torch.distributed, time; print('up', flush=True); time.sleep(600)"


def _start(code: str, env: dict[str, str], n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", code], env={**os.environ, **env},
                             stdout=subprocess.PIPE, text=True, start_new_session=True)
            for _ in range(n)]


def _time(fn, rounds: int) -> list[float]:
    out = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def measure(idle: int = 200, ranks: int = 4, no_torch: int = 4, rounds: int = 30) -> dict:
    procs = _start(IDLE, {}, idle)
    procs += _start(IDLE, {"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_JOB_ID": "1"},
                    no_torch)
    tr = [subprocess.Popen([sys.executable, "-c", RANK],
                           env={**os.environ, "RANK": str(r), "WORLD_SIZE": str(ranks),
                                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"},
                           stdout=subprocess.PIPE, text=True, start_new_session=True)
          for r in range(ranks)]
    spawn = subprocess.Popen([sys.executable, "-m", "tests.workloads.launch_spawn", "--port",
                              "29998", "--go", "/nonexistent/never"],
                             stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        for p in tr:
            p.stdout.readline()
        for line in spawn.stdout:
            if "phase=ready rank=1" in line or "phase=ready rank=0" in line:
                if "rank=1" in line:
                    break
        time.sleep(6)  # past discovery's YOUNG window
        pids = len(os.listdir("/proc"))
        d = Discovery("bench")
        cold = _time(d.scan, 1)[0]
        found = d.scan()
        old = _main_discovery()
        old_cold = _time(old.scan, 1)[0]
        old.scan()
        steady, old_steady = [], []
        for _ in range(rounds):  # interleaved: the machine's noise hits both alike
            steady += _time(d.scan, 1)
            old_steady += _time(old.scan, 1)
            time.sleep(0.2)
        fresh = []
        for _ in range(3):
            fresh += _time(Discovery("bench").scan, 1)
        return {
            "pids_on_node": pids, "ranks_found": len(found),
            "spawn_ranks": sorted(r.identity.rank for r in found
                                  if r.identity.rank_source == "spawn_index"),
            "cold_ms": round(1000 * cold, 1),
            "cold_median_ms": round(1000 * statistics.median(fresh), 1),
            "steady_median_ms": round(1000 * statistics.median(steady), 2),
            "steady_max_ms": round(1000 * max(steady), 2),
            "spawn_probes": d.spawn_probes_total,
            "main_cold_ms": round(1000 * old_cold, 1),
            "main_steady_median_ms": round(1000 * statistics.median(old_steady), 2),
        }
    finally:
        for p in [*procs, *tr, spawn]:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def _main_discovery():
    """main's discover.py (environment only), loaded from git for the ratio."""
    import types
    src = subprocess.run(["git", "show", "main:ncclwatch/agent/discover.py"], check=True,
                         capture_output=True, text=True).stdout
    mod = sys.modules["main_discover"] = types.ModuleType("main_discover")
    exec(compile(src, "main:discover.py", "exec"), mod.__dict__)
    return mod.Discovery("bench")


def render(r: dict) -> str:
    return "\n".join([
        f"{r['pids_on_node']} pids on the node, {r['ranks_found']} ranks found (other work's "
        "jobs included); main's discovery (environment only) timed interleaved with it.", "",
        "| | this discovery | main's (env only) |", "|---|---|---|",
        f"| first scan (every pid) | {r['cold_ms']} ms (fresh instances: median "
        f"{r['cold_median_ms']} ms) | {r['main_cold_ms']} ms |",
        f"| later scans, median | {r['steady_median_ms']} ms | {r['main_steady_median_ms']} ms |",
        f"| later scans, max | {r['steady_max_ms']} ms | - |", "",
        f"- mp.spawn workers numbered by spawn index: {r['spawn_ranks']} "
        f"({r['spawn_probes']} py-spy --locals probe(s), once per worker)",
    ])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--idle", type=int, default=200)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--no-torch", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=30)
    a = ap.parse_args()
    print(measure(a.idle, a.ranks, a.no_torch, a.rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
