"""Root causes of stalls and what to do about each (data, shared by every output).

One entry per root cause, not per stall kind: "rank 0 writes too slowly"
and "rank 0 will run out of memory" are both ``checkpoint_gather`` but need
different fixes. ``cause`` is a template filled from the incident's evidence
(daemon/diagnosis.py picks the entry); ``fix`` and ``example`` are rendered
as they are in ``/api/v1/jobs``, ``ncclwatch status`` and
docs/runbooks/<kind>.md (generated from this table: ``make runbooks``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ncclwatch.model import StallKind
from ncclwatch.timeoutsource import HOW_TO_STATE


@dataclass(frozen=True)
class RootCause:
    id: str
    kind: StallKind
    title: str
    #: One sentence, formatted with the evidence facts (see diagnosis.facts).
    cause: str
    fix: str
    example: str = ""
    #: The job dies unless someone acts, whatever the forecast says.
    always_at_risk: bool = False


_DCP_EXAMPLE = """\
# Every rank writes its own shard: no gather to rank 0, no rank waits for it.
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict

model_sd, optim_sd = get_state_dict(model, optimizer)
dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=f"/ckpt/step{step}")
# or overlap it with training: fut = dcp.async_save(...); fut.result() before the next save"""

_TIMEOUT_EXAMPLE = """\
# If rank 0 must write alone: let the others wait on a group with a long timeout,
# not in the next NCCL collective (whose watchdog fires after 10 minutes).
import datetime
ckpt_group = dist.new_group(backend="gloo", timeout=datetime.timedelta(hours=2))
if dist.get_rank() == 0:
    torch.save(full_state, path)
dist.barrier(group=ckpt_group)"""

_MEMORY_EXAMPLE = """\
# Gather shard by shard to host memory on rank 0 only, or do not gather at all (dcp.save).
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                          cpu_offload=True))
# FSDP1: FullStateDictConfig(offload_to_cpu=True, rank0_only=True)"""

_GATHER_ORDER_EXAMPLE = """\
# Every rank must call the state-dict gather at the same point of the program:
if step % save_every == 0:          # the same condition on every rank
    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    if dist.get_rank() == 0:
        torch.save(sd, path)"""

ROOT_CAUSES: tuple[RootCause, ...] = (
    # -- checkpoint_gather ------------------------------------------------------
    RootCause(
        "gather_out_of_memory", StallKind.CHECKPOINT_GATHER,
        "The checkpointing rank runs out of memory",
        "rank {rank} will run out of {device} memory in about {mem_eta}: {mem_used} of "
        "{mem_limit} used, growing {mem_rate}/s while it is {activity}; {waiting_n} rank(s) "
        "wait in {ops} and will hang until the watchdog fires in {remaining}.",
        "Do not materialise the full state on one rank: save sharded with "
        "torch.distributed.checkpoint (dcp.save), or FSDP SHARDED_STATE_DICT. If a full "
        "state dict is required, gather with cpu_offload=True (FSDP1: offload_to_cpu=True, "
        "rank0_only=True) and give that rank's host or cgroup more memory than the whole "
        "model state, optimizer included.",
        _MEMORY_EXAMPLE, always_at_risk=True),
    RootCause(
        "save_overruns_watchdog", StallKind.CHECKPOINT_GATHER,
        "The checkpoint write will outlast the watchdog",
        "rank {rank} is writing {expected} at {rate}/s ({written} done, size from the "
        "{expected_source}): the rest {fit}; {waiting_n} rank(s) wait in {ops}.",
        "Save sharded with torch.distributed.checkpoint so every rank writes its part "
        "(dcp.save / dcp.async_save), or FSDP SHARDED_STATE_DICT. Until then: let the "
        "other ranks wait on a gloo group with a long timeout instead of the next NCCL "
        "collective, or raise init_process_group(timeout=...) above the save time; write "
        "to faster local storage and copy to shared storage afterwards.",
        _DCP_EXAMPLE + "\n\n" + _TIMEOUT_EXAMPLE, always_at_risk=True),
    RootCause(
        "save_within_assumed_timeout", StallKind.CHECKPOINT_GATHER,
        "A one-rank checkpoint write against a timeout the job never stated",
        "rank {rank} is writing {expected} at {rate}/s (size from the {expected_source}) and "
        "should end in {eta}, but the job's watchdog timeout is not known: {timeout_note}; "
        "{waiting_n} rank(s) wait in {ops}.",
        "Take the evidence now, then find the job's timeout (init_process_group(timeout=...) "
        "or its framework's setting): a job that sets one shorter than this save dies first. "
        f"So that ncclwatch can count on it, {HOW_TO_STATE}. The pattern does not scale: "
        "plan for sharded checkpoints (torch.distributed.checkpoint).",
        _DCP_EXAMPLE + "\n\n" + _TIMEOUT_EXAMPLE),
    RootCause(
        "save_within_budget", StallKind.CHECKPOINT_GATHER,
        "A one-rank checkpoint write that fits the budget",
        "rank {rank} is writing {expected} at {rate}/s (size from the {expected_source}): "
        "the rest {fit}; {waiting_n} rank(s) wait in {ops}.",
        "Nothing to do now. The pattern does not scale: as the model or the storage "
        "latency grows this save will reach the watchdog; plan for sharded checkpoints "
        "(torch.distributed.checkpoint).",
        _DCP_EXAMPLE),
    RootCause(
        "slow_state_dict_gather", StallKind.CHECKPOINT_GATHER,
        "Gathering the full state dict is slow",
        "rank {rank} has been gathering the full state dict for {for_s} while "
        "{waiting_n} rank(s) wait in {ops}; the watchdog fires in {remaining}.",
        "A full state dict moves every parameter through one rank (and usually its host "
        "memory). Save sharded instead (dcp.save with get_state_dict, or FSDP "
        "SHARDED_STATE_DICT); if you need one file, convert offline with "
        "torch.distributed.checkpoint.format_utils.dcp_to_torch_save.",
        _DCP_EXAMPLE),
    RootCause(
        "slow_save", StallKind.CHECKPOINT_GATHER,
        "A one-rank checkpoint write with no end in sight yet",
        "rank {rank} has been {activity} for {for_s} ({written} of {expected} written, "
        "{rate}/s: no end forecast yet) while {waiting_n} rank(s) wait in {ops}; the "
        "watchdog fires in {remaining}.",
        "Save sharded with torch.distributed.checkpoint so no rank waits for another's "
        "write, or let the waiting ranks wait on a group with a timeout longer than the "
        "save. Keep the previous checkpoint in the same directory so ncclwatch can "
        "forecast the next one.",
        _DCP_EXAMPLE + "\n\n" + _TIMEOUT_EXAMPLE),
    # -- checkpoint_restore ------------------------------------------------------
    RootCause(
        "restore_out_of_memory", StallKind.CHECKPOINT_RESTORE,
        "The restoring rank runs out of memory",
        "rank {rank} will run out of {device} memory in about {mem_eta} while loading the "
        "checkpoint ({mem_used} of {mem_limit}, growing {mem_rate}/s); {waiting_n} rank(s) "
        "wait in {ops}.",
        "Load sharded (dcp.load) so each rank reads only its part, or load with "
        "torch.load(..., mmap=True, map_location='cpu') to avoid a second copy.",
        "sd = torch.load(path, mmap=True, map_location='cpu', weights_only=True)",
        always_at_risk=True),
    RootCause(
        "slow_restore", StallKind.CHECKPOINT_RESTORE,
        "One rank loads the full checkpoint while the others wait",
        "rank {rank} has been loading the checkpoint for {for_s} while {waiting_n} rank(s) "
        "wait in {ops} for the restored state; the watchdog fires in {remaining}.",
        "Load sharded with torch.distributed.checkpoint (dcp.load): every rank reads its "
        "own shard in parallel. With set_model_state_dict(broadcast_from_rank0=True) or "
        "FSDP sync_module_states, raise the process-group timeout for the restore.",
        "dcp.load({'model': model_sd}, checkpoint_id='/ckpt/step1000')\n"
        "set_model_state_dict(model, model_sd)"),
    # -- collective_hang -----------------------------------------------------------
    RootCause(
        "late_for_state_dict_gather", StallKind.COLLECTIVE_HANG,
        "A rank never reached the state-dict gather",
        "rank(s) {waiting} wait inside the full state-dict gather ({ops}) for rank(s) "
        "{culprits}, which are {culprit_states} instead of calling state_dict(); the "
        "watchdog fires in {remaining}.",
        "Every rank must enter the state-dict collective at the same point: check "
        "rank-dependent conditions around the save (`if rank == 0: model.state_dict()` "
        "deadlocks FSDP), and what the late rank is doing in its stack.",
        _GATHER_ORDER_EXAMPLE, always_at_risk=True),
    RootCause(
        "rank_in_dataloader", StallKind.COLLECTIVE_HANG,
        "A rank is stuck loading data",
        "rank(s) {culprits} are in the data loader for {for_s} while {waiting_n} rank(s) "
        "wait in {ops}; the watchdog fires in {remaining}.",
        "Look at the input pipeline of that rank: a slow or hung storage read, a "
        "DataLoader worker that died, or an uneven shard that makes one rank read more. "
        "More workers (num_workers, prefetch_factor) or faster storage for that node.",
        always_at_risk=True),
    RootCause(
        "rank_computing", StallKind.COLLECTIVE_HANG,
        "A rank is still computing",
        "rank(s) {culprits} have been computing for {for_s} while {waiting_n} rank(s) wait "
        "in {ops} they have not joined; the watchdog fires in {remaining}.",
        "A rank-dependent branch: extra work (evaluation, logging, a larger batch) on one "
        "rank, or a collective skipped on it. Make every rank run the same collectives in "
        "the same order; TORCH_DISTRIBUTED_DEBUG=DETAIL reports mismatches.",
        always_at_risk=True),
    RootCause(
        "rank_waiting_on_device", StallKind.COLLECTIVE_HANG,
        "A rank waits on its GPU",
        "rank(s) {culprits} are blocked at a device sync for {for_s} while {waiting_n} "
        "rank(s) wait in {ops}; the watchdog fires in {remaining}.",
        "On NCCL a rank's CPU runs ahead and blocks at the next .item()/.cpu()/"
        "synchronize: the collective it waits for is stuck on the GPU. Check that GPU "
        "(nvidia-smi, Xid errors), and the Flight Recorder dump for the last collective.",
        always_at_risk=True),
    RootCause(
        "rank_idle", StallKind.COLLECTIVE_HANG,
        "A rank sleeps or waits on something else",
        "rank(s) {culprits} are {culprit_states} for {for_s} (no collective on the stack) "
        "while {waiting_n} rank(s) wait in {ops}; the watchdog fires in {remaining}.",
        "The late rank waits for something outside torch.distributed: a lock, a file, a "
        "subprocess, a sleep or retry loop. Its stack shows where.",
        always_at_risk=True),
    RootCause(
        "all_ranks_in_collective", StallKind.COLLECTIVE_HANG,
        "Every rank waits in the same collective",
        "every rank ({waiting}) has waited in {ops} for {for_s} with no progress, and no "
        "rank is elsewhere: no rank of the job is late, so what holds the collective is a "
        "peer outside the job, the network, or a device; the watchdog fires in {remaining}.",
        "Now, before the watchdog fires: take the Flight Recorder (TORCH_FR_BUFFER_SIZE; "
        "ncclwatch shows which collective and sequence number each rank is in) and a "
        "native stack of every rank (py-spy dump --native). Then look below the "
        "collective: the network (NIC and link state, `ibstat`, run with NCCL_DEBUG=INFO "
        "NCCL_DEBUG_SUBSYS=INIT,NET for the interface NCCL chose), and the GPUs "
        "(`nvidia-smi`: a GPU at 100% utilisation runs a kernel that never ends, one "
        "idle at low power waits on its peers; `dmesg` for Xid errors). A process group "
        "that includes a rank outside this job (a subgroup, a second job on the same "
        "store) waits on that rank.",
        "py-spy dump --native --pid <pid>          # every rank: where it waits in C++\n"
        "NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET torchrun ...   # which NIC, which error",
        always_at_risk=True),
    # -- desync --------------------------------------------------------------------
    RootCause(
        "collective_order_mismatch", StallKind.DESYNC,
        "Ranks issued different collectives",
        "ranks wait in different collectives ({groups}) for {for_s}: the program issued "
        "collectives in a different order on rank(s) {culprits}; the watchdog fires in "
        "{remaining}.",
        "Make every rank issue the same collectives in the same order (no collective "
        "under a rank-dependent condition). TORCH_DISTRIBUTED_DEBUG=DETAIL checks each "
        "collective's op and shapes across ranks at run time.",
        "# in the job's environment, then read the error it raises:\n"
        "# TORCH_DISTRIBUTED_DEBUG=DETAIL torchrun --nproc-per-node 8 train.py",
        always_at_risk=True),
    # -- rank_lost -----------------------------------------------------------------
    RootCause(
        "rank_exited", StallKind.RANK_LOST,
        "A rank's process exited",
        "rank(s) {unknown} exited while {waiting_n} rank(s) wait in {ops} for them; they "
        "will hang until the watchdog fires in {remaining}.",
        "Find why it died: its log (Python traceback), the kernel log for the OOM killer "
        "(`dmesg | grep -i oom`), exit codes in the launcher. The job cannot continue; "
        "restart it from the last checkpoint.",
        always_at_risk=True),
    RootCause(
        "agent_silent", StallKind.RANK_LOST,
        "No news from some ranks",
        "rank(s) {unknown} have not been reported for a while (node or agent down, or a "
        "network partition) while {waiting_n} rank(s) wait in {ops}; the watchdog fires "
        "in {remaining}.",
        "Check the node of those ranks and its ncclwatch agent "
        "(`systemctl status ncclwatch-agent`); ncclwatch does not guess what a rank it "
        "cannot see is doing.",
        always_at_risk=True),
)

BY_ID: dict[str, RootCause] = {rc.id: rc for rc in ROOT_CAUSES}

#: Root causes only a post-mortem names (``ncclwatch diagnose``): live, these
#: failures look like the hang or the lost rank they cause, and the daemon's
#: entries above apply. ``cause`` here is filled by diagnose's own facts.
POSTMORTEM_CAUSES: tuple[RootCause, ...] = (
    RootCause(
        "nccl_network_error", StallKind.COLLECTIVE_HANG,
        "The network or the NCCL transport failed",
        "rank(s) {initiating} reported a transport error first ({evidence}); the other "
        "ranks failed after them.",
        "Look at the node of the first rank that reported it: NIC and link state "
        "(`ibstat`, `ip -s link`, switch logs), `dmesg` for Xid/PCIe errors, and run the "
        "job with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET to see which interface NCCL "
        "chose (set NCCL_SOCKET_IFNAME / NCCL_IB_HCA if it is the wrong one). Exclude the "
        "node and restart from the last checkpoint; nccl-tests all_reduce_perf across the "
        "suspect nodes confirms it.",
        "NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET torchrun ...   # which NIC, which error\n"
        "all_reduce_perf -b 8 -e 1G -f 2 -g 1                   # nccl-tests on the nodes",
        always_at_risk=True),
    RootCause(
        "rank_never_joined", StallKind.COLLECTIVE_HANG,
        "A rank never joined the collective the others waited in",
        "rank(s) {initiating} never started {op} while {waiting_n} rank(s) waited in it "
        "until the {timeout} timeout.",
        "Find what that rank did instead: a py-spy dump during the hang (ncclwatch shows "
        "it live), its last log lines, the Flight Recorder (TORCH_FR_BUFFER_SIZE=2000) for "
        "the last collective it started. Typical causes are a collective under a "
        "rank-dependent condition, an uneven number of batches (use join() or drop_last), "
        "or a long rank-local step (evaluation, logging, checkpointing) before it.",
        _GATHER_ORDER_EXAMPLE),
    RootCause(
        "collective_never_finished", StallKind.COLLECTIVE_HANG,
        "Every rank joined, and the collective itself never finished",
        "every rank of the group ({initiating}) enqueued {op} and timed out in it after "
        "{timeout}: no rank was missing, so what hung is the work on the devices or the "
        "transport between them.",
        "No rank is late: look below the collective. A kernel queued before it on a rank's "
        "stream that runs long or never ends (a custom kernel, a data-dependent loop, a "
        "GPU hang: `nvidia-smi` shows 100% utilisation, `dmesg` may show an Xid), or an "
        "NCCL transport that stopped (run with NCCL_DEBUG=INFO, check NICs and links, "
        "nccl-tests). The Flight Recorder with TORCH_NCCL_ENABLE_TIMING=1 records whether "
        "the collective ever started on each rank's GPU.",
        "TORCH_NCCL_ENABLE_TIMING=1 TORCH_FR_BUFFER_SIZE=2000 TORCH_NCCL_DUMP_ON_TIMEOUT=1 "
        "torchrun ...\n"
        "ncclwatch diagnose logs/ $TORCH_FR_DUMP_TEMP_FILE*   # started or not, per rank",
        always_at_risk=True),
)

ALL_BY_ID: dict[str, RootCause] = {**BY_ID, **{rc.id: rc for rc in POSTMORTEM_CAUSES}}


def for_kind(kind: StallKind) -> list[RootCause]:
    return [rc for rc in ROOT_CAUSES if rc.kind is kind]


# -- the fix in the job's own framework ------------------------------------------
#
# A root cause says *what* to change (save sharded, write in the background,
# gather to host memory, give the save a longer timeout); each framework has
# its own way to say it. ``FIXES`` is that table, framework x remedy; every
# snippet is checked by the framework's own code (a strategy constructed, a
# config parsed and validated: tests/unit/test_remediation_framework_fixes.py),
# so a wrong key fails.

#: What each remedy means, framework-free (its heading in the runbooks).
REMEDIES: dict[str, str] = {
    "sharded_save": "Save sharded: every rank writes its own part, nothing is gathered",
    "async_save": "Save asynchronously: the write runs in the background",
    "offload_gather": "If one full file is needed: gather to host memory on rank 0 only",
    "checkpoint_timeout": "Give the save a timeout longer than it takes",
    "sharded_load": "Load sharded: every rank reads its own part",
}

#: The remedies for each root cause, most effective first (none: not a save).
REMEDIES_FOR: dict[str, tuple[str, ...]] = {
    "gather_out_of_memory": ("sharded_save", "offload_gather"),
    "save_overruns_watchdog": ("sharded_save", "async_save", "checkpoint_timeout"),
    "save_within_assumed_timeout": ("sharded_save", "async_save", "checkpoint_timeout"),
    "save_within_budget": ("sharded_save", "async_save"),
    "slow_state_dict_gather": ("sharded_save", "offload_gather"),
    "slow_save": ("sharded_save", "async_save", "checkpoint_timeout"),
    "restore_out_of_memory": ("sharded_load",),
    "slow_restore": ("sharded_load", "checkpoint_timeout"),
}


@dataclass(frozen=True)
class Fix:
    framework: str          # frameworks.FRAMEWORKS id
    remedy: str             # a REMEDIES key
    text: str
    #: python | yaml | json | toml | argv (what the tests parse it as)
    lang: str = "python"
    snippet: str = ""


FIXES: tuple[Fix, ...] = (
    # -- PyTorch (also FSDP2 and DCP users: they call these functions themselves)
    Fix("torch", "sharded_save",
        "Save with torch.distributed.checkpoint: every rank writes its shard, no rank "
        "waits for another's write.", "python", """\
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict

model_sd, optim_sd = get_state_dict(model, optimizer)
dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=f"/ckpt/step{step}")
# one file for export, offline: python -m torch.distributed.checkpoint.format_utils dcp_to_torch /ckpt/step1000 model.pt"""),
    Fix("torch", "async_save",
        "dcp.async_save stages the state in host memory and writes it in a background "
        "thread; training continues.", "python", """\
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict

if pending is not None:
    pending.result()              # the previous save must be done first
model_sd, optim_sd = get_state_dict(model, optimizer)
pending = dcp.async_save({"model": model_sd, "optim": optim_sd},
                         checkpoint_id=f"/ckpt/step{step}")"""),
    Fix("torch", "offload_gather",
        "Gather the full state dict shard by shard into rank 0's host memory "
        "(cpu_offload=True), never whole on a GPU; give that host more memory than the "
        "model state, optimizer included.", "python", """\
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                          cpu_offload=True))
if dist.get_rank() == 0:
    torch.save(sd, path)"""),
    Fix("torch", "checkpoint_timeout",
        "If rank 0 must write alone, let the others wait on a gloo group of their own "
        "with a long timeout, not in the next NCCL collective (whose watchdog fires at "
        "the process-group timeout).", "python", """\
import datetime
import torch.distributed as dist

ckpt_group = dist.new_group(backend="gloo", timeout=datetime.timedelta(hours=2))
if dist.get_rank() == 0:
    torch.save(full_state, path)
dist.barrier(group=ckpt_group)"""),
    Fix("torch", "sharded_load",
        "Load with torch.distributed.checkpoint: every rank reads its own shard in "
        "parallel; a full file loads with mmap=True, without a second copy.", "python", """\
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

model_sd, optim_sd = get_state_dict(model, optimizer)
dcp.load({"model": model_sd, "optim": optim_sd}, checkpoint_id="/ckpt/step1000")
set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)"""),
    # -- torch FSDP1 (FullyShardedDataParallel): its own state-dict switch
    Fix("torch_fsdp1", "sharded_save",
        "Switch the FSDP module to SHARDED_STATE_DICT and save with dcp: each rank "
        "writes its own shard.", "python", """\
import torch.distributed.checkpoint as dcp
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, StateDictType

with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
    dcp.save({"model": model.state_dict()}, checkpoint_id=f"/ckpt/step{step}")"""),
    Fix("torch_fsdp1", "offload_gather",
        "A full state dict gathered to rank 0 only, offloaded to its host memory.",
        "python", """\
from torch.distributed.fsdp import FullStateDictConfig, FullyShardedDataParallel as FSDP, StateDictType

cfg = FullStateDictConfig(offload_to_cpu=True, rank0_only=True)
with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, cfg):
    sd = model.state_dict()"""),
    # -- Lightning
    Fix("lightning", "sharded_save",
        "FSDPStrategy(state_dict_type=\"sharded\"): every rank writes its own shard "
        "into the checkpoint directory.", "python", """\
from lightning.pytorch import Trainer
from lightning.pytorch.strategies import FSDPStrategy

strategy = FSDPStrategy(state_dict_type="sharded")
trainer = Trainer(strategy=strategy)"""),
    Fix("lightning", "async_save",
        "AsyncCheckpointIO writes the checkpoint in a background thread.", "python", """\
from lightning.pytorch import Trainer
from lightning.pytorch.plugins.io import AsyncCheckpointIO

trainer = Trainer(plugins=[AsyncCheckpointIO()])"""),
    Fix("lightning", "offload_gather",
        "Lightning's full state dict is already gathered to rank 0 only and offloaded to "
        "its host memory: give that host more memory than the model state, or save "
        "sharded.", "python", """\
from lightning.pytorch.strategies import FSDPStrategy

strategy = FSDPStrategy(state_dict_type="sharded")"""),
    Fix("lightning", "checkpoint_timeout",
        "Lightning makes one process group: raise its timeout above the save time.",
        "python", """\
import datetime
from lightning.pytorch.strategies import FSDPStrategy

strategy = FSDPStrategy(state_dict_type="sharded", timeout=datetime.timedelta(hours=2))"""),
    Fix("lightning", "sharded_load",
        "A sharded checkpoint directory loads shard by shard on every rank with the same "
        "strategy: trainer.fit(model, ckpt_path=dir).", "python", """\
from lightning.pytorch.strategies import FSDPStrategy

strategy = FSDPStrategy(state_dict_type="sharded")"""),
    # -- transformers Trainer
    Fix("transformers", "sharded_save",
        "fsdp_config state_dict_type SHARDED_STATE_DICT: Trainer checkpoints are written "
        "by every rank (a single file for export: trainer.accelerator.get_state_dict "
        "after training, or accelerate merge-weights offline).", "python", """\
from transformers import TrainingArguments

args = TrainingArguments(output_dir="/ckpt/run", fsdp=True,
                         fsdp_config={"state_dict_type": "SHARDED_STATE_DICT"})"""),
    Fix("transformers", "checkpoint_timeout",
        "ddp_timeout is the process-group timeout the Trainer sets: raise it above the "
        "save time.", "python", """\
from transformers import TrainingArguments

args = TrainingArguments(output_dir="/ckpt/run", ddp_timeout=7200)"""),
    Fix("transformers", "sharded_load",
        "With SHARDED_STATE_DICT, resume_from_checkpoint loads each rank's shard.",
        "python", """\
from transformers import TrainingArguments

args = TrainingArguments(output_dir="/ckpt/run", fsdp=True,
                         fsdp_config={"state_dict_type": "SHARDED_STATE_DICT"})
# trainer.train(resume_from_checkpoint=True)"""),
    # -- accelerate (the config file accelerate launch reads)
    Fix("accelerate", "sharded_save",
        "fsdp_state_dict_type: SHARDED_STATE_DICT in the accelerate config: "
        "accelerator.save_state writes one shard per rank.", "yaml", """\
distributed_type: FSDP
fsdp_config:
  fsdp_version: 2
  fsdp_state_dict_type: SHARDED_STATE_DICT"""),
    Fix("accelerate", "offload_gather",
        "A full state dict gathered to rank 0 only, offloaded to its host memory.",
        "python", """\
from accelerate import Accelerator, FullyShardedDataParallelPlugin
from torch.distributed.fsdp import FullStateDictConfig

plugin = FullyShardedDataParallelPlugin(
    fsdp_version=1, state_dict_type="FULL_STATE_DICT",
    state_dict_config=FullStateDictConfig(offload_to_cpu=True, rank0_only=True))
accelerator = Accelerator(fsdp_plugin=plugin)"""),
    Fix("accelerate", "checkpoint_timeout",
        "InitProcessGroupKwargs sets the process-group timeout accelerate creates.",
        "python", """\
import datetime
from accelerate import Accelerator, InitProcessGroupKwargs

accelerator = Accelerator(kwargs_handlers=[InitProcessGroupKwargs(timeout=datetime.timedelta(hours=2))])"""),
    Fix("accelerate", "sharded_load",
        "With SHARDED_STATE_DICT, accelerator.load_state reads each rank's shard.", "yaml", """\
distributed_type: FSDP
fsdp_config:
  fsdp_version: 2
  fsdp_state_dict_type: SHARDED_STATE_DICT"""),
    # -- DeepSpeed
    Fix("deepspeed", "sharded_save",
        "ZeRO-3 with stage3_gather_16bit_weights_on_model_save false: "
        "engine.save_checkpoint writes per-rank shards and nothing is gathered; make one "
        "file offline with `python zero_to_fp32.py CKPT_DIR OUT_DIR` (the script "
        "DeepSpeed writes beside the checkpoint).", "json", """\
{
  "zero_optimization": {
    "stage": 3,
    "stage3_gather_16bit_weights_on_model_save": false
  }
}"""),
    Fix("deepspeed", "checkpoint_timeout",
        "deepspeed.init_distributed(timeout=...) sets the process-group timeout.",
        "python", """\
import datetime
import deepspeed

deepspeed.init_distributed(dist_backend="nccl", timeout=datetime.timedelta(hours=2))"""),
    Fix("deepspeed", "sharded_load",
        "engine.load_checkpoint(dir) reads each rank's ZeRO shard; keep "
        "stage3_gather_16bit_weights_on_model_save false.", "json", """\
{
  "zero_optimization": {
    "stage": 3,
    "stage3_gather_16bit_weights_on_model_save": false
  }
}"""),
    # -- Megatron-LM (command-line flags of pretrain_gpt.py and friends)
    Fix("megatron", "sharded_save",
        "torch_dist checkpoints are written by every rank in parallel.", "argv",
        "--ckpt-format torch_dist --ckpt-fully-parallel-save"),
    Fix("megatron", "async_save",
        "--async-save writes torch_dist checkpoints in the background.", "argv",
        "--ckpt-format torch_dist --async-save"),
    Fix("megatron", "checkpoint_timeout",
        "The process-group timeout, in minutes.", "argv", "--distributed-timeout-minutes 120"),
    Fix("megatron", "sharded_load",
        "Every rank reads its part of a torch_dist checkpoint.", "argv",
        "--ckpt-format torch_dist --ckpt-fully-parallel-load"),
    # -- NeMo 2 (MegatronStrategy arguments)
    Fix("nemo", "sharded_save",
        "torch_dist checkpoints, saved by every rank in parallel.", "python", """\
from nemo import lightning as nl

strategy = nl.MegatronStrategy(save_ckpt_format="torch_dist", ckpt_parallel_save=True)"""),
    Fix("nemo", "async_save",
        "ckpt_async_save writes the checkpoint in the background.", "python", """\
from nemo import lightning as nl

strategy = nl.MegatronStrategy(save_ckpt_format="torch_dist", ckpt_async_save=True)"""),
    # -- torchtitan (the job's TOML config)
    Fix("torchtitan", "async_save",
        "checkpoint.async_mode writes DCP checkpoints in the background "
        "(async_with_pinned_mem: staged in pinned host memory, fastest).", "toml", """\
[checkpoint]
async_mode = "async_with_pinned_mem\""""),
    Fix("torchtitan", "checkpoint_timeout",
        "comm.train_timeout_seconds is the process-group timeout after the first step: "
        "raise it above the save time.", "toml", """\
[comm]
train_timeout_seconds = 3600"""),
    # -- torchtune (the recipe's YAML config)
    Fix("torchtune", "async_save",
        "enable_async_checkpointing writes intermediate checkpoints with dcp.async_save.",
        "yaml", "enable_async_checkpointing: True"),
    # -- Composer
    Fix("composer", "sharded_save",
        "state_dict_type sharded: every rank writes its own shard.", "python", """\
from composer import Trainer

trainer = Trainer(model=model, parallelism_config={"fsdp": {"state_dict_type": "sharded"}})"""),
    Fix("composer", "checkpoint_timeout",
        "dist_timeout is the process-group timeout, in seconds.", "python", """\
from composer import Trainer

trainer = Trainer(model=model, dist_timeout=7200.0)"""),
)

#: Frameworks whose users call torch's own functions: they fall back to its rows.
TORCH_FAMILY = frozenset({"torch", "torch_fsdp1", "torch_fsdp2", "torch_dcp"})

_FIX_BY: dict[tuple[str, str], Fix] = {(f.framework, f.remedy): f for f in FIXES}


def fixes_for(framework: str, root_cause: str) -> list[Fix]:
    """The framework's fixes for a root cause, in REMEDIES_FOR order.

    A torch-family job gets torch's row where its own has none; another
    framework gets only its own rows (a Trainer user does not write dcp code).
    """
    out = []
    for remedy in REMEDIES_FOR.get(root_cause, ()):
        fix = _FIX_BY.get((framework, remedy))
        if fix is None and framework in TORCH_FAMILY:
            fix = _FIX_BY.get(("torch", remedy))
        if fix is not None:
            out.append(fix)
    return out


def fixes_view(framework: str, root_cause: str) -> list[dict[str, str]]:
    """The fixes as ``/api/v1/jobs`` shows them (and the page and status render)."""
    return [{"remedy": f.remedy, "title": REMEDIES[f.remedy], "framework": f.framework,
             "text": f.text, "lang": f.lang, "snippet": f.snippet}
            for f in fixes_for(framework, root_cause)]
