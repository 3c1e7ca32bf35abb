"""Two jobs for tests/e2e/test_blind_e2e.py.

``deep``: one rank (torch imported, so the agent takes it for one) that
recurses DEPTH frames deep (``BLIND_DEPTH``) and sleeps there. ``stall RANK``: a 2-rank gloo
job in which rank 0 sleeps while rank 1 waits in a barrier.
"""

from __future__ import annotations

import os
import sys
import time

import torch  # noqa: F401  (the agent watches processes that loaded torch)

DEPTH = int(os.environ.get("BLIND_DEPTH", "5000"))


def recurse(n: int) -> None:
    if n <= 0:
        print("deep: ready", flush=True)
        while True:
            time.sleep(0.5)
    recurse(n - 1)


def stall(rank: int) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=2,
                            init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}")
    print(f"stall: rank {rank} ready", flush=True)
    if rank == 0:
        while True:
            time.sleep(0.5)
    dist.barrier()


if __name__ == "__main__":
    if sys.argv[1] == "deep":
        sys.setrecursionlimit(DEPTH + 1000)
        recurse(DEPTH)
    else:
        stall(int(sys.argv[2]))
