"""A real torch.distributed job (gloo on CPU) that stalls the way big jobs do.

Run under torchrun, e.g.:

    torchrun --standalone --nproc-per-node 4 -m ncclwatch.demo.job \\
        --scenario slow-save --model-mb 64 --save-seconds 20

Scenarios (one function each, below):
  slow-save         train, then rank --saver (0) torch.saves the full state to
                    slow storage while the other ranks wait in --wait-op
                    (barrier); an earlier, fast checkpoint sits beside it
  fast-save         the same with an unthrottled save (no stall)
  fsdp-gather-slow  FSDP2 model; rank 0 is slow inside get_model_state_dict
                    (full_state_dict) while the others wait in its all_gathers
  slow-load         rank 0 torch.loads from slow storage, the others wait in
                    the broadcast of the restored weights
  fsdp1-late        FSDP1 full state_dict(): rank --late-rank (last) is busy in
                    --late-activity while the others wait in its all_gather
  fsdp2-late        the same with FSDP2 and get_model_state_dict
  fsdp2-save        FSDP2 training; rank 0 saves the full state slowly while
                    the others run ahead (--wait-op fsdp2-forward)
  park              all ranks but --late-rank (0) enter collective --op while
                    it is busy in --late-activity (sleep, compute, dataloader)
  desync            ranks 0..N-2 call --op, the last rank --other-op: a hang in
                    two different collectives
  gather-oom        FSDP2 full state dict gathered into rank 0's host memory
                    under an address-space limit it runs into, slowly
  train             healthy DDP training for --save-seconds; with --eval-every
                    N rank --late-rank (0) evaluates --eval-seconds every N steps
                    while the others wait in a barrier; with --hang-after S that
                    rank skips an all_reduce after S seconds (--late-activity),
                    waited NCCL-style in work.wait() with --wait-op async-wait
  compute           all ranks do matmuls; dataloader: all ranks wait on a slow
                    DataLoader (--num-workers)

--busy-thread F (any scenario): every rank burns F of a core in a thread, with
the GIL released, as NCCL ranks spin in cudaStreamSynchronize while they wait:
no rank ever looks CPU-quiet.

Every rank prints one line per phase, and machine-readable markers:
    NCCLWATCH_DEMO phase=<phase> rank=<r> pid=<pid> t=<time.time()> [k=v ...]
"""

from __future__ import annotations

import argparse
import datetime
import os
import resource
import sys
import tempfile
import time
import traceback

import torch
import torch.distributed as dist
import torch.nn as nn

from ncclwatch.demo.rankwork import (LATE_ACTIVITIES, SlowDataset, SlowHostCopy, busy_thread,
                                     die_with_parent, full_state_dict, keep_sockets,
                                     make_model, nbytes, vm_size)
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


def train(model: nn.Module, opt, steps: int, tag: str, dim: int | None = None) -> None:
    """A few SGD steps; DDP all_reduces / FSDP reduce-scatters the grads."""
    dim = dim or next(model.parameters()).shape[-1]
    for i in range(steps):
        loss = model(torch.randn(8, dim)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        log(f"{tag} step {i} loss={loss.item():.4f}")


def ckpt_path(args) -> str:
    return os.path.join(args.ckpt_dir, f"ncclwatch-demo-{args.scenario}.pt")


def ckpt_dir(args) -> str:
    """One directory per run, as training scripts keep ``ckpt-step{N}.pt`` files."""
    run = os.environ.get("MASTER_PORT") or str(os.getppid())
    path = os.path.join(args.ckpt_dir, f"ncclwatch-demo-{args.scenario}-{run}")
    os.makedirs(path, exist_ok=True)
    return path


def storage_rate(args, size: int) -> float:
    return args.rate or size / max(args.save_seconds, 0.001)


def _wait_op(args, saver: int, model: nn.Module | None = None, opt=None):
    """The collective the non-saving ranks wait in after the save.

    The NCCL-shaped ones block where no c10d frame is on the Python stack:
    ``work.wait()`` of an async collective, a wait on its future, and DDP's
    next backward (the reducer's bucket all_reduce waits in C++).
    """
    t, obj = torch.zeros(1024), [None]

    def async_wait() -> None:
        work = dist.all_reduce(t, async_op=True)
        work.wait()

    def future_wait() -> None:
        dist.all_reduce(t, async_op=True).get_future().wait()

    return {
        "barrier": lambda: dist.barrier(),
        "broadcast": lambda: dist.broadcast(t, src=saver),
        "broadcast_object_list": lambda: dist.broadcast_object_list(obj, src=saver),
        "async-wait": async_wait,
        "future-wait": future_wait,
        "ddp-backward": lambda: train(model, opt, 1, "next step"),
        # FSDP2: the next forward's first unshard (its all_gather) waits in C++.
        "fsdp2-forward": lambda: train(model, opt, 1, "next step"),
    }[args.wait_op]


def save_rank0(args, state: dict, throttled: bool, step: int = 200,
               model: nn.Module | None = None, opt=None) -> None:
    """One rank writes, the others wait in a collective (the common bad pattern).

    Unless --no-previous-checkpoint, an earlier checkpoint of the same state
    is written first, fast, into the same directory: training scripts keep
    ``ckpt-step{N}.pt`` files, and the previous one says how big the next is.
    """
    saver = args.saver
    wait = _wait_op(args, saver, model, opt)
    if RANK == saver:
        size = sum(t.numel() * t.element_size() for t in state.values())
        directory = ckpt_dir(args)
        if args.previous_checkpoint:
            prev = os.path.join(directory, f"ckpt-step{step // 2}.pt")
            torch.save(state, prev)
            marker("previous_saved", path=prev, bytes=os.path.getsize(prev))
        path = os.path.join(directory, f"ckpt-step{step}.pt")
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
        log(f"checkpoint: waiting for rank {saver} in {args.wait_op}")
        marker("wait_start", op=args.wait_op)
    wait()
    log(f"checkpoint: {args.wait_op} passed")


def scenario_save(args, throttled: bool) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = DDP(make_model(args.model_mb))
    log(f"model: {nbytes(model) / 2**20:.1f} MiB (DDP)")
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    train(model, opt, args.steps, "train")
    # cpu_offload keeps the gathered state on rank 0 only; another saver
    # writes its own (DDP: identical) replica.
    state = full_state_dict(model) if args.saver == 0 else model.module.state_dict()
    save_rank0(args, state, throttled, model=model, opt=opt)
    train(model, opt, args.steps, "train after checkpoint")


def scenario_slow_save(args) -> None:
    scenario_save(args, throttled=True)


def scenario_fast_save(args) -> None:
    scenario_save(args, throttled=False)


def _fsdp2_model(args, layers: int = 4) -> nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = make_model(args.model_mb, layers)
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def scenario_fsdp_gather_slow(args) -> None:
    model = _fsdp2_model(args)
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


def be_late(args, what: str) -> None:
    if args.keep_sockets:
        keep_sockets(args.pg_timeout + 30)
    log(f"late: {args.late_activity} for {args.save_seconds}s before {what}")
    marker("busy_start", op=what, activity=args.late_activity)
    LATE_ACTIVITIES[args.late_activity](args.save_seconds)


def late_rank(args, default: int) -> int:
    return default if args.late_rank is None else args.late_rank


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
        "all_gather_single": lambda: dist.all_gather_single(torch.empty(1024 * world), t),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(
            torch.empty(1024 * world), t),
        "reduce_scatter_single": lambda: dist.reduce_scatter_single(
            torch.empty(1024), torch.ones(1024 * world)),
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(
            torch.empty(1024), torch.ones(1024 * world)),
        "recv_object_list": lambda: ([dist.send_object_list([obj], dst=r)
                                      for r in range(1, world)] if r0
                                     else dist.recv_object_list([None], src=0)),
        "send_object_list": lambda: ([dist.recv_object_list([None], src=r)
                                      for r in range(1, world)] if r0
                                     else dist.send_object_list([obj], dst=0)),
    }[args.op]


def scenario_park(args) -> None:
    run = _park_op(args, dist.get_world_size())
    if RANK == late_rank(args, 0):
        be_late(args, args.op)
    else:
        log(f"park: entering {args.op}")
        marker("wait_start", op=args.op)
    run()
    log(f"park: {args.op} done")


def scenario_fsdp1_late(args) -> None:
    """FSDP1 FULL_STATE_DICT: the punctual ranks block in its all_gather."""
    from torch.distributed.fsdp import FullStateDictConfig, StateDictType
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    # device_id=cpu: without it FSDP1 refuses to start on a host with no GPU.
    plain = make_model(args.model_mb)
    dim = plain[0].in_features  # FSDP1 flattens the parameters it shards
    model = FSDP(plain, use_orig_params=True, device_id=torch.device("cpu"))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    train(model, opt, args.steps, "train", dim)
    cfg = FullStateDictConfig(offload_to_cpu=True, rank0_only=True)
    if RANK == late_rank(args, dist.get_world_size() - 1):
        be_late(args, "state_dict")
    else:
        marker("gather_start")
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, cfg):
        state = model.state_dict()
    marker("gather_end", tensors=len(state))
    dist.barrier()


def scenario_fsdp2_save(args) -> None:
    """FSDP2 training; rank 0 writes the gathered full state slowly while the
    others run ahead into the next step, whose forward unshards (all_gather)."""
    model = _fsdp2_model(args)
    # As on NCCL, the unshard's all_gather returns at once and the forward
    # waits for it later (FSDPParamGroup.wait_for_unshard: work.wait() in C++).
    if hasattr(model, "_set_unshard_async_op"):
        model._set_unshard_async_op(True)
    log(f"model: {nbytes(model) / 2**20:.1f} MiB (FSDP2, sharded)")
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    train(model, opt, args.steps, "train")
    state = full_state_dict(model)
    save_rank0(args, state, throttled=True, model=model, opt=opt)
    train(model, opt, args.steps, "train after checkpoint")


def scenario_fsdp2_late(args) -> None:
    """fully_shard + get_model_state_dict: the punctual ranks wait in all_gather."""
    model = _fsdp2_model(args)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    train(model, opt, args.steps, "train")
    if RANK == late_rank(args, dist.get_world_size() - 1):
        be_late(args, "get_model_state_dict")
    else:
        marker("gather_start")
    state = full_state_dict(model)
    marker("gather_end", tensors=len(state))
    dist.barrier()


def scenario_desync(args) -> None:
    """The last rank issues a different collective, on a subgroup, than the rest.

    Ranks 0..N-2 enter --op on the world group; rank N-1 enters --other-op on
    a group {N-2, N-1}: each side waits for a rank that sits in the other
    collective (the cross-group deadlock of a rank-dependent code path).
    """
    world = dist.get_world_size()
    pair = dist.new_group([world - 2, world - 1])
    if RANK == world - 1:
        op, group = args.other_op, pair
    else:
        op, group = args.op, None
    log(f"desync: entering {op}")
    marker("wait_start", op=op)
    t = torch.ones(1024)
    {"all_reduce": lambda: dist.all_reduce(t, group=group),
     "broadcast": lambda: dist.broadcast(t, src=world - 2, group=group),
     "barrier": lambda: dist.barrier(group=group),
     "all_gather": lambda: dist.all_gather(
         [torch.empty_like(t) for _ in range(dist.get_world_size(group))], t, group=group),
     }[op]()


def scenario_gather_oom(args) -> None:
    """Rank 0 gathers the full state into host memory under a low RLIMIT_AS.

    Each gathered tensor is copied to the host slowly (SlowHostCopy), so
    rank 0's memory grows step by step while the others wait in the
    all_gather of the next tensor, until an allocation fails.
    """
    model = _fsdp2_model(args, layers=16)
    n = len(model.state_dict())
    if RANK == 0:
        vm = vm_size()
        limit = vm + int(args.mem_limit_mb * 2**20)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        log(f"gather-oom: RLIMIT_AS={limit} (VmSize {vm} + {args.mem_limit_mb} MiB), "
            f"{n} tensors of {args.model_mb / 16:.1f} MiB")
        marker("gather_start", tensors=n, limit_bytes=limit)
        with SlowHostCopy(args.save_seconds, n - 1):
            state = full_state_dict(model)
    else:
        marker("gather_start", tensors=n)
        state = full_state_dict(model)
    marker("gather_end", tensors=len(state))
    dist.barrier()


def evaluate(args, step: int) -> None:
    """--eval-every: rank --late-rank (0) evaluates for --eval-seconds while the
    others wait in a barrier: a long wait that is healthy."""
    if RANK == late_rank(args, 0):
        log(f"eval at step {step}: {args.late_activity} for {args.eval_seconds}s")
        marker("eval_start", step=step)
        LATE_ACTIVITIES[args.late_activity](args.eval_seconds)
    else:
        marker("wait_start", op="barrier", step=step)
    dist.barrier()
    marker("eval_end", step=step)


def scenario_train(args) -> None:
    """Healthy training: DDP steps (compute + all_reduce) for --save-seconds."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = DDP(make_model(args.model_mb))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    dim = next(model.parameters()).shape[-1]
    marker("train_start")
    # Ranks must agree on the last step: a rank that leaves a time-bound loop
    # on its own clock goes to the barrier while a peer's next backward waits
    # in DDP's all_reduce, a real hang (ncclwatch flagged it).
    end, i, stop = time.time() + args.save_seconds, 0, torch.zeros(1)
    hang_at = time.time() + args.hang_after if args.hang_after is not None else None
    while True:
        stop.fill_(float(time.time() >= end))
        if hang_at is not None and time.time() >= hang_at and RANK == late_rank(args, 0):
            hang_at = None  # --hang-after: skip this all_reduce for a while
            log(f"late: {args.late_activity} instead of step {i}'s all_reduce")
            marker("busy_start", op="all_reduce", activity=args.late_activity, step=i)
            LATE_ACTIVITIES[args.late_activity](args.pg_timeout + 10)
        if args.wait_op == "async-wait":  # NCCL-shaped: queued, then waited in C++
            dist.all_reduce(stop, op=dist.ReduceOp.MAX, async_op=True).wait()
        else:
            dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        if stop.item():
            break
        if args.eval_every and i and i % args.eval_every == 0:
            evaluate(args, i)
        loss = model(torch.randn(8, dim)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if i % 20 == 0:
            log(f"train step {i} loss={loss.item():.4f}")
        i += 1
        # --step-seconds: higher ranks a little slower, so the others wait in
        # the next all_reduce for part of each step, as stragglers make them.
        time.sleep(0.02 if args.step_seconds is None
                   else args.step_seconds * (1 + 0.5 * RANK / dist.get_world_size()))
    marker("train_end", steps=i)
    dist.barrier()


def scenario_compute(args) -> None:
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    marker("compute_start")
    end = time.time() + args.save_seconds
    while time.time() < end:
        a = torch.tanh(a @ b)
    dist.barrier()


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
    "fsdp2-save": scenario_fsdp2_save,
    "fast-save": scenario_fast_save,
    "fsdp-gather-slow": scenario_fsdp_gather_slow,
    "slow-load": scenario_slow_load,
    "park": scenario_park,
    "compute": scenario_compute,
    "dataloader": scenario_dataloader,
    "fsdp1-late": scenario_fsdp1_late,
    "fsdp2-late": scenario_fsdp2_late,
    "desync": scenario_desync,
    "gather-oom": scenario_gather_oom,
    "train": scenario_train,
}
PARK_OPS = ["barrier", "broadcast", "all_reduce", "all_gather", "gather",
            "scatter", "reduce_scatter", "gather_object", "all_gather_object",
            "broadcast_object_list", "monitored_barrier", "recv", "send",
            "all_gather_single", "all_gather_into_tensor", "reduce_scatter_single",
            "reduce_scatter_tensor", "recv_object_list", "send_object_list"]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--scenario", required=True, choices=sorted(SCENARIOS))
    p.add_argument("--op", default="barrier", choices=PARK_OPS,
                   help="collective for --scenario park / desync")
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
    p.add_argument("--saver", type=int, default=0, help="the rank that writes the checkpoint")
    p.add_argument("--wait-op", default="barrier",
                   choices=["barrier", "broadcast", "broadcast_object_list", "async-wait",
                            "future-wait", "ddp-backward", "fsdp2-forward"],
                   help="where the other ranks wait during the save (train: "
                        "async-wait waits the step's all_reduce in work.wait())")
    p.add_argument("--no-previous-checkpoint", dest="previous_checkpoint",
                   action="store_false",
                   help="skip the earlier, fast checkpoint in the same directory")
    p.add_argument("--late-rank", type=int, default=None,
                   help="park/fsdp*-late: the rank that is late (default 0 / the last)")
    p.add_argument("--late-activity", default="sleep", choices=sorted(LATE_ACTIVITIES),
                   help="what the late rank does meanwhile")
    p.add_argument("--keep-sockets", action="store_true",
                   help="late rank: keep its connections open if it is killed (a dead "
                        "node, not a clean exit)")
    p.add_argument("--other-op", default="barrier",
                   choices=["all_reduce", "broadcast", "barrier", "all_gather"],
                   help="desync: the last rank's collective (--op: the others')")
    p.add_argument("--mem-limit-mb", type=float, default=None,
                   help="gather-oom: address-space headroom of rank 0 (default: "
                        "two thirds of --model-mb)")
    p.add_argument("--eval-every", type=int, default=0, metavar="STEPS",
                   help="train: every this many steps the late rank evaluates")
    p.add_argument("--eval-seconds", type=float, default=20.0,
                   help="train: how long each evaluation takes")
    p.add_argument("--hang-after", type=float, default=None, metavar="SECONDS",
                   help="train: after this long the late rank stops joining the step's "
                        "all_reduce (a hang in a fast-stepping job)")
    p.add_argument("--step-seconds", type=float, default=None, metavar="SECONDS",
                   help="train: each step's length (ranks after the first a little longer)")
    p.add_argument("--busy-thread", type=float, default=0.0, metavar="FRACTION",
                   help="every rank burns this fraction of a core in a thread (GIL "
                        "released), as NCCL ranks spin while they wait: never CPU-quiet")
    p.add_argument("--init-method", default=None, metavar="URL",
                   help="tcp://host:port or file:///path: meet there, as hand-rolled "
                        "launchers do (with --rank and --world-size; default: env://)")
    p.add_argument("--rank", type=int, default=None,
                   help="this process's rank, given on the command line (--init-method)")
    p.add_argument("--world-size", type=int, default=None,
                   help="the job's world size, given on the command line (--init-method)")
    p.add_argument("--local-rank", "--local_rank", type=int, default=None,
                   help="ignored: torch.distributed.launch (without --use-env) and "
                        "DeepSpeed's launcher pass it")
    args = p.parse_args(argv)
    if args.init_method and (args.rank is None or args.world_size is None):
        p.error("--init-method needs --rank and --world-size")
    if args.mem_limit_mb is None:
        args.mem_limit_mb = args.model_mb * 2 / 3
    return args


def main(argv=None) -> int:
    global RANK
    args = parse_args(argv)
    RANK = args.rank if args.init_method else int(os.environ.get("RANK", "0"))
    die_with_parent()
    torch.set_num_threads(1)  # small boxes: one compute thread per rank
    if args.busy_thread > 0:
        busy_thread(min(args.busy_thread, 1.0))
    where = (dict(init_method=args.init_method, rank=args.rank, world_size=args.world_size)
             if args.init_method else {})
    dist.init_process_group(
        "gloo", timeout=datetime.timedelta(seconds=args.pg_timeout), **where)
    from ncclwatch.demo import debug_pipe
    piped = debug_pipe.start(RANK)
    marker("ready", world=dist.get_world_size(), scenario=args.scenario,
           debug_pipe=int(piped))
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
