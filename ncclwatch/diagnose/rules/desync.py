"""Rule: ranks ran different collectives (fingerprints, the Flight Recorder, the
watchdog's timed-out work, or each rank's traceback)."""

from __future__ import annotations

import re
from collections import Counter

from ncclwatch.diagnose.crashes import own_crashes
from ncclwatch.diagnose.facts import Facts, RankFacts, blocked_op
from ncclwatch.diagnose.finding import LogFinding, who
from ncclwatch.diagnose.scanresult import Evidence
from ncclwatch.diagnose.signtypes import Event
from ncclwatch.diagnose.waiting import fr_where, pg_key


def _fingerprint_ops(facts: Facts) -> tuple[dict[int, str], list[int], list[tuple[str, str]]]:
    """Each rank's collective from c10d's mismatch lines (rank -> op and shape), the ranks
    named where the other side is cut off or NCCL names only a neighbourhood, evidence."""
    ops: dict[int, str] = {}
    named: list[int] = []
    ev: list[tuple[str, str]] = []
    for e in facts.all_evidence(Event.MISMATCH)[:8]:
        ev.append((e.where, e.text[:300]))
        if e.fields.get("around"):
            named.append(int(e.fields["around"]))
        for rk, fp in (("rank", "mine"), ("other", "theirs")):
            if e.fields.get(rk) is None:
                continue
            r = int(e.fields[rk])
            named.append(r)
            if e.fields.get(fp):
                ops[r] = _fingerprint(e.fields[fp])
    return ops, sorted(set(named)), ev


def _fingerprint(fp: str) -> str:
    """What of a CollectiveFingerPrint must agree across ranks: sequence, op, shapes."""
    parts = [f"{k}={m.group(1)}" for k, rx in (("SequenceNumber", r"\d+"), ("OpType", r"\w+"),
                                                ("TensorShape", r"\[[^\]]*\]"))
             if (m := re.search(k + "=(" + rx + ")", fp))]
    return ", ".join(parts) if parts else fp.strip(" .")


def _timeout_divergence(facts: Facts) -> tuple[dict[int, str], list[tuple[str, str]]]:
    """Waiting ranks of one process group that timed out in different work: the same
    SeqNum with a different op or size, or different SeqNums (one rank issued a
    collective the others did not, so NCCL paired different calls)."""
    by_pg: dict[str, dict[int, Evidence]] = {}
    guessed: dict[int, set[str]] = {}  # untagged timeouts put in the default group
    for r, rf in facts.ranks.items():
        for e in rf.timeouts:
            if e.fields.get("seq") is None or "op" not in e.fields:
                continue
            pg = pg_key(e) if e.pg is not None else _seq_pg(facts, rf, e)
            if pg == "default" and e.pg is None:
                guessed.setdefault(r, set()).add(e.fields["seq"])
            by_pg.setdefault(pg, {}).setdefault(r, e)
    if any(len(seqs) > 1 for seqs in guessed.values()):
        by_pg.pop("default", None)  # untagged lines of several groups: not comparable
    for pg, first in sorted(by_pg.items()):
        if len(first) < 2:
            continue
        keys = {r: (int(e.fields["seq"]), e.fields["op"], e.fields.get("numel_in"))
                for r, e in first.items()}
        if len(set(keys.values())) < 2:
            continue
        desc = {r: f"#{k[0]} {k[1]}" + (f" NumelIn={k[2]}" if k[2] else "")
                for r, k in keys.items()}
        ev = [(first[r].where, f"rank {r} timed out in {d}") for r, d in sorted(desc.items())]
        return desc, ev
    return {}, []


def _seq_pg(facts: Facts, rf: RankFacts, e: Evidence) -> str:
    """The group of an untagged timeout line: that of the rank's progress line with the
    same work number (torch prints them together), else the default group."""
    for p in rf.progress:
        if p.fields.get("seq") == e.fields.get("seq") and p.pg is not None:
            return pg_key(p)
    return "default"


def rule_desync(facts: Facts) -> LogFinding | None:
    ops, named, ev = _fingerprint_ops(facts)
    how = "c10d's collective fingerprints (TORCH_DISTRIBUTED_DEBUG=DETAIL)"
    fr = facts.fr
    if not ops and fr is not None and fr.mismatches:
        mm = fr.mismatches[0]
        ops = {int(r): f"{v[0]} {[list(x) for x in v[1]]}" for r, v in mm.ops.items()}
        ev.append((fr_where(facts), f"collective #{mm.seq} of process group "
                   f"{mm.pg_name or mm.pg_id}: " + ", ".join(f"rank {r} {o}"
                                                         for r, o in sorted(ops.items()))))
        how = "the Flight Recorder"
    if not ops and not named:
        ops, tev = _timeout_divergence(facts)
        ev += tev
        how = "the watchdog's timed-out work of each rank"
        if not ops and not own_crashes(facts):
            # Where each rank's collective failed (timed out, or its peer went away).
            waited = {}
            for r, rf in facts.ranks.items():
                for tb in reversed(rf.tracebacks):
                    op = blocked_op(tb)
                    if op:
                        waited[r] = op
                        ev.append((tb.where, f"rank {r} failed waiting in {op}: "
                                   f"{tb.exception[:120]}"))
                        break
            if len(set(waited.values())) > 1 and len(waited) >= 2:
                ops = waited
                how = "each rank's traceback"
    if len(set(ops.values())) < 2:
        if not named:
            return None
        # One side of the comparison only (the paste cut it), or NCCL's neighbourhood.
        return LogFinding("desync", [], [], "collective_order_mismatch",
                          f"ranks ran different collectives; the log names {who(named)} in the "
                          "comparison but not both sides of it, so which rank left the common "
                          f"order is not in it: the initiator is among {who(named)}.", ev,
                          candidates=named,
                          missing=["the other side of the mismatch (the full DETAIL line, or the "
                                "logs of every rank)"],
                          collect=["every rank's log with TORCH_DISTRIBUTED_DEBUG=DETAIL",
                                "Flight Recorder dumps (TORCH_NCCL_TRACE_BUFFER_SIZE=2000, "
                                "TORCH_NCCL_DUMP_ON_TIMEOUT=1)"])
    count = Counter(ops.values())
    desc = ", ".join(f"rank {r} {o}" for r, o in sorted(ops.items()))
    top, n = count.most_common(1)[0]
    if len(ops) == 2 or n * 2 <= len(ops) and 0 not in ops:
        # Two ranks (or no majority and no rank 0 to compare with): either may be the odd one.
        among = sorted(ops)
        return LogFinding("desync", [], [r for r in facts.waiting if r not in among],
                          "collective_order_mismatch",
                          f"ranks issued different collectives ({desc}), by {how}; with no "
                          f"majority the odd one is among {who(among)}.", ev, candidates=among,
                          missing=["a third rank's view of the same collective, to tell which "
                                "side left the common order"],
                          collect=["every rank's log with TORCH_DISTRIBUTED_DEBUG=DETAIL",
                                "Flight Recorder dumps of all ranks (TORCH_NCCL_DUMP_ON_TIMEOUT=1)"])
    odd = sorted(r for r, o in ops.items() if o != top)
    if n * 2 <= len(ops):
        # No majority: the ranks that differ from rank 0, as c10d compares with rank 0.
        ref = ops[0]
        odd = sorted(r for r, o in ops.items() if o != ref)
    collateral = [r for r in facts.world if r not in odd]
    return LogFinding("desync", odd, collateral, "collective_order_mismatch",
                      f"ranks issued different collectives ({desc}), by {how}; {who(odd)} "
                      f"left the common order.", ev)
