"""Prometheus exposition: a collector that builds fresh families per scrape.

As in client_python's own collectors, nothing is cached between scrapes:
``collect()`` reads the current job tables (on the daemon's event loop, via
``call``) and yields families. Cardinality stays bounded: per-rank series
only for culprits; everything else is per job, per node or per state.
"""

from __future__ import annotations

import time
from typing import Callable, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from ncclwatch import __version__
from ncclwatch.daemon.core import Daemon
from ncclwatch.daemon.detect import DETECTED_KINDS
from ncclwatch.daemon.table import AgentRecord
from ncclwatch.model import RankState


class DaemonCollector(Collector):
    def __init__(self, daemon: Daemon,
                 call: Callable[[Callable[[], list]], list] = lambda fn: fn()) -> None:
        self.daemon = daemon
        self._call = call

    def collect(self) -> Iterable:
        return self._call(self.families)

    def families(self) -> list:
        d, now = self.daemon, time.monotonic()
        table = d.table
        g = GaugeMetricFamily
        active = g("ncclwatch_stall_active", "1 while a stall of this kind is active in the job",
                   labels=["job", "kind"])
        duration = g("ncclwatch_stall_duration_seconds",
                     "Seconds since the first waiting rank blocked (0 when inactive)",
                     labels=["job", "kind"], unit="seconds")
        waiting = g("ncclwatch_stall_waiting_ranks", "Ranks blocked waiting in the stall",
                    labels=["job", "kind"])
        culprit = g("ncclwatch_stall_culprit_info",
                    "The rank(s) the others wait for, with host and state",
                    labels=["job", "kind", "rank", "host", "state"])
        timeout = g("ncclwatch_watchdog_timeout_seconds",
                    "Process-group (watchdog) timeout assumed for the job",
                    labels=["job"], unit="seconds")
        hang = g("ncclwatch_hang_threshold_seconds",
                 "Seconds a rank may sit still in a collective before a hang is flagged: "
                 "learned from the job's normal waits, between --hang-floor and "
                 "--hang-threshold", labels=["job"], unit="seconds")
        remaining = g("ncclwatch_watchdog_remaining_seconds",
                      "Timeout minus how long the longest-blocked rank has been blocked",
                      labels=["job"], unit="seconds")
        ranks = g("ncclwatch_ranks", "Ranks of the job by state (unknown: not reporting)",
                  labels=["job", "state"])
        world = g("ncclwatch_job_world_size", "World size of the job", labels=["job"])
        at_risk = g("ncclwatch_stall_at_risk",
                    "1 while the stall is forecast to (or may) reach the watchdog",
                    labels=["job", "kind"])
        cause = g("ncclwatch_stall_root_cause_info", "The diagnosed root cause of the stall",
                  labels=["job", "kind", "root_cause"])
        eta = g("ncclwatch_checkpoint_eta_seconds",
                "Forecast seconds until the culprit's checkpoint write ends",
                labels=["job"], unit="seconds")
        overrun = g("ncclwatch_watchdog_forecast_overrun_seconds",
                    "Forecast save time minus the watchdog budget left (>0: the watchdog "
                    "fires first)", labels=["job"], unit="seconds")
        mem_eta = g("ncclwatch_memory_exhaustion_eta_seconds",
                    "Forecast seconds until a culprit rank reaches a memory bound",
                    labels=["job", "rank", "device"], unit="seconds")
        written = g("ncclwatch_checkpoint_written_bytes",
                    "Size of the checkpoint file the culprit is writing", labels=["job"],
                    unit="bytes")
        expected = g("ncclwatch_checkpoint_expected_bytes",
                     "Expected size of that checkpoint (previous checkpoint, gathered bytes)",
                     labels=["job"], unit="bytes")
        write_rate = g("ncclwatch_checkpoint_write_rate_bytes_per_second",
                       "The culprit's recent checkpoint write rate", labels=["job"])
        rank_mem = g("ncclwatch_culprit_memory_bytes",
                     "Memory a culprit rank holds (host RSS, or its use of one GPU)",
                     labels=["job", "rank", "device"], unit="bytes")
        max_mem = g("ncclwatch_job_rank_memory_max_bytes",
                    "The largest memory any rank of the job holds, per device kind",
                    labels=["job", "device"], unit="bytes")
        warn = g("ncclwatch_job_config_warning",
                 "1 per setting in the job's environment that defeats the watchdog or "
                 "the evidence", labels=["job", "code", "severity"])
        shown: set[tuple[str, int]] = set()
        shown_write: set[str] = set()
        for job_id, job in table.jobs.items():
            counts = {s: 0 for s in RankState}
            for rec in job.ranks.values():
                counts[rec.state if table.fresh(rec, now) else RankState.UNKNOWN] += 1
            counts[RankState.UNKNOWN] += max(0, job.world_size - len(job.ranks))
            for s, n in counts.items():
                ranks.add_metric([job_id, s.value], n)
            world.add_metric([job_id], job.world_size)
            host_max = max((r.rss_bytes for r in job.ranks.values()), default=0)
            gpu_max = max((u for r in job.ranks.values() for _, u, _ in r.gpu), default=None)
            max_mem.add_metric([job_id, "host"], host_max)
            if gpu_max is not None:
                max_mem.add_metric([job_id, "gpu"], gpu_max)
            b = d.budget_of(job_id, now)
            timeout.add_metric([job_id], b.timeout)
            remaining.add_metric([job_id], b.remaining)
            hang.add_metric([job_id], d.hang_threshold_of(job, now))
            for kind in DETECTED_KINDS:
                inc = d.incidents.active.get((job_id, kind))
                active.add_metric([job_id, kind.value], 1 if inc else 0)
                duration.add_metric([job_id, kind.value], now - inc.started_at if inc else 0)
                waiting.add_metric([job_id, kind.value], len(inc.finding.waiting) if inc else 0)
                at_risk.add_metric([job_id, kind.value], 1 if inc and inc.at_risk else 0)
                if inc:
                    for c in inc.finding.culprits:
                        culprit.add_metric([job_id, kind.value, str(c.rank), c.node,
                                            c.state.value], 1)
                        _culprit_memory(rank_mem, job_id, job.ranks.get(c.rank), shown)
                    dx = inc.diagnosis
                    cause.add_metric([job_id, kind.value, dx.root_cause.id], 1)
                    if dx.checkpoint_eta is not None:
                        eta.add_metric([job_id], dx.checkpoint_eta)
                        overrun.add_metric([job_id], dx.evidence.overrun)
                    w = dx.evidence.write
                    if w is not None and job_id not in shown_write:
                        shown_write.add(job_id)
                        written.add_metric([job_id], w.written_bytes)
                        write_rate.add_metric([job_id], w.rate_bytes_per_second)
                        if w.expected_bytes is not None:
                            expected.add_metric([job_id], w.expected_bytes)
                    seen = set()
                    for m in dx.evidence.memory:
                        if m.eta_seconds is not None and (m.rank, m.device) not in seen:
                            seen.add((m.rank, m.device))
                            mem_eta.add_metric([job_id, str(m.rank), m.device], m.eta_seconds)
            for w in job.warnings:
                warn.add_metric([job_id, w.code, w.severity], 1)
        out = [active, duration, waiting, culprit, timeout, remaining, hang, ranks, world,
               at_risk, cause, eta, overrun, mem_eta, written, expected, write_rate,
               rank_mem, max_mem, warn]
        out += _agent_families(_latest_per_node(table.agents.values()), now, table.staleness)
        c = CounterMetricFamily
        opened = c("ncclwatch_incidents_opened", "Incidents opened, by stall kind",
                   labels=["kind"])
        for kind in DETECTED_KINDS:
            opened.add_metric([kind.value], d.incidents.opened_total[kind])
        rejected = c("ncclwatch_daemon_rejected_reports", "Reports rejected, by gRPC status",
                     labels=["code"])
        for code, n in sorted(d.rejected_total.items()):
            rejected.add_metric([code], n)
        out += [
            opened, rejected,
            c("ncclwatch_daemon_reports", "Node reports applied", value=table.reports_total),
            c("ncclwatch_daemon_rank_samples", "Rank samples applied", value=table.samples_total),
            c("ncclwatch_daemon_detect_seconds", "Time spent in detection ticks",
              value=d.detect_seconds_total, unit="seconds"),
            g("ncclwatch_daemon_jobs", "Jobs tracked", value=len(table.jobs)),
            g("ncclwatch_daemon_agents_connected", "Agents with an open stream",
              value=sum(1 for a in table.agents.values() if a.connected)),
            g("ncclwatch_daemon_stacks_interned", "Distinct stacks held", value=len(table.stacks)),
        ]
        info = InfoMetricFamily("ncclwatch_build", "ncclwatch version", value={"version": __version__})
        out.append(info)
        return out


def _culprit_memory(fam: GaugeMetricFamily, job_id: str, rec, shown: set) -> None:
    """A culprit's host RSS and per-GPU use, once per rank across stall kinds."""
    if rec is None or (job_id, rec.rank) in shown:
        return
    shown.add((job_id, rec.rank))
    fam.add_metric([job_id, str(rec.rank), "host"], rec.rss_bytes)
    for index, used, _total in rec.gpu:
        fam.add_metric([job_id, str(rec.rank), f"gpu{index}"], used)


def _latest_per_node(agents: Iterable[AgentRecord]) -> list[AgentRecord]:
    """One agent per node: after an agent restart the newest speaks for the node."""
    best: dict[str, AgentRecord] = {}
    for a in agents:
        if a.node not in best or a.last_recv > best[a.node].last_recv:
            best[a.node] = a
    return sorted(best.values(), key=lambda a: a.node)


def _agent_families(agents: list[AgentRecord], now: float, staleness: float) -> list:
    g, c = GaugeMetricFamily, CounterMetricFamily
    fams = {
        "last": g("ncclwatch_agent_last_report_timestamp_seconds",
                  "Daemon wall-clock time of the node's last report", labels=["node"],
                  unit="seconds"),
        "up": g("ncclwatch_agent_up", "1 while the node's agent reports in time",
                labels=["node"]),
        "nvml": g("ncclwatch_agent_nvml_up", "1 when the agent can read GPUs through NVML",
                  labels=["node"]),
        "gpus": g("ncclwatch_agent_gpus_expected",
                  "GPU device nodes (/dev/nvidiaN) on the node", labels=["node"]),
        "ranks": g("ncclwatch_agent_ranks_watched", "Training ranks the agent watches",
                   labels=["node"]),
        "queue": g("ncclwatch_agent_queue_length", "Reports waiting in the agent's queue",
                   labels=["node"]),
        "runs": c("ncclwatch_agent_pyspy_runs", "py-spy dumps started", labels=["node"]),
        "fail": c("ncclwatch_agent_pyspy_failures", "py-spy dumps that failed or timed out",
                  labels=["node"]),
        "secs": c("ncclwatch_agent_pyspy_seconds", "Wall time spent in py-spy dumps",
                  labels=["node"], unit="seconds"),
        "drop": c("ncclwatch_agent_reports_dropped", "Reports dropped by the agent's queue bound",
                  labels=["node"]),
        "gaps": c("ncclwatch_agent_report_gaps", "Reports missing in the sequence the daemon saw",
                  labels=["node"]),
        "cpu": c("ncclwatch_agent_cpu_seconds", "CPU time of the agent and its py-spy children",
                 labels=["node"], unit="seconds"),
    }
    for a in agents:
        h, n = a.health, [a.node]
        fams["last"].add_metric(n, a.last_recv_wall)
        fams["up"].add_metric(n, 0 if a.stale(now, staleness) else 1)
        fams["nvml"].add_metric(n, 1 if h.nvml_up else 0)
        fams["gpus"].add_metric(n, h.gpus_expected)
        fams["ranks"].add_metric(n, h.ranks_watched)
        fams["queue"].add_metric(n, h.queue_length)
        fams["runs"].add_metric(n, h.pyspy_runs_total)
        fams["fail"].add_metric(n, h.pyspy_failures_total)
        fams["secs"].add_metric(n, h.pyspy_seconds_total)
        fams["drop"].add_metric(n, h.reports_dropped_total)
        fams["gaps"].add_metric(n, a.gaps_total)
        fams["cpu"].add_metric(n, h.cpu_seconds_total)
    return list(fams.values())


def make_registry(daemon: Daemon, call=lambda fn: fn()) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DaemonCollector(daemon, call))
    return registry
