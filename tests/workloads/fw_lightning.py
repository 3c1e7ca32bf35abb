"""Lightning DDP on CPU whose ModelCheckpoint writes to slow storage.

    torchrun --nproc-per-node 2 tests/workloads/fw_lightning.py --ckpt-dir MOUNT [--pkg pytorch_lightning]

Rank 0 saves through Lightning's own path (ModelCheckpoint -> Trainer.save_checkpoint
-> TorchCheckpointIO -> _atomic_save: torch.save to a buffer, then an fsspec
transaction whose commit moves the temp file onto the mount); the other ranks
wait in the strategy barrier. Markers come from Callback.on_save_checkpoint.
--resume: train once (the mount paces reads only), then fit again from the
checkpoint: every rank restores it (_restore_modules_and_callbacks -> _lazy_load);
the marker is Callback.setup, which runs just before the restore.
--rank0-save 1: no ModelCheckpoint; a callback torch.saves the module on rank 0
only (``if trainer.is_global_zero``, a common pattern) while the other ranks run
ahead into the next step (they block in the loop's per-step SIGTERM broadcast),
and every rank spins a thread as NCCL ranks do (issue 18).
"""

from __future__ import annotations

import datetime
import importlib
import os

import torch
import torch.nn as nn

from fwcommon import RANK, args, dim_for, marker

a = args(__doc__, pkg=(str, "lightning"), save_every=(int, 2), max_steps=(int, 2),
         resume=(int, 0), rank0_save=(int, 0), rate=(float, 60_000.0))
L = importlib.import_module("lightning.pytorch" if a.pkg == "lightning" else "pytorch_lightning")
from importlib import import_module  # noqa: E402

DDPStrategy = import_module(L.__name__ + ".strategies").DDPStrategy
ModelCheckpoint = import_module(L.__name__ + ".callbacks").ModelCheckpoint


class Tiny(L.LightningModule):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.net = nn.Sequential(*[nn.Linear(dim, dim) for _ in range(4)])

    def training_step(self, batch, _):
        return self.net(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)


class Markers(L.Callback):
    """The save starts when Lightning asks callbacks for their checkpoint state."""

    def __init__(self, resuming: bool = False) -> None:
        self.resuming = resuming

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        marker("save_start" if trainer.is_global_zero else "wait_start", step=trainer.global_step)

    def on_train_end(self, trainer, pl_module) -> None:
        marker("save_done")

    def setup(self, trainer, pl_module, stage) -> None:
        if self.resuming:
            marker("load_start")


class Rank0Save(L.Callback):
    """Rank 0 alone writes the weights after step ``save_every``; nobody waits for it
    on purpose, the others block in the next step's gradient all_reduce."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step != a.save_every:
            return
        if trainer.is_global_zero:
            from ncclwatch.demo.slow_storage import ThrottledWriter
            marker("save_start", step=trainer.global_step)
            # Slow storage paced in the writer itself (no FUSE mount needed).
            with ThrottledWriter(os.path.join(a.ckpt_dir, "rank0-save.pt"), a.rate) as f:
                torch.save(pl_module.state_dict(), f)
            marker("save_end")
        else:
            marker("wait_start", step=trainer.global_step)


dim = dim_for(a.model_mb, 4)
torch.manual_seed(0)
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64, dim)),
                                   batch_size=4)


def make_trainer(max_steps: int, resuming: bool = False):
    if a.rank0_save:
        return L.Trainer(
            accelerator="cpu", devices=int(os.environ["LOCAL_WORLD_SIZE"]),
            strategy=DDPStrategy(process_group_backend="gloo",
                                 timeout=datetime.timedelta(seconds=a.pg_timeout)),
            max_steps=max_steps, logger=False, enable_progress_bar=False,
            enable_model_summary=False, enable_checkpointing=False, callbacks=[Rank0Save()])
    return L.Trainer(
        accelerator="cpu", devices=int(os.environ["LOCAL_WORLD_SIZE"]),
        strategy=DDPStrategy(process_group_backend="gloo",
                             timeout=datetime.timedelta(seconds=a.pg_timeout)),
        max_steps=max_steps, logger=False, enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[Markers(resuming), ModelCheckpoint(dirpath=a.ckpt_dir, save_top_k=-1,
                                              every_n_train_steps=a.save_every)])


if a.rank0_save:
    from ncclwatch.demo.job import busy_thread
    busy_thread(0.6)
marker("ready", world=int(os.environ["WORLD_SIZE"]), framework=a.pkg)
make_trainer(a.max_steps).fit(Tiny(dim), data)
if a.resume:
    last = os.path.join(a.ckpt_dir, f"epoch=0-step={a.max_steps}.ckpt")
    make_trainer(a.max_steps + 1, resuming=True).fit(Tiny(dim), data, ckpt_path=last)
marker("done")
