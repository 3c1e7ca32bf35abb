"""torch.multiprocessing.spawn job: the rank is set in-process (spawn index),
nothing in the workers' environment says it. Rank 0 stalls in a slow save.

    python launch_spawn.py --world 2 --port P --go FILE

Across nodes, as the tutorials do, the node's number only on the command
line (no WORLD_SIZE, no NODE_RANK in the environment): one such process per
node, each spawning --world workers, rank = node_rank * world + i:

    python launch_spawn.py --world 2 --nnodes 2 --node-rank 1 --addr IP --port P --go FILE
"""

from __future__ import annotations

import argparse
import datetime
import os

import torch.distributed as dist
import torch.multiprocessing as mp

from tests.workloads import launch_job


def worker(i: int, args) -> None:
    rank = args.node_rank * args.world + i
    launch_job.RANK = rank
    launch_job.marker("started")
    dist.init_process_group("gloo", rank=rank, world_size=args.world * args.nnodes,
                            timeout=datetime.timedelta(seconds=args.pg_timeout))
    launch_job.marker("ready")
    launch_job.stall(args, rank)
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--addr", default="127.0.0.1", help="the rendezvous address (node 0's)")
    launch_job.add_stall_args(p)
    args = p.parse_args()
    # As the tutorials do: the rendezvous set in-process, inherited by the workers.
    os.environ["MASTER_ADDR"] = args.addr
    os.environ["MASTER_PORT"] = str(args.port)
    mp.spawn(worker, args=(args,), nprocs=args.world)


if __name__ == "__main__":
    main()
