"""``ncclwatch status``: the live jobs and stalls as a terminal table."""

from __future__ import annotations

import base64
import json
import math
import ssl
import sys
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import unquote, urljoin, urlsplit, urlunsplit

from ncclwatch import sanitize, timeoutsource
from ncclwatch.daemon.clock import ago, span
from ncclwatch.daemon.page import fault_sentence
from ncclwatch.model import SIZE_SOURCES, describe_container, rank_ranges, scheduler_label
from ncclwatch.savefit import seconds

DEFAULT_DAEMON = "http://127.0.0.1:7471"

#: The anchor a culprit's "for Ns" counts from (the incident's clock, daemon/clock.py).
STATE_ANCHOR = {"saving": "save start", "gathering_state_dict": "gather start",
                "loading": "load start"}


class StatusError(RuntimeError):
    pass


def split_credentials(daemon: str, auth: str | None = None) -> tuple[str, str | None]:
    """The URL without user info (safe to print), and ``user:pass`` from the URL
    or else from ``auth`` (NCCLWATCH_DAEMON_AUTH)."""
    parts = urlsplit(daemon)
    if parts.username is None:
        return daemon, auth or None
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host + (f":{parts.port}" if parts.port else "")
    clean = urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    return clean, f"{unquote(parts.username)}:{unquote(parts.password or '')}"


def origin(url: str) -> tuple[str, str, int | None]:
    """A URL's origin: scheme, host and port (the scheme's default when none)."""
    parts = urlsplit(url)
    port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    return parts.scheme.lower(), (parts.hostname or "").lower(), port


class Credentials:
    """Basic-auth credentials bound to the origins the user typed: a URL's own
    user info for its origin, else NCCLWATCH_DAEMON_AUTH (or the first URL's)
    for every typed origin. A URL that a daemon listed (a shard map) or a
    redirect named gets none unless its origin is one of those, scheme
    included: never over http unless the user typed http."""

    def __init__(self, typed: list[str], auth: str | None = None) -> None:
        fallback = auth or (split_credentials(typed[0])[1] if typed else None)
        self.by_origin: dict[tuple[str, str, int | None], str] = {}
        for url in typed:
            clean, own = split_credentials(url)
            chosen = own if urlsplit(url).username is not None else fallback
            if chosen:
                self.by_origin.setdefault(origin(clean), chosen)

    def for_url(self, url: str) -> str | None:
        return self.by_origin.get(origin(url))


def fetch(daemon: str, timeout: float = 5.0, *, ca: str | None = None,
          auth: str | None = None, creds: Credentials | None = None) -> dict[str, Any]:
    """Every job's summary (all pages of /api/v1/jobs). ``creds``: which origins
    get credentials (default: the one of ``daemon``, as typed)."""
    creds = creds or Credentials([daemon], auth)
    daemon = split_credentials(daemon)[0]
    view = _fetch_page(daemon, "", timeout, ca=ca, creds=creds)
    while view.get("next_cursor"):
        more = _fetch_page(daemon, view["next_cursor"], timeout, ca=ca, creds=creds)
        view["jobs"] += more["jobs"]
        view["next_cursor"] = more.get("next_cursor")
    return view


def fetch_shards(daemons: str, timeout: float = 5.0, *, ca: str | None = None,
                 auth: str | None = None) -> tuple[dict[str, Any], list[str]]:
    """Every shard's jobs in one view, and what could not be asked.

    ``daemons``: one URL, an HA pair (``a,b``: the first that answers) or
    shards (``a0,b0;a1,b1``). One shard whose daemon knows the shard map
    (``--shards``) stands for all: every other shard is asked too. A job
    reported by more than one shard (agents mid-move) is shown from its owner.
    """
    from ncclwatch.shard import shard, shard_list

    try:
        groups = [list(g) for g in shard_list(daemons)]
    except ValueError as e:
        raise StatusError(f"--daemon {daemons!r}: {e}") from None
    # Credentials go only to the origins typed here, never to a URL a daemon
    # listed: a shard map may name other hosts, or http.
    creds = Credentials([u for g in groups for u in g], auth)
    views: dict[int, dict[str, Any]] = {}
    errors = []
    if len(groups) == 1:
        first = _ask_shard(groups[0], timeout, ca=ca, creds=creds)
        known = first.get("shards") or {}
        if known.get("count", 1) <= 1:
            return first, errors
        groups = known["urls"]
        if known.get("self") is not None:
            views[known["self"]] = first
    for k, group in enumerate(groups):
        if k not in views:
            try:
                views[k] = _ask_shard(group, timeout, ca=ca, creds=creds)
            except StatusError as e:
                errors.append(f"shard {k}: {e}")
    if not views:
        raise StatusError("; ".join(errors))
    n = len(groups)
    first = views[min(views)]
    jobs: dict[str, dict[str, Any]] = {}
    agents: dict[str, dict[str, Any]] = {}
    for k, v in sorted(views.items()):
        for j in v["jobs"]:
            owner = shard(j["job"], n)
            j["shard"] = {**j.get("shard", {}), "index": owner, "owned": owner == k,
                          "reported_by": sorted({k, *jobs.get(j["job"], {}).get(
                              "shard", {}).get("reported_by", [])})}
            if j["job"] not in jobs or owner == k:
                jobs[j["job"]] = j
            else:
                jobs[j["job"]]["shard"]["reported_by"] = j["shard"]["reported_by"]
        for a in v.get("agents", []):  # every shard hears every node
            key = a["agent_id"] or "node:" + a["node"]   # "": no agent held (refused)
            held = agents.get(key)
            if held is None or a.get("connected"):
                agents[key] = a
            if held is not None:   # each shard drops its own jobs' parts: say them all
                agents[key] = {**agents[key], **_both_faults(a, held)}
    ended = {e["id"]: e for k, v in sorted(views.items()) for e in v.get("ended") or []
             if shard(e["job"], n) == k}
    view = {**first, "jobs": [jobs[j] for j in sorted(jobs)], "next_cursor": None,
            "ended": sorted(ended.values(), key=lambda e: -(e.get("ended_at") or 0)),
            "agents": sorted(agents.values(), key=lambda a: (a["node"], a["agent_id"])),
            "shards": {"count": n, "asked": sorted(views), "urls": groups}}
    return view, errors


def _ask_shard(group: list[str], timeout: float, *, ca: str | None,
               creds: Credentials) -> dict[str, Any]:
    """A shard's view from the first of its daemons that answers."""
    last: StatusError | None = None
    for url in group:
        try:
            return fetch(url, timeout, ca=ca, creds=creds)
        except StatusError as e:
            last = e
    assert last is not None
    raise last


class _SameOriginAuth(urllib.request.HTTPRedirectHandler):
    """Follows a redirect; the Authorization header (never copied by urllib:
    it is an unredirected header) goes along only to the same origin."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: ANN001
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        auth = req.unredirected_hdrs.get("Authorization")
        if new is not None and auth and origin(new.full_url) == origin(req.full_url):
            new.add_unredirected_header("Authorization", auth)
        return new


def _fetch_page(daemon: str, cursor: str, timeout: float, *, ca: str | None,
                creds: Credentials) -> dict[str, Any]:
    auth = creds.for_url(daemon)
    url = daemon.rstrip("/") + "/api/v1/jobs" + (f"?cursor={cursor}" if cursor else "")
    req = urllib.request.Request(url)
    if auth:
        req.add_unredirected_header(
            "Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        ctx = ssl.create_default_context(cafile=ca) if ca else None
    except (OSError, ssl.SSLError) as e:
        raise StatusError(f"cannot load --ca {ca}: {e}") from None
    opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=ctx),
                                         _SameOriginAuth())
    try:
        with opener.open(req, timeout=timeout) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:
        if e.code == 401:
            who = (f"rejected the credentials of user {auth.partition(':')[0]!r}" if auth else
                   "needs basic auth: https://user:pass@host:7471 or "
                   "NCCLWATCH_DAEMON_AUTH=user:pass (credentials go only to the URLs given "
                   "in --daemon: give every shard there, 'URL0;URL1')")
            raise StatusError(f"the ncclwatch daemon at {daemon} {who}") from None
        raise StatusError(f"bad answer from {url}: HTTP {e.code} {e.reason}") from None
    except urllib.error.URLError as e:
        hint = " (give the daemon's CA with --ca)" if isinstance(
            e.reason, ssl.SSLCertVerificationError) and not ca else ""
        raise StatusError(f"cannot reach the ncclwatch daemon at {daemon}: "
                          f"{e.reason}{hint}") from None
    except (OSError, ValueError) as e:
        raise StatusError(f"bad answer from {url}: {e}") from None


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [fmt.format(*header), fmt.format(*("-" * w for w in widths))]
    lines += [fmt.format(*map(str, r)) for r in rows]
    return "\n".join(line.rstrip() for line in lines)


def terminal_view(view: dict[str, Any]) -> dict[str, Any]:
    """``view`` with every string escaped (sanitize.deep): job ids, Slurm
    names, hosts, stack frames, paths and the sentences that quote them, so
    nothing a job chose can move the cursor, clear the screen or forge a line.

    A fix's snippet is ncclwatch's own multi-line code (remediation.FIXES, no
    job text in it): it becomes ``snippet_lines``, split at its newlines first
    and each line escaped, so it prints as the lines it is."""
    safe = sanitize.deep(view)
    for raw, job in zip(view.get("jobs", []), safe.get("jobs", [])):
        for raw_stall, stall in zip(raw.get("stalls", []), job.get("stalls", [])):
            fixes = (raw_stall.get("diagnosis") or {}).get("fixes", [])
            for fx, out in zip(fixes, (stall.get("diagnosis") or {}).get("fixes", [])):
                out["snippet_lines"] = [sanitize.escape(line)
                                        for line in str(fx.get("snippet", "")).splitlines()]
    return safe


def _assumed(w: dict[str, Any], job_w: dict[str, Any]) -> str:
    """"(assumed 600 s ...)" where the timeout is a guess (timeoutsource.note);
    a stall's view from an older daemon has no source: the job's says it."""
    note = w.get("timeout_note")
    if note is None:
        note = timeoutsource.note(w["timeout_seconds"],
                                  w.get("timeout_source") or job_w.get("timeout_source", ""))
    return f" ({note})" if note else ""


def render(view: dict[str, Any], daemon: str = "") -> str:
    """The terminal text of a /api/v1/jobs view, every string escaped
    (terminal_view)."""
    view = terminal_view(view)
    jobs = view.get("jobs", [])
    lost = _lost_lines(view.get("ended") or []) + _fault_lines(view.get("agents", []))
    if not jobs:
        n = sum(1 for a in view.get("agents", []) if a.get("connected"))
        return "\n".join([f"no training jobs seen ({n} agent(s) connected)", *lost])
    out = []
    rows = []
    sharded = (view.get("shards") or {}).get("count", 1) > 1
    for j in jobs:
        stalls = ", ".join(s["kind"] for s in j["stalls"]) or "-"
        w = j["watchdog"]
        rows.append([j["job"], scheduler_label(j.get("scheduler_job")) or "-",
                     f"{j['ranks_reporting']}/{j['world_size']}",
                     ",".join(j["nodes"]), stalls,
                     f"{_left(w)}s/{w['timeout_seconds']:.0f}s"
                     + (" assumed" if timeoutsource.assumed(w.get("timeout_source", "")) else "")]
                    + ([_shard_text(j.get("shard") or {})] if sharded else []))
    out.append(_table(rows, ["JOB", "SCHEDULER JOB", "RANKS", "NODES", "STALL",
                             "WATCHDOG LEFT"] + (["SHARD"] if sharded else [])))
    for j in jobs:
        out += _identity_lines(j)
    for j in jobs:
        for s in j["stalls"]:
            out.append("")
            dx = s.get("diagnosis") or {}
            risk = "AT RISK" if s.get("at_risk") else "within budget"
            out.append(f"STALL {s['kind']} in {j['job']} ({risk}): {s['summary']}")
            if dx:
                out.append(f"  root cause ({dx['root_cause']}): {dx['cause']}")
            now = s.get("advice")
            if now:
                out.append(f"  NOW: {now['headline']}")
                out.append(f"       {now['text']}")
                for c in now.get("commands") or ():
                    out.append(f"       {c['step']}: {c['command']}")
            w = s["watchdog"]
            out.append(f"  watchdog: {_left(w)}s of {w['timeout_seconds']:.0f}s "
                       f"left{_assumed(w, j['watchdog'])}")
            anchors = (s.get("clock") or {}).get("anchors", [])
            if anchors:  # every duration from one reading, each naming its anchor
                out.append("  clock: " + "; ".join(
                    f"{a['what']} {ago(a)}" for a in anchors))
            ck = (s.get("forecast") or {}).get("checkpoint")
            if ck:
                size = (f"{ck['expected_bytes'] / 2**20:.1f} MiB (size from "
                        f"the {SIZE_SOURCES.get(ck.get('expected_source') or '', 'unknown source')})"
                        if ck.get("expected_bytes") is not None else "an unknown size")
                out.append(f"  checkpoint: {ck['written_bytes'] / 2**20:.1f} MiB of {size} written "
                           f"at {ck['write_bytes_per_second'] / 2**20:.2f} MiB/s")
            if ck and ck.get("eta_seconds") is not None:
                over = ck["overrun_seconds"]
                fires = ("an assumed watchdog fires" if _assumed(w, j["watchdog"])
                         else "the watchdog fires")
                out.append(f"  forecast: save ends in {seconds(ck['eta_seconds'])}, "
                           + (f"{seconds(over)} after {fires}" if over > 0 else
                              f"{seconds(-over)} before {fires}"))
            for m in (s.get("forecast") or {}).get("memory", []):
                if m.get("eta_seconds") is not None and m.get("applies", True):
                    out.append(f"  forecast: rank {m['rank']} reaches its {m['device']} memory "
                               f"limit in {seconds(m['eta_seconds'])}")
            for c in s["culprits"]:
                where = describe_container(c.get("container"))
                out.append(f"  culprit: rank {c.get('member', c['rank'])} on {c['host']} "
                           f"(pid {c['pid']}{'; ' + where if where else ''}) "
                           f"{c['state']} for {span(c.get('for_seconds_min'), c['for_seconds'])} "
                           f"(since {STATE_ANCHOR.get(c['state'], c['state'] + ' began')})")
                for f in (c.get("stack") or {}).get("frames", [])[:8]:
                    out.append(f"      {f['name']} ({f['file']}:{f['line']})")
            waited = {a["id"]: a["seconds_ago"] for a in anchors}.get("first_wait")
            out.append(f"  waiting: ranks {_ranks_text(s['waiting']['ranks'])} in "
                       f"{'/'.join(s['waiting']['ops'])}"
                       + (f" for {waited:.0f}s (since the first wait)" if waited is not None
                          else "") + _evidence_text(s["waiting"]))
            fr = s.get("flight_recorder")
            if fr and fr.get("sentence"):
                out.append(f"  {fr['sentence']} ({fr['dumps']} dump(s), "
                           f"{fr['oldest_dump_age_seconds']:.0f}s old)")
            fw = dx.get("framework")
            if not dx.get("fixes"):  # no framework rows: the root cause's own words
                out.append(f"  fix: {s['fix']}")
            for fx in dx.get("fixes", []):
                out.append(f"  fix for {fw['name'] if fw else fx['framework']}: {fx['title']}. "
                           f"{fx['text']}")
                out += [f"      {line}" if line else "" for line in fx["snippet_lines"]]
            if dx.get("runbook_url") or dx.get("runbook"):
                out.append(f"  runbook: {urljoin(daemon, dx.get('runbook_url') or dx['runbook'])}")
        for w in j.get("config_warnings", []):
            out.append("")
            out.append(f"{w['severity'].upper()} {j['job']} ({w['code']}): {w['message']}")
        states = {g["state"] + (f"/{g['op']}" if g["op"] else ""): g["ranks"]
                  for g in j.get("rank_states", [])}
        if states:
            out.append("")
            out.append(f"{j['job']} ranks: " + "; ".join(
                f"{k}: {v}" for k, v in sorted(states.items())))
    return "\n".join(out + lost)


def _lost_lines(ended: list[dict[str, Any]]) -> list[str]:
    """Jobs a stall lost in the last day (the API's ``ended``, outcome.py): said
    after the live ones, so a resolved alert never reads as all well."""
    out = []
    for e in ended:
        o = e.get("outcome") or {}
        if not o.get("lost"):
            continue
        who = ", ".join(f"rank {c['rank']} on {c['host']} ({c['state']})"
                        for c in e.get("culprits", [])) or "no culprit named"
        ago_ = e.get("ended_seconds_ago")
        out += ["", f"LOST {e['job']}: {e['kind']} ended"
                    + (f" {seconds(ago_)} ago" if ago_ is not None else "")
                    + f": {o.get('sentence', '')}",
                f"  culprit: {who}; root cause {e.get('root_cause', '?')}"]
        if e.get("evidence_bundle"):
            out.append(f"  evidence bundle: {e['evidence_bundle']}")
    return out


def _fault_lines(agents: list[dict[str, Any]]) -> list[str]:
    """A line per node whose report parts were dropped or reports refused
    lately (the API's ``faults_recent``): a blind node is never silent."""
    by_node: dict[str, dict[str, Any]] = {}
    for a in agents:
        if a.get("faults_recent") and a["node"] not in by_node:
            by_node[a["node"]] = a
    if not by_node:
        return []
    return ["", *(f"FAULTS on {node}: {fault_sentence(a)}; those parts are missing from "
                  f"the daemon's picture (runbook ncclwatch_health.md#node-report-faults)"
                  for node, a in sorted(by_node.items()))]


def _both_faults(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Two shards' fault fields of one agent as one: counts summed, the later last."""
    faults = dict(a.get("faults") or {})
    for r, n in (b.get("faults") or {}).items():
        faults[r] = faults.get(r, 0) + n
    agos = [x for x in (a.get("last_fault_seconds_ago"), b.get("last_fault_seconds_ago"))
            if x is not None]
    # The agent's own count is the same agent's health, seen by both: the larger.
    left = dict(a.get("left_out") or {})
    for r, n in (b.get("left_out") or {}).items():
        left[r] = max(left.get(r, 0), n)
    left_agos = [x for x in (a.get("left_out_seconds_ago"), b.get("left_out_seconds_ago"))
                 if x is not None]
    return {"faults": faults, "last_fault_seconds_ago": min(agos) if agos else None,
            "left_out": left, "left_out_seconds_ago": min(left_agos) if left_agos else None,
            "faults_recent": bool(a.get("faults_recent") or b.get("faults_recent"))}


def _identity_lines(j: dict) -> list[str]:
    """Ranks two nodes report, and timeout changes: said, never silent."""
    out = []
    for c in j.get("contested_ranks") or []:
        o = c["owner"]
        others = ", ".join(f"{x['host']} (pid {x['pid']})" for x in c["contenders"])
        out.append(f"{j['job']}: rank {c['rank']} also reported by {others}; "
                   f"owned by {o['host']} (pid {o['pid']})")
    for t in j.get("timeout_changes") or []:
        out.append(f"{j['job']}: {t['timeout'].replace('_', ' ')} timeout changed from "
                   f"{t['from_seconds']:g}s to {t['to_seconds']:g}s "
                   f"({t['host']}, rank {t['rank']}) {t['seconds_ago']:.0f}s ago")
    return out
def _shard_text(sh: dict[str, Any]) -> str:
    """'1', or '1 (also seen on 0)' for a job an agent with another map reports."""
    k = sh.get("index", "?")
    also = [str(x) for x in sh.get("reported_by", []) if x != k]
    return f"{k} (also seen on {','.join(also)})" if also else str(k)


def _left(w: dict[str, Any]) -> int:
    """Whole seconds of budget, rounded down: never more time than there is."""
    return math.floor(w["remaining_seconds"])


def _evidence_text(w: dict) -> str:
    """' (by native_frame: 1-2)': how the waiting was established."""
    ev = w.get("evidence") or {}
    if not ev:
        return ""
    text = "; ".join(f"{k}: {_ranks_text(v)}" for k, v in ev.items())
    return f" (by {text}{', PROVISIONAL' if w.get('provisional') else ''})"


def _ranks_text(items: list[int | str]) -> str:
    """Rank numbers as ranges, then members whose rank is unknown ('?1')."""
    return ",".join(filter(None, [rank_ranges(i for i in items if isinstance(i, int)),
                                  *(str(i) for i in items if not isinstance(i, int))]))


def main(daemon: str, as_json: bool, *, ca: str | None = None, auth: str | None = None) -> int:
    """Exit 0; 1 when a shard could not be asked (the others are still shown)."""
    view, errors = fetch_shards(daemon, ca=ca, auth=auth)
    first = split_credentials(daemon.split(";")[0].split(",")[0])[0]
    print(json.dumps(view, indent=1) if as_json else render(view, first))
    for e in errors:
        print(f"ncclwatch status: {e}", file=sys.stderr)
    return 1 if errors else 0
