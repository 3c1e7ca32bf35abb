"""accelerate (DDP on CPU, gloo): save_state / save_model to slow storage, load_state back.

    torchrun --nproc-per-node 2 tests/workloads/fw_accelerate.py --ckpt-dir MOUNT --mode save_state

--mode save_state: Accelerator.save_state (model as safetensors, optimizer,
  RNG) on the main process; the others wait in accelerator.wait_for_everyone().
--mode save_model: Accelerator.get_state_dict + save_model (safetensors shards).
--mode load_state: save_state (the mount paces reads only), then the main
  process restores it with load_state while the others wait (a rank that
  resumes alone after a restart).
Markers come from accelerate's save_state pre-hook (register_save_state_pre_hook)
and load_state pre-hook; save_model has none, so its marker is the call site.
"""

from __future__ import annotations

import datetime
import os

import torch
import torch.nn as nn

from fwcommon import RANK, args, dim_for, marker

a = args(__doc__, mode=(str, "save_state"))

from accelerate import Accelerator  # noqa: E402
from accelerate.utils import InitProcessGroupKwargs, ProjectConfiguration  # noqa: E402

acc = Accelerator(cpu=True, kwargs_handlers=[InitProcessGroupKwargs(
    backend="gloo", timeout=datetime.timedelta(seconds=a.pg_timeout))],
    project_config=ProjectConfiguration(project_dir=a.ckpt_dir))
dim = dim_for(a.model_mb, 4)
torch.manual_seed(0)
model = nn.Sequential(*[nn.Linear(dim, dim) for _ in range(4)])
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
model, opt = acc.prepare(model, opt)


def start(phase_main: str):
    marker(phase_main if acc.is_main_process else "wait_start", mode=a.mode)


if a.mode != "load_state":
    acc.register_save_state_pre_hook(lambda models, weights, out_dir: start("save_start"))
acc.register_load_state_pre_hook(lambda models, in_dir: start("load_start"))
marker("ready", world=acc.num_processes, framework="accelerate")
loss = model(torch.randn(4, dim)).pow(2).mean()
acc.backward(loss)
opt.step()
out = os.path.join(a.ckpt_dir, "ckpt")
if a.mode == "save_state":
    acc.save_state(out)
    if not acc.is_main_process:
        # Every rank writes its own RNG state into the (slow) checkpoint directory
        # inside save_state: the others only start waiting for rank 0 here.
        marker("wait_begin")
    acc.wait_for_everyone()
elif a.mode == "save_model":
    start("save_start")
    acc.save_model(model, out)
    acc.wait_for_everyone()
elif a.mode == "load_state":
    # rank 0 restores alone (e.g. a rank that resumes after a restart) while the others wait
    acc.save_state(out)
    acc.wait_for_everyone()
    if acc.is_main_process:
        acc.load_state(out)
    else:
        start("load_start")
    acc.wait_for_everyone()
marker("save_done")
acc.end_training()
marker("done")
