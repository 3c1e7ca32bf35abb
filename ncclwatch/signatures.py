"""Stack signatures: which frames mean which rank state (data, not code).

Each row names a source file (a glob on the path, matched from the end) and
the function names that mean a state or a collective. py-spy prints the
qualified name on Python 3.11+ (``_BaseDataLoaderIter.__next__``), the bare
``co_name`` before; rows hold the bare name and match either.
Facts behind the rows: ../shared/reference/torch-signals.md; every row that
a real job can produce here is exercised by a py-spy fixture in tests/data.

Classification keeps two facts apart, because a rank can be both at once:
*what* it works on (saving, gathering_state_dict, loading: the innermost such
frame wins, so ``torch.save`` inside HF's ``_save_checkpoint`` is saving) and
*which collective* it is blocked in (the outermost c10d frame, so
``broadcast_object_list`` wins over the ``broadcast`` it calls). A rank
gathering a state dict while inside ``all_gather`` is a participant waiting
for someone, not the rank the others wait for.

Precedence between rows is this rule (``Classifier.classify``), never the
order of the table:

1. *Work* rows (frames that move the checkpoint's bytes or gather its
   tensors) name the activity; the innermost one wins, except that a gather
   inside a load is that load's own unshard, so LOADING outranks
   GATHERING_STATE_DICT wherever it sits (``OUTRANKS``).
2. *Span* rows (a framework's checkpoint entry points: Lightning's
   ``Trainer.save_checkpoint``, HF's ``_save_checkpoint``, accelerate's
   ``save_state``, DeepSpeed's ``save_checkpoint``) name the activity of what
   runs below them that no row knows (shutil's copy, fsspec, os calls), and
   only when no work row matched and no collective is inside them: a rank in
   the barrier that closes ``Trainer.save_checkpoint`` waits like any other.
3. The outermost collective frame names the op.
4. Fallback rows (dataloader, device wait, idle) only without 1-3.
5. A rank whose main thread waits (idle) while another of its threads is in
   checkpoint work takes that thread's state (``classify_rank``): DCP's
   ``async_save`` writes in a thread while the main thread sits in
   ``Future.result()``. A main thread that computes or waits in a collective
   keeps its own state: an async save overlapped with training is no stall.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Iterable, Sequence

from ncclwatch.model import CHECKPOINT_STATES
from ncclwatch.model import CollectiveOp as Op
from ncclwatch.model import RankState as S
from ncclwatch.stacks import Frame, Stack, ThreadDump, main_thread


@dataclass(frozen=True, slots=True)
class Signature:
    """Frames named ``names`` in a file matching ``path`` mean ``state``/``op``."""

    path: str
    names: frozenset[str]
    state: S | None = None
    op: Op | None = None
    # Fallback states (dataloader, idle, device_wait) count only as the
    # innermost Python frame, where the thread actually waits.
    innermost_only: bool = False
    #: A framework's checkpoint entry point (rule 2 of the module docstring).
    span: bool = False


def _sig(path: str, names: str, state: S | None = None, op: Op | None = None,
         innermost_only: bool = False) -> Signature:
    return Signature(path, frozenset(names.split()), state, op, innermost_only)


def _span(path: str, names: str, state: S) -> Signature:
    return Signature(path, frozenset(names.split()), state, span=True)


#: Activity -> the activity that outranks it from anywhere on the stack (rule 1).
OUTRANKS: dict[S, S] = {S.GATHERING_STATE_DICT: S.LOADING}

#: Main-thread states that may be waiting on one of the rank's own threads (rule 5).
DELEGATING_STATES: frozenset[S] = frozenset({S.IDLE})


_C10D = "*/torch/distributed/distributed_c10d.py"
_FUNCOL = "*/torch/distributed/_functional_collectives.py"
_DS_COMM = "*/deepspeed/comm/*.py"
_SER = "*/torch/serialization.py"
_DSD = "*/torch/distributed/checkpoint/state_dict.py"
_SDU = "*/torch/distributed/_state_dict_utils.py"
# Lightning ships as `lightning` (fabric inside) and as `pytorch_lightning` + `lightning_fabric`.
_LIGHTNING = ("lightning/pytorch", "pytorch_lightning")
_FABRIC = ("lightning/fabric", "lightning_fabric")

#: Checkpoint work: saving, gathering a full state dict, loading.
ACTIVITY_SIGNATURES: tuple[Signature, ...] = (
    # torch.save; write_record is C++ and never a frame.
    _sig(_SER, "save _save _legacy_save persistent_id", S.SAVING),
    _sig("*/safetensors/torch.py", "save_file save", S.SAVING),
    _sig("*/torch/distributed/checkpoint/filesystem.py",
         "write_data _write_data _write_files_from_queue _write_item", S.SAVING),
    _sig("*/torch/distributed/checkpoint/state_dict_saver.py",
         "save async_save _save_state_dict save_state_dict", S.SAVING),
    _sig("*/deepspeed/runtime/checkpoint_engine/torch_checkpoint_engine.py", "save", S.SAVING),
    # Lightning's atomic save: torch.save to a buffer, then an fsspec transaction
    # whose commit moves a temp file into place (shutil's copy across filesystems).
    *(_sig(f"*/{pkg}/utilities/cloud_io.py", "_atomic_save", S.SAVING) for pkg in _FABRIC),
    # Full state dict gathers: FSDP1, FSDP2/DCP, DeepSpeed ZeRO-3, HF.
    _sig("*/torch/distributed/fsdp/_state_dict_utils.py",
         "_full_pre_state_dict_hook _full_post_state_dict_hook "
         "_enter_unshard_params_ctx _common_unshard_post_state_dict_hook",
         S.GATHERING_STATE_DICT),
    _sig("*/torch/distributed/fsdp/_unshard_param_utils.py",
         "_unshard_fsdp_state_params _unshard_params _unshard_params_for_summon",
         S.GATHERING_STATE_DICT),
    _sig("*/torch/distributed/fsdp/_optim_utils.py",
         "_optim_state_dict _map_param_key_to_optim_keys _gather_all_orig_param_state "
         "_allgather_orig_param_states",
         S.GATHERING_STATE_DICT),
    _sig("*/torch/distributed/fsdp/fully_sharded_data_parallel.py",
         "full_optim_state_dict optim_state_dict _optim_state_dict_impl",
         S.GATHERING_STATE_DICT),
    _sig(_SDU, "_gather_state_dict _iterate_state_dict _all_gather_sharded_tensor "
         "_offload_state_dict_to_cpu", S.GATHERING_STATE_DICT),
    _sig(_DSD, "get_model_state_dict get_optimizer_state_dict get_state_dict "
         "_get_model_state_dict _get_optim_state_dict _maybe_full_or_cpu_state_dict",
         S.GATHERING_STATE_DICT),
    _sig("*/deepspeed/runtime/engine.py", "_zero3_consolidated_16bit_state_dict",
         S.GATHERING_STATE_DICT),
    _sig("*/deepspeed/runtime/zero/partition_parameters.py", "__enter__",
         S.GATHERING_STATE_DICT),
    # ZeroRedundancyOptimizer gathers every optimizer shard on one rank before a save.
    _sig("*/torch/distributed/optim/zero_redundancy_optimizer.py", "consolidate_state_dict",
         S.GATHERING_STATE_DICT),
    _sig("*/accelerate/accelerator.py", "get_state_dict", S.GATHERING_STATE_DICT),
    # Loading: torch.load, DCP load, restoring a full state dict.
    _sig(_SER, "load _load _legacy_load persistent_load", S.LOADING),
    _sig("*/safetensors/torch.py", "load_file load", S.LOADING),
    _sig("*/torch/distributed/checkpoint/state_dict_loader.py",
         "load _load_state_dict load_state_dict", S.LOADING),
    _sig("*/torch/distributed/checkpoint/filesystem.py", "read_data read_metadata", S.LOADING),
    _sig(_DSD, "set_model_state_dict set_optimizer_state_dict set_state_dict "
         "_load_model_state_dict _load_optim_state_dict", S.LOADING),
    _sig(_SDU, "_broadcast_state_dict _distribute_state_dict _broadcast_tensors",
         S.LOADING),
    # FSDP1 loading a full state dict unshards (all_gather) to copy it in: a load.
    _sig("*/torch/distributed/fsdp/_state_dict_utils.py",
         "_full_pre_load_state_dict_hook _full_post_load_state_dict_hook "
         "_pre_load_state_dict_hook _post_load_state_dict_hook", S.LOADING),
    _sig("*/deepspeed/runtime/checkpoint_engine/torch_checkpoint_engine.py", "load", S.LOADING),
    *(_sig(f"*/{pkg}/utilities/cloud_io.py", "_load", S.LOADING) for pkg in _FABRIC),
    *(_sig(f"*/{pkg}/utilities/load.py", "_lazy_load", S.LOADING) for pkg in _FABRIC),
)

#: Checkpoint entry points of the frameworks (span rows, rule 2).
SPAN_SIGNATURES: tuple[Signature, ...] = (
    *(row for pkg in _FABRIC for row in (
        _span(f"*/{pkg}/plugins/io/*.py", "save_checkpoint remove_checkpoint", S.SAVING),
        _span(f"*/{pkg}/plugins/io/*.py", "load_checkpoint", S.LOADING),
        _span(f"*/{pkg}/strategies/*.py", "save_checkpoint", S.SAVING),
        _span(f"*/{pkg}/strategies/*.py", "load_checkpoint", S.LOADING))),
    *(row for pkg in _LIGHTNING for row in (
        _span(f"*/{pkg}/trainer/trainer.py", "save_checkpoint", S.SAVING),
        _span(f"*/{pkg}/strategies/*.py", "save_checkpoint remove_checkpoint", S.SAVING),
        _span(f"*/{pkg}/strategies/*.py", "load_checkpoint", S.LOADING),
        _span(f"*/{pkg}/trainer/connectors/checkpoint_connector.py",
              "resume_start restore _restore_modules_and_callbacks restore_model "
              "restore_training_state", S.LOADING),
        _span(f"*/{pkg}/core/saving.py", "_load_from_checkpoint _load_state", S.LOADING))),
    _span("*/transformers/trainer.py",
          "_save_checkpoint save_model _save _save_optimizer_and_scheduler _save_rng_state "
          "_save_scaler", S.SAVING),
    _span("*/transformers/trainer.py",
          "_load_from_checkpoint _load_best_model _load_optimizer_and_scheduler "
          "_load_rng_state _load_scaler", S.LOADING),
    # Rotation deletes old checkpoints on the same (slow) storage.
    _span("*/transformers/trainer_utils.py", "rotate_checkpoints", S.SAVING),
    _span("*/transformers/modeling_utils.py", "save_pretrained", S.SAVING),
    _span("*/transformers/modeling_utils.py", "from_pretrained _load_pretrained_model",
          S.LOADING),
    _span("*/accelerate/accelerator.py", "save_state save_model save", S.SAVING),
    _span("*/accelerate/accelerator.py", "load_state", S.LOADING),
    _span("*/accelerate/checkpointing.py", "save_accelerator_state save_custom_state",
          S.SAVING),
    _span("*/accelerate/checkpointing.py", "load_accelerator_state load_custom_state",
          S.LOADING),
    _span("*/accelerate/utils/other.py", "save", S.SAVING),
    _span("*/deepspeed/runtime/engine.py",
          "save_checkpoint _save_checkpoint _save_zero_checkpoint save_16bit_model "
          "_create_checkpoint_file _copy_recovery_script _save_moe_checkpoint", S.SAVING),
    _span("*/deepspeed/runtime/engine.py",
          "load_checkpoint _load_checkpoint _load_zero_checkpoint", S.LOADING),
)

#: Collectives, c10d and its wrappers. Object variants have their own op.
COLLECTIVE_SIGNATURES: tuple[Signature, ...] = tuple(
    _sig(path, names, op=op)
    for path in (_C10D, _DS_COMM)
    for names, op in (
        # Single-tensor spellings and the object point-to-point calls (which
        # run send/recv inside: the outermost frame names them).
        ("all_gather_single", Op.ALL_GATHER),
        ("reduce_scatter_single", Op.REDUCE_SCATTER),
        ("send_object_list", Op.SEND),
        ("recv_object_list", Op.RECV),
        ("barrier", Op.BARRIER),
        ("monitored_barrier", Op.MONITORED_BARRIER),
        ("broadcast", Op.BROADCAST),
        ("all_reduce all_reduce_coalesced", Op.ALL_REDUCE),
        ("all_gather all_gather_into_tensor _all_gather_base all_gather_coalesced "
         "all_gather_base", Op.ALL_GATHER),
        ("gather", Op.GATHER),
        ("scatter", Op.SCATTER),
        ("reduce", Op.REDUCE),
        ("reduce_scatter reduce_scatter_tensor _reduce_scatter_base reduce_scatter_base",
         Op.REDUCE_SCATTER),
        ("all_to_all all_to_all_single", Op.ALL_TO_ALL),
        ("send", Op.SEND),
        ("recv", Op.RECV),
        ("all_gather_object", Op.ALL_GATHER_OBJECT),
        ("gather_object", Op.GATHER_OBJECT),
        ("broadcast_object_list", Op.BROADCAST_OBJECT_LIST),
        ("scatter_object_list", Op.SCATTER_OBJECT_LIST),
    )
) + (
    _sig(_FUNCOL, "broadcast", op=Op.BROADCAST),
    _sig(_FUNCOL, "all_reduce all_reduce_coalesced", op=Op.ALL_REDUCE),
    _sig(_FUNCOL, "all_gather_tensor all_gather_single all_gather_tensor_autograd "
         "all_gather_into_tensor_coalesced", op=Op.ALL_GATHER),
    _sig(_FUNCOL, "reduce_scatter_tensor reduce_scatter_single "
         "reduce_scatter_tensor_coalesced", op=Op.REDUCE_SCATTER),
    _sig(_FUNCOL, "all_to_all_single", op=Op.ALL_TO_ALL),
    _sig(_FUNCOL, "wait_tensor wait", op=Op.WAIT),
)

#: Where a thread waits when it is in neither checkpoint work nor a collective.
FALLBACK_SIGNATURES: tuple[Signature, ...] = (
    _sig("*/torch/utils/data/dataloader.py",
         "__next__ _next_data _get_data _try_get_data _next_index", S.DATALOADER),
    _sig("*/torch/utils/data/_utils/fetch.py", "fetch", S.DATALOADER),
    _sig("*/torch/cuda/__init__.py", "synchronize", S.DEVICE_WAIT, innermost_only=True),
    _sig("*/torch/cuda/streams.py", "synchronize wait query", S.DEVICE_WAIT,
         innermost_only=True),
    _sig("*/threading.py", "wait join _wait_for_tstate_lock", S.IDLE, innermost_only=True),
    _sig("*/queue.py", "get", S.IDLE, innermost_only=True),
    _sig("*/selectors.py", "select", S.IDLE, innermost_only=True),
)


@dataclass(frozen=True, slots=True)
class Classification:
    state: S
    op: Op = Op.NONE

    @property
    def blocked_in_collective(self) -> bool:
        return self.op is not Op.NONE


UNKNOWN = Classification(S.UNKNOWN)


class Classifier:
    """Matches frames against signature rows, indexed by function name."""

    def __init__(self, signatures: Iterable[Signature]) -> None:
        self._by_name: dict[str, list[Signature]] = {}
        signatures = tuple(signatures)
        self._rank = {sig: i for i, sig in enumerate(signatures)}
        for sig in signatures:
            for name in sig.names:
                self._by_name.setdefault(name, []).append(sig)

    def _match(self, frame: Frame) -> Signature | None:
        # py-spy names frames by qualified name on 3.11+ ("Class.method",
        # "f.<locals>.g"): rows name the function itself.
        rows = self._by_name.get(frame.name.rpartition(".")[2])
        if not rows:
            return None
        path = frame.filename.replace("\\", "/")
        for sig in rows:
            if fnmatchcase(path, sig.path):
                return sig
        return None

    def classify(self, frames: Sequence[Frame]) -> Classification:
        """State and op of a thread from its frames (innermost first).

        Applies rules 1-4 of the module docstring.
        """
        if not frames:
            return UNKNOWN
        work: S | None = None        # innermost work row
        span: S | None = None        # innermost span row with no collective inside
        seen: set[S] = set()         # every work state on the stack (for OUTRANKS)
        op: Op | None = None
        fallback: Signature | None = None
        for depth, frame in enumerate(frames):
            sig = self._match(frame)
            if sig is None:
                continue
            if sig.op is not None:
                op = sig.op  # keep going: the outermost collective wins
            elif sig.span:
                if span is None and op is None:
                    span = sig.state
            elif sig.state in CHECKPOINT_STATES:
                seen.add(sig.state)
                if work is None:
                    work = sig.state
            elif depth == 0 or not sig.innermost_only:
                # Earlier table rows win: a main thread polling the DataLoader's
                # queue (selectors.select innermost) is in the dataloader.
                if fallback is None or self._rank[sig] < self._rank[fallback]:
                    fallback = sig
        if work is not None and OUTRANKS.get(work) in seen:
            work = OUTRANKS[work]
        activity = work if work is not None else span
        if activity is not None:
            return Classification(activity, op or Op.NONE)
        if op is not None:
            return Classification(S.COLLECTIVE, op)
        if fallback is not None:
            return Classification(fallback.state)
        return Classification(S.COMPUTE)

    def classify_rank(self, threads: Sequence[ThreadDump], pid: int
                      ) -> tuple[Classification, Stack] | None:
        """A rank's state from all its threads, and the stack that shows it (rule 5)."""
        main = main_thread(list(threads), pid)
        if main is None:
            return None
        own = self.classify(main.stack.frames)
        if own.state not in DELEGATING_STATES:
            return own, main.stack
        helpers = [(self.classify(t.stack.frames), t) for t in threads if t is not main]
        helpers = [(c, t) for c, t in helpers if c.state in CHECKPOINT_STATES]
        if not helpers:
            return own, main.stack
        # a thread doing the work before one waiting in the save's collective
        c, t = min(helpers, key=lambda h: h[0].blocked_in_collective)
        return c, t.stack


DEFAULT_CLASSIFIER = Classifier(ACTIVITY_SIGNATURES + SPAN_SIGNATURES + COLLECTIVE_SIGNATURES
                                + FALLBACK_SIGNATURES)


def classify(frames: Sequence[Frame]) -> Classification:
    return DEFAULT_CLASSIFIER.classify(frames)


def classify_rank(threads: Sequence[ThreadDump], pid: int) -> tuple[Classification, Stack] | None:
    return DEFAULT_CLASSIFIER.classify_rank(threads, pid)
