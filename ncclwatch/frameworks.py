"""Which training framework a job uses, from its stacks (and its loaded modules).

The fix a person can apply lives in the framework they use: a Lightning user
sets a strategy argument, a Trainer user an FSDP config key, a DeepSpeed
user a ZeRO key. The framework is read from the file paths of the frames
ncclwatch already has (the culprit's and the waiters' stacks: a training
loop's frames name its package) and, where known, from module names.
Rows are tried in order, most specific first: NeMo runs on Lightning and
Megatron, a Trainer on accelerate, everything on torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Iterable


@dataclass(frozen=True)
class Framework:
    id: str
    name: str
    #: fnmatch patterns over a frame's file path.
    paths: tuple[str, ...]
    #: Top-level module names (``sys.modules`` keys) that mean this framework.
    modules: tuple[str, ...] = ()


FRAMEWORKS: tuple[Framework, ...] = (
    Framework("nemo", "NeMo", ("*/nemo/*",), ("nemo",)),
    Framework("megatron", "Megatron-LM", ("*/megatron/*",), ("megatron",)),
    Framework("torchtitan", "torchtitan", ("*/torchtitan/*",), ("torchtitan",)),
    Framework("torchtune", "torchtune", ("*/torchtune/*", "*/recipes/*_distributed.py"),
              ("torchtune",)),
    Framework("composer", "Composer", ("*/composer/*",), ("composer",)),
    Framework("lightning", "Lightning",
              ("*/lightning/pytorch/*", "*/pytorch_lightning/*", "*/lightning/fabric/*",
               "*/lightning_fabric/*"),
              ("lightning", "pytorch_lightning", "lightning_fabric")),
    Framework("deepspeed", "DeepSpeed", ("*/deepspeed/*",), ("deepspeed",)),
    Framework("transformers", "transformers Trainer",
              ("*/transformers/trainer.py", "*/transformers/trainer_*.py"), ()),
    Framework("accelerate", "accelerate", ("*/accelerate/*",), ("accelerate",)),
    Framework("torch_fsdp2", "torch FSDP2 (fully_shard)",
              ("*/torch/distributed/fsdp/_fully_shard/*",
               "*/torch/distributed/_composable/fsdp/*"), ()),
    Framework("torch_fsdp1", "torch FSDP1 (FullyShardedDataParallel)",
              ("*/torch/distributed/fsdp/*",), ()),
    Framework("torch_dcp", "torch.distributed.checkpoint",
              ("*/torch/distributed/checkpoint/*",), ()),
    Framework("torch", "PyTorch", (), ("torch",)),
)

BY_ID: dict[str, Framework] = {f.id: f for f in FRAMEWORKS}
DEFAULT = BY_ID["torch"]


def detect(files: Iterable[str] = (), modules: Iterable[str] = ()) -> Framework:
    """The most specific framework any frame file or loaded module names."""
    # Rooted, so that short paths ("lightning/pytorch/...", as the API shows
    # frames below site-packages) match the same patterns as full ones.
    files = ["/" + f.replace("\\", "/").lstrip("/") for f in files if f]
    tops = {m.partition(".")[0] for m in modules}
    for fw in FRAMEWORKS:
        if tops.intersection(fw.modules) and fw is not DEFAULT:
            return fw
        if any(fnmatchcase(f, p) for f in files for p in fw.paths):
            return fw
    return DEFAULT


def from_stacks(stacks: Iterable[dict | None]) -> Framework:
    """``detect`` over stack views (``{"frames": [{"file": ...}]}``) as the API has them."""
    return detect(fr.get("file", "") for s in stacks if s for fr in s.get("frames", ()))
