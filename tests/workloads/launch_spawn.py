"""torch.multiprocessing.spawn job: the rank is set in-process (spawn index),
nothing in the workers' environment says it. Rank 0 stalls in a slow save.

    python launch_spawn.py --world 2 --port P --go FILE
"""

from __future__ import annotations

import argparse
import datetime
import os

import torch.distributed as dist
import torch.multiprocessing as mp

from tests.workloads import launch_job


def worker(i: int, args) -> None:
    dist.init_process_group("gloo", rank=i, world_size=args.world,
                            timeout=datetime.timedelta(seconds=args.pg_timeout))
    launch_job.RANK = i
    launch_job.marker("ready")
    launch_job.stall(args, i)
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--port", type=int, required=True)
    launch_job.add_stall_args(p)
    args = p.parse_args()
    # As the tutorials do: the rendezvous set in-process, inherited by the workers.
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(args.port)
    mp.spawn(worker, args=(args,), nprocs=args.world)


if __name__ == "__main__":
    main()
