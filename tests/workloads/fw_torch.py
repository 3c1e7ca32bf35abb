"""torch.distributed checkpoint paths on slow storage (gloo on CPU).

    torchrun --nproc-per-node 2 tests/workloads/fw_torch.py --ckpt-dir MOUNT --mode dcp-async

--mode dcp-async: every rank calls torch.distributed.checkpoint.async_save and
  waits in Future.result(); the writes happen in DCP's writer thread. Rank 0
  holds the big tensors (its optimizer shard, say), so its thread writes for
  long while the others' threads wait in the save's final collective.
--mode fsdp1-load: restore of an FSDP1 model from a full state dict that every
  rank torch.loads and hands to load_state_dict under FULL_STATE_DICT (whose
  unshard is a collective). Rank 0 reads its copy from the mount, paced on
  reads (a node with slow storage); the others read a local copy and wait for
  it in the unshard's all_gather.
Markers: at the call sites (DCP and FSDP1 have no callbacks for this).
"""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist
import torch.nn as nn

from fwcommon import RANK, WORLD, args, dim_for, marker

a = args(__doc__, mode=(str, "dcp-async"))
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=a.pg_timeout))
marker("ready", world=WORLD, framework="torch", mode=a.mode)
dim = dim_for(a.model_mb, 4)
torch.manual_seed(0)

if a.mode == "dcp-async":
    import torch.distributed.checkpoint as dcp
    small = {"step": torch.tensor(RANK), f"rank{RANK}.bias": torch.zeros(16)}
    big = {f"rank0.shard{i}": torch.randn(dim, dim) for i in range(4)} if RANK == 0 else {}
    marker("save_start" if RANK == 0 else "wait_start")
    fut = dcp.async_save({**small, **big}, checkpoint_id=os.path.join(a.ckpt_dir, "dcp"))
    fut.result()
    marker("save_done")
elif a.mode == "fsdp1-load":
    from torch.distributed.fsdp import FullStateDictConfig, StateDictType
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    plain = nn.Sequential(*[nn.Linear(dim, dim) for _ in range(4)])
    # the "local disk" copies sit beside the mount, in the dir its owner removes
    local = os.path.join(os.path.dirname(os.path.abspath(a.ckpt_dir)), f"local-rank{RANK}")
    os.makedirs(local, exist_ok=True)
    path = os.path.join(a.ckpt_dir if RANK == 0 else local, "full.pt")
    torch.save(plain.state_dict(), path)  # the mount paces reads only
    dist.barrier()
    model = FSDP(plain, use_orig_params=True, device_id=torch.device("cpu"))
    marker("load_start" if RANK == 0 else "wait_start")
    full = torch.load(path, weights_only=True)
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT,
                              FullStateDictConfig(offload_to_cpu=True)):
        model.load_state_dict(full)
    marker("load_done")
    import shutil
    shutil.rmtree(local, ignore_errors=True)
dist.barrier()
dist.destroy_process_group()
marker("done")
