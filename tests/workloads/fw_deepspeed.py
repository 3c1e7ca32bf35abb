"""DeepSpeed ZeRO-3 on CPU (DS_ACCELERATOR=cpu, gloo) checkpointing to slow storage.

    DS_ACCELERATOR=cpu torchrun --nproc-per-node 2 tests/workloads/fw_deepspeed.py --ckpt-dir MOUNT --mode 16bit

--mode 16bit: engine.save_16bit_model: every rank joins the ZeRO-3
  consolidation (_zero3_consolidated_16bit_state_dict), then rank 0 writes
  the model while the others wait at DeepSpeed's barrier.
--mode checkpoint: engine.save_checkpoint: each rank writes its ZeRO shards,
  rank 0 the model states; the others wait at its barriers.
Markers: at the call site (DeepSpeed has no save hooks).
"""

from __future__ import annotations

import datetime
import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

from fwcommon import RANK, WORLD, args, dim_for, marker  # noqa: E402

a = args(__doc__, mode=(str, "16bit"))

import deepspeed  # noqa: E402

deepspeed.init_distributed(dist_backend="gloo",
                           timeout=datetime.timedelta(seconds=a.pg_timeout))
dim = dim_for(a.model_mb, 4)
torch.manual_seed(0)
model = nn.Sequential(*[nn.Linear(dim, dim) for _ in range(4)])
config = {
    "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
    "optimizer": {"type": "SGD", "params": {"lr": 1e-3}},
    "zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": True},
    "bf16": {"enabled": a.mode == "16bit"},
    "steps_per_print": 10**9, "zero_allow_untested_optimizer": True,
}
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                  config=config)
marker("ready", world=WORLD, framework="deepspeed", mode=a.mode)
x = torch.randn(2, dim, dtype=torch.bfloat16 if a.mode == "16bit" else torch.float32)
loss = engine(x).float().pow(2).mean()
engine.backward(loss)
engine.step()
marker("save_start" if RANK == 0 else "wait_start")
if a.mode == "16bit":
    engine.save_16bit_model(a.ckpt_dir, "model.bin")
else:
    engine.save_checkpoint(a.ckpt_dir, tag="step1")
marker("save_done")
deepspeed.comm.barrier()
marker("done")
