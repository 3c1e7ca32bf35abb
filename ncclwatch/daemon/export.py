"""Prometheus exposition: fresh families per scrape, built mostly off the event loop.

As in client_python's own collectors, nothing is cached between scrapes.
A scrape has two steps so that 16k ranks never hold the daemon's event loop
for the length of a render: ``capture`` runs on the loop (via ``call``) and
only takes what must be consistent, per job and per incident, plus shallow
copies of the rank and agent lists (C-speed list copies); ``build`` then
walks those ranks and agents in the HTTP thread and ``encode`` writes the
text format directly (client_python's per-sample objects cost more than the
whole walk at this size). ``DaemonCollector`` serves the same rows to a
client_python registry. Cardinality stays bounded: per-rank series only for
culprits; everything else is per job, per node or per state.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
)
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString

from ncclwatch import __version__
from ncclwatch.contract.checks import REASONS
from ncclwatch.daemon import dumpguard, links
from ncclwatch.daemon.agents import AgentRecord
from ncclwatch.contract.bounds import BOUND_LABELS
from ncclwatch.daemon.core import Daemon
from ncclwatch.daemon.detect import DETECTED_KINDS
from ncclwatch.daemon.exposure import unauthenticated, web_authenticates
from ncclwatch.daemon.incidents import ERROR_BUCKETS
from ncclwatch.daemon.outcome import OUTCOMES as INCIDENT_OUTCOMES
from ncclwatch.daemon.outcome import VERDICTS
from ncclwatch.daemon.ownership import OUTCOMES
from ncclwatch.daemon.validate import REJECT_CODES
from ncclwatch.model import RankState, rank_label, rank_or_process


@dataclass
class Family:
    """One metric family as rows of label values; ``type``: gauge, counter or info."""

    name: str
    help: str
    labels: tuple[str, ...] = ()
    type: str = "gauge"
    rows: list[tuple[tuple[str, ...], float]] = field(default_factory=list)

    def add(self, values: Iterable[str], value: float) -> None:
        self.rows.append((tuple(values), value))


@dataclass
class Capture:
    """What a scrape takes on the event loop; the rest is built from it elsewhere."""

    now: float
    #: (job_id, world_size, ranks list, budget, incidents, warnings, culprits, hang threshold)
    jobs: list[tuple]
    agents: list[AgentRecord]
    staleness: float
    fresh: Callable[[Any, float], bool]
    counters: dict[str, Any]
    #: (external URL, runbook base) for ncclwatch_daemon_info.
    links: tuple[str, str] = ("", "")
    #: Port -> listening beyond loopback with no one authenticated (exposure.py).
    unauthenticated: dict[str, bool] = field(default_factory=dict)


#: The reasons ncclwatch_daemon_node_faults_total names: the contract's (any other: "other").
FAULT_REASONS = frozenset(REASONS)

#: What ncclwatch_daemon_identity_refusals_total counts (all exported, 0 or not).
IDENTITY_REFUSALS = ("exited", "rankless_job_facts", "dump_stacks")


def capture(d: Daemon, now: float | None = None) -> Capture:
    """On the event loop: O(jobs + incidents), plus list copies of ranks and agents."""
    now = time.monotonic() if now is None else now
    table = d.table
    jobs = []
    for job_id, job in table.jobs.items():
        incs = [(kind, d.incidents.active.get((job_id, kind))) for kind in DETECTED_KINDS]
        culprits = {cu.rank: job.ranks.get(cu.rank)
                    for _, inc in incs if inc for cu in inc.finding.culprits}
        jobs.append((job_id, job.world_size, list(job.ranks.values()), d.budget_of(job_id, now),
                     incs, list(job.warnings), culprits, d.hang_threshold_of(job, now)))
    cfg = d.config
    url = links.external_url(cfg.external_url, cfg.http, bool(cfg.web and cfg.web.ssl_context))
    return Capture(now=now, jobs=jobs, agents=list(table.agents.values()),
                   links=(url, links.runbook_base(cfg.runbook_url, url)),
                   unauthenticated=unauthenticated(cfg.grpc, cfg.http, grpc_tls=bool(cfg.tls),
                                                   http_auth=web_authenticates(cfg.web)),
                   staleness=table.staleness, fresh=table.fresh, counters={
                       "opened": dict(d.incidents.opened_total),
                       **_outcome_counters(d),
                       "rejected": dict(d.rejected_total),
                       "rejected_jobs": dict(d.rejected_jobs_total),
                       "bound_hits": {**d.bound_hits_total, "stored_stack_bytes":
                                      table.stacks.evicted_for_bytes_total},
                       "identity": dict(table.identity_refusals_total),
                       "claims": dict(d.ownership.claims_total),
                       "node_faults": {who: dict(n) for who, n in
                                       d.node_faults.items()},
                       "nodes": [(who, table.held.of(who), len(d.node_jobs(who)), len(ids))
                                 for who, ids in table.node_agents.items()],
                       "held": table.held.total, "agent_ids": len(table.agents),
                       "reports": table.reports_total, "samples": table.samples_total,
                       "escaped": d.texts_escaped_total,
                       "forms": dict(table.forms_total), "resyncs": table.resyncs_total,
                       "detect": d.detect_seconds_total, "jobs": len(table.jobs),
                       "stacks": len(table.stacks),
                       "workers": [(str(w.index), w.listening, w.forwarded_total,
                                    w.cpu_seconds_total, w.restarts_total)
                                   for w in d.ingest_workers]})


def build(c: Capture) -> list[Family]:
    """The families from a capture; walks every rank and agent (any thread)."""
    now = c.now
    F = Family
    active = F("ncclwatch_stall_active", "1 while a stall of this kind is active in the job",
               ("job_id", "kind"))
    duration = F("ncclwatch_stall_duration_seconds",
                 "Seconds since the first waiting rank blocked (0 when inactive)", ("job_id", "kind"))
    waiting = F("ncclwatch_stall_waiting_ranks", "Ranks blocked waiting in the stall",
                ("job_id", "kind"))
    culprit = F("ncclwatch_stall_culprit_info",
                "The rank(s) the others wait for, with host and state (and the "
                "Kubernetes namespace and pod of a rank in one, else empty: rank_ "
                "names, which no scrape's target labels overwrite); node: the same name "
                "as host, the label the agents' series carry, for joins",
                ("job_id", "kind", "rank", "host", "node", "state", "rank_namespace",
                 "rank_pod"))
    timeout = F("ncclwatch_watchdog_timeout_seconds",
                "Process-group (watchdog) timeout the budget runs on: learned from the job, "
                "stated for it, or assumed (ncclwatch_watchdog_timeout_assumed)", ("job_id",))
    assumed = F("ncclwatch_watchdog_timeout_assumed",
                "1 when the job stated no timeout ncclwatch could learn and the budget runs "
                "on the daemon's default (torch's 600 s unless --watchdog-timeout): the job "
                "may time out sooner; 0 when the job or the config stated it", ("job_id",))
    remaining = F("ncclwatch_watchdog_remaining_seconds",
                  "Timeout minus how long the longest-blocked rank has been blocked", ("job_id",))
    hang = F("ncclwatch_hang_threshold_seconds",
             "Seconds a rank may sit still in a collective before a hang is flagged: learned "
             "from the job's normal waits, between --hang-floor and --hang-threshold", ("job_id",))
    ranks = F("ncclwatch_ranks", "Ranks of the job by state (unknown: not reporting)",
              ("job_id", "state"))
    world = F("ncclwatch_job_world_size", "World size of the job", ("job_id",))
    at_risk = F("ncclwatch_stall_at_risk",
                "1 while the stall is forecast to (or may) reach the watchdog", ("job_id", "kind"))
    action = F("ncclwatch_stall_advice_info",
               "What to do with the running job now: stop_now, stop_cleanly, let_it_run or "
               "dump_now (advice.py)", ("job_id", "kind", "action"))
    decide = F("ncclwatch_stall_decide_within_seconds",
               "Seconds left to act on the advice (until memory runs out, the watchdog fires "
               "or the save should end)", ("job_id", "kind"))
    cause = F("ncclwatch_stall_root_cause_info", "The diagnosed root cause of the stall",
              ("job_id", "kind", "root_cause"))
    eta = F("ncclwatch_checkpoint_eta_seconds",
            "Forecast seconds until the culprit's checkpoint write ends", ("job_id",))
    overrun = F("ncclwatch_watchdog_forecast_overrun_seconds",
                "Forecast save time minus the watchdog budget left (>0: the watchdog "
                "fires first)", ("job_id",))
    mem_eta = F("ncclwatch_memory_exhaustion_eta_seconds",
                "Forecast seconds until a culprit rank reaches a memory bound",
                ("job_id", "rank", "device"))
    written = F("ncclwatch_checkpoint_written_bytes",
                "Size of the checkpoint file the culprit is writing", ("job_id",))
    expected = F("ncclwatch_checkpoint_expected_bytes",
                 "Expected size of that checkpoint (its own header or copy source, else the "
                 "previous checkpoint, else the memory gathered)",
                 ("job_id",))
    write_rate = F("ncclwatch_checkpoint_write_rate_bytes_per_second",
                   "The culprit's recent checkpoint write rate", ("job_id",))
    rank_mem = F("ncclwatch_culprit_memory_bytes",
                 "Memory a culprit rank holds (host RSS, or its use of one GPU)",
                 ("job_id", "rank", "device"))
    gpu_info = F("ncclwatch_culprit_gpu_info",
                 "1 per GPU a culprit rank uses, labelled as dcgm-exporter labels the GPU "
                 "(Hostname: the node, gpu: the index, UUID) so its DCGM_FI_DEV_* series join; "
                 "rank_namespace and rank_pod: the rank's Kubernetes pod (else empty), which "
                 "dcgm-exporter's pod mapping names as exported_namespace and exported_pod",
                 ("job_id", "rank", "Hostname", "gpu", "UUID", "rank_namespace", "rank_pod"))
    max_mem = F("ncclwatch_job_rank_memory_max_bytes",
                "The largest memory any rank of the job holds, per device kind",
                ("job_id", "device"))
    warn = F("ncclwatch_job_config_warning",
             "1 per setting in the job's environment that defeats the watchdog or "
             "the evidence; level warning or info (not `severity`, the alerts' own label)",
             ("job_id", "code", "level"))
    shown: set[tuple[str, int]] = set()
    shown_write: set[str] = set()
    unknown = RankState.UNKNOWN
    for job_id, world_size, recs, b, incs, warnings, culprit_recs, hang_s in c.jobs:
        hang.add((job_id,), hang_s)
        counts = {s: 0 for s in RankState}
        host_max, gpu_max = 0, None
        for rec in recs:
            counts[rec.state if c.fresh(rec, now) else unknown] += 1
            if rec.rss_bytes > host_max:
                host_max = rec.rss_bytes
            for _, u, _ in rec.gpu:
                if gpu_max is None or u > gpu_max:
                    gpu_max = u
        counts[unknown] += max(0, world_size - len(recs))
        for s, n in counts.items():
            ranks.add((job_id, s.value), n)
        world.add((job_id,), world_size)
        max_mem.add((job_id, "host"), host_max)
        if gpu_max is not None:
            max_mem.add((job_id, "gpu"), gpu_max)
        timeout.add((job_id,), b.timeout)
        assumed.add((job_id,), 1.0 if b.assumed else 0.0)
        remaining.add((job_id,), b.remaining)
        for kind, inc in incs:
            active.add((job_id, kind.value), 1 if inc else 0)
            duration.add((job_id, kind.value), now - inc.started_at if inc else 0)
            waiting.add((job_id, kind.value), len(inc.finding.waiting) if inc else 0)
            at_risk.add((job_id, kind.value), 1 if inc and inc.at_risk else 0)
            if not inc:
                continue
            for cu in inc.finding.culprits:
                rec = culprit_recs.get(cu.rank)
                ns, pod = _pod_of(rec)
                culprit.add((job_id, kind.value, rank_or_process(cu.rank, cu.node, cu.pid),
                             cu.node, cu.node, cu.state.value, ns, pod), 1)
                _culprit_memory(rank_mem, gpu_info, job_id, rec, shown)
            dx = inc.diagnosis
            cause.add((job_id, kind.value, dx.root_cause.id), 1)
            if dx.advice is not None:
                action.add((job_id, kind.value, dx.advice.action), 1)
                if dx.advice.decide_within_seconds is not None:
                    decide.add((job_id, kind.value), dx.advice.decide_within_seconds)
            if dx.checkpoint_eta is not None:
                eta.add((job_id,), dx.checkpoint_eta)
                overrun.add((job_id,), dx.evidence.overrun)
            w = dx.evidence.write
            if w is not None and job_id not in shown_write:
                shown_write.add(job_id)
                written.add((job_id,), w.written_bytes)
                write_rate.add((job_id,), w.rate_bytes_per_second)
                if w.expected_bytes is not None:
                    expected.add((job_id,), w.expected_bytes)
            seen = set()
            for m in dx.evidence.memory:
                if m.eta_seconds is not None and (m.rank, m.device) not in seen:
                    seen.add((m.rank, m.device))
                    rec = culprit_recs.get(m.rank)
                    mem_eta.add((job_id, rank_or_process(m.rank, rec.node if rec else "",
                                                         rec.pid if rec else 0), m.device),
                                m.eta_seconds)
        for w in warnings:
            warn.add((job_id, w.code, w.severity), 1)
    out = [active, duration, waiting, culprit, timeout, assumed, remaining, hang, ranks, world,
           at_risk, action, decide, cause, eta, overrun, mem_eta, written, expected, write_rate,
           rank_mem, gpu_info, max_mem, warn]
    out += _agent_families(_latest_per_node(c.agents), now, c.staleness)
    k = c.counters
    opened = F("ncclwatch_incidents_opened", "Incidents opened, by stall kind", ("kind",),
               "counter")
    for kind in DETECTED_KINDS:
        opened.add((kind.value,), k["opened"].get(kind, 0))
    out += _outcome_families(k)
    rejected = F("ncclwatch_daemon_rejected_reports", "Reports rejected, by gRPC status",
                 ("code",), "counter")
    for code, n in _with_zeros(REJECT_CODES, k["rejected"]):
        rejected.add((code,), n)
    rejected_jobs = F("ncclwatch_daemon_rejected_job_samples",
                      "Jobs left out of an applied report (a world size or a rank that "
                      "contradicts what the daemon knows), by gRPC status", ("code",), "counter")
    for code, n in _with_zeros(REJECT_CODES, k["rejected_jobs"]):
        rejected_jobs.add((code,), n)
    bound_hits = F("ncclwatch_daemon_bound_hits",
                   "Reports, jobs or stacks refused (stacks: evicted) for passing a bound of "
                   "the daemon's config (max_*), by bound", ("bound",), "counter")
    for label in BOUND_LABELS.values():
        bound_hits.add((label,), k["bound_hits"].get(label, 0))
    identity = F("ncclwatch_daemon_identity_refusals",
                 "Parts of reports refused because the sending node does not own them: "
                 "exits of its ranks, job facts from rank-less members, DumpStacks calls",
                 ("what",), "counter")
    for what in IDENTITY_REFUSALS:
        identity.add((what,), k["identity"].get(what, 0))
    claims = F("ncclwatch_daemon_rank_claims",
               "Ranks reported by a node other than the one that owns them, by how the "
               "evidence decided (ownership.py): owner_silent and corroborated move the rank, "
               "uncorroborated, kept and retake_refused set the claim aside as a contender",
               ("outcome",), "counter")
    for outcome in OUTCOMES:
        claims.add((outcome,), k["claims"].get(outcome, 0))
    dumps = F("ncclwatch_daemon_dump_requests",
              "POSTs to /api/v1/dump (a fresh ask of a job's ranks), by how the guard "
              "answered (dumpguard.py): served, refused_origin, refused_token (403), busy "
              "(409: that job's dump was running), rate_limited (429)", ("outcome",), "counter")
    for outcome, n in _with_zeros(dumpguard.OUTCOMES, k.get("dump_requests", {})):
        dumps.add((outcome,), n)

    faults = F("ncclwatch_daemon_node_faults",
               "Parts of a node identity's reports the daemon dropped, or its reports "
               "refused whole, by the contract's reason (any other: other)",
               ("node", "reason"), "counter")
    for who, row in sorted(k["node_faults"].items()):
        for reason, n in fault_reasons(row):
            faults.add((who, reason), n)

    def one(name: str, text: str, value: float, type_: str = "gauge") -> Family:
        return F(name, text, (), type_, [((), value)])

    workers = k["workers"]

    def per_worker(name: str, text: str, col: int) -> Family:
        return F(name, text, ("worker",), "counter", [((w[0],), w[col]) for w in workers])

    nodes = k["nodes"]

    def per_node(name: str, text: str, col: int) -> Family:
        return F(name, text, ("node",), "gauge", [((n[0],), n[col]) for n in nodes])

    out += [
        opened, rejected, rejected_jobs, bound_hits, identity, claims, dumps, faults,
        per_node("ncclwatch_daemon_node_held_bytes", "Bytes of rank and job data the daemon "
                 "holds from a node identity (its certificate's node; without TLS, its "
                 "node), estimated (max_node_bytes)", 1),
        per_node("ncclwatch_daemon_node_jobs", "Jobs a node identity's agents reported that "
                 "the daemon holds (max_jobs_per_node)", 2),
        per_node("ncclwatch_daemon_node_agent_ids", "Agent ids a node identity holds "
                 "(max_agents_per_node)", 3),
        one("ncclwatch_daemon_held_bytes", "Bytes of rank and job data held, all nodes, "
            "estimated (max_held_bytes)", k["held"]),
        one("ncclwatch_daemon_agent_ids", "Agent ids held, all nodes (max_agents)",
            k["agent_ids"]),
        one("ncclwatch_daemon_reports", "Node reports applied", k["reports"], "counter"),
        one("ncclwatch_daemon_rank_samples", "Rank samples applied", k["samples"], "counter"),
        one("ncclwatch_daemon_escaped_reports", "Reports applied that held a control or bidi "
            "character, or bytes that are not UTF-8, stored escaped (an agent's gate "
            "escapes them all: a rise is a sender that is not one)", k["escaped"], "counter"),
        F("ncclwatch_daemon_rank_samples_by_form",
          "Rank samples applied, by the form they came in (protocol 2: full, change, brief)",
          ("form",), "counter", [((f,), n) for f, n in k["forms"].items()]),
        one("ncclwatch_daemon_resyncs", "Times the daemon asked an agent's stream for full "
            "samples again (briefs or changes named ranks it does not hold)", k["resyncs"],
            "counter"),
        one("ncclwatch_daemon_detect_seconds", "Time spent in detection ticks", k["detect"],
            "counter"),
        one("ncclwatch_daemon_jobs", "Jobs tracked", k["jobs"]),
        one("ncclwatch_daemon_agents_connected", "Agents with an open stream",
            sum(1 for a in c.agents if a.connected)),
        one("ncclwatch_daemon_stacks_interned", "Distinct stacks held", k["stacks"]),
        one("ncclwatch_daemon_ingest_workers", "Ingest worker processes listening for agents "
            "(--ingest-workers; 0: the daemon process serves gRPC itself)",
            sum(1 for w in workers if w[1])),
        per_worker("ncclwatch_daemon_ingest_worker_reports",
                   "Reports an ingest worker forwarded to the daemon's core", 2),
        per_worker("ncclwatch_daemon_ingest_worker_cpu_seconds",
                   "CPU time of an ingest worker (its processes so far, as each last said)", 3),
        per_worker("ncclwatch_daemon_ingest_worker_restarts",
                   "Ingest worker processes started again after one ended", 4),
        F("ncclwatch_build", "ncclwatch version", ("version",), "info", [((__version__,), 1)]),
        F("ncclwatch_daemon", "Where operators reach this daemon's page (url) and the "
          "runbooks alerts link to (runbook_base): --external-url, --runbook-url",
          ("url", "runbook_base"), "info", [(c.links, 1)]),
        F("ncclwatch_daemon_unauthenticated_listener", "1 while the port listens beyond "
          "loopback with no one authenticated (--insecure: gRPC without mTLS, HTTP without "
          "basic auth or client certificates)", ("port",), "gauge",
          [((port,), int(v)) for port, v in sorted(c.unauthenticated.items())]),
    ]
    return out


def _outcome_counters(d: Daemon) -> dict[str, Any]:
    """On the loop: ended incidents by outcome, forecasts scored, lost jobs (a day)."""
    inc = d.incidents
    lost: dict[tuple[str, str, str, str, str], None] = {}
    for i in inc.ended:   # one series per job, kind, outcome and culprit (deduplicated)
        o = i.outcome
        if o is None or not o.lost:
            continue
        c = i.finding.culprits[0] if i.finding.culprits else None
        rank = c.rank if c else o.lost_rank
        host = c.node if c else o.lost_host
        lost[(i.job_id, i.kind.value, o.outcome,
              rank_label(rank) if rank is not None else "", host)] = None
    return {"outcomes": dict(inc.outcomes_total), "verdicts": dict(inc.verdicts_total),
            "forecast_error": (list(inc.error_buckets), inc.error_sum, inc.error_count),
            "lost": list(lost)}


def _outcome_families(k: dict[str, Any]) -> list[Family]:
    outcomes = Family("ncclwatch_incident_outcomes",
                      "Incidents ended, by stall kind and how the job came out of it "
                      "(completed, killed_by_watchdog, rank_lost, lost_sight)",
                      ("kind", "outcome"), "counter")
    for kind in DETECTED_KINDS:
        for o in INCIDENT_OUTCOMES:
            outcomes.add((kind.value, o), k["outcomes"].get((kind.value, o), 0))
    lost = Family("ncclwatch_job_lost",
                  "1 for a day after a stall of the job ended with the job lost "
                  "(killed_by_watchdog, rank_lost, lost_sight); rank and host: the culprit, "
                  "or the rank that went first", ("job_id", "kind", "outcome", "rank", "host"))
    for labels in k["lost"]:
        lost.add(labels, 1)
    verdicts = Family("ncclwatch_forecast_verdicts",
                      "Save forecasts scored when their stall ended: what the first forecast "
                      "said (ends_in_time, overruns) and whether the outcome bore it out",
                      ("verdict", "right"), "counter")
    for v in VERDICTS:
        for right in (True, False):
            verdicts.add((v, "true" if right else "false"), k["verdicts"].get((v, right), 0))
    buckets, total, count = k["forecast_error"]
    error = Family("ncclwatch_forecast_error_seconds",
                   "How far the first save forecast's end was from the save's end, for "
                   "stalls that completed (seconds)", (), "histogram")
    for le, n in zip(ERROR_BUCKETS, itertools.accumulate(buckets)):
        error.add((floatToGoString(le),), n)
    error.add(("+Inf",), count)
    error.add(("sum",), total)
    error.add(("count",), count)
    return [outcomes, lost, verdicts, error]


def _with_zeros(known: Iterable[str], counts: dict[str, float]) -> list[tuple[str, float]]:
    """Every known label value (0 until counted: a rate needs the series before
    the first event), then any other value counted, in order."""
    return [(v, counts.get(v, 0)) for v in known] + sorted(
        (v, n) for v, n in counts.items() if v not in known)


#: Sample-name suffix and exposed TYPE of each family type (text format 0.0.4).
_EXPOSED = {"gauge": ("", "gauge"), "counter": ("_total", "counter"), "info": ("_info", "gauge"),
            "histogram": ("", "histogram")}
#: Histogram rows carry their series in the last label value: a bucket's
#: bound ("0.5", "+Inf"), or "sum" / "count".
_HIST_SERIES = ("sum", "count")


def fault_reasons(counts: dict[str, int]) -> list[tuple[str, int]]:
    """A node's fault counts by reason, any reason outside the contract's set
    summed as ``other``: the label's values stay a fixed set."""
    out: dict[str, int] = {}
    for reason, n in counts.items():
        key = reason if reason in FAULT_REASONS else "other"
        out[key] = out.get(key, 0) + n
    return sorted(out.items())


def _label(v: str) -> str:
    if "\\" in v or "\n" in v or '"' in v:
        return v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')
    return v


def encode(families: list[Family]) -> bytes:
    """Prometheus text format 0.0.4, as client_python's ``generate_latest`` writes it."""
    out: list[str] = []
    for f in families:
        suffix, exposed = _EXPOSED[f.type]
        name = f.name + suffix
        doc = f.help.replace("\\", r"\\").replace("\n", r"\n")
        out.append(f"# HELP {name} {doc}\n# TYPE {name} {exposed}\n")
        keys = f.labels
        if f.type == "histogram":
            for values, value in f.rows:
                *own, series = values
                labels = [f'{k}="{_label(v)}"' for k, v in zip(keys, own)]
                if series in _HIST_SERIES:
                    sel = "{" + ",".join(labels) + "}" if labels else ""
                    out.append(f"{name}_{series}{sel} {floatToGoString(value)}\n")
                else:
                    sel = ",".join([*labels, f'le="{series}"'])
                    out.append(f"{name}_bucket{{{sel}}} {floatToGoString(value)}\n")
            continue
        for values, value in f.rows:
            if keys:
                labels = ",".join(f'{k}="{_label(v)}"' for k, v in zip(keys, values))
                out.append(f"{name}{{{labels}}} {floatToGoString(value)}\n")
            else:
                out.append(f"{name} {floatToGoString(value)}\n")
    return "".join(out).encode()


def to_client(f: Family):
    """The same family as a client_python metric family (for registries and tests)."""
    labels = list(f.labels)
    if f.type == "info":
        fam = InfoMetricFamily(f.name, f.help, labels=labels[:0])
        for values, _ in f.rows:
            fam.add_metric([], dict(zip(labels, values)))
        return fam
    if f.type == "histogram":
        hist = HistogramMetricFamily(f.name, f.help, labels=labels)
        series: dict[tuple[str, ...], dict[str, Any]] = {}
        for values, value in f.rows:
            *own, key = values
            series.setdefault(tuple(own), {})[key] = value
        for own, by in series.items():
            hist.add_metric(list(own), [(k, v) for k, v in by.items() if k not in _HIST_SERIES],
                            sum_value=by.get("sum", 0.0))
        return hist
    cls = CounterMetricFamily if f.type == "counter" else GaugeMetricFamily
    fam = cls(f.name, f.help, labels=labels)
    for values, value in f.rows:
        fam.add_metric(list(values), value)
    return fam


class DaemonCollector(Collector):
    def __init__(self, daemon: Daemon,
                 call: Callable[[Callable[[], Any]], Any] = lambda fn: fn(),
                 dumps: dumpguard.DumpGuard | None = None) -> None:
        """``dumps``: the HTTP side's dump guard, whose counts are exported (none: 0)."""
        self.daemon = daemon
        self._call = call
        self._dumps = dumps

    def collect(self) -> Iterable:
        return [to_client(f) for f in self.families()]

    def families(self) -> list[Family]:
        c = self._call(lambda: capture(self.daemon))
        c.counters["dump_requests"] = self._dumps.counts() if self._dumps else {}
        return build(c)

    def exposition(self) -> bytes:
        """/metrics: the capture on the loop, the rest in the calling thread."""
        return encode(self.families())


def _pod_of(rec) -> tuple[str, str]:
    """(namespace, pod) of a culprit in a Kubernetes pod, else ("", "")."""
    c = rec.container if rec is not None else None
    return (c[5], c[6]) if c else ("", "")


def _culprit_memory(fam: Family, gpus: Family, job_id: str, rec, shown: set) -> None:
    """A culprit's host RSS and per-GPU use, and its GPUs by dcgm-exporter's labels
    and its pod, once per rank across stall kinds."""
    if rec is None or (job_id, rec.rank) in shown:
        return
    shown.add((job_id, rec.rank))
    label = rank_or_process(rec.rank, rec.node, rec.pid)
    fam.add((job_id, label, "host"), rec.rss_bytes)
    for index, used, _total in rec.gpu:
        fam.add((job_id, label, f"gpu{index}"), used)
    ns, pod = _pod_of(rec)
    for index, uuid in rec.gpu_uuids:
        gpus.add((job_id, label, rec.node, str(index), uuid, ns, pod), 1)


def _latest_per_node(agents: Iterable[AgentRecord]) -> list[AgentRecord]:
    """One agent per node: after an agent restart the newest speaks for the node."""
    best: dict[str, AgentRecord] = {}
    for a in agents:
        if a.node not in best or a.last_recv > best[a.node].last_recv:
            best[a.node] = a
    return sorted(best.values(), key=lambda a: a.node)


#: The agent health families: key, name, help, type, value of an AgentRecord.
_AGENT_FAMILIES: tuple[tuple[str, str, str, Callable[[AgentRecord], float]], ...] = (
    ("ncclwatch_agent_last_report_timestamp_seconds",
     "Daemon wall-clock time of the node's last report", "gauge", lambda a: a.last_recv_wall),
    ("ncclwatch_agent_up", "1 while the node's agent reports in time", "gauge", None),
    ("ncclwatch_agent_nvml_up", "1 when the agent can read GPUs through NVML", "gauge",
     lambda a: 1 if a.health.nvml_up else 0),
    ("ncclwatch_agent_gpus_expected", "GPU device nodes (/dev/nvidiaN) on the node", "gauge",
     lambda a: a.health.gpus_expected),
    ("ncclwatch_agent_ranks_watched", "Training ranks the agent watches", "gauge",
     lambda a: a.health.ranks_watched),
    ("ncclwatch_agent_queue_length", "Reports waiting in the agent's queue", "gauge",
     lambda a: a.health.queue_length),
    ("ncclwatch_agent_pyspy_runs", "py-spy dumps started", "counter",
     lambda a: a.health.pyspy_runs_total),
    ("ncclwatch_agent_pyspy_failures", "py-spy dumps that failed or timed out", "counter",
     lambda a: a.health.pyspy_failures_total),
    ("ncclwatch_agent_pyspy_seconds", "Wall time spent in py-spy dumps", "counter",
     lambda a: a.health.pyspy_seconds_total),
    ("ncclwatch_agent_native_dumps", "Native dumps (py-spy --native, which pause the rank) "
     "taken of ranks whose stillness is abnormal", "counter",
     lambda a: a.health.native_dumps_total),
    ("ncclwatch_agent_native_dump_failures", "Native dumps that failed or timed out", "counter",
     lambda a: a.health.native_dump_failures_total),
    ("ncclwatch_agent_pause_budget_seconds", "Seconds per rank per hour native dumps may "
     "pause a rank (--pause-budget; 0: no native dumps)", "gauge",
     lambda a: a.health.pause_budget_seconds_per_hour),
    ("ncclwatch_agent_pause_budget_spent_ranks", "Watched ranks whose pause budget for the "
     "last hour is spent: no native dump of them until it frees", "gauge",
     lambda a: a.health.ranks_pause_budget_spent),
    ("ncclwatch_agent_native_dumps_refused", "Native dumps a rank's stillness asked for "
     "that its spent pause budget refused", "counter",
     lambda a: a.health.native_dumps_refused_total),
    ("ncclwatch_agent_reports_dropped", "Reports dropped by the agent's queue bound", "counter",
     lambda a: a.health.reports_dropped_total),
    ("ncclwatch_agent_report_gaps", "Reports missing in the sequence the daemon saw", "counter",
     lambda a: a.gaps_total),
    ("ncclwatch_agent_cpu_seconds", "CPU time of the agent and its py-spy children", "counter",
     lambda a: a.health.cpu_seconds_total),
    ("ncclwatch_agent_fields_dropped", "Fields of a rank left out of a round: text that "
     "could not be encoded", "counter", lambda a: a.health.fields_dropped_total),
    ("ncclwatch_agent_texts_escaped", "Strings from ranks with undecodable bytes or control "
     "characters, escaped", "counter", lambda a: a.health.texts_escaped_total),
    ("ncclwatch_agent_texts_truncated", "Strings from ranks cut to their length cap", "counter",
     lambda a: a.health.texts_truncated_total),
    ("ncclwatch_agent_stacks_trimmed", "Stacks cut to the daemon's bounds (innermost and "
     "outermost frames kept, a marker between)", "counter",
     lambda a: a.health.stacks_trimmed_total),
    ("ncclwatch_agent_flight_recorder_trimmed", "Flight Recorder summaries cut to the "
     "daemon's bounds (waiting groups kept first)", "counter",
     lambda a: a.health.flight_recorder_trimmed_total),
    ("ncclwatch_agent_reports_refused", "Reports the daemon refused as malformed or too "
     "large: dropped by the agent, never sent again", "counter",
     lambda a: a.health.reports_refused_total),
)


def _agent_families(agents: list[AgentRecord], now: float, staleness: float) -> list[Family]:
    out = []
    for name, text, type_, value in _AGENT_FAMILIES:
        if value is None:  # up: judged now, by the daemon's staleness
            rows = [((a.node,), 0 if a.stale(now, staleness) else 1) for a in agents]
        else:
            rows = [((a.node,), value(a)) for a in agents]
        out.append(Family(name, text, ("node",), type_, rows))
    out.append(_native_dump_histogram(agents))
    out.append(_rank_budget_hits(agents))
    out.append(_parts_left_out(agents))
    return out


def _parts_left_out(agents: list[AgentRecord]) -> Family:
    """Parts of its reports an agent left out (or cleared) before sending, by the
    contract's reason: a process that breaks the contract costs its own part on
    the agent's side as on the daemon's."""
    from ncclwatch.contract.checks import REASONS

    return _by_reason(agents, "ncclwatch_agent_parts_left_out",
                      "Rank samples the agent left out of its reports (or whose readings it "
                      "cleared) for breaking the report contract, by reason", REASONS,
                      lambda a: a.health.parts_left_out, zeros=False)


def _rank_budget_hits(agents: list[AgentRecord]) -> Family:
    """Per-rank work an agent cut or skipped for its budget, by reason."""
    from ncclwatch.contract.health import BUDGET_REASONS

    return _by_reason(agents, "ncclwatch_agent_rank_budget_hits",
                      "Per-rank work the agent cut or skipped for its budget (bytes read, "
                      "values redacted, time of its round), by reason", BUDGET_REASONS,
                      lambda a: a.health.rank_budget_hits)


def _by_reason(agents: list[AgentRecord], name: str, text: str, reasons, counts_of, *,
               zeros: bool = True) -> Family:
    """A counter per node and reason from an agent's health list, in ``reasons``'
    order (an older agent sends fewer). ``zeros``: every reason exported, 0 or
    not; else a reason's series appears with its first count (the contract's
    ~30 reasons at 0 on every node would be most of a fleet's series)."""
    fam = Family(name, text, ("node", "reason"), "counter")
    for a in agents:
        counts = list(counts_of(a))
        for i, reason in enumerate(reasons):
            n = counts[i] if i < len(counts) else 0
            if n or zeros:
                fam.add((a.node, reason), n)
    return fam


def _native_dump_histogram(agents: list[AgentRecord]) -> Family:
    """How long each native dump paused its rank (py-spy's run: an upper bound)."""
    from ncclwatch.contract.health import NATIVE_BUCKETS

    fam = Family("ncclwatch_agent_native_dump_seconds",
                 "Seconds a native dump (py-spy --native) paused its rank, an upper bound",
                 ("node",), "histogram")
    bounds = [floatToGoString(b) for b in NATIVE_BUCKETS] + ["+Inf"]
    for a in agents:
        h = a.health
        counts = list(h.native_dump_bucket_counts)
        if len(counts) != len(bounds):
            counts = [0] * (len(bounds) - 1) + [h.native_dumps_total]
        for le, n in zip(bounds, counts):
            fam.add((a.node, le), n)
        fam.add((a.node, "sum"), h.native_dump_seconds_total)
        fam.add((a.node, "count"), h.native_dumps_total)
    return fam


def make_registry(daemon: Daemon, call=lambda fn: fn()) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DaemonCollector(daemon, call))
    return registry
