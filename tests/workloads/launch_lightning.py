"""Lightning's own launcher: ``python launch_lightning.py`` with
``Trainer(accelerator="cpu", devices=3, strategy="ddp")``. Rank 0 is this
very process (no rank variables at all); Lightning starts ranks 1-2 as
children with LOCAL_RANK/NODE_RANK/WORLD_SIZE/MASTER_* but no RANK.
In the first training step rank 0 stalls in a slow save, the others wait
in the strategy's barrier.
"""

from __future__ import annotations

import argparse
import datetime
import os
import time

import lightning as L
import torch
from lightning.pytorch.strategies import DDPStrategy

from ncclwatch.demo.slow_storage import ThrottledWriter
from tests.workloads import launch_job


class Stall(L.LightningModule):
    def __init__(self, args) -> None:
        super().__init__()
        self.args = args
        self.layer = torch.nn.Linear(4, 4)

    def training_step(self, batch, idx):
        rank = self.global_rank
        launch_job.RANK = rank
        if idx == 0:
            launch_job.marker("ready")
            while not os.path.exists(self.args.go):
                time.sleep(0.1)
            if rank == 0:
                launch_job.marker("save_start")
                size = self.args.mb * 2**20
                torch.save({"w": torch.zeros(size // 4)},
                           ThrottledWriter(os.path.join(self.args.dir, f"ckpt-{os.getpid()}.pt"),
                                           size / self.args.save_seconds))
            else:
                launch_job.marker("wait_start")
            self.trainer.strategy.barrier()
            launch_job.marker("done")
        return self.layer(batch[0]).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--devices", type=int, default=3)
    launch_job.add_stall_args(p)
    args = p.parse_args()
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4)),
                                       batch_size=2)
    trainer = L.Trainer(accelerator="cpu", devices=args.devices,
                        strategy=DDPStrategy(process_group_backend="gloo",
                                             timeout=datetime.timedelta(seconds=args.pg_timeout)),
                        max_steps=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Stall(args), data)


if __name__ == "__main__":
    main()
