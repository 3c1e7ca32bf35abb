"""A training script started by ``srun python``: it takes its rank from Slurm itself.

Lightning's SLURMEnvironment and submitit do the same: rank = SLURM_PROCID,
world size = SLURM_NTASKS, local rank = SLURM_LOCALID, set in-process. What
the process was started with (/proc/PID/environ, all ncclwatch reads) holds
only Slurm's names. Under torchrun (RANK already set) it changes nothing.
"""

from __future__ import annotations

import os
import sys

SLURM_TO_TORCH = (("RANK", "SLURM_PROCID"), ("WORLD_SIZE", "SLURM_NTASKS"),
                  ("LOCAL_RANK", "SLURM_LOCALID"))

if __name__ == "__main__":
    if "RANK" not in os.environ:
        for torch_name, slurm_name in SLURM_TO_TORCH:
            os.environ[torch_name] = os.environ[slurm_name]
    from ncclwatch.demo.job import main
    sys.exit(main())
