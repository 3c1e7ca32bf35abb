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
        "{expected_source}): it needs {eta} more, the watchdog fires in {remaining}, "
        "about {overrun} too late; {waiting_n} rank(s) wait in {ops}.",
        "Save sharded with torch.distributed.checkpoint so every rank writes its part "
        "(dcp.save / dcp.async_save), or FSDP SHARDED_STATE_DICT. Until then: let the "
        "other ranks wait on a gloo group with a long timeout instead of the next NCCL "
        "collective, or raise init_process_group(timeout=...) above the save time; write "
        "to faster local storage and copy to shared storage afterwards.",
        _DCP_EXAMPLE + "\n\n" + _TIMEOUT_EXAMPLE, always_at_risk=True),
    RootCause(
        "save_within_budget", StallKind.CHECKPOINT_GATHER,
        "A one-rank checkpoint write that fits the budget",
        "rank {rank} is writing {expected} at {rate}/s (size from the {expected_source}): "
        "it needs {eta} more and the "
        "watchdog has {remaining} left, so it should finish with {margin} to spare; "
        "{waiting_n} rank(s) wait in {ops}.",
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
