"""Generate the ncclwatch Grafana dashboards (grafana-foundation-sdk builders).

    python -m dashboards.generate [--out DIR]     # default: dashboards/grafana

writes ``ncclwatch-fleet.json``, ``ncclwatch-job.json`` and ``.lint`` (the
linter's exclusions, JSON, which is also YAML for grafana's Go linter). The
output is stable (sorted keys, fixed uids and panel ids), so regenerating an
unchanged source is byte-identical; tests/repo/test_dashboards.py fails when the
committed files differ from a fresh generation (run ``make dashboards``).

Every query selects by ``job=~"$job"`` (the Prometheus scrape job of the
daemons, the label Prometheus gives every target), ``instance=~"$instance"``
(the daemon's scrape target) and ``replica=~"$replica|"``: with a highly
available pair (two daemons that judge the same jobs, told apart by a
``replica`` target label) the dashboards show one replica, picked in the
single-select ``replica`` variable, so nothing is counted twice; without one
the variable is empty and the matcher selects the series that have no
``replica`` label. Per-job metrics also select ``job_id=~"$job_id"``: the
training job, a label of its own, so no ``honor_labels`` is needed. Agent and
daemon self-metrics have no training job; their panels select
``node=~"$node"`` or nothing more.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus, stat, statetimeline, table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

OUT = Path(__file__).resolve().parent / "grafana"
FLEET_UID, JOB_UID = "ncclwatch-fleet", "ncclwatch-job"
TAGS = ["ncclwatch"]
DS = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")

# Selectors. J: per-job metrics; N: per-node agent metrics; I: daemon-wide.
J = '{job=~"$job", instance=~"$instance", replica=~"$replica|", job_id=~"$job_id"}'
#: dcgm-exporter's series the job board joins (not the daemon's: no data without it).
FOREIGN_METRICS = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_XID_ERRORS")
#: A dcgm-exporter series (%s) for the culprit's GPU: the joins of rules.yaml's
#: ncclwatch:culprit_gpu_*:max (by the rank's pod as exported_namespace/exported_pod,
#: then as namespace/pod, then by node), with the dashboard's filters on ncclwatch's side.
_GPU_BY = "max by (job_id, rank, Hostname, gpu, UUID, rank_namespace, rank_pod)"
_IN_POD = J[:-1] + ', rank_pod!=""}'
GPU_JOIN = " or ".join([
    *(f"{_GPU_BY} (ncclwatch_culprit_gpu_info{_IN_POD})"
      " * on (rank_namespace, rank_pod, UUID) group_left ()"
      " max by (rank_namespace, rank_pod, UUID) (label_replace(label_replace(%s,"
      f' "rank_namespace", "$1", "{ns}", "(.+)"), "rank_pod", "$1", "{pod}", "(.+)"))'
      for ns, pod in (("exported_namespace", "exported_pod"), ("namespace", "pod"))),
    f"{_GPU_BY} (ncclwatch_culprit_gpu_info{J})"
    " * on (Hostname, UUID) group_left () max by (Hostname, UUID) (%s)"])
N = '{job=~"$job", instance=~"$instance", replica=~"$replica|", node=~"$node"}'
I = '{job=~"$job", instance=~"$instance", replica=~"$replica|"}'


# Threshold colours.
GREEN, YELLOW, ORANGE, RED, BLUE = "green", "yellow", "orange", "red", "blue"


def steps(base: str, *more: tuple[float, str]) -> db.ThresholdsConfig:
    return db.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps(
        [dm.Threshold(value=None, color=base)] + [dm.Threshold(value=v, color=c) for v, c in more])


def q(expr: str, legend: str | None = None, *, table_format: bool = False) -> prometheus.Dataquery:
    t = prometheus.Dataquery().expr(expr).datasource(DS)
    if legend is not None:
        t = t.legend_format(legend)
    if table_format:
        t = t.instant().format(PromQueryFormat.TABLE)
    else:
        t = t.range()
    return t


def _legend() -> cb.VizLegendOptions:
    return (cb.VizLegendOptions().display_mode(cm.LegendDisplayMode.LIST)
            .placement(cm.LegendPlacement.BOTTOM).show_legend(True))


def _tooltip() -> cb.VizTooltipOptions:
    return cb.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI).sort(cm.SortOrder.DESCENDING)


def organize(exclude: Sequence[str] = (), order: Sequence[str] = (),
             rename: dict[str, str] | None = None) -> dm.DataTransformerConfig:
    return dm.DataTransformerConfig(id_val="organize", options={
        "excludeByName": {name: True for name in exclude},
        "indexByName": {name: i for i, name in enumerate(order)},
        "renameByName": dict(rename or {}),
    })


class Board:
    """A dashboard being built: panel ids, rows, and the .lint exclusions."""

    def __init__(self, uid: str, title: str, description: str) -> None:
        self.title = title
        self.next_id = 1
        self.no_job: list[str] = []  # panel titles whose queries have no job matcher
        #: Panels that join another exporter's series (dcgm-exporter): those come
        #: from its own scrape job and instances, so only ncclwatch's side is filtered.
        self.foreign: list[str] = []
        self._annotation_extras: dict[str, dict] = {}  # fields the SDK's model lacks
        self.d = (db.Dashboard(title).uid(uid).description(description).tags(TAGS)
                  .readonly().refresh("10s").time("now-1h", "now").timezone("browser")
                  .tooltip(dm.DashboardCursorSync.CROSSHAIR)
                  .timepicker(db.TimePicker().refresh_intervals(
                      ["10s", "30s", "1m", "5m", "15m", "1h"]))
                  .link(db.DashboardLink("ncclwatch dashboards")
                        .type(dm.DashboardLinkType.DASHBOARDS)
                        .tags(TAGS).as_dropdown(True).include_vars(True).keep_time(True)
                        .target_blank(False).icon("external link").tooltip("").url("")))

    def _id(self) -> int:
        i, self.next_id = self.next_id, self.next_id + 1
        return i

    def row(self, title: str) -> None:
        self.d = self.d.with_row(db.Row(title).id(self._id()).collapsed(False))

    def panel(self, p, *, title: str, description: str, unit: str, targets: Iterable,
              w: int, h: int, job_scoped: bool = True):
        refs = "ABCDEFGHIJ"
        p = (p.id(self._id()).title(title).description(description).unit(unit)
             .datasource(DS).span(w).height(h))
        for ref, t in zip(refs, targets):
            p = p.with_target(t.ref_id(ref))
        if not job_scoped:
            self.no_job.append(title)
        self.d = self.d.with_panel(p)

    def ts(self, title: str, description: str, unit: str, targets: Iterable, *, w: int = 12,
           h: int = 8, stack: bool = False, bars: bool = False, min_val: float | None = 0,
           max_val: float | None = None, thresholds: db.ThresholdsConfig | None = None,
           threshold_style: cm.GraphTresholdsStyleMode = cm.GraphTresholdsStyleMode.OFF,
           overrides: Sequence[tuple[str, list[dm.DynamicConfigValue]]] = (),
           job_scoped: bool = True, foreign: bool = False) -> None:
        if foreign:
            self.foreign.append(title)
        p = (timeseries.Panel().legend(_legend()).tooltip(_tooltip())
             .line_width(1).fill_opacity(25 if stack or bars else 10)
             .show_points(cm.VisibilityMode.NEVER).span_nulls(False)
             .thresholds(thresholds or steps(GREEN))
             .thresholds_style(cb.GraphThresholdsStyleConfig().mode(threshold_style)))
        if bars:
            p = p.draw_style(cm.GraphDrawStyle.BARS)
        else:
            p = p.draw_style(cm.GraphDrawStyle.LINE).line_interpolation(
                cm.LineInterpolation.STEP_AFTER)
        if stack:
            p = p.stacking(cb.StackingConfig().mode(cm.StackingMode.NORMAL).group("A"))
        if min_val is not None:
            p = p.min(min_val)
        if max_val is not None:
            p = p.max(max_val)
        for name, props in overrides:
            p = p.override_by_name(name, props)
        self.panel(p, title=title, description=description, unit=unit, targets=targets,
                   w=w, h=h, job_scoped=job_scoped)

    def stat(self, title: str, description: str, unit: str, targets: Iterable, *, w: int = 4,
             h: int = 4, thresholds: db.ThresholdsConfig | None = None,
             no_value: str | None = None, job_scoped: bool = True) -> None:
        p = (stat.Panel().graph_mode(cm.BigValueGraphMode.AREA)
             .color_mode(cm.BigValueColorMode.VALUE).justify_mode(cm.BigValueJustifyMode.AUTO)
             .text_mode(cm.BigValueTextMode.AUTO).orientation(cm.VizOrientation.AUTO)
             .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
             .thresholds(thresholds or steps(GREEN)))
        if no_value is not None:
            p = p.no_value(no_value)
        self.panel(p, title=title, description=description, unit=unit, targets=targets,
                   w=w, h=h, job_scoped=job_scoped)

    def table(self, title: str, description: str, unit: str, targets: Iterable, *,
              transformations: Sequence[dm.DataTransformerConfig], w: int = 24, h: int = 7,
              overrides: Sequence[tuple[str, list[dm.DynamicConfigValue]]] = (),
              thresholds: db.ThresholdsConfig | None = None, no_value: str | None = None,
              job_scoped: bool = True) -> None:
        p = (table.Panel().show_header(True).cell_height(cm.TableCellHeight.SM)
             .transformations(list(transformations)).thresholds(thresholds or steps(GREEN)))
        if no_value is not None:
            p = p.no_value(no_value)
        for name, props in overrides:
            p = p.override_by_name(name, props)
        self.panel(p, title=title, description=description, unit=unit, targets=targets,
                   w=w, h=h, job_scoped=job_scoped)

    def timeline(self, title: str, description: str, unit: str, targets: Iterable, *,
                 mappings: list, w: int = 24, h: int = 6) -> None:
        p = (statetimeline.Panel().show_value(cm.VisibilityMode.NEVER).merge_values(True)
             .row_height(0.9).line_width(0).fill_opacity(80).legend(_legend())
             .tooltip(cb.VizTooltipOptions().mode(cm.TooltipDisplayMode.SINGLE)
                      .sort(cm.SortOrder.NONE))
             .mappings(mappings).thresholds(steps(GREEN)))
        self.panel(p, title=title, description=description, unit=unit, targets=targets,
                   w=w, h=h)

    def annotation(self, name: str, expr: str, color: str, title_format: str,
                   job_scoped: bool) -> None:
        self.d = self.d.annotation(db.AnnotationQuery().name(name).datasource(DS).enable(True)
                                   .hide(False).icon_color(color).expr(expr))
        self._annotation_extras[name] = {"titleFormat": title_format, "step": "$__rate_interval",
                                         "useValueForTime": False}
        if not job_scoped:
            self.no_job.append(f"annotation: {name}")

    def variables(self, *, job_all: bool, node: bool) -> None:
        self.d = self.d.with_variable(
            db.DatasourceVariable("datasource").label("Data source").type("prometheus")
            .description("The Prometheus that scrapes the ncclwatch daemon(s)"))
        self.d = self.d.with_variable(self._query_var(
            "job", "Job", "label_values(ncclwatch_build_info, job)",
            "The Prometheus scrape job of the ncclwatch daemon(s)", include_all=True))
        self.d = self.d.with_variable(self._query_var(
            "instance", "Instance", 'label_values(ncclwatch_build_info{job=~"$job"}, instance)',
            "The ncclwatch daemon(s), by scrape target", include_all=True))
        # One replica of an HA pair (never All: the pair's series would count twice).
        self.d = self.d.with_variable(
            db.QueryVariable("replica").label("Replica")
            .description("Daemon replica of a highly available pair (the `replica` target "
                         "label); empty without one")
            .query('label_values(ncclwatch_build_info{job=~"$job", instance=~"$instance"}, '
                   'replica)')
            .datasource(DS).refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(dm.VariableSort.ALPHABETICAL_CASE_INSENSITIVE_ASC)
            .multi(False).include_all(False))
        self.d = self.d.with_variable(self._query_var(
            "job_id", "Training job", 'label_values(ncclwatch_job_world_size{job=~"$job", '
            'instance=~"$instance", replica=~"$replica|"}, job_id)',
            "Training job id, as the daemon derives it from the ranks' environment",
            include_all=job_all))
        if node:
            self.d = self.d.with_variable(self._query_var(
                "node", "Node", 'label_values(ncclwatch_agent_up{job=~"$job", '
                'instance=~"$instance", replica=~"$replica|"}, node)',
                "GPU node, by its agent", include_all=True))

    @staticmethod
    def _query_var(name: str, label: str, query: str, description: str, *,
                   include_all: bool) -> db.QueryVariable:
        return (db.QueryVariable(name).label(label).description(description).query(query)
                .datasource(DS).refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
                .sort(dm.VariableSort.ALPHABETICAL_CASE_INSENSITIVE_ASC)
                .multi(True).include_all(include_all).all_value(".+"))

    def json(self) -> dict:
        d = json.loads(json.dumps(self.d.build(), cls=JSONEncoder))
        for a in d["annotations"]["list"]:
            a.update(self._annotation_extras.get(a["name"], {}))
        # Grafana's own "Annotations & Alerts" entry, as the UI would add it.
        d["annotations"]["list"].insert(0, {
            "builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
            "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
            "name": "Annotations & Alerts", "type": "dashboard"})
        return d


def _value_map(**options: tuple[str, str]) -> dm.ValueMap:
    return dm.ValueMap(options={k: dm.ValueMappingResult(text=t, color=c, index=i)
                                for i, (k, (t, c)) in enumerate(options.items())})


def _job_link(title: str) -> dm.DynamicConfigValue:
    return dm.DynamicConfigValue("links", [{
        "title": title,
        "url": (f"/d/{JOB_UID}/{JOB_UID}?${{datasource:queryparam}}"
                "&var-instance=${__data.fields.instance}&var-job_id=${__data.fields.job_id}"
                "&${__url_time_range}"),
        "targetBlank": False,
    }])


def fleet() -> Board:
    b = Board(FLEET_UID, "ncclwatch / Fleet overview",
              "Every job the ncclwatch daemons track: stalls, jobs at risk of the NCCL "
              "watchdog, rank states, and the health of the agents and daemons.")
    b.variables(job_all=True, node=True)

    b.row("Jobs")
    b.stat("Jobs tracked", "Jobs the daemon(s) track now (all jobs, not only those selected).",
           "short", [q(f"sum(ncclwatch_daemon_jobs{I})")], thresholds=steps(BLUE),
           job_scoped=False)
    b.stat("Active stalls", "Stalls active now across the selected jobs, all kinds.", "short",
           [q(f"sum(ncclwatch_stall_active{J})")], thresholds=steps(GREEN, (1, RED)))
    b.stat("Jobs at risk",
           "Jobs with a stall forecast to (or that may) reach the NCCL watchdog timeout.",
           "short", [q(f"count(max by (instance, job_id) (ncclwatch_stall_at_risk{J}) > 0) "
                       "or vector(0)")], thresholds=steps(GREEN, (1, RED)))
    b.stat("Jobs with config warnings",
           "Jobs whose environment has a setting that defeats the watchdog or the evidence "
           "(see the job dashboard).", "short",
           [q(f"count(max by (instance, job_id) (ncclwatch_job_config_warning{J})) or vector(0)")],
           thresholds=steps(GREEN, (1, YELLOW)))
    b.stat("Agents up", "Nodes whose agent reports in time.", "short",
           [q(f"sum(ncclwatch_agent_up{N})")], thresholds=steps(BLUE), job_scoped=False)
    b.stat("Agents down",
           "Nodes whose agent went silent (no report within the daemon's staleness bound): "
           "their ranks count as unknown and rank_lost stalls may follow.", "short",
           [q(f"count(ncclwatch_agent_up{N} == 0) or vector(0)")],
           thresholds=steps(GREEN, (1, RED)), job_scoped=False)

    b.ts("Active stalls by kind", "Active stalls in the selected jobs, stacked by stall kind.",
         "short", [q(f"sum by (kind) (ncclwatch_stall_active{J})", "{{kind}}")],
         stack=True, bars=False)
    b.ts("Ranks by state",
         "Ranks of the selected jobs by state, stacked (unknown: not reporting).", "short",
         [q(f"sum by (state) (ncclwatch_ranks{J})", "{{state}}")], stack=True)

    at_risk = (f"min by (instance, job_id) (ncclwatch_watchdog_remaining_seconds{J})"
               " * on (instance, job_id) group_right ()"
               f" (max by (instance, job_id, kind, root_cause) (ncclwatch_stall_root_cause_info{J})"
               " * on (instance, job_id, kind) group_left ()"
               f" (max by (instance, job_id, kind) (ncclwatch_stall_at_risk{J}) > 0))")
    b.table("At-risk jobs and root cause",
            "Stalls forecast to reach the watchdog, with the diagnosed root cause and the "
            "watchdog budget left. Click a job for its dashboard.", "s",
            [q(at_risk, table_format=True)],
            transformations=[organize(exclude=["Time"],
                                      order=["job_id", "kind", "root_cause", "Value", "instance"],
                                      rename={"Value": "budget left", "root_cause": "root cause"})],
            overrides=[("job_id", [_job_link("Job dashboard")]),
                       ("budget left", [dm.DynamicConfigValue("custom.cellOptions",
                                                              {"type": "color-text"})])],
            thresholds=steps(RED, (120, YELLOW), (300, GREEN)),
            no_value="no job at risk", h=7)

    b.ts("Watchdog budget left (share of timeout)",
         "Per job: the watchdog budget left over the timeout (1: nobody blocked; 0: the "
         "watchdog fires). Red under 20%.", "percentunit",
         [q(f"min by (instance, job_id) (ncclwatch_watchdog_remaining_seconds{J}"
            f" / ncclwatch_watchdog_timeout_seconds{J})", "{{job_id}}")],
         max_val=1, thresholds=steps(RED, (0.2, YELLOW), (0.5, GREEN)),
         threshold_style=cm.GraphTresholdsStyleMode.DASHED_AND_AREA)
    b.ts("Incidents opened",
         "Incidents the daemon(s) opened, by stall kind (all jobs: the counter has no job "
         "label).", "short",
         [q(f"sum by (kind) (increase(ncclwatch_incidents_opened_total{I}[$__rate_interval]))",
            "{{kind}}")], bars=True, job_scoped=False)

    b.row("Agents")
    b.ts("py-spy failure ratio",
         "Share of py-spy dumps that failed or timed out, per node. Stacks (and so states) "
         "go stale when this is high.", "percentunit",
         [q(f"sum by (node) (rate(ncclwatch_agent_pyspy_failures_total{N}[$__rate_interval]))"
            f" / sum by (node) (rate(ncclwatch_agent_pyspy_runs_total{N}[$__rate_interval]))",
            "{{node}}")], w=8, max_val=1,
         thresholds=steps(GREEN, (0.1, YELLOW), (0.5, RED)),
         threshold_style=cm.GraphTresholdsStyleMode.DASHED, job_scoped=False)
    b.ts("py-spy time per dump", "Mean wall time of one py-spy dump, per node.", "s",
         [q(f"sum by (node) (rate(ncclwatch_agent_pyspy_seconds_total{N}[$__rate_interval]))"
            f" / sum by (node) (rate(ncclwatch_agent_pyspy_runs_total{N}[$__rate_interval]))",
            "{{node}}")], w=8, job_scoped=False)
    b.ts("Agent CPU",
         "CPU of each agent and its py-spy children, in cores, and per watched rank "
         "(design target: at most 0.2% of a core per rank).", "percentunit",
         [q(f"sum by (node) (rate(ncclwatch_agent_cpu_seconds_total{N}[$__rate_interval]))",
            "{{node}}"),
          q(f"sum by (node) (rate(ncclwatch_agent_cpu_seconds_total{N}[$__rate_interval]))"
            f" / sum by (node) (clamp_min(ncclwatch_agent_ranks_watched{N}, 1))",
            "{{node}} per rank")], w=8, job_scoped=False)
    b.ts("Agent queue length",
         "Reports waiting in each agent's send queue; a growing queue means the daemon "
         "is slow or unreachable.", "short",
         [q(f"max by (node) (ncclwatch_agent_queue_length{N})", "{{node}}")],
         w=8, thresholds=steps(GREEN, (10, YELLOW)), job_scoped=False)
    b.ts("Reports dropped and missing",
         "Reports an agent dropped at its queue bound, and gaps the daemon saw in the "
         "agent's sequence numbers, per second.", "cps",
         [q(f"sum by (node) (rate(ncclwatch_agent_reports_dropped_total{N}[$__rate_interval]))",
            "{{node}} dropped"),
          q(f"sum by (node) (rate(ncclwatch_agent_report_gaps_total{N}[$__rate_interval]))",
            "{{node}} missing")], w=8, job_scoped=False)
    b.ts("NVML up vs GPUs expected",
         "GPU device nodes on each node, and how many of them the agent can read through "
         "NVML (0 while NVML is down: no GPU memory evidence).", "short",
         [q(f"max by (node) (ncclwatch_agent_gpus_expected{N})", "{{node}} GPUs expected"),
          q(f"max by (node) (ncclwatch_agent_gpus_expected{N} * ncclwatch_agent_nvml_up{N})",
            "{{node}} GPUs readable (NVML up)")], w=8, job_scoped=False)
    b.ts("Time since last report",
         "Seconds since the daemon last heard from each node's agent (stale after 10 s "
         "by default).", "s",
         [q(f"time() - max by (node) (ncclwatch_agent_last_report_timestamp_seconds{N})",
            "{{node}}")], w=8, thresholds=steps(GREEN, (5, YELLOW), (10, RED)),
         threshold_style=cm.GraphTresholdsStyleMode.DASHED, job_scoped=False)
    b.ts("Ranks watched", "Training ranks each agent watches.", "short",
         [q(f"max by (node) (ncclwatch_agent_ranks_watched{N})", "{{node}}")], w=8,
         job_scoped=False)
    b.ts("Agents connected",
         "Agents with an open gRPC stream to each daemon.", "short",
         [q(f"sum by (instance) (ncclwatch_daemon_agents_connected{I})", "{{instance}}")],
         w=8, job_scoped=False)

    b.row("Daemon")
    b.ts("Daemon throughput",
         "Rank samples and node reports each daemon applies per second (design target: "
         "100k rank samples/s on one core).", "cps",
         [q(f"sum by (instance) (rate(ncclwatch_daemon_rank_samples_total{I}[$__rate_interval]))",
            "{{instance}} rank samples"),
          q(f"sum by (instance) (rate(ncclwatch_daemon_reports_total{I}[$__rate_interval]))",
            "{{instance}} reports")], job_scoped=False)
    b.ts("Daemon detection time",
         "Share of wall time each daemon spends in detection ticks (1 = one core busy).",
         "percentunit",
         [q(f"sum by (instance) (rate(ncclwatch_daemon_detect_seconds_total{I}[$__rate_interval]))",
            "{{instance}}")], thresholds=steps(GREEN, (0.5, YELLOW), (0.9, RED)),
         job_scoped=False)

    b.annotation("Incidents opened",
                 f"sum by (kind) (increase(ncclwatch_incidents_opened_total{I}[$__rate_interval]))"
                 " > 0", RED, "incident opened: {{kind}}", job_scoped=False)
    return b


def job() -> Board:
    b = Board(JOB_UID, "ncclwatch / Job",
              "One training job: its stalls and culprit ranks, the NCCL watchdog budget and "
              "the save forecast, rank states, culprit memory, checkpoint progress and "
              "configuration warnings.")
    b.variables(job_all=False, node=False)

    b.row("Stall")
    b.timeline("Stall timeline", "When each kind of stall was active in the job.", "none",
               [q(f"max by (job_id, kind) (ncclwatch_stall_active{J})", "{{job_id}} {{kind}}")],
               mappings=[_value_map(**{"0": ("ok", GREEN), "1": ("stalled", RED)})])
    b.stat("Watchdog budget left",
           "Timeout minus how long the longest-blocked rank has been blocked. Red under "
           "120 s (20% of NCCL's default 600 s; the next panel is exact).", "s",
           [q(f"min(ncclwatch_watchdog_remaining_seconds{J})")],
           thresholds=steps(RED, (120, YELLOW), (300, GREEN)))
    b.stat("Budget left (share of timeout)",
           "Watchdog budget left over the job's timeout. Red under 20%.", "percentunit",
           [q(f"min(ncclwatch_watchdog_remaining_seconds{J}"
              f" / ncclwatch_watchdog_timeout_seconds{J})")],
           thresholds=steps(RED, (0.2, YELLOW), (0.5, GREEN)))
    b.stat("Forecast overrun",
           "Forecast save time minus the budget left: above 0 the watchdog fires before the "
           "culprit's checkpoint write ends.", "s",
           [q(f"max(ncclwatch_watchdog_forecast_overrun_seconds{J})")],
           thresholds=steps(GREEN, (0, RED)), no_value="no forecast")
    b.stat("Stall duration", "Seconds since the first waiting rank blocked (longest stall).",
           "s", [q(f"max(ncclwatch_stall_duration_seconds{J})")],
           thresholds=steps(GREEN, (30, YELLOW), (300, RED)))
    b.stat("Waiting ranks", "Ranks blocked waiting in the stall (largest stall).", "short",
           [q(f"max(ncclwatch_stall_waiting_ranks{J})")], thresholds=steps(GREEN, (1, ORANGE)))
    b.stat("World size", "Ranks in the job.", "short",
           [q(f"max(ncclwatch_job_world_size{J})")], thresholds=steps(BLUE))
    culprits = (f"max by (instance, job_id, kind, rank, host, state) (ncclwatch_stall_culprit_info{J})"
                " * on (instance, job_id, kind) group_left (root_cause)"
                f" max by (instance, job_id, kind, root_cause) (ncclwatch_stall_root_cause_info{J})")
    b.table("Culprits",
            "The rank(s) the others wait for in each active stall, with host, state and the "
            "diagnosed root cause (runbooks: docs/runbooks/).", "none",
            [q(culprits, table_format=True)],
            transformations=[organize(
                exclude=["Time", "Value", "instance"],
                order=["job_id", "kind", "rank", "host", "state", "root_cause"],
                rename={"root_cause": "root cause"})],
            no_value="no stall", h=6)

    b.row("Watchdog budget and forecast")
    b.ts("Watchdog budget",
         "The job's watchdog timeout and the budget left (timeout minus the longest block).",
         "s", [q(f"max by (job_id) (ncclwatch_watchdog_timeout_seconds{J})", "{{job_id}} timeout"),
               q(f"min by (job_id) (ncclwatch_watchdog_remaining_seconds{J})", "{{job_id}} remaining")],
         thresholds=steps(RED, (120, GREEN)),
         threshold_style=cm.GraphTresholdsStyleMode.DASHED)
    b.ts("Save and memory forecast",
         "Forecast seconds until the culprit's checkpoint write ends, the forecast overrun of "
         "the watchdog (above 0: too late), and until a culprit reaches a memory bound.", "s",
         [q(f"max by (job_id) (ncclwatch_checkpoint_eta_seconds{J})", "{{job_id}} save ETA"),
          q(f"max by (job_id) (ncclwatch_watchdog_forecast_overrun_seconds{J})",
            "{{job_id}} overrun"),
          q(f"min by (job_id, rank, device) (ncclwatch_memory_exhaustion_eta_seconds{J})",
            "{{job_id}} rank {{rank}} {{device}} memory exhausted")],
         min_val=None, thresholds=steps(GREEN, (0, RED)),
         threshold_style=cm.GraphTresholdsStyleMode.LINE)

    b.row("Ranks and memory")
    b.ts("Ranks by state over time",
         "Ranks of the job by state, stacked (unknown: not reporting), against the world size.",
         "short", [q(f"sum by (state) (ncclwatch_ranks{J})", "{{state}}"),
                   q(f"max(ncclwatch_job_world_size{J})", "world size")],
         stack=True,
         overrides=[("world size", [
             dm.DynamicConfigValue("custom.stacking", {"mode": "none", "group": "A"}),
             dm.DynamicConfigValue("custom.fillOpacity", 0),
             dm.DynamicConfigValue("custom.lineStyle", {"fill": "dash", "dash": [10, 10]}),
         ])])
    b.ts("Rank memory",
         "Memory each culprit rank holds (host RSS, or its use of one GPU) and the largest "
         "any rank of the job holds, per device kind.", "bytes",
         [q(f"max by (job_id, rank, device) (ncclwatch_culprit_memory_bytes{J})",
            "{{job_id}} culprit rank {{rank}} {{device}}"),
          q(f"max by (job_id, device) (ncclwatch_job_rank_memory_max_bytes{J})",
            "{{job_id}} largest rank ({{device}})")])
    util, xid = FOREIGN_METRICS
    b.ts("Culprit GPU (dcgm-exporter)",
         "The culprit rank's GPU as dcgm-exporter reports it: utilisation (100% in a hung "
         "collective or kernel, 0% in a save on the host) and the last XID error (0: none; "
         "79: fallen off the bus, 48: double-bit ECC...). Joined on dcgm-exporter's own "
         "labels (ncclwatch_culprit_gpu_info): the rank's pod and the GPU's UUID, as "
         "dcgm-exporter's pod mapping names the pod using each GPU (exported_namespace "
         "and exported_pod, or namespace and pod under honor_labels), else Hostname and "
         "UUID; empty where dcgm-exporter is not scraped, or neither maps the rank's pod "
         "nor has the node's name as Hostname.", "percent",
         [q(GPU_JOIN.replace("%s", util), "{{job_id}} rank {{rank}} gpu {{gpu}} util"),
          q(GPU_JOIN.replace("%s", xid), "{{job_id}} rank {{rank}} gpu {{gpu}} XID")],
         max_val=None, foreign=True,
         overrides=[("/ XID$/", [dm.DynamicConfigValue("unit", "none"),
                                 dm.DynamicConfigValue("custom.axisPlacement", "right"),
                                 dm.DynamicConfigValue("custom.drawStyle", "points")])])

    b.row("Checkpoint save")
    b.ts("Checkpoint written vs expected",
         "Size of the checkpoint file the culprit is writing, and its expected size (the "
         "previous checkpoint, or the gathered bytes).", "bytes",
         [q(f"max by (job_id) (ncclwatch_checkpoint_written_bytes{J})", "{{job_id}} written"),
          q(f"max by (job_id) (ncclwatch_checkpoint_expected_bytes{J})", "{{job_id}} expected")],
         w=8)
    b.ts("Checkpoint write rate", "The culprit's recent checkpoint write rate.", "Bps",
         [q(f"max by (job_id) (ncclwatch_checkpoint_write_rate_bytes_per_second{J})", "{{job_id}}")],
         w=8)
    b.ts("Save progress", "Bytes written over the expected size of the checkpoint.",
         "percentunit",
         [q(f"max by (job_id) (ncclwatch_checkpoint_written_bytes{J})"
            f" / max by (job_id) (ncclwatch_checkpoint_expected_bytes{J})", "{{job_id}}")],
         w=8, max_val=1)

    b.row("Configuration")
    b.table("Config warnings",
            "Settings in the job's environment that defeat the watchdog or the evidence "
            "(`ncclwatch status` explains each code).", "none",
            [q(f"max by (job_id, code, level) (ncclwatch_job_config_warning{J})",
               table_format=True)],
            transformations=[organize(exclude=["Time", "Value"],
                                      order=["job_id", "level", "code"])],
            no_value="no warnings", h=6)

    b.annotation("Incidents opened",
                 f"sum by (kind) (increase(ncclwatch_incidents_opened_total{I}[$__rate_interval]))"
                 " > 0", RED, "incident opened: {{kind}} (any job of this daemon)",
                 job_scoped=False)
    b.annotation("Stall started or ended",
                 f"sum by (job_id, kind) (changes(ncclwatch_stall_active{J}[$__rate_interval])) > 0",
                 ORANGE, "{{job_id}}: {{kind}} stall started or ended", job_scoped=True)
    return b


BOARDS = {"ncclwatch-fleet.json": fleet, "ncclwatch-job.json": job}


#: The linter's rules a panel joining another exporter's series cannot meet.
FOREIGN_RULES = ("target-job-rule", "target-instance-rule")


def lint_config(boards: Sequence[Board]) -> dict:
    """The .lint file. Every query of ncclwatch's series selects the scrape ``job``
    (the training job is ``job_id``; ``Board.no_job``: the panels without one);
    the exclusions are the other exporter's selectors of ``Board.foreign`` panels."""
    entries = [{"dashboard": b.title, "panel": t} for b in boards for t in b.foreign]
    why = ("dcgm-exporter's series come from its own scrape job and instances; the "
           "query filters ncclwatch's side and joins on dcgm-exporter's own labels "
           "(the pod it maps a GPU to, or Hostname, with UUID)")
    return {"exclusions": {r: {"reason": why, "entries": entries}
                           for r in FOREIGN_RULES if entries}}


def dumps(obj: dict) -> str:
    return json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def generate(out: Path = OUT) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written, boards = [], []
    for name, make in BOARDS.items():
        b = make()
        boards.append(b)
        path = out / name
        path.write_text(dumps(b.json()))
        written.append(path)
    path = out / ".lint"
    path.write_text(dumps(lint_config(boards)))
    written.append(path)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dashboards.generate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=OUT, help="output folder (default: %(default)s)")
    args = ap.parse_args(argv)
    for path in generate(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
