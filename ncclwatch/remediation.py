"""What each stall means and what to do about it (data, shared by every output)."""

from __future__ import annotations

from dataclasses import dataclass

from ncclwatch.model import StallKind


@dataclass(frozen=True)
class Remedy:
    cause: str
    fix: str


REMEDIES: dict[StallKind, Remedy] = {
    StallKind.CHECKPOINT_GATHER: Remedy(
        cause="A rank is gathering or writing a full checkpoint while the other ranks wait "
              "in the next collective; if it takes longer than the process-group timeout "
              "the NCCL watchdog kills the job and the waiting ranks' logs take the blame.",
        fix="Save sharded instead of gathering to one rank: torch.distributed.checkpoint "
            "(dcp.save / dcp.async_save) or FSDP SHARDED_STATE_DICT; or have every rank wait "
            "with a longer timeout around the save (a barrier with a generous timeout, or a "
            "larger init_process_group timeout); write to faster storage.",
    ),
    StallKind.CHECKPOINT_RESTORE: Remedy(
        cause="A rank is loading a full checkpoint while the other ranks wait in the "
              "collective that follows (the broadcast of the loaded state).",
        fix="Load sharded with torch.distributed.checkpoint (dcp.load) so every rank reads "
            "its own shard, or raise the process-group timeout for the restore.",
    ),
    StallKind.COLLECTIVE_HANG: Remedy(
        cause="Ranks wait in a collective that some rank never joined.",
        fix="Look at the absent ranks' stacks: a rank stuck in data loading, an exception "
            "swallowed on one rank, or a rank-dependent branch that skips the collective.",
    ),
    StallKind.DESYNC: Remedy(
        cause="Ranks wait in different collectives: the program issued collectives in a "
              "different order on different ranks.",
        fix="Make every rank issue the same collectives in the same order; "
            "TORCH_DISTRIBUTED_DEBUG=DETAIL checks this at run time.",
    ),
    StallKind.RANK_LOST: Remedy(
        cause="A rank's process exited or its agent stopped reporting.",
        fix="Check the node and the rank's log (OOM killer, crash); the others will hang "
            "until the watchdog fires.",
    ),
}
