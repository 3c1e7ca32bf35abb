"""Grafana dashboards: generated, committed, linted, and built on real metric names.

- the committed JSON is what ``dashboards/generate.py`` writes today;
- both dashboards pass every rule of ``dashboards/lint.py`` (grafana's
  dashboard-linter rules) and each rule fires on a deliberately broken copy;
- every metric a query selects is one a real Daemon exports (names taken from
  its registry after driving it through a checkpoint stall), with labels it has;
- ``panel_queries`` fills in the variables for end-to-end runs.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import time
from pathlib import Path

import promql_parser
import pytest

from dashboards import generate
from dashboards.lint import (RULES, lint, lint_file, load_config, metric_names, parse_promql,
                             selectors)
from dashboards.queries import iter_panels, iter_targets, panel_queries
from ncclwatch.daemon.core import Daemon, DaemonConfig
from ncclwatch.daemon.export import make_registry
from ncclwatch.model import CollectiveOp, RankState
from ncclwatch.v1 import collector_pb2 as pb
from tests.harness.paths import ROOT
from tests.harness.reports import report, sample

GRAFANA = ROOT / "dashboards" / "grafana"
FILES = sorted(generate.BOARDS)
MB = 1 << 20


def _load(name: str) -> dict:
    return json.loads((GRAFANA / name).read_text())


# --- generated and committed -------------------------------------------------------

def test_committed_dashboards_are_what_the_generator_writes(tmp_path: Path) -> None:
    written = generate.generate(tmp_path)
    assert sorted(p.name for p in written) == sorted(FILES + [".lint"])
    for path in written:
        committed = GRAFANA / path.name
        assert committed.exists(), f"{committed} is missing: run `make dashboards`"
        assert committed.read_bytes() == path.read_bytes(), \
            f"{committed} differs from a fresh generation: run `make dashboards`"
    again = generate.generate(tmp_path / "again")
    assert [p.read_bytes() for p in again] == [p.read_bytes() for p in written]


@pytest.mark.parametrize("name,uid", [("ncclwatch-fleet.json", "ncclwatch-fleet"),
                                      ("ncclwatch-job.json", "ncclwatch-job")])
def test_dashboard_settings(name: str, uid: str) -> None:
    d = _load(name)
    assert d["uid"] == uid
    assert d["tags"] == ["ncclwatch"]
    assert d["refresh"] == "10s"
    assert d["time"] == {"from": "now-1h", "to": "now"}
    assert d["editable"] is False
    names = [t["name"] for t in d["templating"]["list"]]
    # job: the scrape job (the linter's convention); job_id: the training job
    assert names[:5] == ["datasource", "job", "instance", "replica", "job_id"]
    replica = d["templating"]["list"][3]  # HA: one replica, never both (nor All)
    assert replica["multi"] is False and replica["includeAll"] is False
    ds = d["templating"]["list"][0]
    assert ds["type"] == "datasource" and ds["query"] == "prometheus"
    ids = [p["id"] for p in d["panels"]] + [q["id"] for p in d["panels"] for q in p.get("panels", [])]
    assert len(ids) == len(set(ids))
    titles = [p["title"] for p in iter_panels(d)]
    assert len(titles) == len(set(titles)), "panel titles name .lint exclusions: keep them unique"


def test_every_panel_has_a_target_a_unit_and_a_description() -> None:
    for name in FILES:
        for p in iter_panels(_load(name)):
            assert p.get("targets"), (name, p["title"])
            assert p["fieldConfig"]["defaults"].get("unit"), (name, p["title"])
            assert p.get("description"), (name, p["title"])
            assert all(t["refId"] for t in p["targets"]), (name, p["title"])


def test_every_rate_and_increase_uses_rate_interval() -> None:
    for name in FILES:
        for title, _, t, _ in iter_targets(_load(name)):
            for fn in ("rate(", "increase(", "changes("):
                if fn in t["expr"]:
                    assert "[$__rate_interval]" in t["expr"], (name, title, t["expr"])


def test_fleet_table_links_to_the_job_dashboard() -> None:
    d = _load("ncclwatch-fleet.json")
    table = next(p for p in iter_panels(d) if p["title"] == "At-risk jobs and root cause")
    assert "stall_root_cause_info" in table["targets"][0]["expr"]
    (override,) = [o for o in table["fieldConfig"]["overrides"] if o["matcher"]["options"] == "job_id"]
    (links,) = [p["value"] for p in override["properties"] if p["id"] == "links"]
    url = links[0]["url"]
    assert url.startswith(f"/d/{generate.JOB_UID}/")
    assert "var-job_id=${__data.fields.job_id}" in url and "var-instance=${__data.fields.instance}" in url


# --- the linter --------------------------------------------------------------------

@pytest.mark.parametrize("name", FILES)
def test_dashboards_pass_the_linter(name: str) -> None:
    problems = lint_file(GRAFANA / name)
    assert problems == [], "\n".join(map(str, problems))


def test_lint_cli_exit_codes(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "dashboards.lint"]
    ok = subprocess.run(cmd + [str(GRAFANA / n) for n in FILES], cwd=ROOT, check=False,
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    broken = _load("ncclwatch-job.json")
    del broken["panels"][1]["fieldConfig"]["defaults"]["unit"]
    (tmp_path / "broken.json").write_text(json.dumps(broken))
    bad = subprocess.run(cmd + [str(tmp_path / "broken.json")], cwd=ROOT, check=False,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1
    assert "panel-units-rule" in bad.stdout


def _panel(d: dict, title: str) -> dict:
    return next(p for p in iter_panels(d) if p["title"] == title)


def _var(d: dict, name: str) -> dict:
    return next(t for t in d["templating"]["list"] if t["name"] == name)


def _drop_var(name: str):
    def f(d: dict) -> None:
        d["templating"]["list"] = [t for t in d["templating"]["list"] if t["name"] != name]
    return f


def _set_expr(title: str, expr: str, idx: int = 0):
    def f(d: dict) -> None:
        _panel(d, title)["targets"][idx]["expr"] = expr
    return f


def _edit_expr(title: str, old: str, new: str, idx: int = 0):
    def f(d: dict) -> None:
        t = _panel(d, title)["targets"][idx]
        assert old in t["expr"]
        t["expr"] = t["expr"].replace(old, new)
    return f


def _set(getter, key, value):
    def f(d: dict) -> None:
        target = getter(d)
        if value is KeyError:
            del target[key]
        else:
            target[key] = value
    return f


TS = "Watchdog budget"  # a job-view time series with two per-job targets
BREAKAGES = [
    ("template-datasource-rule", "no datasource variable", _drop_var("datasource")),
    ("template-datasource-rule", "query variable on a fixed data source",
     _set(lambda d: _var(d, "job"), "datasource", {"type": "prometheus", "uid": "abc123"})),
    ("template-job-rule", "missing job variable", _drop_var("job")),
    ("template-job-rule", "job variable not multi-select", _set(lambda d: _var(d, "job"), "multi", False)),
    ("template-instance-rule", "missing instance variable", _drop_var("instance")),
    ("template-instance-rule", "instance allValue not .+",
     _set(lambda d: _var(d, "instance"), "allValue", "")),
    ("template-label-promql-rule", "variable query does not parse",
     _set(lambda d: _var(d, "job"), "query", "label_values(ncclwatch_job_world_size{, job)")),
    ("template-label-promql-rule", "variable query function unknown",
     _set(lambda d: _var(d, "job"), "query", "label_valuez(ncclwatch_job_world_size, job)")),
    ("template-on-time-change-reload-rule", "variable refreshed on load only",
     _set(lambda d: _var(d, "job"), "refresh", 1)),
    ("uneditable-dashboard-rule", "editable", _set(lambda d: d, "editable", True)),
    ("panel-datasource-rule", "hard-coded panel data source",
     _set(lambda d: _panel(d, TS), "datasource", {"type": "prometheus", "uid": "P1809F7CD0C75ACF3"})),
    ("panel-datasource-rule", "hard-coded target data source",
     _set(lambda d: _panel(d, TS)["targets"][1], "datasource", {"type": "prometheus", "uid": "x"})),
    ("panel-title-description-rule", "no description", _set(lambda d: _panel(d, TS), "description", "")),
    ("panel-units-rule", "no unit",
     _set(lambda d: _panel(d, TS)["fieldConfig"]["defaults"], "unit", KeyError)),
    ("panel-units-rule", "unknown unit",
     _set(lambda d: _panel(d, TS)["fieldConfig"]["defaults"], "unit", "seconds")),
    ("panel-no-targets-rule", "no targets", _set(lambda d: _panel(d, TS), "targets", [])),
    ("target-promql-rule", "unbalanced parentheses",
     _set_expr(TS, 'max(ncclwatch_watchdog_timeout_seconds{job=~"$job", instance=~"$instance"}')),
    ("target-promql-rule", "unknown function",
     _set_expr(TS, 'maxx(ncclwatch_watchdog_timeout_seconds{job=~"$job", instance=~"$instance"})')),
    ("target-logql-rule", "a Loki target",
     _set(lambda d: _panel(d, TS)["targets"][0], "datasource", {"type": "loki", "uid": "${datasource}"})),
    ("target-rate-interval-rule", "rate over a fixed range",
     _set_expr("Save progress",
               'rate(ncclwatch_checkpoint_written_bytes{job=~"$job", instance=~"$instance"}[5m])')),
    ("target-rate-interval-rule", "increase over a fixed range (annotation)",
     lambda d: d["annotations"]["list"][1].update(
         expr=d["annotations"]["list"][1]["expr"].replace("[$__rate_interval]", "[1m]"))),
    ("target-job-rule", "no job matcher", _edit_expr(TS, 'job=~"$job", ', "")),
    ("target-job-rule", "job matcher with a fixed value", _edit_expr(TS, 'job=~"$job"', 'job="job-1"')),
    ("target-instance-rule", "no instance matcher", _edit_expr(TS, ', instance=~"$instance"', "", idx=1)),
    ("target-counter-agg-rule", "a raw counter",
     _set_expr(TS, 'sum(ncclwatch_agent_pyspy_runs_total{job=~"$job", instance=~"$instance"})')),
    ("target-counter-agg-rule", "a counter through max_over_time",
     _set_expr(TS, 'max_over_time(ncclwatch_agent_pyspy_runs_total{job=~"$job", '
                   'instance=~"$instance"}[$__rate_interval])')),
]


@pytest.mark.parametrize("rule,why,breakage", BREAKAGES, ids=[f"{r}: {w}" for r, w, _ in BREAKAGES])
def test_each_rule_fires_on_a_broken_copy(rule: str, why: str, breakage) -> None:
    d = _load("ncclwatch-job.json")
    config = load_config(GRAFANA)
    assert lint(d, config) == []
    broken = copy.deepcopy(d)
    breakage(broken)
    fired = lint(broken, config)
    assert rule in {p.rule for p in fired}, (why, [str(p) for p in fired])


def test_every_rule_has_a_negative_test() -> None:
    assert {r for r, _, _ in BREAKAGES} == set(RULES)
    for name, (scope, fn) in RULES.items():
        assert scope in ("dashboard", "panel", "target")
        assert (fn.__doc__ or "").strip(), f"{name} needs a docstring"


def test_every_query_of_ncclwatchs_series_selects_the_scrape_job() -> None:
    """The training job is job_id, so every query can select the scrape job: the only
    exclusions are the job and instance rules for the dcgm-exporter selectors of the
    panels that join them, whose ncclwatch selectors still carry every filter."""
    config = load_config(GRAFANA)["exclusions"]
    assert set(config) == set(generate.FOREIGN_RULES)
    for rule in config.values():
        assert [e["panel"] for e in rule["entries"]] == ["Culprit GPU (dcgm-exporter)"]
    for name in FILES:
        for title, _, t, _ in iter_targets(_load(name)):
            if title == "Culprit GPU (dcgm-exporter)":
                assert generate.J[:-1] in t["expr"] and "DCGM_FI_DEV_" in t["expr"]
                # only ncclwatch's side filtered, every one of its selectors by all of J
                ast, err = parse_promql(t["expr"])
                assert err is None, err
                want = {"job", "instance", "replica", "job_id"}
                for s in selectors(ast):
                    have = {m.name for m in s.matchers.matchers}
                    if s.name in generate.FOREIGN_METRICS:
                        assert not have, t["expr"]
                    else:
                        assert s.name == "ncclwatch_culprit_gpu_info" and want <= have, t["expr"]


def test_promql_parser_is_real() -> None:
    ast, err = parse_promql('sum by (kind) (rate(x_total{job=~"$job"}[$__rate_interval]))')
    assert err is None and isinstance(ast, promql_parser.AggregateExpr)
    assert parse_promql("sum(rate(x[5m])")[0] is None
    assert parse_promql("nosuchfunction(x)")[0] is None


# --- metric names against a real Daemon -------------------------------------------

def _driven_daemon() -> Daemon:
    """A daemon through a slow checkpoint save, so every family has samples."""
    d = Daemon(DaemonConfig(stall_threshold=5.0))
    start = time.monotonic() - 15
    for i in range(15):
        now = start + i
        r0 = sample("job-1", 0, 4, RankState.SAVING, seconds=i, timeout=90.0)
        r0.process.rss_bytes = 1000 * MB + 40 * MB * i
        r0.process.files_writing.append(pb.OpenFile(
            path="/ckpt/ckpt-2.pt", size_bytes=(i + 1) * MB,
            previous_path="/ckpt/ckpt-1.pt", previous_size_bytes=200 * MB))
        r0.process.memory_limits.append(pb.MemoryLimit(
            kind=pb.MEMORY_LIMIT_KIND_HOST, used_bytes=900 * MB + 40 * MB * i,
            limit_bytes=20_000 * MB))
        samples = [r0] + [sample("job-1", r, 4, RankState.COLLECTIVE, CollectiveOp.BARRIER,
                                 seconds=i, timeout=90.0) for r in (1, 2, 3)]
        req = report(samples, seq=i + 1)
        req.report.health.CopyFrom(pb.AgentHealth(ranks_watched=4, pyspy_runs_total=i,
                                                  gpus_expected=2, queue_length=1))
        d.ingest(req, now=now)
        d.tick(now=now, wall=time.time() - 15 + i)
    return d


@pytest.fixture(scope="module")
def exported() -> dict[str, set[str]]:
    """Metric name as Prometheus stores it -> its label names, from the registry."""
    out: dict[str, set[str]] = {}
    for fam in make_registry(_driven_daemon()).collect():
        suffix = {"counter": "_total", "info": "_info"}.get(fam.type, "")
        labels = set(getattr(fam, "_labelnames", ()))
        for s in fam.samples:
            labels |= set(s.labels)
            assert s.name == fam.name + suffix or (
                fam.type == "histogram" and s.name[len(fam.name):] in
                ("_bucket", "_sum", "_count", "_created")), (s.name, fam.type)
        out[fam.name + suffix] = labels
    return out


def _all_exprs(d: dict) -> list[tuple[str, str]]:
    exprs = [(title, t["expr"]) for title, _, t, _ in iter_targets(d)]
    for t in d["templating"]["list"]:
        if t["type"] == "query":
            inner = t["query"][t["query"].index("(") + 1:t["query"].rindex(",")]
            exprs.append((f"variable {t['name']}", inner))
    return exprs


@pytest.mark.parametrize("name", FILES)
def test_every_metric_is_exported_by_the_daemon(name: str, exported: dict[str, set[str]]) -> None:
    d = _load(name)
    used = set()
    for title, expr in _all_exprs(d):
        names = metric_names(expr)
        assert names, (title, expr)
        unknown = names - set(exported) - set(generate.FOREIGN_METRICS)
        assert not unknown, f"{name} '{title}' uses metrics the daemon does not export: {unknown}"
        used |= names
        ast, _ = parse_promql(expr)
        for s in selectors(ast):
            if s.name in generate.FOREIGN_METRICS:
                continue
            # target labels Prometheus adds (replica: the HA pair's, README)
            have = exported[s.name] | {"instance", "job", "replica"}
            for m in s.matchers.matchers:
                assert m.name in have, f"{name} '{title}': {s.name} has no label {m.name}"
    assert len(used) >= 10


def test_panels_without_a_training_job_use_only_metrics_without_one(exported) -> None:
    """Per-job panels select job_id; the others use only metrics that have none."""
    for fname, make in generate.BOARDS.items():
        board = make()
        d = _load(fname)
        for title, _, t, _ in iter_targets(d):
            ours = metric_names(t["expr"]) - set(generate.FOREIGN_METRICS)
            per_job = {m for m in ours if "job_id" in exported[m]}
            assert "job" not in set().union(*(exported[m] for m in ours))
            if title in board.no_job:
                assert not per_job, f"{title}: {per_job} have a job_id label: select by $job_id"
            elif per_job:
                assert 'job_id=~"$job_id"' in t["expr"], title


# --- panel_queries ----------------------------------------------------------------

def test_panel_queries_fill_every_variable() -> None:
    for name in FILES:
        d = _load(name)
        queries = panel_queries(GRAFANA / name, job_id="job-1", instance="127.0.0.1:7471")
        assert len(queries) == sum(len(p["targets"]) for p in iter_panels(d))
        for title, expr in queries:
            # "$1": label_replace's regex group, which Grafana keeps (no such variable)
            assert "$" not in expr.replace('"$1"', "") and "[[" not in expr, (title, expr)
            promql_parser.parse(expr)
            if "ncclwatch_stall_active" in expr:
                assert 'job_id=~"job-1"' in expr and 'job=~".+"' in expr
            assert 'instance=~"127\\\\.0\\\\.0\\\\.1:7471"' in expr, expr
            assert 'replica=~"|"' in expr, expr  # no HA pair: series without the label
        assert all("[1m]" in e for _, e in queries if "rate(" in e)
    with_ann = panel_queries(GRAFANA / "ncclwatch-job.json", annotations=True)
    assert any(t.startswith("annotation: ") for t, _ in with_ann)


def test_panel_queries_default_to_all_and_escape_regex_values() -> None:
    q = dict(panel_queries(GRAFANA / "ncclwatch-job.json"))
    assert 'job=~".+"' in q["World size"] and 'instance=~".+"' in q["World size"]
    q = dict(panel_queries(GRAFANA / "ncclwatch-job.json", job_id=["10.0.0.1:29500/4", "b"]))
    assert 'job_id=~"10\\\\.0\\\\.0\\\\.1:29500/4|b"' in q["World size"]
    q = dict(panel_queries(GRAFANA / "ncclwatch-job.json", replica="b"))
    assert 'replica=~"b|"' in q["World size"]
    fleet = dict(panel_queries(GRAFANA / "ncclwatch-fleet.json", node="gpu-1",
                               rate_interval="30s"))
    assert 'node=~"gpu-1"' in fleet["Agent queue length"]
    assert "[30s]" in fleet["Daemon throughput"]


def test_a_regex_group_in_a_string_is_no_variable() -> None:
    """label_replace's "$1" stays (Grafana has no variable 1 and keeps it); a variable
    in a string is still filled, and one outside a string is never a group."""
    from dashboards.queries import substitute

    fill = {"job": "ncclwatch"}.__getitem__
    assert (substitute('label_replace(x{job=~"$job"}, "p", "$1", "exported_pod", "(.+)")',
                       fill, fill)
            == 'label_replace(x{job=~"ncclwatch"}, "p", "$1", "exported_pod", "(.+)")')
    with pytest.raises(KeyError):
        substitute("x[$1]", fill, fill)
