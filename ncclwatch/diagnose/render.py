"""The text an operator reads: the verdict first, then why, then what to do."""

from __future__ import annotations

import datetime as _dt

from ncclwatch.diagnose import Diagnosis
from ncclwatch.diagnose.verdict import who
from ncclwatch.model import rank_ranges


def _ranks(ranks: list[int]) -> str:
    return rank_ranges(ranks) if ranks else "-"


def _time(t: float | None) -> str:
    if t is None:
        return "          "
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).strftime("%H:%M:%S.%f")[:-3]


def text(d: Diagnosis) -> str:
    lines = [f"{d.title} ({d.cls})", "", f"  {d.summary}", ""]
    if d.cls not in ("none",):
        among = ([f"  initiator among:    {_ranks(d.candidates)}  (the logs do not say "
                  "which)"] if d.candidates else [])
        lines += [f"  initiating rank(s): {_ranks(d.initiating)}", *among,
                  f"  collateral rank(s): {_ranks(d.collateral)}  (only timed out or failed "
                  "waiting for them)" if d.collateral else "  collateral rank(s): -"]
        if d.timeout_s:
            lines.append(f"  process-group timeout: {d.timeout_s:g} s")
        lines.append("")
    for n in d.notes:
        lines.append(f"  note: {n}")
    if d.notes:
        lines.append("")
    if d.evidence:
        lines.append("Evidence:")
        for where, why in d.evidence:
            lines.append(f"  {where}" + (f"  {why}" if why else ""))
        lines.append("")
    fr = d.flight_recorder
    if fr:
        lines.append("Flight Recorder:")
        groups: dict[tuple, list[int]] = {}
        for r, pgs in (fr.get("progress") or {}).items():
            for p in pgs:
                key = (p.get("pg_desc") or p.get("pg_name"), p["last_enqueued"],
                       p["last_started"], p["last_completed"], p.get("pending_op") or "")
                groups.setdefault(key, []).append(int(r))
        for (pg, enq, started, done, op), ranks in sorted(groups.items(),
                                                          key=lambda kv: (kv[0][0], min(kv[1]))):
            pend = f", pending {op} #{done + 1}" if op else ""
            st = f", started #{started}" if started >= 0 else ""
            lines.append(f"  {who(ranks)}: {pg}: last enqueued #{enq}{st}, completed "
                         f"#{done}{pend}")
        for s in fr.get("stuck", [])[:4]:
            lines.append(f"  pg {s.get('pg_name') or s.get('pg_id')}: {s.get('op')} "
                         f"#{s.get('seq')} waiting {_ranks(s.get('waiting_ranks', []))}, "
                         f"missing {_ranks(s.get('missing_ranks', []))}")
        for m in fr.get("mismatches", [])[:4]:
            lines.append(f"  mismatch at pg {m.get('pg_id')} #{m.get('seq')}: {m.get('ops')}")
        if fr.get("timeout_ms"):
            lines.append(f"  timeout_ms: {fr['timeout_ms']}")
        lines.append("")
    if d.timeline:
        lines.append("Timeline:")
        for t in d.timeline:
            r = "" if t["rank"] is None else f"rank {t['rank']}"
            lines.append(f"  {_time(t['time'])}  {r:<8} {t['what'][:150]}  ({t['where']})")
        lines.append("")
    for title, items in (("Missing evidence:", d.missing_evidence),
                         ("Collect next time:", d.collect_next_time)):
        if items:
            lines += [title, *(f"  - {m}" for m in items), ""]
    rc = d.root_cause
    if rc is not None:
        lines += [f"Fix ({rc.id}): {rc.title}", f"  {rc.fix}", ""]
        if rc.example:
            lines += ["  " + ln for ln in rc.example.splitlines()] + [""]
    inp = d.inputs
    lines.append(f"Read {len(inp.get('files', []))} log file(s), "
                 f"{len(inp.get('flight_recorder_dumps', []))} Flight Recorder dump(s), "
                 f"{inp.get('lines', 0):,} lines in {inp.get('seconds', 0):.2f} s.")
    for s in inp.get("skipped", []):
        lines.append(f"  skipped {s['path']}: {s['why']}")
    return "\n".join(lines) + "\n"
