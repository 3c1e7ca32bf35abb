"""What ncclwatch sees of real GPU ranks: a probe to run where GPUs are (issue 26).

    python -m bench.gpu_probe --out DIR        # about 5 minutes; exits 2 without a GPU

On a machine with NVIDIA GPUs, torch with CUDA and NCCL, ``torchrun`` and
``ncclwatch`` next to this Python, it starts ``ncclwatch run`` (daemon + agent),
then a DDP job under torchrun, one rank per GPU (up to 8):

1. healthy, ``--healthy-seconds``: long steps (``--step-seconds`` of GPU work,
   gradient accumulation, DDP's all_reduce on the last micro-batch, then
   ``loss.item()``); rank 0 logs each step;
2. a stall: rank 0 torch.saves the model to a file paced to take
   ``--save-seconds`` while the others run into the next step and block at
   ``.item()`` (the step's all_reduce waits for rank 0 on the device).

Every second it records what the ranks show: the kernel's progress counters
(read/write syscalls, the main thread's voluntary and involuntary switches,
CPU), the daemon's view (state, stillness, evidence, native frame), the stalls
and their verdict; the native dumps (the agent's counters) and every pause of
a rank (ptrace stops, bench/pausewatch.py). All of it goes to one JSON file,
``DIR/gpu-probe-<UTC time>.json``; nothing is committed.

With one GPU, NCCL refuses two ranks on one device: the job then runs two
ranks on it with gloo for the collectives (GPU compute and ``.item()``
syncs are real; the stall's wait is in gloo's C++, not on the device), and
the record says so (``backend``).

Exits 2 with a message when there is no GPU, no NCCL, or no torchrun/ncclwatch.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
MARK = re.compile(r"NCCLWATCH_DEMO phase=(\S+) rank=(\d+) pid=(\d+) t=([\d.]+)(.*)")


# -- the job (run by torchrun: python -m bench.gpu_probe --worker) ----------------

def worker(a: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ncclwatch.demo.slow_storage import ThrottledWriter

    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    gpus = torch.cuda.device_count()
    dev = torch.device("cuda", local % gpus)
    torch.cuda.set_device(dev)
    backend = "nccl" if gpus >= int(os.environ["WORLD_SIZE"]) else "gloo"
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=a.pg_timeout))

    def marker(phase: str, **kv) -> None:
        extra = "".join(f" {k}={v}" for k, v in kv.items())
        sys.stdout.write(f"NCCLWATCH_DEMO phase={phase} rank={rank} pid={os.getpid()} "
                         f"t={time.time():.6f}{extra}\n")
        sys.stdout.flush()

    torch.manual_seed(0)
    dim = a.dim
    model = DDP(nn.Sequential(*[nn.Linear(dim, dim) for _ in range(4)]).to(dev),
                device_ids=[dev.index])
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(a.batch, dim, device=dev)
    marker("ready", backend=backend, device=dev.index)

    def micro(sync: bool) -> torch.Tensor:
        if sync:
            loss = model(x).pow(2).mean()
            loss.backward()
            return loss
        with model.no_sync():
            loss = model(x).pow(2).mean()
            loss.backward()
            return loss

    for _ in range(3):  # warm up, then time one micro-batch
        micro(False)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(5):
        micro(False)
    torch.cuda.synchronize()
    per = (time.perf_counter() - t0) / 5
    inner = torch.tensor([max(1, int(a.step_seconds / per))], device=dev)
    dist.all_reduce(inner, op=dist.ReduceOp.MIN)
    inner = int(inner.item())
    opt.zero_grad()
    marker("train_start", micro_batches=inner, micro_seconds=f"{per:.4f}")
    end = time.time() + a.healthy_seconds
    step, stop = 0, torch.zeros(1, device=dev)
    saved = False
    while True:
        for _ in range(inner - 1):
            micro(False)
        loss = micro(True)   # DDP's all_reduce of the grads
        opt.step()
        opt.zero_grad()
        value = loss.item()  # waits for the device (and the all_reduce on it)
        if rank == 0:
            sys.stdout.write(f"[rank 0] step {step} done t={time.time():.3f} loss={value:.4f}\n")
            sys.stdout.flush()
        stop.fill_(float(time.time() >= end))
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        if stop.item() and not saved:
            saved = True
            if rank == 0:
                state = {k: v.detach().cpu() for k, v in model.module.state_dict().items()}
                size = sum(v.numel() * v.element_size() for v in state.values())
                path = os.path.join(a.ckpt_dir, "ckpt.pt")
                marker("save_start", bytes=size)
                with ThrottledWriter(path, size / a.save_seconds) as f:
                    torch.save(state, f)
                marker("save_end")
            else:
                marker("wait_start", op="item")
            # the others run on into this step: its all_reduce waits for rank 0
            end = time.time() + a.after_seconds
        elif stop.item():
            break
        step += 1
    marker("train_end", steps=step + 1)
    dist.barrier()
    dist.destroy_process_group()
    marker("done")
    return 0


# -- the probe ------------------------------------------------------------------

def preflight() -> str | None:
    """Why this machine cannot run the probe, or None."""
    for tool in ("torchrun", "ncclwatch", "py-spy"):
        if not (BIN / tool).exists() and shutil.which(tool) is None:
            return f"{tool} not found (next to {sys.executable} or on PATH)"
    try:
        import torch
        import torch.distributed as dist
    except ImportError as e:
        return f"torch is not importable: {e}"
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        return (f"no NVIDIA GPU visible to torch {torch.__version__} "
                f"(CUDA build: {torch.version.cuda or 'none'}); this probe needs one")
    if not dist.is_nccl_available():
        return f"torch {torch.__version__} was built without NCCL"
    return None


def _tool(name: str) -> str:
    return str(BIN / name) if (BIN / name).exists() else shutil.which(name) or name


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.read().decode()
    except OSError:
        return None


def _metric(text: str | None, name: str) -> float | None:
    if text is None:
        return None
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") or line.startswith(name + " "))


AGENT_METRICS = ("ncclwatch_agent_native_dumps_total", "ncclwatch_agent_native_dump_failures_total",
                 "ncclwatch_agent_native_dump_seconds_sum", "ncclwatch_agent_pyspy_runs_total",
                 "ncclwatch_agent_cpu_seconds_total")


def _agent(http: str) -> dict:
    text = _get(f"{http}/metrics")
    return {m: _metric(text, m) for m in AGENT_METRICS}


def _counters(pid: int) -> dict | None:
    """The kernel's progress counters of a rank: what the agent's stillness reads."""
    try:
        with open(f"/proc/{pid}/io") as f:
            io = dict(line.split(":", 1) for line in f if ":" in line)
        with open(f"/proc/{pid}/status") as f:
            st = dict(line.split(":", 1) for line in f if ":" in line)
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        tasks = os.listdir(f"/proc/{pid}/task")
    except (OSError, ValueError):
        return None
    tick = os.sysconf("SC_CLK_TCK")
    return {"syscr": int(io["syscr"]), "syscw": int(io["syscw"]),
            "main_voluntary_switches": int(st["voluntary_ctxt_switches"]),
            "main_involuntary_switches": int(st["nonvoluntary_ctxt_switches"]),
            "cpu_seconds": (int(fields[11]) + int(fields[12])) / tick,
            "threads": len(tasks), "state": fields[0]}


def _job_view(http: str, pids: set[int]) -> dict | None:
    text = _get(f"{http}/api/v1/jobs?ranks=1")
    if text is None:
        return None
    for job in json.loads(text).get("jobs", []):
        if pids & {r.get("pid") for r in job.get("ranks", [])}:
            return job
    return None


RANK_KEYS = ("rank", "pid", "state", "op", "for_seconds", "evidence", "native_frame",
             "still_seconds", "still_reason", "cpu_utilization", "stack_id")
STALL_KEYS = ("kind", "at_risk", "provisional")


def _compact(job: dict | None) -> dict | None:
    if job is None:
        return None
    return {"ranks": [{k: r.get(k) for k in RANK_KEYS} for r in job.get("ranks", [])],
            "stalls": [{**{k: st.get(k) for k in STALL_KEYS},
                        "culprits": [(c.get("rank"), c.get("state"))
                                     for c in st.get("culprits", [])],
                        "root_cause": (st.get("diagnosis") or {}).get("root_cause"),
                        "waiting_evidence": (st.get("waiting") or {}).get("evidence"),
                        "waiting_ops": (st.get("waiting") or {}).get("ops")}
                       for st in job.get("stalls", [])]}


def probe(a: argparse.Namespace) -> dict:
    from bench.pausewatch import PauseWatch
    import torch

    gpus = torch.cuda.device_count()
    world = max(2, min(gpus, a.max_ranks))
    grpc, http_port = _port(), _port()
    http = f"http://127.0.0.1:{http_port}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    mon = subprocess.Popen([_tool("ncclwatch"), "run", "--grpc", f"127.0.0.1:{grpc}", "--http",
                            f"127.0.0.1:{http_port}"], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, start_new_session=True)
    mon_lines: list[str] = []
    threading.Thread(target=lambda: [mon_lines.append(x) for x in mon.stdout], daemon=True).start()
    record: dict = {
        "probe": "bench/gpu_probe.py", "started": datetime.datetime.now(datetime.UTC).isoformat(),
        "args": vars(a), "world": world, "gpus": gpus,
        "gpu_names": [torch.cuda.get_device_name(i) for i in range(gpus)],
        "torch": torch.__version__, "cuda": torch.version.cuda,
        "nccl": _nccl_version(),
        "backend": "nccl" if gpus >= world else
                   "gloo (one GPU: NCCL refuses two ranks on one device)",
        "nvidia_smi": _run_text(["nvidia-smi", "-L"]), "completed": False,
    }
    lines: list[str] = []
    with tempfile.TemporaryDirectory(prefix="ncclwatch-gpu-probe-") as ckpt:
        job = subprocess.Popen(
            [_tool("torchrun"), "--standalone", f"--nproc-per-node={world}", "--max-restarts=0",
             "-m", "bench.gpu_probe", "--worker", "--ckpt-dir", ckpt,
             "--step-seconds", str(a.step_seconds), "--healthy-seconds", str(a.healthy_seconds),
             "--save-seconds", str(a.save_seconds), "--after-seconds", str(a.after_seconds),
             "--dim", str(a.dim), "--batch", str(a.batch), "--pg-timeout", str(a.pg_timeout)],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True)
        threading.Thread(target=lambda: [lines.append(x) for x in job.stdout],
                         daemon=True).start()
        deadline = time.time() + a.deadline
        watch = None
        timeline: list[dict] = []
        metrics0 = None
        try:
            ranks: dict[int, int] = {}
            while len(ranks) < world:
                ranks = {int(m.group(2)): int(m.group(3)) for x in list(lines)
                         if (m := MARK.search(x)) and m.group(1) == "ready"}
                if job.poll() is not None or time.time() > deadline:
                    raise RuntimeError("the job never became ready")
                time.sleep(0.5)
            metrics0 = _agent(http)
            watch = PauseWatch(ranks).start()
            record["ranks"] = {str(r): p for r, p in sorted(ranks.items())}
            while job.poll() is None and time.time() < deadline:
                t = time.time()
                timeline.append({"t": round(t, 2),
                                 "counters": {str(r): _counters(p) for r, p in ranks.items()},
                                 "daemon": _compact(_job_view(http, set(ranks.values())))})
                time.sleep(max(0.0, 1.0 - (time.time() - t)))
            record["completed"] = job.poll() == 0
        except RuntimeError as e:
            record["error"] = str(e)
        finally:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGTERM)
                try:
                    job.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(job.pid, signal.SIGKILL)
            record["job_returncode"] = job.poll()
            pauses = watch.stop() if watch else None
            record["agent_metrics_before"] = metrics0
            record["agent_metrics_after"] = _agent(http)
            mon.send_signal(signal.SIGTERM)
            try:
                mon.wait(20)
            except subprocess.TimeoutExpired:
                mon.kill()
    marks = [{"phase": m.group(1), "rank": int(m.group(2)), "t": float(m.group(4)),
              "extra": m.group(5).strip()} for x in lines if (m := MARK.search(x))]
    record["markers"] = marks
    record["step_lines"] = [x.strip() for x in lines if "[rank 0] step" in x]
    record["timeline"] = timeline
    record["pauses"] = ([{"rank": p.rank, "t": round(p.start, 2), "seconds": round(p.seconds, 3),
                          "tracer": p.tracer} for p in pauses.pauses] if pauses else [])
    record["verdict"] = verdict(marks, timeline, record["pauses"])
    record["job_output_tail"] = "".join(lines[-60:])
    record["ncclwatch_log_tail"] = "".join(mon_lines[-200:])
    return record


def verdict(marks: list[dict], timeline: list[dict], pauses: list[dict]) -> dict:
    """The healthy phase's alarms and pauses; the stall's first finding and its delay."""
    save = min((m["t"] for m in marks if m["phase"] == "save_start"), default=None)
    train = min((m["t"] for m in marks if m["phase"] == "train_start"), default=None)
    split = save if save is not None else float("inf")
    healthy_alarms = sorted({st["kind"] for p in timeline if p["t"] < split and p["daemon"]
                             for st in p["daemon"]["stalls"]})
    first = next(((p["t"], st) for p in timeline if p["t"] >= split and p["daemon"]
                  for st in p["daemon"]["stalls"]), None)
    return {
        "healthy_seconds": round(split - train, 1) if train and save else None,
        "healthy_alarms": healthy_alarms,
        "healthy_pauses": sum(1 for p in pauses if p["t"] < split),
        "healthy_paused_seconds": round(sum(p["seconds"] for p in pauses if p["t"] < split), 3),
        "stall_pauses": sum(1 for p in pauses if p["t"] >= split),
        "stall_found": first is not None,
        "stall_delay_seconds": round(first[0] - save, 1) if first and save else None,
        "stall": first[1] if first else None,
    }


def _nccl_version() -> str | None:
    try:
        import torch
        v = torch.cuda.nccl.version()
    except Exception:  # noqa: BLE001 - a record without it is still a record
        return None
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def _run_text(argv: list[str]) -> str | None:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="directory for the JSON record (required unless --worker)")
    ap.add_argument("--step-seconds", type=float, default=8.0)
    ap.add_argument("--healthy-seconds", type=float, default=150.0)
    ap.add_argument("--save-seconds", type=float, default=75.0)
    ap.add_argument("--after-seconds", type=float, default=10.0,
                    help="training after the save before the job ends")
    ap.add_argument("--dim", type=int, default=4096,
                    help="width of the 4 Linear layers (4096: a 256 MiB model)")
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--max-ranks", type=int, default=8)
    ap.add_argument("--pg-timeout", type=float, default=900.0)
    ap.add_argument("--deadline", type=float, default=420.0,
                    help="stop everything and write what was seen after this many seconds")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--ckpt-dir", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        return worker(a)
    if not a.out:
        ap.error("--out DIR is required")
    why = preflight()
    if why:
        print(f"gpu_probe: cannot run here: {why}", file=sys.stderr)
        return 2
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    record = probe(a)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    path = out / f"gpu-probe-{stamp}.json"
    path.write_text(json.dumps(record, indent=1, default=str) + "\n")
    v = record["verdict"]
    print(f"gpu_probe: {path}")
    print(f"  {record['world']} ranks on {record['gpus']} GPU(s), {record['backend']}; "
          f"completed={record['completed']}")
    print(f"  healthy: {v['healthy_seconds']} s, alarms {v['healthy_alarms']}, pauses "
          f"{v['healthy_pauses']} ({v['healthy_paused_seconds']} s)")
    print(f"  stall: found={v['stall_found']} after {v['stall_delay_seconds']} s: "
          f"{(v['stall'] or {}).get('kind')} {(v['stall'] or {}).get('culprits')}; "
          f"pauses {v['stall_pauses']}")
    return 0 if record["completed"] or record.get("timeline") else 1


if __name__ == "__main__":
    sys.exit(main())
