"""The landing page at ``/``: what an operator needs in the first minute.

Server-rendered from the same view as /api/v1/jobs, refreshing itself; no
JavaScript, so it works through any proxy and in a terminal browser.
"""

from __future__ import annotations

from html import escape
from typing import Any
from urllib.parse import quote

from ncclwatch import __version__
from ncclwatch.model import SIZE_SOURCES, scheduler_label

#: Jobs up to this many ranks are shown rank by rank; larger ones by state.
RANK_ROWS = 64

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.3em}h2{font-size:1.1em;margin-top:1.5em}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:2px 8px;text-align:left}
.stall{border:2px solid #c00;padding:.5em 1em;margin:.8em 0;background:#fff5f5}
.ok{color:#070}.bad{color:#c00;font-weight:bold}pre{background:#f6f6f6;padding:.5em;overflow:auto}
small{color:#666}
"""


def render(view: dict[str, Any]) -> str:
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        "<meta http-equiv='refresh' content='2'><title>ncclwatch</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>ncclwatch <small>{escape(__version__)}</small></h1>",
        "<p><a href='/metrics'>/metrics</a> · <a href='/api/v1/jobs'>/api/v1/jobs</a> · "
        "<a href='/api/v1/incidents'>/api/v1/incidents</a></p>",
    ]
    if not view["jobs"]:
        parts.append("<p>No training jobs seen yet. Agents connected: "
                     f"{sum(1 for a in view['agents'] if a['connected'])}.</p>")
    for job in view["jobs"]:
        parts.append(_job(job))
    parts.append(_agents(view["agents"]))
    parts.append("</body></html>")
    return "".join(parts)


def _job(job: dict[str, Any]) -> str:
    w = job["watchdog"]
    stalled = bool(job["stalls"])
    sj = job.get("scheduler_job")
    named = f"<p class='scheduler-job'>{escape(scheduler_label(sj))}</p>" if sj else ""
    head = (f"<h2>job {escape(job['job'])} — "
            f"<span class='{'bad' if stalled else 'ok'}'>{'STALLED' if stalled else 'ok'}</span></h2>"
            + named + f"<p>{job['ranks_reporting']}/{job['world_size']} ranks on "
            f"{escape(', '.join(job['nodes']))}; watchdog timeout {w['timeout_seconds']:.0f}s "
            f"({escape(w['timeout_source'])}), <b>{w['remaining_seconds']:.0f}s left</b></p>")
    out = [head]
    for s in job["stalls"]:
        out.append(_stall(s))
    if "ranks" not in job:  # a large job: its ranks by state (per rank: the API)
        rows = "".join(
            f"<tr><td>{escape(g['state'])}{' / ' + escape(g['op']) if g['op'] else ''}</td>"
            f"<td>{g['count']}</td><td>{escape(g['ranks'])}</td></tr>"
            for g in job["rank_states"])
        out.append("<table><tr><th>state</th><th>ranks</th><th>which</th></tr>"
                   f"{rows}</table><p><a href='/api/v1/jobs?job={quote(job['job'])}&amp;ranks=1'>"
                   "each rank (API, paged)</a></p>")
        return "".join(out)
    rows = "".join(
        f"<tr><td>{r['member']}</td><td>{escape(r['host'])}</td><td>{r['pid']}</td>"
        f"<td>{escape(r['state'])}{' / ' + escape(r['op']) if r['op'] else ''}</td>"
        f"<td>{r['for_seconds']:.0f}s</td><td>{r['cpu_utilization']:.2f}</td>"
        f"<td>{r['rss_bytes'] / 2**20:.0f} MiB</td></tr>" for r in job["ranks"])
    out.append("<table><tr><th>rank</th><th>host</th><th>pid</th><th>state</th>"
               f"<th>for</th><th>cpu</th><th>rss</th></tr>{rows}</table>")
    return "".join(out)


def _stall(s: dict[str, Any]) -> str:
    w, dx = s["watchdog"], s["diagnosis"]
    used = 1 - max(w["remaining_seconds"], 0) / w["timeout_seconds"] if w["timeout_seconds"] else 0
    risk = "<span class='bad'>AT RISK</span> " if s["at_risk"] else ""
    out = [f"<div class='stall' data-kind='{escape(s['kind'])}'>{risk}"
           f"<b>{escape(s['kind'])}</b>: {escape(s['summary'])}<br>",
           f"watchdog budget: <meter min='0' max='1' low='0.5' high='0.75' optimum='0' "
           f"value='{used:.3f}'></meter> <b class='remaining'>{w['remaining_seconds']:.0f}s</b> "
           f"of {w['timeout_seconds']:.0f}s left (stalled {s['duration_seconds']:.0f}s)"]
    out.append(_forecast(s["forecast"], w["remaining_seconds"]))
    for c in s["culprits"]:
        files = ", ".join(f"{escape(f['path'])} ({f['size_bytes'] / 2**20:.1f} MiB)"
                          for f in c.get("files_writing", []))
        who = f"rank {c['rank']}" if c["rank"] is not None else f"unidentified rank {c['member']}"
        out.append(f"<p class='culprit' data-rank='{c['member']}'>culprit: <b>{who}</b> "
                   f"on <b>{escape(c['host'])}</b> (pid {c['pid']}), {escape(c['state'])} for "
                   f"{c['for_seconds']:.0f}s{'; writing ' + files if files else ''}</p>")
        out.append(_stack(c.get("stack")))
    out.append(_waiting(s["waiting"]))
    fr = s.get("flight_recorder")
    if fr and fr.get("sentence"):
        out.append(f"<p class='flight-recorder'>{escape(fr['sentence'])} "
                   f"<small>({fr['dumps']} dump(s), ranks {escape(fr['ranks_dumped'])}, "
                   f"{fr['oldest_dump_age_seconds']:.0f}s old)</small></p>")
    if s["unknown_ranks"]:
        out.append(f"<p class='bad'>unknown ranks (exited or not reporting, never guessed as "
                   f"culprits): {escape(', '.join(map(str, s['unknown_ranks'])))}</p>")
    out.append("<details open><summary>ranks grouped by stack (outliers first)</summary>")
    for g in s["rank_groups"]:
        op = f" / {escape(g['op'])}" if g["op"] else ""
        out.append(f"<p class='group'>{g['count']} rank(s) {escape(g['ranks'])}: "
                   f"{escape(g['state'])}{op}</p>{_stack(g['stack'])}")
    out.append("</details>")
    out.append(f"<p><b>Why:</b> {escape(dx['cause'])}<br><b>Fix:</b> {escape(dx['fix'])}"
               f"<br><small>runbook: {escape(dx['runbook'])}</small></p>")
    if dx.get("example"):
        out.append(f"<pre>{escape(dx['example'])}</pre>")
    if s["env"]:
        env = " ".join(f"{escape(k)}={escape(v)}" for k, v in sorted(s["env"].items()))
        out.append(f"<p><small>env: {env}</small></p>")
    out.append("</div>")
    return "".join(out)


def _waiting(w: dict[str, Any]) -> str:
    """Who waits, and how that was established (python/native frame, Flight
    Recorder, or stillness: provisional)."""
    how = "; ".join(f"{escape(k.replace('_', ' '))}: {escape(','.join(map(str, v)))}"
                    for k, v in (w.get("evidence") or {}).items())
    tag = " <span class='bad'>provisional</span>" if w.get("provisional") else ""
    return (f"<p class='waiting'>waiting: ranks {escape(','.join(map(str, w['ranks'])))} in "
            f"{escape('/'.join(w['ops']))}{' (by ' + how + ')' if how else ''}{tag}</p>")


def _forecast(f: dict[str, Any], remaining: float) -> str:
    out = []
    ck = f.get("checkpoint")
    if ck:
        size = (f"{ck['expected_bytes'] / 2**20:.1f} MiB (size from the "
                f"{escape(SIZE_SOURCES.get(ck.get('expected_source') or '', 'unknown source'))})"
                if ck["expected_bytes"] is not None else "unknown size")
        eta = f"{ck['eta_seconds']:.0f}s more" if ck["eta_seconds"] is not None else "ETA unknown"
        over = ""
        if ck["overrun_seconds"] is not None:
            over = (f", <span class='bad'>{ck['overrun_seconds']:.0f}s past the watchdog</span>"
                    if ck["overrun_seconds"] > 0 else
                    f", {-ck['overrun_seconds']:.0f}s to spare")
        out.append(f"<p class='forecast'>save: {ck['written_bytes'] / 2**20:.1f} MiB of {size} at "
                   f"{ck['write_bytes_per_second'] / 2**20:.2f} MiB/s: {eta}{over}</p>")
    for m in f.get("memory", []):
        if m["eta_seconds"] is not None:
            bad = " bad" if m["eta_seconds"] < remaining else ""
            out.append(f"<p class='forecast{bad}'>rank {m['rank']} {escape(m['device'])} memory: "
                       f"{m['used_bytes'] / 2**30:.2f} of {m['limit_bytes'] / 2**30:.2f} GiB, "
                       f"full in about {m['eta_seconds']:.0f}s</p>")
    return "".join(out)


def _stack(stack: dict[str, Any] | None) -> str:
    if not stack:
        return "<pre>(stack not yet received)</pre>"
    lines = "\n".join(f"{escape(f['name'])} ({escape(f['file'])}:{f['line']})"
                      for f in stack["frames"])
    return f"<pre>{lines}</pre>"


def _agents(agents: list[dict[str, Any]]) -> str:
    rows = "".join(
        f"<tr><td>{escape(a['node'])}</td><td>{'yes' if a['connected'] else 'no'}</td>"
        f"<td>{a['last_report_seconds']:.0f}s ago</td><td>{a['ranks_watched']}</td>"
        f"<td>{'yes' if a['nvml_up'] else 'no'}</td></tr>" for a in agents)
    return ("<h2>agents</h2><table><tr><th>node</th><th>connected</th><th>last report</th>"
            f"<th>ranks</th><th>NVML</th></tr>{rows}</table>")
