"""A small data-parallel trainer (DDP + ZeRO-1 optimizer, gloo) that fails on
purpose, for the `ncclwatch diagnose` corpus. make_corpus.py runs it under
torchrun; --fault picks the failure. Logging imitates an HF-style trainer:
the main process logs at INFO, replicas at WARNING.

    torchrun --nproc-per-node 4 train.py --fault save_overrun --out DIR
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import io
import logging
import math
import os
import resource
import signal
import socket
import sys
import threading
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

logger = logging.getLogger("trainer")

FAULTS = ("none", "save_overrun", "hang_compute", "hang_sleep", "desync_op",
          "desync_shape", "gather_oom", "raise", "sigkill", "abort", "segfault",
          "cut_links", "monitored_barrier", "gather_alloc_oom")


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--fault", choices=FAULTS, default="none")
    p.add_argument("--fault-rank", type=int, default=0)
    p.add_argument("--fault-step", type=int, default=130)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--save-steps", type=int, default=100)
    p.add_argument("--timeout", type=float, default=10.0)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--out", default="/tmp/ncclwatch-corpus-run")
    p.add_argument("--save-seconds", type=float, default=30.0,
                   help="save_overrun: how long rank 0's write takes")
    p.add_argument("--no-ddp", action="store_true",
                   help="average gradients with plain all_reduce instead of DDP "
                        "(DDP segfaults under TORCH_DISTRIBUTED_DEBUG=DETAIL on torch 2.13 CPU)")
    p.add_argument("--fr-dir", default="",
                   help="write a Flight Recorder dump per rank here on failure")
    return p.parse_args()


def setup_logging(rank):
    level = logging.INFO if rank == 0 else logging.WARNING
    logging.basicConfig(
        format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
        datefmt="%m/%d/%Y %H:%M:%S", level=level, stream=sys.stdout)
    logger.setLevel(level)


class Model(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.embed = nn.Embedding(1024, hidden)
        self.blocks = nn.Sequential(*[
            nn.Sequential(nn.LayerNorm(hidden), nn.Linear(hidden, 4 * hidden),
                          nn.GELU(), nn.Linear(4 * hidden, hidden))
            for _ in range(4)])
        self.head = nn.Linear(hidden, 1024)

    def forward(self, x):
        return self.head(self.blocks(self.embed(x)))


class SlowWriter(io.RawIOBase):
    """A file on a slow network filesystem: each write takes its share of
    `seconds` (the whole save takes about that long)."""

    def __init__(self, path, total_bytes, seconds):
        self.f = open(path, "wb")
        self.rate = max(total_bytes, 1) / max(seconds, 0.001)

    def writable(self):
        return True

    def write(self, b):
        time.sleep(len(b) / self.rate)
        return self.f.write(b)

    def close(self):
        self.f.close()
        super().close()


def dump_flight_recorder(args, rank, why):
    if not args.fr_dir:
        return
    os.makedirs(args.fr_dir, exist_ok=True)
    path = os.path.join(args.fr_dir, f"nccl_trace_rank_{rank}")
    data = torch._C._distributed_c10d._dump_fr_trace()
    with open(path, "wb") as f:
        f.write(data)
    print(f"[rank{rank}] wrote Flight Recorder dump to {path} ({why})",
          file=sys.stderr, flush=True)


def burn_cpu(seconds):
    """An evaluation loop that only this rank runs (the bug)."""
    a = torch.randn(256, 256)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        a = torch.tanh(a @ a.T / 256.0)


def cut_gloo_links(master_port):
    """Shut down this process's peer-to-peer TCP connections (not the
    TCPStore's): a link failure while the process stays alive."""
    n = 0
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            s = socket.socket(fileno=fd)
        except OSError:
            continue
        try:
            if s.type == socket.SOCK_STREAM and s.family in (socket.AF_INET, socket.AF_INET6):
                peer = s.getpeername()
                local = s.getsockname()
                if master_port not in (peer[1], local[1]):
                    s.shutdown(socket.SHUT_RDWR)
                    n += 1
        except OSError:
            pass
        finally:
            s.detach()
    return n


def save_checkpoint(args, rank, world, step, net, optimizer):
    ckpt_dir = os.path.join(args.out, f"checkpoint-{step}")
    logger.info("Saving model checkpoint to %s", ckpt_dir)
    if args.fault in ("gather_oom", "gather_alloc_oom") and rank == args.fault_rank:
        # The host has little memory left for the consolidated state: cap the
        # address space a little above what the process maps now.
        with open("/proc/self/statm") as f:
            vm_pages = int(f.read().split()[0])
        vm = vm_pages * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (vm + 6 * 2**20, resource.RLIM_INFINITY))
    if args.fault == "gather_alloc_oom" and rank == args.fault_rank:
        # Rank 0 materialises the full (fp32 + optimizer-sized) state in one buffer:
        # torch's CPU allocator refuses it under the cap.
        full = sum(p.numel() for p in net.parameters()) * 64
        torch.empty(full, dtype=torch.float32)
    # All ranks take part: the ZeRO shards are sent to rank 0.
    optimizer.consolidate_state_dict(to=0)
    if rank == 0:
        state = {"model": net.state_dict(),
                 "optimizer": optimizer.state_dict(), "step": step}
        os.makedirs(ckpt_dir, exist_ok=True)
        path = os.path.join(ckpt_dir, "pytorch_model.bin")
        nbytes = sum(t.numel() * t.element_size() for t in net.state_dict().values()) * 3
        if args.fault == "save_overrun":
            if args.fr_dir:
                t = threading.Timer(args.timeout * 0.7, dump_flight_recorder,
                                    (args, rank, "still saving"))
                t.daemon = True
                t.start()
            f = SlowWriter(path, nbytes, args.save_seconds)
        else:
            f = open(path, "wb")
        with f:
            torch.save(state, f)
        logger.info("Model weights saved in %s", path)
    dist.barrier()


def main():
    args = parse_args()
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    setup_logging(rank)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    print(f"[{socket.gethostname()}] rank {rank}/{world} (local rank {os.environ['LOCAL_RANK']}, "
          f"pid {os.getpid()}) joined the process group", flush=True)
    torch.manual_seed(0)
    net = Model(args.hidden)
    model = net if args.no_ddp else DDP(net)
    optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=3e-4)
    nparams = sum(p.numel() for p in model.parameters())
    logger.info("***** Running training *****")
    logger.info("  Num processes = %d (gloo, timeout %.0fs)", world, args.timeout)
    logger.info("  Total optimization steps = %d", args.steps)
    logger.info("  Number of trainable parameters = %d", nparams)
    gen = torch.Generator().manual_seed(1234 + rank)
    faulty = rank == args.fault_rank
    t0 = time.monotonic()
    for step in range(1, args.steps + 1):
        x = torch.randint(0, 1024, (8, 16), generator=gen)
        y = torch.roll(x, 1, dims=1)
        loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if args.no_ddp:
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= world
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step == args.fault_step and faulty:
            if args.fault == "hang_compute":
                burn_cpu(10 * args.timeout)
            elif args.fault == "hang_sleep":
                time.sleep(10 * args.timeout)
            elif args.fault == "raise":
                raise ValueError(f"Batch at step {step} has an empty label tensor (shard 17, offset 40960)")
            elif args.fault == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            elif args.fault == "abort":
                os.abort()
            elif args.fault == "segfault":
                ctypes.string_at(0)
            elif args.fault == "cut_links":
                cut_gloo_links(int(os.environ["MASTER_PORT"]))
            elif args.fault == "monitored_barrier":
                time.sleep(10 * args.timeout)  # stuck: never reaches the sanity barrier
        if args.fault == "monitored_barrier" and step == args.fault_step:
            # A trainer's sanity check before evaluation: rank 0 names the absent ranks.
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=args.timeout))
        # Mean loss over ranks for logging, every step (the trainer's metric sync).
        stat = torch.tensor([loss.item(), 1.0])
        if args.fault == "desync_op" and step == args.fault_step and faulty:
            dist.broadcast(stat, src=0)
        elif args.fault == "desync_shape" and step == args.fault_step and faulty:
            dist.all_reduce(torch.tensor([loss.item(), 1.0, 0.0]))
        else:
            try:
                dist.all_reduce(stat)
            except RuntimeError:
                dump_flight_recorder(args, rank, "all_reduce failed")
                raise
        mean_loss = (stat[0] / stat[1]).item()
        if step % 1 == 0:
            lr = optimizer.param_groups[0]["lr"] * (0.5 * (1 + math.cos(math.pi * step / args.steps)))
            logger.info("{'loss': %.4f, 'grad_norm': %.4f, 'learning_rate': %.3e, 'epoch': %.2f}",
                        mean_loss, float(gnorm), lr, step / args.steps)
        if step % 20 == 0:
            logger.info("step %d/%d: %.1f samples/s", step, args.steps,
                        world * 8 * step / (time.monotonic() - t0))
        if step % args.save_steps == 0:
            try:
                save_checkpoint(args, rank, world, step, net, optimizer)
            except RuntimeError:
                dump_flight_recorder(args, rank, "checkpoint collective failed")
                raise
    logger.info("Training completed. Do not forget to share your model on huggingface.co/models =)")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
