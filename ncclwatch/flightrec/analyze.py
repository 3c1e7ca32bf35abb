"""Across ranks: per-group progress, the first collective not done everywhere, desyncs.

As torch's flight_recorder ``components/builder.py``: from each rank's
summary (``summarize``: what an agent ships, a few numbers per group) to
the groups' stuck collectives, the members blocked in them (waiting) and
the ones that never enqueued them (missing: the culprits), plus desyncs
(same group and sequence number, different op or sizes).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from ncclwatch.flightrec.model import (FlightRecorderError, FrAnalysis, FrDump, FrEntry, Mismatch,
                                       PgProgress, Stuck)

# Ops whose per-rank input / output sizes legitimately differ (uneven splits,
# root-only buffers), as torch's own analyzer treats them.
_INPUT_MAY_DIFFER = frozenset({
    "scatter", "all_to_all", "all_to_all_single", "all_to_all_v_single", "alltoall",
    "alltoall_base", "all_gather_v", "reduce_scatter_v", "coalesced",
})
_OUTPUT_MAY_DIFFER = frozenset({
    "gather", "all_to_all", "all_to_all_single", "all_to_all_v_single", "alltoall",
    "alltoall_base", "all_gather_v", "reduce_scatter_v", "coalesced",
})


def summarize(dump: FrDump) -> list[PgProgress]:
    """One PgProgress per process group of the dump, in pg_id order."""
    coll: dict[str, dict[int, FrEntry]] = {}
    last: dict[str, FrEntry] = {}
    for e in dump.entries:
        last[e.pg_id] = e
        if not e.is_p2p:
            coll.setdefault(e.pg_id, {}).setdefault(e.seq, e)   # first entry of a (coalesced) seq
    out = []
    for pg_id in sorted(dump.pgs, key=_id_key):
        info = dump.pgs[pg_id]
        le, ls, lc = dump.status.get(pg_id, (-1, -1, -1))
        pend = coll.get(pg_id, {}).get(lc + 1) if le > lc else None
        ranks = info.ranks or dump.configured.get(info.name, ())
        lastent = last.get(pg_id)
        newest = coll.get(pg_id, {}).get(le)
        out.append(PgProgress(
            pg_id=pg_id, pg_name=info.name, ranks=tuple(ranks),
            last_enqueued=le, last_started=ls, last_completed=lc,
            pending_op=pend.op if pend else "",
            pending_seq=(lc + 1) if le > lc else 0,
            pending_timeout_ms=pend.timeout_ms if pend else None,
            pending_since_ns=pend.time_created_ns if pend else None,
            pending_sizes=pend.input_sizes if pend else (),
            pending_output_sizes=pend.output_sizes if pend else (),
            pg_desc=info.desc, backend=(pend or lastent).backend if (pend or lastent) else dump.backend,
            timeout_ms=lastent.timeout_ms if lastent else None,
            last_op=newest.op if newest else ""))
    return out


def _id_key(pg_id: str) -> tuple[int, int | str]:
    return (0, int(pg_id)) if pg_id.isdigit() else (1, pg_id)


def is_default_group(name: str, desc: str) -> bool:
    return desc == "default_pg" or name == "0"


def _sizes_differ(op: str, a: tuple, b: tuple) -> bool:
    """(input, output) size pairs that disagree for this op."""
    if op not in _INPUT_MAY_DIFFER and a[0] != b[0]:
        return True
    return op not in _OUTPUT_MAY_DIFFER and a[1] != b[1]


def _signatures_disagree(sigs: Mapping[int, tuple[str, tuple, tuple]]) -> bool:
    vals = list(sigs.values())
    first = vals[0]
    for other in vals[1:]:
        if other[0] != first[0]:
            return True
        if _sizes_differ(first[0], first[1:], other[1:]):
            return True
    return False


def analyze_progress(progress: Mapping[int, Sequence[PgProgress]], *,
                     world_size: int | None = None) -> FrAnalysis:
    """Cross-rank analysis from summaries alone (what the daemon has).

    Per process group (matched by name across ranks: pg ids are per-process):
    members come from the dumps' pg_config (NCCL), else for the default group
    from ``world_size`` (plus every reporting rank: all ranks are in it), else
    from the ranks that report the group. The pending sequence number is the
    lowest ``last_completed + 1`` of the ranks that have enqueued beyond what
    they completed; members with ``last_enqueued`` below it never joined it
    (missing), members that enqueued it and did not complete it are waiting.
    A member with no dump at all is unreported, never missing.
    """
    reporting = set(progress)
    groups: dict[str, dict[int, PgProgress]] = {}
    for rank, pps in progress.items():
        for p in pps:
            groups.setdefault(p.pg_name, {}).setdefault(rank, p)

    stuck: list[Stuck] = []
    mismatches: list[Mismatch] = []
    unreported_all: set[int] = set()
    default_timeout: int | None = None
    for name in sorted(groups, key=_id_key):
        per_rank = groups[name]
        any_p = next(iter(per_rank.values()))
        desc = next((p.pg_desc for p in per_rank.values() if p.pg_desc), "")
        members: set[int] = set()
        for p in per_rank.values():
            members.update(p.ranks)
        known = bool(members)
        if is_default_group(name, desc):
            if world_size:
                members.update(range(world_size))
                known = True
            members.update(reporting)
        if not members:
            members = set(per_rank)
        unreported = sorted(members - reporting) if known else []
        unreported_all.update(unreported)
        if is_default_group(name, desc):
            ts = [p.timeout_ms for p in per_rank.values() if p.timeout_ms is not None]
            if ts:
                default_timeout = min(ts)

        le = {r: max(per_rank[r].last_enqueued, 0) if r in per_rank else 0
              for r in members if r in reporting}
        lc = {r: max(per_rank[r].last_completed, 0) if r in per_rank else 0
              for r in members if r in reporting}
        behind = [lc[r] + 1 for r in le if le[r] > lc[r]]
        if not behind:
            continue
        seq = min(behind)
        waiting = sorted(r for r in le if le[r] >= seq and lc[r] < seq)
        missing = sorted(r for r in le if le[r] < seq)
        at_seq = {r: per_rank[r] for r in waiting if per_rank[r].pending_seq == seq}
        ops = Counter(p.pending_op for p in at_seq.values() if p.pending_op)
        op = ops.most_common(1)[0][0] if ops else ""
        low = min(le.values())
        if not missing and seq <= low < max(le.values()):
            # Every member enqueued the oldest unfinished collective (gloo records
            # completions late; NCCL's may just be queued behind): the first one
            # some member never enqueued is where the others wait on it, as
            # torch's analyzer finds matching entries in order.
            seq = low + 1
            waiting = sorted(r for r in le if le[r] >= seq and lc[r] < seq)
            missing = sorted(r for r in le if le[r] < seq)
            ops = Counter(per_rank[r].last_op for r in waiting
                          if per_rank[r].last_enqueued == seq and per_rank[r].last_op)
            op = ops.most_common(1)[0][0] if ops else ""
            at_seq = {}
        timeouts = ([p.pending_timeout_ms for p in at_seq.values() if p.pending_timeout_ms is not None]
                    or [per_rank[r].timeout_ms for r in waiting if per_rank[r].timeout_ms is not None])
        since = [p.pending_since_ns for p in at_seq.values() if p.pending_since_ns is not None]
        pg_id = per_rank[min(waiting)].pg_id if waiting else any_p.pg_id
        stuck.append(Stuck(pg_id=pg_id, pg_name=name, seq=seq, op=op, waiting_ranks=tuple(waiting),
                           missing_ranks=tuple(missing), timeout_ms=min(timeouts) if timeouts else None,
                           unreported_ranks=tuple(unreported), since_ns=min(since) if since else None,
                           pg_desc=desc))
        sigs = {r: (p.pending_op, p.pending_sizes, p.pending_output_sizes)
                for r, p in sorted(at_seq.items()) if p.pending_op}
        if len(sigs) > 1 and _signatures_disagree(sigs):
            mismatches.append(Mismatch(pg_id=pg_id, seq=seq, ops=sigs, pg_name=name))

    stuck_timeouts = [s.timeout_ms for s in stuck if s.timeout_ms is not None]
    return FrAnalysis(progress={r: list(ps) for r, ps in progress.items()}, stuck=stuck,
                      mismatches=mismatches,
                      timeout_ms=min(stuck_timeouts) if stuck_timeouts else default_timeout,
                      unreported=tuple(sorted(unreported_all)))


def analyze(dumps: Iterable[FrDump], *, world_size: int | None = None) -> FrAnalysis:
    """Cross-rank analysis of full dumps: analyze_progress on their summaries,
    and desyncs over every sequence number the ranks' buffers share."""
    by_rank: dict[int, FrDump] = {}
    for d in dumps:
        if d.rank is None:
            raise FlightRecorderError(f"{d.path}: rank unknown (pass rank= to load_dump)")
        if d.rank in by_rank:
            raise FlightRecorderError(f"{d.path}: a second dump for rank {d.rank} "
                                      f"(first: {by_rank[d.rank].path})")
        by_rank[d.rank] = d
    result = analyze_progress({r: summarize(d) for r, d in sorted(by_rank.items())},
                              world_size=world_size)

    # (pg name, seq) -> rank -> signature of all entries with that seq (coalesced: several)
    table: dict[tuple[str, int], dict[int, tuple[str, tuple, tuple]]] = {}
    pg_ids: dict[tuple[str, int], str] = {}
    for r, d in sorted(by_rank.items()):
        grouped: dict[tuple[str, int], list[FrEntry]] = {}
        for e in d.entries:
            if not e.is_p2p:
                grouped.setdefault((e.pg_name, e.seq), []).append(e)
        for key, es in grouped.items():
            op = "+".join(e.op for e in es)
            ins = tuple(s for e in es for s in e.input_sizes)
            outs = tuple(s for e in es for s in e.output_sizes)
            table.setdefault(key, {})[r] = (op, ins, outs)
            pg_ids.setdefault(key, es[0].pg_id)
    full = [Mismatch(pg_id=pg_ids[key], seq=key[1], ops=dict(sorted(sigs.items())), pg_name=key[0])
            for key, sigs in sorted(table.items(), key=lambda kv: (_id_key(kv[0][0]), kv[0][1]))
            if len(sigs) > 1 and _signatures_disagree(sigs)]
    seen = {(m.pg_name, m.seq) for m in full}
    result.mismatches = full + [m for m in result.mismatches if (m.pg_name, m.seq) not in seen]
    return result
