"""A real torch.distributed job (gloo on CPU) that stalls the way big jobs do.

Run under torchrun, e.g.:

    torchrun --standalone --nproc-per-node 4 -m ncclwatch.demo.job \\
        --scenario slow-save --model-mb 64 --save-seconds 20

Scenarios (one function each, below):
  slow-save         train, then rank 0 torch.saves the full state to slow
                    storage while the other ranks wait in dist.barrier()
  fast-save         the same with an unthrottled save (no stall)
  fsdp-gather-slow  FSDP2 model; rank 0 is slow inside get_model_state_dict
                    (full_state_dict) while the others wait in its all_gathers
  slow-load         rank 0 torch.loads from slow storage, the others wait in
                    the broadcast of the restored weights
  park              ranks 1..N-1 enter collective --op while rank 0 sleeps
  compute           all ranks do matmuls; dataloader: all ranks wait on a slow
                    DataLoader (--num-workers)

Every rank prints one line per phase, and machine-readable markers:
    NCCLWATCH_DEMO phase=<phase> rank=<r> pid=<pid> t=<time.time()> [k=v ...]
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile
import time
import traceback

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.tensor import DTensor
from torch.overrides import TorchFunctionMode

from ncclwatch.demo.slow_storage import ThrottledReader, ThrottledWriter

RANK = 0


def _emit(line: str) -> None:
    # One write per line: ranks share torchrun's stdout, keep lines whole.
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def log(msg: str) -> None:
    _emit(f"[rank {RANK}] {msg}")


def marker(phase: str, **kv) -> None:
    extra = "".join(f" {k}={v}" for k, v in kv.items())
    _emit(f"NCCLWATCH_DEMO phase={phase} rank={RANK} pid={os.getpid()} "
          f"t={time.time():.6f}{extra}")


def make_model(model_mb: float) -> nn.Module:
    """Four square Linear layers holding about model_mb MiB of fp32 weights."""
    dim = max(16, int((model_mb * 2**20 / 16) ** 0.5))
    torch.manual_seed(0)  # same init on every rank
    return nn.Sequential(*[nn.Linear(dim, dim) for _ in range(4)])


def nbytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def train(model: nn.Module, opt, steps: int, tag: str) -> None:
    """A few SGD steps; DDP all_reduces / FSDP reduce-scatters the grads."""
    dim = next(model.parameters()).shape[-1]
    for i in range(steps):
        loss = model(torch.randn(8, dim)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        log(f"{tag} step {i} loss={loss.item():.4f}")


def ckpt_path(args) -> str:
    return os.path.join(args.ckpt_dir, f"ncclwatch-demo-{args.scenario}.pt")


def storage_rate(args, size: int) -> float:
    return args.rate or size / max(args.save_seconds, 0.001)


def full_state_dict(model: nn.Module) -> dict:
    """The usual way: the whole model state, on rank 0's host memory."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions, get_model_state_dict)
    return get_model_state_dict(model, options=StateDictOptions(
        full_state_dict=True, cpu_offload=True))


def save_rank0(args, state: dict, throttled: bool) -> None:
    """Rank 0 writes, the others wait in barrier (the common bad pattern)."""
    if RANK == 0:
        path = ckpt_path(args)
        size = sum(t.numel() * t.element_size() for t in state.values())
        rate = storage_rate(args, size)
        log(f"checkpoint: torch.save start path={path} bytes={size}"
            + (f" rate={rate:.0f}B/s" if throttled else " (unthrottled)"))
        marker("save_start", path=path, bytes=size)
        t0 = time.time()
        if throttled:
            with ThrottledWriter(path, rate) as f:
                torch.save(state, f)
        else:
            torch.save(state, path)
        marker("save_end", seconds=f"{time.time() - t0:.3f}")
        log(f"checkpoint: torch.save done in {time.time() - t0:.3f}s")
    else:
        log("checkpoint: waiting for rank 0 in dist.barrier()")
        marker("wait_start", op="barrier")
    dist.barrier()
    log("checkpoint: barrier passed")


def scenario_save(args, throttled: bool) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = DDP(make_model(args.model_mb))
    log(f"model: {nbytes(model) / 2**20:.1f} MiB (DDP)")
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    train(model, opt, args.steps, "train")
    save_rank0(args, full_state_dict(model), throttled)
    train(model, opt, args.steps, "train after checkpoint")


def scenario_slow_save(args) -> None:
    scenario_save(args, throttled=True)


def scenario_fast_save(args) -> None:
    scenario_save(args, throttled=False)


class SlowHostCopy(TorchFunctionMode):
    """Makes ``Tensor.to(cpu)`` sleep: a host copy under memory pressure.

    Inside get_model_state_dict(cpu_offload=True) rank 0 copies each gathered
    tensor to the host; sleeping there keeps the real gather frames on the
    stack while the peers already wait in the all_gather of the next tensor.
    The delay is split over the first ``copies`` copies; never slow the last
    one, after it the peers have left the gather.
    """

    def __init__(self, seconds: float, copies: int):
        super().__init__()
        self.left = max(copies, 1)
        self.each = seconds / self.left

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if (func is torch.Tensor.to and self.left > 0
                and not isinstance(args[0], DTensor)
                and torch.device("cpu") in (*args[1:], kwargs.get("device"))):
            self.left -= 1
            time.sleep(self.each)
        return func(*args, **kwargs)


def scenario_fsdp_gather_slow(args) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = make_model(args.model_mb)
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    log(f"model: {nbytes(model) / 2**20:.1f} MiB (FSDP2, sharded)")
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    train(model, opt, args.steps, "train")
    n = len(model.state_dict())
    slow = min(args.slow_copies or n - 1, n - 1)
    log("checkpoint: get_model_state_dict(full_state_dict=True) start"
        + (f" (rank 0: {slow} slow host copies, {args.save_seconds}s in all)"
           if RANK == 0 else ""))
    marker("gather_start", tensors=n)
    t0 = time.time()
    if RANK == 0:
        with SlowHostCopy(args.save_seconds, slow):
            state = full_state_dict(model)
    else:
        state = full_state_dict(model)
    marker("gather_end", seconds=f"{time.time() - t0:.3f}")
    log(f"checkpoint: gathered {len(state)} tensors in {time.time() - t0:.3f}s")
    save_rank0(args, state, throttled=False)
    train(model, opt, args.steps, "train after checkpoint")


def scenario_slow_load(args) -> None:
    model = make_model(args.model_mb)
    if RANK == 0:
        torch.save(model.state_dict(), ckpt_path(args))
    dist.barrier()
    if RANK == 0:
        size = os.path.getsize(ckpt_path(args))
        log(f"restore: torch.load start path={ckpt_path(args)} bytes={size}")
        marker("load_start", path=ckpt_path(args), bytes=size)
        with ThrottledReader(ckpt_path(args), storage_rate(args, size)) as f:
            model.load_state_dict(torch.load(f, weights_only=True))
        marker("load_end")
        log("restore: torch.load done, broadcasting")
    else:
        log("restore: waiting for rank 0 in dist.broadcast()")
        marker("wait_start", op="broadcast")
    with torch.no_grad():
        for p in model.parameters():
            dist.broadcast(p, src=0)
    log("restore: weights received")


def _busy_elsewhere(seconds: float) -> None:
    time.sleep(seconds)  # plain Python, no torch frame: "rank 0 is late"


def _park_op(args, world: int):
    """A callable that runs collective ``args.op`` here (rank 0 is root)."""
    t, r0 = torch.ones(1024), RANK == 0
    obj = {"rank": RANK, "pad": "x" * 100}
    tv = datetime.timedelta(seconds=args.pg_timeout)
    return {
        "barrier": lambda: dist.barrier(),
        "broadcast": lambda: dist.broadcast(t, src=0),
        "all_reduce": lambda: dist.all_reduce(t),
        "all_gather": lambda: dist.all_gather([torch.empty_like(t)] * world, t),
        "gather": lambda: dist.gather(
            t, [torch.empty_like(t) for _ in range(world)] if r0 else None, dst=0),
        "scatter": lambda: dist.scatter(
            t, [torch.ones(1024) for _ in range(world)] if r0 else None, src=0),
        "reduce_scatter": lambda: dist.reduce_scatter(
            torch.empty_like(t), [t.clone() for _ in range(world)]),
        "gather_object": lambda: dist.gather_object(
            obj, [None] * world if r0 else None, dst=0),
        "all_gather_object": lambda: dist.all_gather_object([None] * world, obj),
        "broadcast_object_list": lambda: dist.broadcast_object_list([obj], src=0),
        "monitored_barrier": lambda: dist.monitored_barrier(timeout=tv),
        "recv": lambda: ([dist.send(t, dst=r) for r in range(1, world)] if r0
                         else dist.recv(t, src=0)),
        "send": lambda: ([dist.recv(t, src=r) for r in range(1, world)] if r0
                         else dist.send(t, dst=0)),
    }[args.op]


def scenario_park(args) -> None:
    run = _park_op(args, dist.get_world_size())
    if RANK == 0:
        log(f"park: busy elsewhere for {args.save_seconds}s before {args.op}")
        marker("busy_start", op=args.op)
        _busy_elsewhere(args.save_seconds)
    else:
        log(f"park: entering {args.op}")
        marker("wait_start", op=args.op)
    run()
    log(f"park: {args.op} done")


def scenario_compute(args) -> None:
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    marker("compute_start")
    end = time.time() + args.save_seconds
    while time.time() < end:
        a = torch.tanh(a @ b)
    dist.barrier()


class SlowDataset(torch.utils.data.Dataset):
    """Each sample takes 0.5 s: an input pipeline that cannot keep up."""

    def __len__(self):
        return 10**6

    def __getitem__(self, i):
        time.sleep(0.5)
        return torch.full((16,), float(i))


def scenario_dataloader(args) -> None:
    loader = torch.utils.data.DataLoader(
        SlowDataset(), batch_size=2, num_workers=args.num_workers)
    marker("dataloader_start", num_workers=args.num_workers)
    end = time.time() + args.save_seconds
    for i, batch in enumerate(loader):
        log(f"dataloader: batch {i}")
        if time.time() > end:
            break
    del loader  # stop the worker before the barrier
    dist.barrier()


SCENARIOS = {
    "slow-save": scenario_slow_save,
    "fast-save": scenario_fast_save,
    "fsdp-gather-slow": scenario_fsdp_gather_slow,
    "slow-load": scenario_slow_load,
    "park": scenario_park,
    "compute": scenario_compute,
    "dataloader": scenario_dataloader,
}
PARK_OPS = ["barrier", "broadcast", "all_reduce", "all_gather", "gather",
            "scatter", "reduce_scatter", "gather_object", "all_gather_object",
            "broadcast_object_list", "monitored_barrier", "recv", "send"]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--scenario", required=True, choices=sorted(SCENARIOS))
    p.add_argument("--op", default="barrier", choices=PARK_OPS,
                   help="collective for --scenario park")
    p.add_argument("--model-mb", type=float, default=64.0)
    p.add_argument("--save-seconds", type=float, default=20.0,
                   help="how long rank 0 is slow (save, gather, load, park)")
    p.add_argument("--write-rate", "--read-rate", dest="rate", type=float,
                   default=None, help="slow storage bytes/s "
                   "(default: model bytes / --save-seconds)")
    p.add_argument("--pg-timeout", type=float, default=90.0,
                   help="init_process_group timeout, seconds")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--slow-copies", type=int, default=0,
                   help="fsdp-gather-slow: split rank 0's delay over this many "
                   "tensors (default all but the last; 1: one long wait)")
    p.add_argument("--num-workers", type=int, default=0,
                   help="DataLoader workers for --scenario dataloader")
    p.add_argument("--ckpt-dir", default=tempfile.gettempdir())
    return p.parse_args(argv)


def _die_with_parent() -> None:
    """If torchrun itself dies (kill -9), take this rank down too (Linux)."""
    try:
        import ctypes
        import signal
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PDEATHSIG
        if os.getppid() == 1:  # parent already gone
            os._exit(1)
    except (OSError, AttributeError):
        pass


def main(argv=None) -> int:
    global RANK
    args = parse_args(argv)
    RANK = int(os.environ.get("RANK", "0"))
    _die_with_parent()
    torch.set_num_threads(1)  # small boxes: one compute thread per rank
    dist.init_process_group(
        "gloo", timeout=datetime.timedelta(seconds=args.pg_timeout))
    marker("ready", world=dist.get_world_size(), scenario=args.scenario)
    try:
        SCENARIOS[args.scenario](args)
    except BaseException as e:  # noqa: BLE001 - report, then die hard
        traceback.print_exc()
        log(f"error: {type(e).__name__}: {e}")
        marker("error", type=type(e).__name__)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)  # no destroy_process_group: peers may be gone or stuck
    dist.destroy_process_group()
    marker("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
