"""One tiny gloo job for every launcher: rank 0 stalls in a slow torch.save
while the others wait in a barrier (tests/e2e/test_launchers.py).

How the rank is found depends on the launcher, as in real scripts:

  --how env        RANK/WORLD_SIZE from torchrun, accelerate launch, deepspeed
  --how mpi        OMPI_COMM_WORLD_* or PMI_* (mpirun, mpiexec.mpich); the
                   rendezvous address is set in-process (invisible from outside)
  --how argv       --rank on the command line, MASTER_*/WORLD_SIZE in the env
                   (a custom launcher: nothing outside shows the rank)
  --how accelerate accelerate.Accelerator() (under accelerate launch)
  --how deepspeed  deepspeed.init_distributed(dist_backend="gloo")

After init every rank prints a ready marker and waits for --go (a file the
test creates once ncclwatch shows the job); then the stall begins.
Markers: ``NCCLWATCH_DEMO phase=<p> rank=<r> pid=<pid> t=<time>``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

from ncclwatch.demo.slow_storage import ThrottledWriter

RANK = -1


def marker(phase: str) -> None:
    sys.stdout.write(f"NCCLWATCH_DEMO phase={phase} rank={RANK} pid={os.getpid()} "
                     f"t={time.time():.6f}\n")
    sys.stdout.flush()


def init(args) -> None:
    timeout = datetime.timedelta(seconds=args.pg_timeout)
    if args.how == "accelerate":
        from accelerate import Accelerator
        from accelerate.utils import InitProcessGroupKwargs
        Accelerator(cpu=True, kwargs_handlers=[InitProcessGroupKwargs(timeout=timeout)])
        return
    if args.how == "deepspeed":
        import deepspeed
        deepspeed.init_distributed(dist_backend="gloo", timeout=timeout)
        return
    if args.how == "mpi":
        env = os.environ
        rank = int(env.get("OMPI_COMM_WORLD_RANK", env.get("PMI_RANK", "-1")))
        world = int(env.get("OMPI_COMM_WORLD_SIZE", env.get("PMI_SIZE", "0")))
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port))
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timeout)
        return
    if args.how == "argv":
        dist.init_process_group("gloo", rank=args.rank,
                                world_size=int(os.environ["WORLD_SIZE"]), timeout=timeout)
        return
    dist.init_process_group("gloo", timeout=timeout)


def add_stall_args(p: argparse.ArgumentParser) -> None:
    """The options every launcher's job shares: the go file and the stall's shape."""
    p.add_argument("--go", required=True)
    p.add_argument("--dir", default="/tmp")
    p.add_argument("--mb", type=int, default=8)
    p.add_argument("--save-seconds", type=float, default=40.0)
    p.add_argument("--pg-timeout", type=float, default=75.0)


def stall(args, rank: int) -> None:
    """Rank 0 saves slowly; the others wait for it in a barrier."""
    state = {"w": torch.zeros(args.mb * 2**18)}  # fp32: mb MiB
    # Every rank waits for the go file outside any collective, so the others'
    # barrier starts with the save (not earlier, where it would look older).
    while not os.path.exists(args.go):
        time.sleep(0.1)
    if rank == 0:
        marker("save_start")
        size = args.mb * 2**20
        torch.save(state, ThrottledWriter(os.path.join(args.dir, f"ckpt-{os.getpid()}.pt"),
                                          size / args.save_seconds))
        marker("save_end")
    else:
        marker("wait_start")
    dist.barrier()
    marker("done")


def main() -> None:
    global RANK
    p = argparse.ArgumentParser()
    p.add_argument("--how", default="env",
                   choices=("env", "mpi", "argv", "accelerate", "deepspeed"))
    p.add_argument("--rank", type=int, default=-1)
    p.add_argument("--port", type=int, default=0)
    add_stall_args(p)
    p.add_argument("--local_rank", type=int, default=-1)  # deepspeed's launcher passes it
    args = p.parse_args()
    init(args)
    RANK = dist.get_rank()
    marker("ready")
    stall(args, RANK)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
