"""The text an operator reads: the verdict first, then why, then what to do.

Fits WIDTH columns: file paths are shown relative to the inputs' common folder,
long lines are wrapped. Text from the logs (group names, file names, messages)
is untrusted: control characters and newlines in it are escaped, so a log line
can neither move the cursor nor forge a line of the verdict.
"""

from __future__ import annotations

import datetime as _dt
import os
import textwrap

from ncclwatch import sanitize
from ncclwatch.diagnose import Diagnosis
from ncclwatch.diagnose.verdict import who
from ncclwatch.model import rank_ranges

WIDTH = 100
#: What the collateral ranks did, by where the stall stood: a bundle's stall still
#: live when taken had timed nobody out yet (the outcome unknown: None).
COLLATERAL = {
    "logs": "only timed out or failed waiting for them",
    "live": "waiting for them when the bundle was taken",
    "killed_by_watchdog": "only timed out or failed waiting for them",
    "ended": "waited for them",
}


def escape(text: str) -> str:
    """Control characters (newlines included), undecodable bytes, line separators
    and bidirectional overrides as visible escapes: the one escaper
    (``ncclwatch.sanitize.escape``); a tab stays a tab (the wrap expands it)."""
    return "\t".join(sanitize.escape(part) for part in text.split("\t"))


def _fit(line: str) -> list[str]:
    """One line of output within WIDTH columns (continuations indented)."""
    if len(line) <= WIDTH:
        return [line]
    indent = len(line) - len(line.lstrip(" "))
    return textwrap.wrap(line, WIDTH, subsequent_indent=" " * (indent + 4),
                         break_long_words=True, break_on_hyphens=False) or [line[:WIDTH]]


def _shortener(d: Diagnosis):
    """Paths relative to the common folder of the inputs (rows must not repeat a long path)."""
    paths = list(d.inputs.get("files", [])) + list(d.inputs.get("flight_recorder_dumps", []))
    base = ""
    if len(paths) > 1:
        try:
            base = os.path.commonpath(paths)
        except ValueError:
            base = ""
    elif paths:
        base = os.path.dirname(paths[0])
    if base and not any(p == base for p in paths):
        base = base.rstrip("/") + "/"
    else:
        base = ""

    def short(where: str) -> str:
        return where[len(base):] if base and where.startswith(base) else where
    return base, short


def _ranks(ranks: list[int]) -> str:
    return rank_ranges(ranks) if ranks else "-"


def _time(t: float | None) -> str:
    if t is None:
        return " " * 12
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).strftime("%H:%M:%S.%f")[:-3]


def _phase(d: Diagnosis) -> str:
    """Where the headline's stall stood (a COLLATERAL key)."""
    lv = d.live
    if not lv or not lv["led"]:
        return "logs"
    if lv["outcome"]:
        return "killed_by_watchdog" if lv["outcome"] == "killed_by_watchdog" else "ended"
    return "live" if lv["active"] else "ended"


def _live(lv: dict | None) -> list[str]:
    """The bundle's live verdict as it stood when taken: the stall, its root
    cause, the budget then, the daemon's advice then, and the outcome if known."""
    if not lv:
        return []
    taken = f"taken {_time(lv['taken_at']).strip()} UTC" if lv["taken_at"] else "taken"
    culprits = ", ".join(f"rank {c['rank'] if c['rank'] is not None else '?'} {c['state']}"
                         + (f" on {c['host']}" if c.get("host") else "")
                         for c in lv["culprits"]) or "no culprit named"
    w = lv["watchdog"]
    out = [f"Live verdict (the daemon's, in the bundle {taken}; "
           + ("it leads" if lv["led"] else "the logs lead") + "):",
           f"  {lv['kind']}: culprit {culprits}"
           + (f"; waiting: {_ranks(lv['waiting_ranks'])}" if lv["waiting_ranks"] else ""),
           f"  root cause ({lv['root_cause']}): {lv['cause']}",
           f"  watchdog: {w['words']} (timeout {w['timeout_from']})"]
    if lv["advice"]:
        a = lv["advice"]
        out.append(f"  advice when {w['as_of']}: {a['headline']}: {a['text']}")
    if lv["outcome"]:
        out.append(f"  outcome: {lv['outcome_words'] or lv['outcome']} "
                   f"(from the {lv['outcome_from']}"
                   + (f": {lv['outcome_sentence']})" if lv["outcome_sentence"] else ")"))
    return out + [""]


def text(d: Diagnosis) -> str:
    base, short = _shortener(d)
    lines = [f"{d.title} ({d.cls})", "", f"  {d.summary}", ""]
    if base:
        lines += [f"  (files under {base})", ""]
    if d.cls not in ("none",):
        among = ([f"  initiator among:    {_ranks(d.candidates)}  (the logs do not say "
                  "which)"] if d.candidates else [])
        lines += [f"  initiating rank(s): {_ranks(d.initiating)}", *among,
                  f"  collateral rank(s): {_ranks(d.collateral)}  ({COLLATERAL[_phase(d)]})"
                  if d.collateral else "  collateral rank(s): -"]
        if d.timeout_s:
            lines.append(f"  process-group timeout: {d.timeout_s:g} s"
                         + (f" ({d.timeout_from})" if d.timeout_from else ""))
        lines.append("")
    for n in d.notes:
        lines.append(f"  note: {n}")
    if d.notes:
        lines.append("")
    lines += _live(d.live)
    if d.evidence:
        lines.append("Evidence:")
        for where, why in d.evidence:
            lines.append(f"  {short(where)}" + (f"  {why}" if why else ""))
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
        untimed = sum(1 for t in d.timeline if t["time"] is None)
        lines.append("Timeline (UTC, each line's own stamp" + (
            f"; {untimed} line(s) carry none and are left blank" if untimed else "") + "):")
        for t in d.timeline:
            r = "" if t["rank"] is None else f"rank {t['rank']}"
            head = f"  {_time(t['time'])}  {r:<8} "
            where = f"  ({short(t['where'])})"
            room = max(20, WIDTH - len(head) - len(where))
            what = escape(t["what"])
            what = what if len(what) <= room else what[:room - 3] + "..."
            lines.append(head + what + where)
        lines.append("")
    for title, items in (("Missing evidence:", d.missing_evidence),
                         ("Collect next time:", d.collect_next_time)):
        if items:
            lines += [title, *(f"  - {m}" for m in items), ""]
    if d.alert_next_time:
        lines.append("Alert on it next time (ncclwatch, live):")
        lines += [f"  - {a['alert']}: {a['metric']} ({a['why']})" for a in d.alert_next_time]
        lines.append("")
    if d.rule_out:
        lines.append("Rule out before acting on it:")
        lines += [f"  - {s['class']}: {s['tell']}" for s in d.rule_out]
        lines.append("")
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
        lines.append(f"  skipped {short(s['path'])}: {s['why']}")
    for b in inp.get("bounded", []):
        lines.append(f"  bounded {short(b)}")
    out: list[str] = []
    for line in lines:
        out += _fit(escape(line))
    return "\n".join(out) + "\n"
