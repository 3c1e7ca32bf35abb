"""transformers Trainer (DDP on CPU, gloo) whose checkpoints go to slow storage.

    torchrun --nproc-per-node 2 tests/workloads/fw_hf_trainer.py --ckpt-dir MOUNT

A tiny GPT-2 (built from a config, nothing downloaded) trains with
save_steps=1 and save_total_limit=1: process 0 writes each checkpoint with
Trainer._save_checkpoint -> save_model -> save_pretrained (safetensors), then
rotates the old one away; the other ranks go on to the next step and wait in
its first collective (the token count's Accelerator.gather). Markers come
from TrainerCallback.on_step_end, which runs just before the save.
"""

from __future__ import annotations

import datetime

import torch

from fwcommon import RANK, args, marker

a = args(__doc__, max_steps=(int, 2))

from transformers import (GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback,  # noqa: E402
                          TrainingArguments)


class Markers(TrainerCallback):
    def on_step_end(self, targs, state, control, **kw):
        if control.should_save:
            marker("save_start" if state.is_world_process_zero else "wait_start",
                   step=state.global_step)

    def on_save(self, targs, state, control, **kw):
        marker("save_done", step=state.global_step)


class Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        ids = torch.randint(0, 64, (16,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


# n_embd sized so the safetensors file is about --model-mb (fp32).
embd = max(32, int((a.model_mb * 2**20 / 4 / 12 / 2) ** 0.5) // 8 * 8)
model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=embd, n_layer=2,
                                   n_head=4, bos_token_id=0, eos_token_id=0))
targs = TrainingArguments(
    output_dir=a.ckpt_dir, max_steps=a.max_steps, per_device_train_batch_size=2,
    save_strategy="steps", save_steps=1, save_total_limit=1,
    logging_strategy="no", report_to=[], use_cpu=True, ddp_backend="gloo",
    ddp_timeout=int(a.pg_timeout), dataloader_num_workers=0, disable_tqdm=True,
    average_tokens_across_devices=True, seed=0)
trainer = Trainer(model=model, args=targs, train_dataset=Tokens(), callbacks=[Markers()])
marker("ready", world=targs.world_size, framework="transformers")
trainer.train()
marker("done")
