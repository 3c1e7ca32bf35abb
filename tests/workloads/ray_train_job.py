"""A Ray Train job (TorchTrainer, CPU workers, gloo) for tests/e2e/test_ray_train.py.

Ray starts each worker as an actor process and sets RANK/WORLD_SIZE inside
it after it starts: nothing in a worker's initial environment says its rank.
After init every worker prints a ready marker and waits for --go; then rank
0 (``--saver N``: rank N) saves slowly (ThrottledWriter) while the others
wait in a barrier, or,
with ``--wait-op async-wait``, NCCL-shaped: ``all_reduce(async_op=True)``
then ``Work.wait()`` from the training function (no c10d frame on the Python
stack), with ``--busy-thread F`` a thread spinning in every worker as NCCL's
busy wait does.
Markers: ``NCCLWATCH_DEMO phase=<p> rank=<r> pid=<pid> t=<time>``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def marker(phase: str, rank: int) -> None:
    sys.stdout.write(f"NCCLWATCH_DEMO phase={phase} rank={rank} pid={os.getpid()} "
                     f"t={time.time():.6f}\n")
    sys.stdout.flush()


def train_fn(config: dict) -> None:
    import torch
    import torch.distributed as dist

    from ncclwatch.demo.slow_storage import ThrottledWriter

    rank = dist.get_rank()
    if config["busy_thread"] > 0:
        from ncclwatch.demo.job import busy_thread
        busy_thread(min(config["busy_thread"], 1.0))
    marker("ready", rank)
    state = {"w": torch.zeros(config["mb"] * 2**18)}
    while not os.path.exists(config["go"]):
        time.sleep(0.1)
    if rank == config["saver"]:
        marker("save_start", rank)
        size = config["mb"] * 2**20
        torch.save(state, ThrottledWriter(os.path.join(config["dir"], f"ckpt-{os.getpid()}.pt"),
                                          size / config["save_seconds"]))
        marker("save_end", rank)
    else:
        marker("wait_start", rank)
    if config["wait_op"] == "async-wait":
        work = dist.all_reduce(torch.zeros(1024), async_op=True)
        work.wait()
    else:
        dist.barrier()
    marker("done", rank)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--go", required=True)
    p.add_argument("--dir", default="/tmp")
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--mb", type=int, default=8)
    p.add_argument("--save-seconds", type=float, default=40.0)
    p.add_argument("--pg-timeout", type=float, default=75.0)
    p.add_argument("--wait-op", choices=["barrier", "async-wait"], default="barrier")
    p.add_argument("--busy-thread", type=float, default=0.0, metavar="FRACTION")
    p.add_argument("--saver", type=int, default=0, help="the rank that saves")
    args = p.parse_args()
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    ray.init(num_cpus=args.workers + 1, include_dashboard=False, log_to_driver=True,
             configure_logging=False)
    trainer = TorchTrainer(
        train_fn,
        train_loop_config={"go": args.go, "dir": args.dir, "mb": args.mb,
                           "save_seconds": args.save_seconds, "wait_op": args.wait_op,
                           "busy_thread": args.busy_thread, "saver": args.saver},
        scaling_config=ScalingConfig(num_workers=args.workers, use_gpu=False),
        torch_config=TorchConfig(backend="gloo", timeout_s=int(args.pg_timeout)),
        run_config=RunConfig(storage_path=os.path.join(args.dir, "ray-results"), name="ncclwatch"),
    )
    trainer.fit()
    ray.shutdown()


if __name__ == "__main__":
    main()
