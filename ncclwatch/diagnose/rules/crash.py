"""Rule: a rank crashed on its own (exception, signal, OOM outside a save)."""

from __future__ import annotations

import re

from ncclwatch.diagnose.crashes import (
    exit_name,
    oom_killed,
    own_crashes,
    unranked_crash,
)
from ncclwatch.diagnose.facts import Facts, inferred_notes
from ncclwatch.diagnose.finding import LogFinding, who
from ncclwatch.diagnose.scanresult import Evidence
from ncclwatch.diagnose.signtypes import Event
from ncclwatch.model import rank_ranges


def rule_crash(facts: Facts) -> LogFinding | None:
    crashes = own_crashes(facts)
    oom_crash = [r for r, rf in facts.ranks.items() if rf.oom or oom_killed(facts, rf)]
    if not crashes and not oom_crash:
        lines = unranked_crash(facts)
        if not lines:
            return None
        waiting = facts.waiting
        silent = [r for r in facts.world if r not in waiting]
        kind = "ran out of memory" if lines[0].event is Event.OOM else "died"
        what, among = _what_died(lines[0])
        candidates = silent if waiting else among
        return LogFinding("rank_crash", [], waiting, "rank_exited",
                          f"a process {kind} ({what}), but no line names its rank"
                          + (f"; it is among {who(silent)}" if silent and waiting else "")
                          + (f"; it is among local ranks {rank_ranges(among)} (the launcher "
                          "names the last worker it spawned, not the failed one)"
                          if among and not waiting else "")
                          + ".", [(e.where, _shown(e)) for e in lines[:4]],
                          candidates=candidates,
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
        e = rf.oom[0] if rf.oom else oom_killed(facts, rf)
        assert e is not None
        ev = [(e.where, e.text[:240])]
        why = f"rank {initiating[0]} ran out of memory outside a checkpoint: {e.text[:160]}"
    collateral = [r for r in facts.world if r not in initiating]
    notes = inferred_notes(facts, initiating)
    if not facts.scan.failures and any("local rank" in c[3] for c in crashes):
        notes.append("the rank is the launcher's local rank (torchrun, deepspeed): equal to "
                     "the global rank on one node")
    missing: list[str] = []
    collect: list[str] = []
    if any("SIGKILL" in c[3] for c in crashes if c[1] in initiating):
        # torchrun's "exitcode : -9": nothing in the job sends SIGKILL; the kernel's OOM
        # killer (host or cgroup memory) is its usual sender, then a scheduler's kill.
        notes.append(SIGKILL_NOTE)
        missing.append("the kernel log of the node (was it the OOM killer?)")
        collect.append("dmesg -T (or journalctl -k) of the node: 'Out of memory: Killed "
                       "process P' names the pid torchrun reports")
    return LogFinding("rank_crash", initiating, collateral, "rank_exited",
                      why + "; the other ranks failed after it.", ev, notes, missing=missing,
                      collect=collect)


#: What an exit by SIGKILL (-9) usually means.
SIGKILL_NOTE = ("exit code -9 (SIGKILL) is the OOM killer's usual signature: the kernel killed "
                "the process when the node or its cgroup ran out of host memory (a scheduler's "
                "kill or a user's kill -9 are the other senders); no OOM-killer line is in "
                "these logs")


def _what_died(e: Evidence) -> tuple[str, list[int]]:
    """What a rank-less death line says, and the local ranks it must be among. The
    deepspeed launcher prints the command of the last worker it spawned (local rank
    N, so the node ran workers 0-N) with the failed worker's return code."""
    if e.sign != "deepspeed_exit":
        return e.text[:160], []
    code = int(e.fields["exitcode"])
    sig = exit_name(code)
    what = (f"the deepspeed launcher: a worker exits with return code {code}"
            + (f", {sig}" if sig != str(code) else ""))
    last = e.fields.get("last_local_rank")
    if last is None or _HOST_TAG.match(e.text):
        return what, []  # a host's tag (pdsh, multi-node): local ranks are not global ones
    return what, list(range(int(last) + 1))


#: pdsh's "worker-1: " (or an address) before the launcher's own "[2023-10-13 ...": the
#: deepspeed runner started the launcher on several nodes.
_HOST_TAG = re.compile(r"\s*[\w.-]+: \[")


def _shown(e: Evidence) -> str:
    """The evidence text; a deepspeed launcher line is mostly the command: keep its end."""
    if e.sign == "deepspeed_exit" and len(e.text) > 240:
        last = e.fields.get("last_local_rank")
        return (e.text[:120] + " ... " + (f"'--local_rank={last}' ... " if last else "")
                + f"exits with return code = {e.fields['exitcode']}")
    return e.text[:240]
