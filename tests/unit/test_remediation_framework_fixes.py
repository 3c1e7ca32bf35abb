"""Each framework's fix is valid in that framework, and a wrong key fails its check."""

from __future__ import annotations

import os

import pytest

from ncclwatch import frameworks
from ncclwatch.remediation import FIXES, REMEDIES_FOR, Fix, fixes_for
from tests.harness.fixcheck import SnippetError, check


@pytest.mark.parametrize("fix", FIXES, ids=lambda f: f"{f.framework}-{f.remedy}")
def test_snippet_is_valid_for_its_framework(fix: Fix) -> None:
    check(fix)


#: (framework, remedy, text in the snippet, a plausible mistake)
MISTAKES = [
    ("lightning", "sharded_save", 'state_dict_type="sharded"', 'state_dict_type="shard"'),
    ("lightning", "sharded_save", "state_dict_type=", "state_dict_typ="),
    ("lightning", "checkpoint_timeout", "timeout=", "pg_timeout="),
    ("transformers", "sharded_save", '"state_dict_type"', '"fsdp_state_dict_type"'),
    ("transformers", "sharded_save", '"SHARDED_STATE_DICT"', '"SHARDED"'),
    ("transformers", "checkpoint_timeout", "ddp_timeout", "dist_timeout"),
    ("accelerate", "sharded_save", "fsdp_state_dict_type", "fsdp_state_dict_typ"),
    ("accelerate", "sharded_save", "SHARDED_STATE_DICT", "SHARDED"),
    ("accelerate", "sharded_save", "distributed_type", "distribution_type"),
    ("accelerate", "checkpoint_timeout", "timeout=", "timeout_s="),
    ("deepspeed", "sharded_save", "stage3_gather_16bit_weights_on_model_save",
     "gather_16bit_weights_on_save"),
    ("deepspeed", "checkpoint_timeout", "timeout=", "pg_timeout="),
    ("torch", "offload_gather", "cpu_offload=True", "offload_to_cpu=True"),
    ("torch", "checkpoint_timeout", "timeout=", "timeout_s="),
    ("torch", "async_save", "checkpoint_id=", "path="),
    ("torch_fsdp1", "offload_gather", "rank0_only=True", "rank_0_only=True"),
    ("megatron", "async_save", "--async-save", "--async-checkpoint"),
    ("megatron", "sharded_save", "torch_dist", "torch-dist"),
    ("nemo", "async_save", "ckpt_async_save", "async_save"),
    ("torchtitan", "async_save", "async_with_pinned_mem", "pinned"),
    ("torchtitan", "async_save", "async_mode", "async"),
    ("torchtune", "async_save", "enable_async_checkpointing", "async_checkpointing"),
    ("composer", "sharded_save", '"sharded"', '"shard"'),
    ("composer", "checkpoint_timeout", "dist_timeout", "timeout"),
]


@pytest.mark.parametrize("framework,remedy,good,bad", MISTAKES,
                         ids=[f"{m[0]}-{m[3]}" for m in MISTAKES])
def test_a_wrong_key_fails_the_check(framework: str, remedy: str, good: str, bad: str) -> None:
    fix = next(f for f in FIXES if (f.framework, f.remedy) == (framework, remedy))
    assert good in fix.snippet
    wrong = Fix(fix.framework, fix.remedy, fix.text, fix.lang, fix.snippet.replace(good, bad))
    with pytest.raises(Exception) as err:
        check(wrong)
    assert not isinstance(err.value, (NameError, SyntaxError)), err.value


def test_every_framework_has_a_fix_for_a_save_that_overruns() -> None:
    for fw in frameworks.FRAMEWORKS:
        got = fixes_for(fw.id, "save_overruns_watchdog")
        assert got, fw.id
        assert all(f.framework in (fw.id, "torch") for f in got)
        if fw.id not in {"torch_fsdp1", "torch_fsdp2", "torch_dcp"}:
            assert all(f.framework == fw.id for f in got), fw.id  # its own words only


def test_every_save_and_load_root_cause_has_remedies() -> None:
    for rc, remedies in REMEDIES_FOR.items():
        assert fixes_for("torch", rc), rc


DS = "/venv/lib/python3.11/site-packages/"


@pytest.mark.parametrize("files,expected", [
    ([DS + "lightning/pytorch/trainer/trainer.py", DS + "torch/serialization.py"], "lightning"),
    ([DS + "pytorch_lightning/loops/fit_loop.py"], "lightning"),
    ([DS + "transformers/trainer.py", DS + "accelerate/accelerator.py"], "transformers"),
    ([DS + "transformers/modeling_utils.py", DS + "accelerate/accelerator.py"], "accelerate"),
    ([DS + "deepspeed/runtime/engine.py", DS + "transformers/trainer.py"], "deepspeed"),
    ([DS + "torch/distributed/fsdp/_fully_shard/_fully_shard.py"], "torch_fsdp2"),
    ([DS + "torch/distributed/fsdp/_state_dict_utils.py"], "torch_fsdp1"),
    ([DS + "torch/distributed/checkpoint/state_dict_saver.py"], "torch_dcp"),
    # Source checkouts: the path alone is not an import (the agent's package
    # evidence is: test_a_source_checkout_is_an_import_a_user_dir_is_not).
    (["/src/torchtitan/torchtitan/train.py"], "torch"),
    (["/src/torchtune/recipes/full_finetune_distributed.py"], "torch"),
    (["/opt/Megatron-LM/megatron/training/training.py"], "torch"),
    (["/home/alice/megatron/train.py", DS + "torch/serialization.py"], "torch"),
    (["/home/alice/composer/train.py", "/home/alice/recipes/lora_distributed.py"], "torch"),
    ([DS + "megatron/core/dist_checkpointing/serialization.py"], "megatron"),
    ([DS + "nemo/lightning/pytorch/strategies/megatron_strategy.py",
      DS + "megatron/core/dist_checkpointing/serialization.py",
      DS + "lightning/pytorch/trainer/trainer.py"], "nemo"),
    ([DS + "composer/trainer/trainer.py"], "composer"),
    (["/job/train.py", DS + "torch/serialization.py"], "torch"),
])
def test_framework_from_stack_files(files: list[str], expected: str) -> None:
    assert frameworks.detect(files).id == expected


def test_framework_from_loaded_modules() -> None:
    assert frameworks.detect([], ["deepspeed.runtime.engine", "torch"]).id == "deepspeed"
    assert frameworks.detect([], ["torch"]).id == "torch"
    # imported modules decide; paths confirm (and pick the part of a package)
    assert frameworks.detect(["/src/torchtitan/torchtitan/train.py"], ["torchtitan"]).id \
        == "torchtitan"
    assert frameworks.detect(["/opt/Megatron-LM/megatron/training/training.py"],
                             ["megatron"]).id == "megatron"
    assert frameworks.detect(["/job/trainer.py"], ["transformers", "torch"]).id == "torch"


def test_a_frame_outranks_a_package_imported_beside_it() -> None:
    """The transformers Trainer imports DeepSpeed when it is installed (a
    matrix row's ranks printed DeepSpeed's accelerator warning and the agent
    saw the package): a Trainer job's stacks in trainer.py, with no DeepSpeed
    frame, get the Trainer's fix; a DeepSpeed engine frame still picks DeepSpeed."""
    trainer = [DS + "transformers/trainer.py", DS + "torch/serialization.py"]
    imported = ["deepspeed", "transformers", "accelerate", "torch"]
    assert frameworks.detect(trainer, imported).id == "transformers"
    assert frameworks.detect(trainer + [DS + "deepspeed/runtime/engine.py"], imported).id \
        == "deepspeed"
    assert frameworks.detect([DS + "torch/serialization.py"], imported).id == "deepspeed"


def _script(path, body: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(body or "import time\nprint('ready', flush=True)\ntime.sleep(60)\n")


def test_a_source_checkout_is_an_import_a_user_dir_is_not(tmp_path) -> None:
    """Issue 29, item 8: ``*/megatron/*`` gave a user's directory named megatron
    Megatron's fix. Real processes, their real frames (py-spy) and maps, the
    agent's import evidence, and the daemon's diagnosis."""
    import asyncio
    import subprocess
    import sys

    from ncclwatch.agent import imports
    from ncclwatch.agent.launchers import read_maps
    from ncclwatch.agent.pyspy import PySpy
    from ncclwatch.daemon.api import jobs_view
    from ncclwatch.daemon.core import Daemon, DaemonConfig
    from ncclwatch.stacks import Frame, stack_id
    from tests.harness.tools import need
    from tests.harness.reports import checkpoint_job, stack_pb

    # A user's directory named megatron (no package), and a Megatron-LM checkout
    # on PYTHONPATH (megatron/ and megatron/training/ are packages).
    user = tmp_path / "alice" / "megatron" / "train.py"
    _script(user)
    repo = tmp_path / "Megatron-LM"
    (repo / "megatron").mkdir(parents=True)
    (repo / "megatron" / "__init__.py").write_text("")
    _script(repo / "megatron" / "training" / "__init__.py", "# package")
    _script(repo / "megatron" / "training" / "loop.py")
    _script(repo / "pretrain_gpt.py", "import megatron.training.loop\n")
    pyspy = PySpy(need("py-spy"))
    cases = [([sys.executable, str(user)], {}, "torch"),
             ([sys.executable, str(repo / "pretrain_gpt.py")], {"PYTHONPATH": str(repo)},
              "megatron")]
    for argv, env, expected in cases:
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True,
                             env={**os.environ, **env})
        try:
            assert p.stdout.readline().strip() == "ready"
            threads = asyncio.run(pyspy.dump(p.pid))
            files = [f.filename for t in threads for f in t.stack.frames]
            assert any(f.endswith(("train.py", "loop.py")) for f in files), files
            found = imports.FramePackages().of_files(p.pid, files)
            found |= imports.of_maps(read_maps(p.pid) or "")
        finally:
            p.kill()
            p.wait()
        assert ("megatron" in found) == (expected == "megatron"), (argv, found)
        # The daemon's diagnosis of a stalled save in that job names the framework.
        d = Daemon(DaemonConfig())
        req = checkpoint_job("job-f", world=2)
        frames = [Frame("save", f, 1) for f in files]
        req.report.stacks.append(stack_pb(frames))
        s0 = req.report.samples[0]
        s0.stack_id = stack_id(frames)
        s0.job.packages.extend(sorted(found))
        d.ingest(req, now=100.0)
        d.tick(now=100.0)
        (stall,) = jobs_view(d, now=100.0)["jobs"][0]["stalls"]
        fw = stall["diagnosis"]["framework"]["id"]
        assert fw == expected, (argv, found, fw)
