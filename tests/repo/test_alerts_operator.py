"""The rules hold however the daemons are scraped: as the Prometheus Operator labels targets.

A PodMonitor gives every target ``namespace``, ``pod``, ``container`` and
``endpoint`` (a ServiceMonitor also ``service``), and users relabel more. For
the highly available pair the two daemons' series then differ by ``pod``, so a
rule that aggregates away only ``instance`` and ``replica`` keeps two series
per job and its ``group_left`` join fails ("many-to-many matching not
allowed"). These tests rewrite every promtool case in ``tests.yaml`` as such a
scrape would label it (each daemon series duplicated for both replicas of a
pair) and require every expected alert, with the same labels and annotations.
A second test takes a real daemon's ``/metrics`` during a stall of a rank in a
pod and labels it for both replicas.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.harness.alerting import RULES, RUNBOOK_FALLBACK
from tests.harness.tools import promtool

#: The targets' labels, as the Prometheus Operator's generated scrape config sets them
#: (pkg/prometheus/promcfg.go: namespace, pod, container, endpoint; service for a
#: ServiceMonitor), plus a relabelled label of the user's own.
SHAPES = {
    "podmonitor": {"namespace": "monitoring", "container": "daemon", "endpoint": "http",
                   "team": "ml-infra"},
    "servicemonitor": {"namespace": "monitoring", "container": "daemon", "endpoint": "http",
                       "service": "ncclwatch-daemon", "team": "ml-infra"},
}
#: The shipped PodMonitor relabels the pod label ncclwatch.io/replica to `replica`;
#: a user's ServiceMonitor may not: both must hold.
REPLICA_LABEL = (True, False)

_SERIES = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


def parse_series(text: str) -> tuple[str, dict[str, str]]:
    m = _SERIES.match(text.strip())
    assert m, f"not a series: {text!r}"
    labels, rest = {}, m.group(2) or ""
    pos = 0
    while pos < len(rest):
        lm = _LABEL.match(rest, pos)
        assert lm, f"cannot parse labels of {text!r} at {rest[pos:]!r}"
        labels[lm.group(1)] = lm.group(2)
        pos = lm.end()
    return m.group(1), labels


def format_series(name: str, labels: dict[str, str]) -> str:
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


class Scrape:
    """Target labels for each daemon replica, as one shape of scrape gives them."""

    def __init__(self, shape: dict[str, str], replica_label: bool) -> None:
        self.shape, self.replica_label = shape, replica_label
        self.by_instance: dict[str, dict[str, str]] = {}

    def target(self, instance: str, replica: str | None) -> dict[str, str]:
        pod = f"ncclwatch-daemon-{replica or '0'}-7c9d5"
        labels = {**self.shape, "pod": pod, "job": "ncclwatch", "instance": instance}
        if replica is not None and self.replica_label:
            labels["replica"] = replica
        self.by_instance[instance] = {k: v for k, v in labels.items() if k != "replica"}
        return labels

    def relabel(self, name: str, labels: dict[str, str]) -> list[dict[str, str]]:
        """The series as scraped: daemon series of a lone daemon come from both replicas.
        Another exporter's (dcgm-exporter's) are written in tests.yaml as its own
        scrape labels them, target labels and exported_* included: kept as they are."""
        if not name.startswith("ncclwatch_") and name != "up":
            return [labels]
        own = {k: v for k, v in labels.items() if k not in ("instance", "replica", "job")}
        if "replica" in labels:
            return [{**own, **self.target(labels.get("instance", "d:7471"), labels["replica"])}]
        if name.startswith("ncclwatch_"):
            return [{**own, **self.target(labels.get("instance", f"10.0.0.{i}:7471"), r)}
                    for i, r in ((1, "a"), (2, "b"))]
        return [{**own, **self.target(labels.get("instance", "10.0.0.9:7471"), None)}]


def operator_shaped(tests: dict, scrape: Scrape) -> dict:
    out = {**tests, "rule_files": [str(RULES / f) for f in tests["rule_files"]], "tests": []}
    for case in tests["tests"]:
        series = []
        for s in case.get("input_series", []):
            name, labels = parse_series(s["series"])
            series += [{**s, "series": format_series(name, lab)}
                       for lab in scrape.relabel(name, labels)]
        alerts = []
        for a in case.get("alert_rule_test", []):
            exp = []
            for e in a.get("exp_alerts") or []:
                # every series of the scrape has its job: the alerts keep it
                labels = {"job": "ncclwatch", **(e.get("exp_labels") or {})}
                if "instance" in labels:  # an alert about one target carries its labels
                    labels.update(scrape.by_instance[labels["instance"]])
                    if "replica" in e["exp_labels"] and scrape.replica_label:
                        labels["replica"] = e["exp_labels"]["replica"]
                    elif "replica" in e["exp_labels"]:   # this scrape labels no replica
                        del labels["replica"]
                exp.append({**e, "exp_labels": labels})
            alerts.append({**a, "exp_alerts": exp})
        exprs = [{**x, "exp_samples": [
                     {**s, "labels": _with_job(s["labels"])} for s in x.get("exp_samples") or []]}
                 for x in case.get("promql_expr_test", [])]
        out["tests"].append({**case, "input_series": series, "alert_rule_test": alerts,
                             **({"promql_expr_test": exprs} if exprs else {})})
    return out


#: Recording rules that sum the fleet by one label: no job label of their own.
FLEET_SUMS = ("kind:ncclwatch_stall_active:sum", "state:ncclwatch_ranks:sum")


def _with_job(series: str) -> str:
    """A recorded series as the scrape's job keeps it (every per-job rule does)."""
    name, labels = parse_series(series)
    return series if name in FLEET_SUMS else format_series(name, {"job": "ncclwatch", **labels})


def _human(seconds: float) -> str:
    """promtool's humanizeDuration for whole seconds under an hour."""
    m, s = divmod(int(seconds), 60)
    return f"{m}m {s}s" if m else f"{s}s"


def _promtool_test(tmp_path: Path, tests: dict) -> subprocess.CompletedProcess:
    path = tmp_path / "tests.yaml"
    path.write_text(yaml.safe_dump(tests, sort_keys=False))
    return subprocess.run([promtool(), "test", "rules", str(path)], capture_output=True,
                          text=True, cwd=tmp_path)


@pytest.mark.parametrize("replica_label", REPLICA_LABEL, ids=["replica", "no-replica"])
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_every_alert_holds_with_operator_target_labels(tmp_path, shape, replica_label) -> None:
    tests = yaml.safe_load((RULES / "tests.yaml").read_text())
    if not replica_label:
        # Without a replica label the pair's targets are two lone daemons: the
        # daemon-down cases (about replicas) do not apply; every other case must.
        tests["tests"] = [c for c in tests["tests"]
                          if not any("replica" in s["series"] and s["series"].startswith("up")
                                     for s in c.get("input_series", []))]
    shaped = operator_shaped(tests, Scrape(SHAPES[shape], replica_label))
    # The rewrite did what it says: daemon series now come from two pods.
    pods = {parse_series(s["series"])[1].get("pod") for c in shaped["tests"]
            for s in c["input_series"] if s["series"].startswith("ncclwatch_stall_culprit_info")}
    assert {"ncclwatch-daemon-a-7c9d5", "ncclwatch-daemon-b-7c9d5"} <= pods, pods
    out = _promtool_test(tmp_path, shaped)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_the_old_rules_fail_with_operator_target_labels(tmp_path) -> None:
    """The rewrite can catch the fault it is for: `without (instance, replica)`
    over series of two pods joins many-to-many."""
    alerts = (RULES / "alerts.yaml").read_text()
    old = re.sub(r"(max|min) by \([^)]*\) \(", r"\1 without (instance, replica) (", alerts)
    (tmp_path / "alerts.yaml").write_text(old)
    (tmp_path / "rules.yaml").write_text((RULES / "rules.yaml").read_text())
    tests = yaml.safe_load((RULES / "tests.yaml").read_text())
    shaped = operator_shaped(tests, Scrape(SHAPES["podmonitor"], True))
    shaped["rule_files"] = [str(tmp_path / "alerts.yaml"), str(tmp_path / "rules.yaml")]
    out = _promtool_test(tmp_path, shaped)
    assert out.returncode != 0
    assert "many-to-many" in out.stdout + out.stderr or "FAILED" in out.stdout


def test_a_real_stall_of_a_pod_pages_once_through_a_podmonitor_scraped_pair(tmp_path) -> None:
    """A real daemon's /metrics (rank 0 of pod team/trainer-0 saving), labelled for
    both replicas as the PodMonitor labels them: one alert, with the culprit's pod."""
    from ncclwatch.daemon.core import Daemon, DaemonConfig
    from ncclwatch.daemon.export import build, capture
    from ncclwatch.v1 import collector_pb2 as pb
    from tests.harness.reports import checkpoint_job

    d = Daemon(DaemonConfig())
    req = checkpoint_job("torchelastic:abc", world=3, timeout=90.0)
    for i, s in enumerate(req.report.samples):
        s.identity.container.CopyFrom(pb.ContainerInfo(
            container_pid=7 + i, hostname=f"trainer-{i}", runtime="containerd",
            pod_uid=f"uid-{i}", namespace="team", pod=f"trainer-{i}"))
    d.ingest(req, now=100.0)
    d.tick(now=100.0)
    families = build(capture(d, now=100.0))
    scrape = Scrape(SHAPES["podmonitor"], True)
    series = []
    for f in families:
        if f.name not in ("ncclwatch_stall_culprit_info", "ncclwatch_watchdog_remaining_seconds",
                          "ncclwatch_watchdog_timeout_seconds", "ncclwatch_stall_active",
                          "ncclwatch_stall_root_cause_info"):
            continue
        for labels, value in f.rows:
            own = {k: v for k, v in zip(f.labels, labels) if v != ""}
            for i, r in ((1, "a"), (2, "b")):
                lab = {**own, **scrape.target(f"10.0.0.{i}:7471", r)}
                series.append({"series": format_series(f.name, lab), "values": f"{value}x20"})
    culprit = [s for s in series if s["series"].startswith("ncclwatch_stall_culprit_info")]
    assert len(culprit) == 2 and all('rank_pod="trainer-0"' in s["series"] for s in culprit), culprit
    remaining = next(v for f in families if f.name == "ncclwatch_watchdog_remaining_seconds"
                     for _, v in f.rows)
    tests = {
        "rule_files": [str(RULES / "alerts.yaml"), str(RULES / "rules.yaml")],
        "evaluation_interval": "5s",
        "tests": [{"interval": "5s", "input_series": series, "alert_rule_test": [{
            "eval_time": "15s", "alertname": "NCCLWatchCheckpointGatherStall",
            "exp_alerts": [{"exp_labels": {
                "severity": "warning", "job": "ncclwatch", "job_id": "torchelastic:abc",
                "kind": "checkpoint_gather",
                "rank": "0", "host": "node-a", "node": "node-a", "rank_namespace": "team",
                "rank_pod": "trainer-0"},
                "exp_annotations": {
                    "summary": "Rank 0 is checkpointing while job torchelastic:abc waits",
                    "description": (
                        "Rank 0 on node-a (pod team/trainer-0) is gathering or writing a "
                        "checkpoint while the other ranks of job torchelastic:abc wait in the "
                        f"next collective; {_human(remaining)} of watchdog budget left. "
                        "Root cause: slow_save."),
                    "runbook_url": RUNBOOK_FALLBACK + "checkpoint_gather.md",
                    "daemon_url": "", "advice": ""}}]}]}],
    }
    out = _promtool_test(tmp_path, tests)
    assert out.returncode == 0, out.stdout + out.stderr + f"\nremaining={remaining}"
