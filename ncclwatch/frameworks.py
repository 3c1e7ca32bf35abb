"""Which training framework a job uses: what it imported decides, paths only confirm.

The fix a person can apply lives in the framework they use: a Lightning user
sets a strategy argument, a Trainer user an FSDP config key, a DeepSpeed
user a ZeRO key. A framework counts only when its top-level package is
imported, by evidence the node has of the rank (``agent/imports.py``): a
frame or a mapped shared object under ``site-packages``/``dist-packages``, or a
frame in a source tree's package (a directory with ``__init__.py``). A
directory that merely has a framework's name (``/home/alice/megatron/train.py``)
is not an import. Where a framework is one part of an imported package (the
transformers Trainer, torch's FSDP and DCP), a frame in that part picks it.
Rows are tried in order, most specific first: NeMo runs on Lightning and
Megatron, a Trainer on accelerate, everything on torch; a row whose frames
the stacks show before a row only imported (packages import their
neighbours).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Iterable


@dataclass(frozen=True)
class Framework:
    id: str
    name: str
    #: fnmatch patterns over a frame's file path: they confirm an import, and
    #: pick the part of a package (``part``), never decide alone.
    paths: tuple[str, ...]
    #: Top-level packages (``sys.modules`` keys) one of which must be imported.
    modules: tuple[str, ...] = ()
    #: One part of an imported package: a frame in ``paths`` is needed too.
    part: bool = False


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
              ("*/transformers/trainer.py", "*/transformers/trainer_*.py"), ("transformers",),
              part=True),
    Framework("accelerate", "accelerate", ("*/accelerate/*",), ("accelerate",)),
    Framework("torch_fsdp2", "torch FSDP2 (fully_shard)",
              ("*/torch/distributed/fsdp/_fully_shard/*",
               "*/torch/distributed/_composable/fsdp/*"), ("torch",), part=True),
    Framework("torch_fsdp1", "torch FSDP1 (FullyShardedDataParallel)",
              ("*/torch/distributed/fsdp/*",), ("torch",), part=True),
    Framework("torch_dcp", "torch.distributed.checkpoint",
              ("*/torch/distributed/checkpoint/*",), ("torch",), part=True),
    Framework("torch", "PyTorch", (), ("torch",)),
)

BY_ID: dict[str, Framework] = {f.id: f for f in FRAMEWORKS}
DEFAULT = BY_ID["torch"]


#: The top-level package of a file installed under site-packages/dist-packages:
#: ``.../site-packages/megatron/core/x.py`` -> megatron, ``.../_foo.cpython-311-x.so``
#: -> _foo (not ``numpy.libs`` or ``*.dist-info``).
_INSTALLED = re.compile(
    r"/(?:site|dist)-packages/([A-Za-z_]\w*)(?:/|\.py$|\.pyc$|\.cpython-|\.abi3\.|\.so$)")


def installed_package(path: str) -> str | None:
    m = _INSTALLED.search(path.replace("\\", "/"))
    return m.group(1) if m else None


def imported(files: Iterable[str] = (), modules: Iterable[str] = ()) -> set[str]:
    """Top-level packages evidenced as imported: ``modules`` (the agent's
    evidence, dotted names allowed) and installed files among ``files``."""
    out = {m.partition(".")[0] for m in modules if m}
    out.update(p for f in files if f and (p := installed_package(f)))
    return out


def detect(files: Iterable[str] = (), modules: Iterable[str] = ()) -> Framework:
    """The most specific framework whose package is imported and whose frames
    the stacks show; else the most specific one imported (a part of a package
    needs its frame either way).

    A frame outranks a bare import: packages import their neighbours when
    installed (the transformers Trainer imports DeepSpeed, which then shows in
    the rank's evidence), and a Trainer job's stacks in ``trainer.py`` with no
    DeepSpeed frame is a Trainer user's, not a DeepSpeed engine's."""
    # Rooted, so that short paths ("lightning/pytorch/...", as the API shows
    # frames below site-packages) match the same patterns as full ones.
    files = ["/" + f.replace("\\", "/").lstrip("/") for f in files if f]
    tops = imported(files, modules)
    candidates = [fw for fw in FRAMEWORKS if tops.intersection(fw.modules)]
    for fw in candidates:
        if fw.paths and any(fnmatchcase(f, p) for f in files for p in fw.paths):
            return fw
    for fw in candidates:
        if not fw.part:
            return fw
    return DEFAULT
