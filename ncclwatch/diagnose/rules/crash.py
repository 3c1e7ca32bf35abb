"""Rule: a rank crashed on its own (exception, signal, OOM outside a save)."""

from __future__ import annotations

from ncclwatch.diagnose.logsigns import Event
from ncclwatch.diagnose.facts import (Facts, Finding, _crashes, _inferred_notes, _oom_killed,
                                      _unranked_crash, who)


def rule_crash(facts: Facts) -> Finding | None:
    crashes = _crashes(facts)
    oom_crash = [r for r, rf in facts.ranks.items() if rf.oom or _oom_killed(facts, rf)]
    if not crashes and not oom_crash:
        lines = _unranked_crash(facts)
        if not lines:
            return None
        waiting = facts.waiting
        silent = [r for r in facts.world if r not in waiting]
        kind = "ran out of memory" if lines[0].event is Event.OOM else "died"
        return Finding("rank_crash", [], waiting, "rank_exited",
                       f"a process {kind} ({lines[0].text[:160]}), but no line names its "
                       "rank" + (f"; it is among {who(silent)}" if silent and waiting else "")
                       + ".", [(e.where, e.text[:240]) for e in lines[:4]],
                       candidates=silent if waiting else [],
                       missing=["the rank of the process that died"],
                       collect=["torchrun's failure summary ('rank : N (local_rank: N)', "
                                "'exitcode : -9 (pid: P)') or every rank's log with its "
                                "prefix (torchrun --tee 3)", "the kernel log (dmesg) for the "
                                "OOM killer's 'Killed process P'"])
    if crashes:
        first = crashes[0]
        initiating = sorted({c[1] for c in crashes if c[0][:2] == first[0][:2]}) \
            if first[0][0] is False else [first[1]]
        ev = [(c[2], c[3]) for c in crashes[:4]]
        why = first[3]
    else:
        initiating = sorted(oom_crash)
        rf = facts.ranks[initiating[0]]
        e = rf.oom[0] if rf.oom else _oom_killed(facts, rf)
        assert e is not None
        ev = [(e.where, e.text[:240])]
        why = f"rank {initiating[0]} ran out of memory outside a checkpoint: {e.text[:160]}"
    collateral = [r for r in facts.world if r not in initiating]
    notes = _inferred_notes(facts, initiating)
    if not facts.scan.failures and any("local rank" in c[3] for c in crashes):
        notes.append("the rank is torchrun's local rank: equal to the global rank on one node")
    missing: list[str] = []
    collect: list[str] = []
    if any("SIGKILL" in c[3] for c in crashes if c[1] in initiating):
        # torchrun's "exitcode : -9": nothing in the job sends SIGKILL; the kernel's OOM
        # killer (host or cgroup memory) is its usual sender, then a scheduler's kill.
        notes.append(SIGKILL_NOTE)
        missing.append("the kernel log of the node (was it the OOM killer?)")
        collect.append("dmesg -T (or journalctl -k) of the node: 'Out of memory: Killed "
                       "process P' names the pid torchrun reports")
    return Finding("rank_crash", initiating, collateral, "rank_exited",
                   why + "; the other ranks failed after it.", ev, notes, missing=missing,
                   collect=collect)


#: What an exit by SIGKILL (-9) usually means.
SIGKILL_NOTE = ("exit code -9 (SIGKILL) is the OOM killer's usual signature: the kernel killed "
                "the process when the node or its cgroup ran out of host memory (a scheduler's "
                "kill or a user's kill -9 are the other senders); no OOM-killer line is in "
                "these logs")
