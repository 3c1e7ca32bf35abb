"""Check a remediation snippet with the framework's own code, so a wrong key fails.

Python snippets: every call whose callee the snippet imports is bound to
the callee's real signature (keywords must be named parameters, not
swallowed by ``**kwargs``; a constant passed for a ``Literal`` parameter
must be one of its values). Installed frameworks also construct or parse:
the transformers TrainingArguments (its fsdp_config keys against the keys
transformers reads), accelerate's config file through accelerate's own
loader and FSDP plugin, the DeepSpeed config through DeepSpeed's config
classes. Frameworks not installed here (Megatron-LM, NeMo, torchtitan,
torchtune, Composer) are checked against the names recorded below from
their sources.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import re
import shlex
import tempfile
import tomllib
import typing
from pathlib import Path
from typing import Any

import yaml

from ncclwatch.remediation import Fix

#: Recorded from the frameworks' sources (not installed in the test venv).
#: Megatron-LM megatron/training/arguments.py (core_r0.13): flags of the
#: checkpoint and distributed groups.
MEGATRON_FLAGS = frozenset({
    "--ckpt-format", "--async-save", "--ckpt-fully-parallel-save", "--ckpt-fully-parallel-load",
    "--no-ckpt-fully-parallel-save", "--use-dist-ckpt", "--ckpt-assume-constant-structure",
    "--dist-ckpt-strictness", "--save", "--load", "--save-interval",
    "--distributed-timeout-minutes", "--use-persistent-ckpt-worker",
})
MEGATRON_VALUES = {"--ckpt-format": {"torch", "torch_dist", "zarr", "torch_dcp", "fsdp_dtensor"}}
#: NeMo 2 nemo/lightning/pytorch/strategies/megatron_strategy.py, and Composer
#: composer/trainer/trainer.py: keyword arguments of the constructors used.
RECORDED_CALLS: dict[str, frozenset[str]] = {
    "nemo.lightning.MegatronStrategy": frozenset({
        "tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
        "sequence_parallel", "save_ckpt_format", "ckpt_async_save", "ckpt_torch_dist_multiproc",
        "ckpt_assume_constant_structure", "ckpt_parallel_save", "ckpt_parallel_save_within_dp",
        "ckpt_parallel_load", "ckpt_parallel_save_optim", "ckpt_load_directly_on_device",
        "ckpt_load_strictness", "timeout"}),
    "composer.Trainer": frozenset({
        "model", "train_dataloader", "max_duration", "parallelism_config", "save_folder",
        "save_interval", "save_overwrite", "load_path", "dist_timeout", "device",
        "precision", "optimizers", "schedulers"}),
}
#: Composer parallelism_config["fsdp"] keys (composer/utils/parallelism.py FSDPConfig).
COMPOSER_FSDP_KEYS = frozenset({
    "state_dict_type", "sharding_strategy", "cpu_offload", "mixed_precision", "use_orig_params",
    "sync_module_states", "load_monolith_rank0_only", "activation_checkpointing",
    "activation_cpu_offload", "verbose", "device_mesh", "data_parallel_shard_degree"})
COMPOSER_STATE_DICT_TYPES = {"full", "sharded"}
#: torchtitan torchtitan/config/job_config.py: [section] key -> allowed values (None: any).
TORCHTITAN_KEYS: dict[str, dict[str, set | None]] = {
    "checkpoint": {"enable_checkpoint": None, "enable": None, "folder": None, "interval": None,
                   "async_mode": {"disabled", "async", "async_with_pinned_mem"},
                   "last_save_model_only": None, "export_dtype": None, "keep_latest_k": None},
    "comm": {"init_timeout_seconds": None, "train_timeout_seconds": None,
             "trace_buf_size": None},
}
#: torchtune recipes/full_finetune_distributed.py: top-level keys it reads with cfg.get.
TORCHTUNE_KEYS = frozenset({"enable_async_checkpointing", "fsdp_cpu_offload", "resume_from_checkpoint",
                            "save_every_n_steps", "fsdp_reshard_after_forward"})


class SnippetError(AssertionError):
    pass


def check(fix: Fix) -> None:
    """Raise SnippetError (or the framework's own error) when the snippet is wrong."""
    checker = _CHECKERS.get((fix.framework, fix.lang)) or _CHECKERS.get(("*", fix.lang))
    if checker is None:
        raise SnippetError(f"no checker for {fix.framework}/{fix.lang}")
    checker(fix.snippet)


# -- python --------------------------------------------------------------------------


def _imports(tree: ast.Module) -> dict[str, str]:
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                names[a.asname or a.name.partition(".")[0]] = a.name if a.asname else \
                    a.name.partition(".")[0]
        elif isinstance(node, ast.ImportFrom):
            for a in node.names:
                names[a.asname or a.name] = f"{node.module}.{a.name}"
    return names


def _dotted(node: ast.expr) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def _resolve(path: str) -> Any:
    """The object a dotted path names, importing the longest module prefix."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(path)


def _literal_values(hint: Any) -> set | None:
    if typing.get_origin(hint) is typing.Literal:
        return set(typing.get_args(hint))
    if typing.get_origin(hint) in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        out: set = set()
        for arg in typing.get_args(hint):
            vals = _literal_values(arg)
            if vals is None and arg is not type(None):
                return None
            out |= vals or set()
        return out or None
    return None


def _hints(obj: Any) -> dict[str, Any]:
    target = obj.__init__ if inspect.isclass(obj) else obj
    try:
        return typing.get_type_hints(target)
    except Exception:
        return {}


def _annotation(obj: Any, sig: inspect.Signature, name: str) -> Any:
    """One parameter's annotation, evaluated where it is a string (when the
    callee's other hints cannot all be resolved, as Lightning's)."""
    ann = sig.parameters[name].annotation
    if isinstance(ann, str):
        target = obj.__init__ if inspect.isclass(obj) else obj
        scope = {**vars(typing), **getattr(inspect.getmodule(target), "__dict__", {})}
        try:
            return eval(ann, scope)  # noqa: S307 - the framework's own annotation
        except Exception:
            return None
    return ann


def check_python(snippet: str) -> None:
    tree = ast.parse(snippet)
    names = _imports(tree)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        dotted = _dotted(node.func)
        if dotted is None or dotted.partition(".")[0] not in names:
            continue  # a call on the job's own objects (model, optimizer, futures)
        head, _, rest = dotted.partition(".")
        path = names[head] + ("." + rest if rest else "")
        kws = [k.arg for k in node.keywords if k.arg is not None]
        try:
            obj = _resolve(path)
        except ImportError:
            recorded = RECORDED_CALLS.get(path)
            if recorded is None:
                raise SnippetError(f"{path}: not installed and not recorded")
            bad = set(kws) - recorded
            if bad:
                raise SnippetError(f"{path}: unknown keyword(s) {sorted(bad)}")
            _check_recorded_values(path, node)
            continue
        try:
            sig = inspect.signature(obj)
        except ValueError:  # a builtin (datetime.timedelta): call it with its constants
            obj(*map(ast.literal_eval, node.args),
                **{k.arg: ast.literal_eval(k.value) for k in node.keywords})
            continue
        named = {p for p, v in sig.parameters.items()
                 if v.kind not in (v.VAR_KEYWORD, v.VAR_POSITIONAL)}
        bad = set(kws) - named
        if bad:
            raise SnippetError(f"{path}: {sorted(bad)} not a parameter of {sig}")
        npos = sum(1 for a in node.args if not isinstance(a, ast.Starred))
        sig.bind_partial(*([None] * npos), **dict.fromkeys(kws))
        hints = _hints(obj)
        for k in node.keywords:
            if k.arg and isinstance(k.value, ast.Constant):
                allowed = _literal_values(hints.get(k.arg, _annotation(obj, sig, k.arg)))
                if allowed is not None and k.value.value not in allowed:
                    raise SnippetError(f"{path}({k.arg}={k.value.value!r}): not one of "
                                       f"{sorted(map(str, allowed))}")


def _check_recorded_values(path: str, call: ast.Call) -> None:
    if path != "composer.Trainer":
        return
    for k in call.keywords:
        if k.arg == "parallelism_config":
            cfg = ast.literal_eval(k.value)
            fsdp = cfg.get("fsdp", {})
            bad = set(fsdp) - COMPOSER_FSDP_KEYS
            if bad or set(cfg) - {"fsdp", "tp"}:
                raise SnippetError(f"composer parallelism_config: unknown {sorted(bad)}")
            if fsdp.get("state_dict_type", "full") not in COMPOSER_STATE_DICT_TYPES:
                raise SnippetError("composer state_dict_type")


def _exec(snippet: str) -> dict[str, Any]:
    ns: dict[str, Any] = {}
    exec(compile(snippet, "<snippet>", "exec"), ns)  # noqa: S102 - our own table's text
    return ns


def check_lightning(snippet: str) -> None:
    check_python(snippet)
    # Construct the strategy (and plugins) for real; a Trainer with an FSDP
    # strategy needs a GPU, so that one is only bound to its signature above.
    tree = ast.parse(snippet)
    tree.body = [st for st in tree.body if not (
        isinstance(st, ast.Assign) and isinstance(st.value, ast.Call)
        and _dotted(st.value.func) == "Trainer"
        and any(k.arg == "strategy" for k in st.value.keywords))]
    _exec(ast.unparse(tree))


def check_transformers(snippet: str) -> None:
    check_python(snippet)
    from accelerate.utils import FullyShardedDataParallelPlugin
    from transformers import TrainingArguments

    with tempfile.TemporaryDirectory() as tmp:
        ns = _exec(snippet.replace('"/ckpt/run"', repr(tmp)))
    args = ns["args"]
    assert isinstance(args, TrainingArguments)
    if args.fsdp_config and args.fsdp:
        src = inspect.getsource(TrainingArguments._process_fsdp_args)
        read = set(re.findall(r'fsdp_config(?:\.get\(|\[|\.setdefault\()"(\w+)"', src))
        read |= set(re.findall(r'"(\w+)" in self\.fsdp_config', src))
        given = set()
        for node in ast.walk(ast.parse(snippet)):
            if isinstance(node, ast.keyword) and node.arg == "fsdp_config":
                given |= set(ast.literal_eval(node.value))
        bad = given - read
        if bad:
            raise SnippetError(f"fsdp_config keys transformers never reads: {sorted(bad)}")
        FullyShardedDataParallelPlugin(**args.fsdp_plugin_args)


def check_accelerate_yaml(snippet: str) -> None:
    from accelerate.commands.config.config_args import ClusterConfig
    from accelerate.utils import FullyShardedDataParallelPlugin

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.yaml"
        path.write_text(snippet)
        cfg = ClusterConfig.from_yaml_file(str(path))
    fsdp = cfg.fsdp_config or {}
    if not all(k.startswith("fsdp_") for k in fsdp):
        raise SnippetError(f"accelerate fsdp_config keys start with fsdp_: {sorted(fsdp)}")
    import dataclasses

    fields = {f.name for f in dataclasses.fields(FullyShardedDataParallelPlugin)}
    FullyShardedDataParallelPlugin(**{k if k in fields else k.removeprefix("fsdp_"): v
                                      for k, v in fsdp.items()})


def check_deepspeed_json(snippet: str) -> None:
    from deepspeed.runtime.config import DeepSpeedConfig
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    cfg = json.loads(snippet)
    DeepSpeedZeroConfig(**cfg["zero_optimization"])   # pydantic: extra keys forbidden
    DeepSpeedConfig({"train_batch_size": 1, **cfg})


def check_megatron_argv(snippet: str) -> None:
    argv = shlex.split(snippet)
    for i, a in enumerate(argv):
        if a.startswith("--"):
            if a not in MEGATRON_FLAGS:
                raise SnippetError(f"Megatron-LM has no flag {a}")
            allowed = MEGATRON_VALUES.get(a)
            if allowed is not None and (i + 1 >= len(argv) or argv[i + 1] not in allowed):
                raise SnippetError(f"{a} takes one of {sorted(allowed)}")


def check_torchtitan_toml(snippet: str) -> None:
    cfg = tomllib.loads(snippet)
    for section, keys in cfg.items():
        known = TORCHTITAN_KEYS.get(section)
        if known is None:
            raise SnippetError(f"torchtitan has no [{section}] recorded")
        for k, v in keys.items():
            if k not in known:
                raise SnippetError(f"torchtitan [{section}] has no {k}")
            if known[k] is not None and v not in known[k]:
                raise SnippetError(f"torchtitan {section}.{k} = {v!r}: not one of {known[k]}")


def check_torchtune_yaml(snippet: str) -> None:
    cfg = yaml.safe_load(snippet)
    bad = set(cfg) - TORCHTUNE_KEYS
    if bad:
        raise SnippetError(f"torchtune recipes read no {sorted(bad)}")


_CHECKERS = {
    ("*", "python"): check_python,
    ("lightning", "python"): check_lightning,
    ("transformers", "python"): check_transformers,
    ("accelerate", "yaml"): check_accelerate_yaml,
    ("deepspeed", "json"): check_deepspeed_json,
    ("megatron", "argv"): check_megatron_argv,
    ("torchtitan", "toml"): check_torchtitan_toml,
    ("torchtune", "yaml"): check_torchtune_yaml,
}
