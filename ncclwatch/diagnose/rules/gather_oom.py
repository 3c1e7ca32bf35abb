"""Rule: a rank ran out of memory while gathering or saving the checkpoint."""

from __future__ import annotations

from ncclwatch.diagnose.crashes import oom_killed
from ncclwatch.diagnose.facts import Facts, exception_kind, inferred_notes
from ncclwatch.diagnose.finding import LogFinding, who
from ncclwatch.diagnose.scanresult import Evidence, PyTraceback
from ncclwatch.diagnose.signtypes import Event
from ncclwatch.model import CHECKPOINT_STATES
from ncclwatch.signatures import classify

#: Text of an OOM line that puts it inside a state-dict gather (FSDP's clone() warnings).
_GATHER_OOM_TEXT = ("state_dict entry", "Failed to clone() tensor")


def _ckpt_open_before(facts: Facts, e: Evidence | PyTraceback) -> Evidence | None:
    """A job-level checkpoint line (any rank, or the main process) before ``e`` in the
    same file with no 'saved' line between: the OOM happened inside that save."""
    opened = [c for c in facts.scan.evidence if c.event is Event.CHECKPOINT
              and c.file == e.file and c.line <= e.line]
    if not opened:
        return None
    last = opened[-1]
    done = [d for d in facts.scan.evidence if d.event is Event.CHECKPOINT_DONE
            and d.file == e.file and last.line < d.line <= e.line]
    return None if done else last


def rule_gather_oom(facts: Facts) -> LogFinding | None:
    hits: list[int] = []
    ev: list[tuple[str, str]] = []
    for r, rf in sorted(facts.ranks.items()):
        oom = list(rf.oom)
        killed = oom_killed(facts, rf)
        if killed is not None:
            oom.append(killed)
        oom_tbs = [t for t in rf.tracebacks if exception_kind(t) == "oom"]
        if not oom and not oom_tbs:
            continue
        state, _op = rf.activity()
        ckpt = rf.checkpointing()
        if ckpt is None and r == 0:
            ckpt = facts.unattributed_checkpointing()
        if ckpt is None:
            ckpt = next((c for c in (_ckpt_open_before(facts, x) for x in oom + oom_tbs) if c), None)
        during = state in CHECKPOINT_STATES or ckpt is not None
        for t in oom_tbs:
            during = during or classify(t.innermost_first()).state in CHECKPOINT_STATES
        clone = [e for e in oom if any(m in e.text for m in _GATHER_OOM_TEXT)]
        if not during and not clone:
            continue  # an OOM elsewhere is rule_crash's
        hits.append(r)
        first = clone[0] if clone else (oom[0] if oom else None)
        where = first.where if first is not None else oom_tbs[0].where
        text = first.text if first is not None else oom_tbs[0].exception
        ev.append((where, f"rank {r} out of memory: {text[:200]}"))
        if clone:
            ev.append((clone[0].where, f"rank {r} was gathering the state dict (FSDP's "
                       "clone() of a full-state-dict entry failed)"))
        elif ckpt is not None:
            ev.append((ckpt.where, f"rank {r} was checkpointing: {ckpt.text[:160]}"))
        elif oom_tbs:
            ev.append((oom_tbs[0].where, f"rank {r}'s traceback is in "
                       f"{classify(oom_tbs[0].innermost_first()).state.value}"))
    if not hits:
        return _unranked_save_oom(facts)
    collateral = [r for r in facts.world if r not in hits]
    return LogFinding("gather_oom", hits, collateral, "gather_out_of_memory",
                      f"{who(hits)} ran out of memory while gathering or saving "
                      f"the checkpoint; the other ranks only waited for them.", ev,
                      inferred_notes(facts, hits))


def _unranked_save_oom(facts: Facts) -> LogFinding | None:
    """An OOM line naming no rank (Slurm's oom_kill, a Kubernetes OOMKilled, Ray's memory
    monitor, the kernel) after a save began in the same file with no 'saved' line."""
    for e in facts.unattributed:
        if e.event is not Event.OOM:
            continue
        ckpt = _ckpt_open_before(facts, e)
        if ckpt is None:
            continue
        return LogFinding("gather_oom", [], [], "gather_out_of_memory",
                          "a process ran out of memory while the checkpoint was being saved; "
                          "no line names its rank.",
                          [(e.where, f"out of memory: {e.text[:200]}"),
                        (ckpt.where, f"the save it was in: {ckpt.text[:160]}")],
                          missing=["the rank of the process that ran out of memory"],
                          collect=["every rank's log with its rank prefix (torchrun --log-dir DIR "
                                "--tee 3, or srun --label)", "the kernel log of the node "
                                "(dmesg -T): 'Killed process P' names the pid"])
    return None
