"""Regenerate the Flight Recorder dumps under tests/data/flightrec/.

    .venv/bin/python tests/data/flightrec/capture.py            # both
    .venv/bin/python tests/data/flightrec/capture.py real       # real gloo jobs (about a minute)
    .venv/bin/python tests/data/flightrec/capture.py legacy     # older formats, from real/hang

``real``: small gloo jobs on this machine (torch.multiprocessing spawn,
``TORCH_FR_BUFFER_SIZE=2000``, 5 s process-group timeout); every rank writes
``torch._C._distributed_c10d._dump_fr_trace()`` to
``real/<scenario>/comm_lib_trace_rank_<rank>``. A rank blocked in a collective
dumps from a background thread while its main thread is blocked, then the
timeout fires and it exits.

``legacy``: the real ``hang`` dumps rewritten into the layout of each older
dump version (2.0 .. 2.9) as the torch sources describe it (README.md):
NCCL-shaped (``nccl:`` names, states from events, a real ``pg_config``),
fields dropped or renamed per version. Deterministic: tests regenerate them
in memory and compare with the committed bytes.
"""

from __future__ import annotations

import copy
import datetime
import os
import pickle
import socket
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REAL = HERE / "real"
LEGACY = HERE / "legacy"
TIMEOUT = datetime.timedelta(seconds=5)
PREFIX = "comm_lib_trace_rank_"
LEGACY_PREFIX = "nccl_trace_rank_"
# version -> what that layout has (see README.md for the evidence of each row)
LEGACY_VERSIONS = ("2.0", "2.1", "2.2", "2.3", "2.4", "2.5", "2.6", "2.7", "2.8", "2.9")
LEGACY_NCCL_VERSION = "2.21.5"

SCENARIOS = {"healthy": 3, "hang": 3, "desync": 3, "multipg": 4}


# ------------------------------------------------------------------ real jobs


def _dump(out: Path, rank: int) -> None:
    import torch

    data = torch._C._distributed_c10d._dump_fr_trace()
    tmp = out / f".{PREFIX}{rank}.tmp"
    tmp.write_bytes(data)
    os.replace(tmp, out / f"{PREFIX}{rank}")


def _dump_later(out: Path, rank: int, delay: float) -> threading.Thread:
    """Dump from a background thread while the main thread is blocked."""
    def run() -> None:
        time.sleep(delay)
        _dump(out, rank)
    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th


def _worker(rank: int, world: int, port: int, scenario: str, out: str) -> None:
    os.environ["TORCH_FR_BUFFER_SIZE"] = "2000"
    import torch
    import torch.distributed as dist

    outp = Path(out)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=TIMEOUT)
    t = torch.ones(4)
    try:
        if scenario == "healthy":
            dist.all_reduce(t)
            dist.broadcast(t, src=0)
            outs = [torch.zeros(4) for _ in range(world)]
            dist.all_gather(outs, t)
            dist.barrier()
            # gloo retires a work (and moves pg_status) on its own thread, a
            # moment after wait() returned: dump once that has happened
            time.sleep(0.5)
            _dump(outp, rank)
        elif scenario == "hang":
            dist.all_reduce(t)              # seq 1
            dist.broadcast(t, src=0)        # seq 2
            dist.barrier()                  # seq 3
            if rank == 2:                   # rank 2 never calls seq 4 (a long save)
                time.sleep(1.0)
                _dump(outp, rank)
                time.sleep(TIMEOUT.total_seconds() + 1.5)
            else:
                th = _dump_later(outp, rank, 1.0)
                try:
                    dist.all_reduce(t)      # seq 4: blocks until the timeout
                except RuntimeError:
                    pass
                th.join()
        elif scenario == "desync":
            dist.all_reduce(t)              # seq 1
            # seq 2: same op, rank 2 with another size (gloo completes it silently)
            dist.broadcast(torch.ones(8) if rank == 2 else t, src=0)
            # seq 3: rank 2 calls another op than the others: everyone blocks
            work = (dist.broadcast(t, src=0, async_op=True) if rank == 2
                    else dist.all_reduce(t, async_op=True))
            time.sleep(1.0)
            _dump(outp, rank)
            try:
                work.wait()
            except RuntimeError:
                pass
        elif scenario == "multipg":
            g01 = dist.new_group([0, 1], timeout=TIMEOUT, group_desc="pair01")
            g23 = dist.new_group([2, 3], timeout=TIMEOUT, group_desc="pair23")
            dist.all_reduce(t)                                  # default seq 1
            if rank in (0, 1):
                dist.all_reduce(t, group=g01)                   # pair01 seq 1
                dist.broadcast(t, src=0, group=g01)             # pair01 seq 2
                dist.barrier(group=g01)                         # pair01 seq 3
                time.sleep(1.0)
                _dump(outp, rank)
            else:
                dist.all_reduce(t, group=g23)                   # pair23 seq 1
                if rank == 3:                                   # never calls pair23 seq 2
                    time.sleep(1.0)
                    _dump(outp, rank)
                    time.sleep(TIMEOUT.total_seconds() + 1.5)
                else:
                    th = _dump_later(outp, rank, 1.0)
                    try:
                        dist.all_reduce(t, group=g23)           # pair23 seq 2: blocks
                    except RuntimeError:
                        pass
                    th.join()
        else:
            raise SystemExit(f"unknown scenario {scenario}")
    finally:
        sys.stdout.flush()
        os._exit(0)   # no destroy_process_group: peers may be gone


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def capture_real(names: list[str] | None = None) -> None:
    import torch.multiprocessing as mp

    for name in names or list(SCENARIOS):
        out = REAL / name
        out.mkdir(parents=True, exist_ok=True)
        for f in out.glob(f"{PREFIX}*"):
            f.unlink()
        world = SCENARIOS[name]
        t0 = time.monotonic()
        mp.start_processes(_worker, args=(world, _free_port(), name, str(out)), nprocs=world,
                           start_method="spawn")
        got = sorted(p.name for p in out.glob(f"{PREFIX}*"))
        if len(got) != world:
            raise SystemExit(f"{name}: expected {world} dumps, got {got}")
        print(f"real/{name}: {world} dumps in {time.monotonic() - t0:.1f} s")


# ------------------------------------------------------------- legacy formats


def _vkey(version: str) -> tuple[int, int]:
    major, minor = version.split(".")
    return int(major), int(minor)


def legacy_dump(real: dict, version: str, world: int) -> dict:
    """A real 2.10 gloo dump (a dict) in the layout of dump ``version``, NCCL-shaped.

    NCCL-shaped: ``nccl:`` profiling names; states from events (a finished
    work ``completed`` with discovery times, the blocked one ``started``); a
    ``pg_config`` that names the groups and their ranks, as ProcessGroupNCCL
    records it (gloo's is unusable, see flightrec.py).
    """
    v = _vkey(version)
    entries = []
    for e in copy.deepcopy(real["entries"]):
        _, _, rest = e["profiling_name"].partition(":")
        e["profiling_name"] = "nccl:" + rest
        done = e.pop("retired")
        created = e["time_created_ns"]
        e["state"] = "completed" if done else "started"
        e["time_discovered_started_ns"] = created + 40_000
        e["time_discovered_completed_ns"] = created + 90_000 if done else None
        e["retired"] = done
        if v < (2, 8):
            e.pop("thread_id", None)
            e.pop("thread_name", None)
        if v < (2, 3):
            e["input_dtypes"] = [d.lower() for d in e["input_dtypes"]]    # dtype().name()
            e["output_dtypes"] = [d.lower() for d in e["output_dtypes"]]
        if v < (2, 2):
            e.pop("timeout_ms", None)
        entries.append(e)

    names = {}
    for e in entries:
        names.setdefault(e["process_group"][0], e["process_group"][1])
    pg_config = {name: {"name": name, "desc": desc,
                        "ranks": "[" + ", ".join(str(r) for r in range(world)) + "]"}
                 for name, desc in names.items()}

    out: dict = {"entries": entries, "version": version, "pg_config": pg_config}
    if v >= (2, 3):
        status = {}
        for pg_id in sorted({e["pg_id"] for e in entries}):
            coll = [e for e in entries if e["pg_id"] == pg_id and not e["is_p2p"]]
            seqs = [e["collective_seq_id"] for e in coll]
            started = [e["collective_seq_id"] for e in coll if e["state"] in ("started", "completed")]
            completed = [e["collective_seq_id"] for e in coll if e["state"] == "completed"]
            status[str(pg_id)] = {
                "last_enqueued_collective": max(seqs, default=-1),
                "last_started_collective": max(started, default=-1),
                "last_completed_collective": max(completed, default=-1),
            }
        out = {"version": version, "pg_config": pg_config, "pg_status": status, "entries": entries}
        if v >= (2, 9):
            out = {"version": version, "pg_config": pg_config, "comm_lib_version": LEGACY_NCCL_VERSION,
                   "pg_status": status, "entries": entries}
        elif v >= (2, 7):
            out = {"version": version, "pg_config": pg_config, "nccl_version": LEGACY_NCCL_VERSION,
                   "pg_status": status, "entries": entries}
    return out


def legacy_bytes(version: str, rank: int) -> bytes:
    real = pickle.loads((REAL / "hang" / f"{PREFIX}{rank}").read_bytes())
    return pickle.dumps(legacy_dump(real, version, SCENARIOS["hang"]), protocol=2)


def write_legacy() -> None:
    for version in LEGACY_VERSIONS:
        out = LEGACY / f"v{version}"
        out.mkdir(parents=True, exist_ok=True)
        for rank in range(SCENARIOS["hang"]):
            (out / f"{LEGACY_PREFIX}{rank}").write_bytes(legacy_bytes(version, rank))
        print(f"legacy/v{version}: {SCENARIOS['hang']} dumps")


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "all"
    if what in ("real", "all"):
        capture_real(sys.argv[2:] or None)
    if what in ("legacy", "all"):
        write_legacy()
