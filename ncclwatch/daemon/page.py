"""The landing page at ``/``: what an operator needs in the first minute, first.

Server-rendered from the same view as /api/v1/jobs. Each stall opens with
what fits in one screen (1400x1000): the verdict, what to do now and the
time left to decide, the budget and the forecast, the culprit, why, and the
fix in the job's own framework. Stacks come once, folded; runbooks are links
(the daemon serves them at /runbooks/). A few lines of script refresh the
live part in place every 2 s, keeping folds as the reader left them; without
script the page reloads itself. Large jobs are shown by state, not by rank.
"""

from __future__ import annotations

import math
from html import escape
from typing import Any
from urllib.parse import quote

from ncclwatch import __version__, timeoutsource
from ncclwatch.daemon.clock import ago, span
from ncclwatch.daemon.links import job_anchor
from ncclwatch.daemon.pageheaders import page_headers
from ncclwatch.model import SIZE_SOURCES, describe_container, scheduler_label
from ncclwatch.savefit import seconds

#: Jobs up to this many ranks are shown rank by rank; larger ones by state.
RANK_ROWS = 64
#: Stack groups shown per stall (the rest: the API).
MAX_GROUPS = 24
#: Fixes shown unfolded (the first, most effective; the others folded).
OPEN_FIXES = 1

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:0 1.2em 1em;color:#222}
header{padding:.4em 0;border-bottom:1px solid #ddd;margin-bottom:.4em}
h2{font-size:1.15em;margin:.5em 0 .2em}
table{border-collapse:collapse;margin:.4em 0}td,th{border:1px solid #ccc;padding:1px 8px;text-align:left}
.stall{border:2px solid #c00;padding:.4em .9em;margin:.5em 0;background:#fff5f5}
.stall.calm{border-color:#d9a400;background:#fffbea}
.verdict{font-size:1.05em}
.now{margin:.35em 0;padding:.35em .7em;border-radius:4px;color:#fff;background:#b00000}
.now.act-let_it_run{background:#2d7a2d}.now.act-dump_now{background:#a35200}
.now b{font-size:1.15em}.now .left{font-weight:bold;margin-left:.6em}
.now small{display:block;color:#fff;opacity:.92}.now small a{color:#fff}
.fix{border-left:4px solid #1a5fb4;background:#f3f7ff;padding:.2em .7em;margin:.4em 0}
.fix pre{margin:.2em 0;background:#fff}
.ended{border-left:4px solid #2d7a2d;padding:.1em .7em;margin:.3em 0}
.ended.lost{border:2px solid #c00;background:#fff5f5}
.ok{color:#070}.bad{color:#c00;font-weight:bold}.assumed{color:#a35200}
pre{background:#f6f6f6;padding:.4em;overflow:auto;margin:.2em 0;font-size:12.5px}
p{margin:.2em 0}small{color:#666}summary{cursor:pointer}
form.dump{margin:.2em 0}form.dump button{font:inherit;cursor:pointer}
"""

#: Refresh #live in place; a fold the reader opened or closed stays so.
_SCRIPT = """
(function(){
  var folds={};
  document.addEventListener('toggle',function(e){
    var d=e.target;if(d.dataset&&d.dataset.key){folds[d.dataset.key]=d.open;}},true);
  function tick(){
    fetch(location.pathname+location.search,{cache:'no-store'}).then(function(r){
      return r.ok?r.text():null;}).then(function(text){
      if(!text){return;}
      var next=new DOMParser().parseFromString(text,'text/html').getElementById('live');
      var live=document.getElementById('live');
      if(!next||!live){return;}
      next.querySelectorAll('details[data-key]').forEach(function(d){
        if(d.dataset.key in folds){d.open=folds[d.dataset.key];}});
      live.replaceWith(next);
    }).catch(function(){}).then(function(){setTimeout(tick,2000);});
  }
  setTimeout(tick,2000);
})();
"""


#: With a shard map: an alert's link to a job this shard does not hold (the
#: rules take the first daemon's URL) goes on to the page of the job's owner.
_OWNER_SCRIPT = """
(function(){
  var h=location.hash;
  if(h.indexOf('#job-')!==0||document.getElementById(h.slice(1))){return;}
  var id=decodeURIComponent(h.slice(5).replace(/\\+/g,' '));
  fetch('/api/v1/shard?job='+encodeURIComponent(id),{cache:'no-store'}).then(function(r){
    return r.ok?r.json():null;}).then(function(s){
    if(s&&s.owned===false&&s.pages.length){location.replace(s.pages[0]);}
  }).catch(function(){});
})();
"""


#: The page's headers: its own style and scripts only, framed by nobody
#: (the same definition as the paste page's, pageheaders.py); its dump
#: forms post to this daemon only.
HEADERS = page_headers(scripts=[_SCRIPT, _OWNER_SCRIPT], styles=[_CSS], forms=True)


def render(view: dict[str, Any], dump_token: str = "") -> str:
    """``dump_token``: this daemon start's dump token (dumpguard.py), which each
    job's dump form posts: a fresh ask is a POST no other site's page can make."""
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>ncclwatch</title>",
        "<noscript><meta http-equiv='refresh' content='5'></noscript>",
        f"<style>{_CSS}</style></head><body>",
        f"<header><b>ncclwatch</b> <small>{escape(__version__)}</small> · "
        "<a href='/metrics'>/metrics</a> · <a href='/api/v1/jobs'>/api/v1/jobs</a> · "
        "<a href='/api/v1/incidents'>/api/v1/incidents</a> · "
        "<a href='/runbooks/checkpoint_gather.md'>runbooks</a>"
        f"{_shards(view.get('shards'))}</header>",
        "<main id='live'>",
    ]
    if not view["jobs"]:
        parts.append("<p>No training jobs seen yet. Agents connected: "
                     f"{sum(1 for a in view['agents'] if a['connected'])}.</p>")
    # Stalled jobs first: the one that needs a person goes above the fold.
    ended: dict[str, list[dict[str, Any]]] = {}
    for e in view.get("ended") or []:
        ended.setdefault(e["job"], []).append(e)
    held = {j["job"] for j in view["jobs"]}
    # Lost jobs that left the table next, a day long: the page that woke
    # someone says the job died, not that all is well.
    gone = [_gone_job(job_id, es) for job_id, es in ended.items()
            if job_id not in held and any(_lost(e) for e in es)]
    for job in sorted(view["jobs"], key=lambda j: not j["stalls"]):
        if not job["stalls"] and gone:
            parts += gone
            gone = []
        parts.append(_job(job, ended.get(job["job"], []), dump_token))
    parts += gone
    parts.append(_agents(view["agents"]))
    owner = f"<script id='owner'>{_OWNER_SCRIPT}</script>" if view.get("shards") else ""
    parts.append(f"</main><script id='refresh'>{_SCRIPT}</script>{owner}</body></html>")
    return "".join(parts)


def _lost(e: dict[str, Any]) -> bool:
    return bool(e.get("outcome") and e["outcome"]["lost"])


def _ended(items: list[dict[str, Any]]) -> str:
    """The job's ended incidents (a day): lost ones in red with the outcome,
    the culprit and the evidence bundle; completed ones in green."""
    out = []
    for e in items:
        o = e.get("outcome")
        lost = _lost(e)
        said = escape(o["sentence"]) if o else "ended; its outcome is being decided"
        who = ", ".join(f"rank {escape(c['rank'])} on {escape(c['host'])} "
                        f"({escape(c['state'].replace('_', ' '))})" for c in e["culprits"])
        sc = e.get("forecast_score")
        score = ""
        if sc and sc.get("right") is not None:
            score = (f" · the forecast said {escape(sc['verdict'].replace('_', ' '))}: "
                     f"{'right' if sc['right'] else 'wrong'}"
                     + (f" (end off by {abs(sc['error_seconds']):.0f}s)"
                        if sc.get("error_seconds") is not None else ""))
        link = (f" · <a class='dump' href='{escape(e['evidence_bundle'])}' download>evidence "
                "bundle</a>" if e.get("evidence_bundle") else "")
        ago_ = e.get("ended_seconds_ago")
        out.append(
            f"<div class='ended {'lost' if lost else 'done'}' data-outcome='"
            f"{escape(o['outcome']) if o else ''}'><p><b class='{'bad' if lost else 'ok'}'>"
            f"{escape(e['kind'].replace('_', ' '))} ended</b>"
            f"{f' {ago_:.0f}s ago' if ago_ is not None else ''} after "
            f"{e['duration_seconds']:.0f}s: {said}</p><p><small>"
            f"{'culprit: ' + who if who else 'no culprit named'}; root cause "
            f"{escape(e['root_cause'])}{score}{link}</small></p></div>")
    return "".join(out)


def _dump_form(job_id: str, token: str) -> str:
    """A POST with the page's token: the fresh ask (pauses ranks already still,
    writes their Flight Recorder pipes) that a link, a GET, never makes."""
    return (f"<form class='dump' method='post' action='/api/v1/dump?job="
            f"{quote(job_id, safe='')}'><input type='hidden' name='token' "
            f"value='{escape(token)}'><button type='submit'>evidence bundle</button> "
            "<small>(tar.gz: asks every rank for fresh stacks first)</small></form>")


def _gone_job(job_id: str, items: list[dict[str, Any]]) -> str:
    """A lost job that left the job table: its ended incidents, under the
    anchor alerts link to."""
    return (f"<section class='job gone' id='{escape(job_anchor(job_id))}'><h2>job "
            f"{escape(job_id)} — <span class='bad'>LOST</span></h2><p><small>its ranks are "
            "gone and it left the job table; kept here for a day</small></p>"
            f"{_ended(items)}</section>")


def _job(job: dict[str, Any], ended: list[dict[str, Any]] | None = None,
         dump_token: str = "") -> str:
    w = job["watchdog"]
    stalled = bool(job["stalls"])
    ended = ended or []
    lost = not stalled and any(_lost(e) for e in ended)
    sj = job.get("scheduler_job")
    named = f"<p class='scheduler-job'>{escape(scheduler_label(sj))}</p>" if sj else ""
    out = [f"<section class='job' id='{escape(job_anchor(job['job']))}'>"
           f"<h2>job {escape(job['job'])} — <span class='{'bad' if stalled or lost else 'ok'}'>"
           f"{'STALLED' if stalled else 'LOST' if lost else 'ok'}</span></h2>{named}"
           f"<p><small>{job['ranks_reporting']}/{job['world_size']} ranks on "
           f"{escape(_nodes(job['nodes']))}; watchdog timeout {w['timeout_seconds']:.0f}s "
           f"({escape(w['timeout_source'])}){_assumed(w)}</small></p>"
           f"{_dump_form(job['job'], dump_token)}{_owner(job.get('shard'))}"]
    for s in job["stalls"]:
        out.append(_stall(job["job"], s))
    out.append(_ended(ended))
    key = escape(f"{job['job']}|ranks")
    if "ranks" not in job:  # a large job: its ranks by state (per rank: the API)
        rows = "".join(
            f"<tr><td>{escape(g['state'])}{' / ' + escape(g['op']) if g['op'] else ''}</td>"
            f"<td>{g['count']}</td><td>{escape(g['ranks'])}</td></tr>"
            for g in job["rank_states"])
        out.append(f"<details data-key='{key}'{'' if stalled else ' open'}><summary>ranks by "
                   f"state ({job['world_size']})</summary><table><tr><th>state</th>"
                   f"<th>ranks</th><th>which</th></tr>{rows}</table><p><a href='/api/v1/jobs?"
                   f"job={quote(job['job'])}&amp;ranks=1'>each rank (API, paged)</a></p>"
                   "</details></section>")
        return "".join(out)
    rows = "".join(
        f"<tr><td>{r['member']}{_conflict(r)}</td><td>{escape(r['host'])}</td>"
        f"<td>{r['pid']}{_in_container(r)}</td>"
        f"<td>{escape(r['state'])}{' / ' + escape(r['op']) if r['op'] else ''}</td>"
        f"<td>{r['for_seconds']:.0f}s</td><td>{r['cpu_utilization']:.2f}</td>"
        f"<td>{r['rss_bytes'] / 2**20:.0f} MiB</td><td>{_gpu_cell(r.get('gpu') or ())}</td>"
        "</tr>" for r in job["ranks"])
    out.append(f"<details data-key='{key}'{'' if stalled else ' open'}><summary>ranks "
               f"({len(job['ranks'])})</summary><table><tr><th>rank</th><th>host</th>"
               "<th>pid</th><th>state</th><th>for</th><th>cpu</th><th>rss</th><th>gpu</th></tr>"
               f"{rows}</table></details></section>")
    return "".join(out)


def _gpu_cell(gpus) -> str:
    """Per device: its index, the rank's memory there, utilisation, power of limit, the judged word."""
    cells = []
    for g in gpus:
        text = f"gpu{g['device']} {g['used_bytes'] / 2**30:.1f} GiB"
        if g.get("util_percent") is not None:
            text += f" {g['util_percent']}%"
        if g.get("power_watts") is not None:
            text += f" {g['power_watts']:.0f}"
            text += f"/{g['power_limit_watts']:.0f} W" if g.get("power_limit_watts") else " W"
        if g.get("activity", "unknown") != "unknown":
            text += f" {g['activity']}"
        cells.append(escape(text))
    return "<br>".join(cells) or "-"


def _shards(shards: dict[str, Any] | None) -> str:
    """' · shards: 0 (this) · 1': every shard's page, when daemons shard jobs."""
    if not shards:
        return ""
    links = [f"{k} (this)" if k == shards["self"] else
             f"<a class='shard' href='{escape(urls[0])}/'>{k}</a>"
             for k, urls in enumerate(shards["urls"])]
    return " · shards: " + " · ".join(links)


def _owner(shard: dict[str, Any] | None) -> str:
    """Which shard owns the job; a link to it when this daemon is not the owner."""
    if not shard:
        return ""
    k = shard["index"]
    if shard["owned"]:
        return f"<p class='shard'><small>shard {k} (this daemon's)</small></p>"
    links = ", ".join(f"<a href='{escape(u)}'>{escape(u.partition('/#')[0])}</a>"
                      for u in shard["pages"])
    why = ("" if shard["owned"] is None else
           " <b class='bad'>not this daemon's</b>: an agent with another shard map "
           "reports it here (mid-move?); its alerts come from its owner")
    return f"<p class='shard'><small>owned by shard {k}: {links}{why}</small></p>"


def _conflict(r: dict) -> str:
    """Numbers the job showed for an unnumbered member that disagree: shown, never merged."""
    c = r.get("rank_conflict")
    return f" <span class='bad'>(shown as {escape(c)})</span>" if c else ""


def _in_container(r: dict[str, Any]) -> str:
    text = describe_container(r.get("container"))
    return f"<span class='container'>; {escape(text)}</span>" if text else ""


def _assumed(w: dict[str, Any]) -> str:
    """The guess said as one, beside every timeout shown (timeoutsource.note)."""
    text = w.get("timeout_note") or timeoutsource.note(w["timeout_seconds"],
                                                        w.get("timeout_source", ""))
    return f" <b class='assumed'>{escape(text)}</b>" if text else ""


def _nodes(nodes: list[str]) -> str:
    return ", ".join(nodes) if len(nodes) <= 8 else f"{', '.join(nodes[:8])} and {len(nodes) - 8} more"


def _stall(job_id: str, s: dict[str, Any]) -> str:
    w, dx, now = s["watchdog"], s["diagnosis"], s.get("advice")
    key = f"{job_id}|{s['kind']}"
    used = 1 - max(w["remaining_seconds"], 0) / w["timeout_seconds"] if w["timeout_seconds"] else 0
    risk = ("<span class='bad'>AT RISK</span>" if s["at_risk"]
            else "<span class='ok'>within budget</span>")
    # The runbook where operators keep it (--runbook-url), else this daemon's copy.
    runbook = (dx.get("runbook_url") or f"/runbooks/{s['kind']}.md").partition("#")[0]
    out = [f"<div class='stall{'' if s['at_risk'] else ' calm'}' data-kind='{escape(s['kind'])}'>"
           f"<div class='verdict'>{risk} <b>{escape(s['kind'])}</b>: "
           f"{escape(dx['title'])} <small>({escape(dx['root_cause'])})</small></div>"]
    if now:
        left = ("" if now["decide_within_seconds"] is None else
                f"<span class='left'>{escape(now['headline'].partition(' (')[2].rstrip(')'))}"
                "</span>")
        out.append(f"<div class='now act-{escape(now['action'])}'><b>"
                   f"{escape(now['headline'].partition(' (')[0])}</b>{left}"
                   f"<small>{escape(now['text'])} <a "
                   f"href='{escape(runbook)}#what-to-do-now'>what to do now</a></small></div>")
    out.append(f"<p class='budget'>watchdog budget: <meter min='0' max='1' low='0.5' "
               f"high='0.75' optimum='0' value='{used:.3f}'></meter> "
               f"<b class='remaining'>{math.floor(w['remaining_seconds'])}s</b> of "
               f"{w['timeout_seconds']:.0f}s left{_assumed(w)}</p>")
    out.append(_forecast(s["forecast"], w["remaining_seconds"]))
    for c in s["culprits"]:
        files = ", ".join(f"{escape(f['path'])} ({f['size_bytes'] / 2**20:.1f} MiB)"
                          for f in c.get("files_writing", []))
        who = f"rank {c['rank']}" if c["rank"] is not None else f"unidentified rank {c['member']}"
        out.append(f"<p class='culprit' data-rank='{c['member']}'>culprit: <b>{who}</b> "
                   f"on <b>{escape(c['host'])}</b> (pid {c['pid']}{_in_container(c)}), "
                   f"{escape(c['state'])} for "
                   f"{span(c.get('for_seconds_min'), c['for_seconds'])}"
                   f"{'; writing ' + files if files else ''}</p>")
    out.append(f"<p class='why'><b>Why:</b> {escape(dx['cause'])}</p>")
    out.append(_fixes(dx, runbook, key))
    anchors = (s.get("clock") or {}).get("anchors", [])
    if anchors:
        out.append("<p class='clock'><small>clock: " + " · ".join(
            f"{escape(a['what'])} {ago(a)}" for a in anchors)
            + "</small></p>")
    out.append(_waiting(s["waiting"]))
    fr = s.get("flight_recorder")
    if fr and fr.get("sentence"):
        out.append(f"<p class='flight-recorder'>{escape(fr['sentence'])} "
                   f"<small>({fr['dumps']} dump(s), ranks {escape(fr['ranks_dumped'])}, "
                   f"{fr['oldest_dump_age_seconds']:.0f}s old)</small></p>")
    if s["unknown_ranks"]:
        out.append(f"<p class='bad'>unknown ranks (exited or not reporting, never guessed as "
                   f"culprits): {escape(', '.join(map(str, s['unknown_ranks'])))}</p>")
    shown = set()
    for c in s["culprits"]:
        st = c.get("stack")
        if st:
            shown.add(st["id"])
        out.append(_stack(f"culprit's stack: rank {c['member']}", st, f"{key}|stack|{c['member']}"))
    out.append(_groups(s["rank_groups"], shown, key))
    if s["env"]:
        env = " ".join(f"{escape(k)}={escape(v)}" for k, v in sorted(s["env"].items()))
        out.append(f"<p><small>env: {env}</small></p>")
    out.append("</div>")
    return "".join(out)


def _fixes(dx: dict[str, Any], runbook: str, key: str) -> str:
    """The fix in the job's framework (for the next run), first one unfolded."""
    fw = dx.get("framework") or {"name": "PyTorch"}
    link = f"<a href='{escape(runbook)}#{quote(dx['root_cause'])}'>runbook</a>"
    fixes = dx.get("fixes") or []
    if not fixes:
        example = f"<pre>{escape(dx['example'])}</pre>" if dx.get("example") else ""
        return (f"<div class='fix'><b>Fix:</b> {escape(dx['fix'])} <small>({link})</small>"
                f"{example}</div>")
    out = [f"<div class='fix'><b>Fix in {escape(fw['name'])}</b> <small>(for the next run; "
           f"{link})</small>"]
    for i, f in enumerate(fixes):
        body = (f"{escape(f['text'])}"
                + (f"<pre>{escape(f['snippet'])}</pre>" if f["snippet"] else ""))
        if i < OPEN_FIXES:
            out.append(f"<p><b>{escape(f['title'])}.</b> {body}</p>")
        else:
            out.append(f"<details data-key='{escape(key)}|fix|{escape(f['remedy'])}'><summary>"
                       f"<b>{escape(f['title'])}</b></summary>{body}</details>")
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
        eta = (f"{seconds(ck['eta_seconds'])} more" if ck["eta_seconds"] is not None
               else "ETA unknown")
        over = ""
        if ck["overrun_seconds"] is not None:
            over = (f", <span class='bad'>{seconds(ck['overrun_seconds'])} past the watchdog"
                    "</span>" if ck["overrun_seconds"] > 0 else
                    f", {seconds(-ck['overrun_seconds'])} to spare")
        out.append(f"<p class='forecast'>forecast: save {ck['written_bytes'] / 2**20:.1f} MiB of "
                   f"{size} at {ck['write_bytes_per_second'] / 2**20:.2f} MiB/s: {eta}{over}</p>")
    for m in f.get("memory", []):
        # Only the forecasts that bear on this stall (diagnosis.StallEvidence.memory_applies).
        if m["eta_seconds"] is not None and m.get("applies", True):
            out.append(f"<p class='forecast bad'>forecast: rank {m['rank']} "
                       f"{escape(m['device'])} memory: {m['used_bytes'] / 2**30:.2f} of "
                       f"{m['limit_bytes'] / 2**30:.2f} GiB, full in about "
                       f"{seconds(m['eta_seconds'])}</p>")
    return "".join(out)


def _stack(title: str, stack: dict[str, Any] | None, key: str) -> str:
    """One stack, folded."""
    if not stack:
        return f"<p><small>{escape(title)}: not yet received</small></p>"
    lines = "\n".join(f"{escape(f['name'])} ({escape(f['file'])}:{f['line']})"
                      for f in stack["frames"])
    return (f"<details data-key='{escape(key)}'><summary>{escape(title)} "
            f"({len(stack['frames'])} frames)</summary><pre>{lines}</pre></details>")


def _groups(groups: list[dict[str, Any]], shown: set[str], key: str) -> str:
    """Ranks grouped by stack, outliers first; a stack already shown is not repeated."""
    out = [f"<details data-key='{escape(key)}|groups'><summary>ranks grouped by stack "
           f"({len(groups)} group(s), outliers first)</summary>"]
    for i, g in enumerate(groups[:MAX_GROUPS]):
        op = f" / {escape(g['op'])}" if g["op"] else ""
        st = g.get("stack")
        line = (f"<p class='group'>{g['count']} rank(s) {escape(g['ranks'])}: "
                f"{escape(g['state'])}{op}")
        if st and st["id"] in shown:
            out.append(line + " <small>(the culprit's stack, above)</small></p>")
        else:
            out.append(line + "</p>" + _stack("stack", st, f"{key}|group|{i}"))
    if len(groups) > MAX_GROUPS:
        out.append(f"<p><small>and {len(groups) - MAX_GROUPS} more group(s): "
                   "/api/v1/jobs</small></p>")
    out.append("</details>")
    return "".join(out)


def _agents(agents: list[dict[str, Any]]) -> str:
    """The agents' table; nodes whose parts were dropped or reports refused
    lately come first, their faults in red (a blind node is never silent)."""
    shown = sorted(agents, key=lambda a: not a.get("faults_recent"))[:RANK_ROWS]
    rows = "".join(
        f"<tr><td>{escape(a['node'])}</td><td>{'yes' if a['connected'] else 'no'}</td>"
        f"<td>{_last_report(a)}</td><td>{a['ranks_watched']}</td>"
        f"<td>{'yes' if a['nvml_up'] else 'no'}</td><td>{_faults(a)}</td></tr>" for a in shown)
    more = (f"<p><small>and {len(agents) - RANK_ROWS} more (API)</small></p>"
            if len(agents) > RANK_ROWS else "")
    loud = " open" if any(a.get("faults_recent") for a in agents) else ""
    return (f"<details data-key='agents'{loud}><summary>agents ({len(agents)})</summary><table>"
            f"<tr><th>node</th><th>connected</th><th>last report</th><th>ranks</th><th>NVML</th>"
            f"<th>report faults</th></tr>{rows}</table>{more}</details>")


def fault_sentence(a: dict[str, Any]) -> str:
    """What the page and ``ncclwatch status`` say of an agents-view row with
    faults: "12 parts dropped or refused (world_size: 10, ...) since the daemon
    started; last 3s ago" ("" for none)."""
    faults, left = a.get("faults") or {}, a.get("left_out") or {}
    said = []
    if faults:
        said.append(f"{sum(faults.values())} parts dropped or reports refused ({_by(faults)}) "
                    f"since the daemon started; last {a.get('last_fault_seconds_ago') or 0:.0f}s "
                    "ago")
    if left:
        said.append(f"{sum(left.values())} samples the agent left out before sending "
                    f"({_by(left)}); last {a.get('left_out_seconds_ago') or 0:.0f}s ago")
    return "; ".join(said)


def _by(counts: dict[str, int]) -> str:
    return ", ".join(f"{r}: {n}" for r, n in sorted(counts.items(), key=lambda x: (-x[1], x[0])))


def _last_report(a: dict[str, Any]) -> str:
    s = a.get("last_report_seconds")
    return "never applied" if s is None else f"{s:.0f}s ago"


def _faults(a: dict[str, Any]) -> str:
    text = fault_sentence(a)
    if not text:
        return "-"
    return (f"<b class='bad faults'>{escape(text)}</b>" if a.get("faults_recent")
            else f"<small>{escape(text)}</small>")
