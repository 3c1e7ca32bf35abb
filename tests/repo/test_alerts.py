"""The Prometheus rules: valid for promtool, unit-tested, and complete.

promtool comes from Debian's ``prometheus`` package (``make test`` installs
it). Every alert must have a firing and a not-firing unit test, the mixin
annotations, and a runbook that exists.
"""

from __future__ import annotations

import re
import subprocess

import pytest
import yaml

from tests.harness.alerting import RULES, RUNBOOK_FALLBACK
from tests.harness.paths import ROOT
from tests.harness.tools import need_system, promtool

ALERTS = RULES / "alerts.yaml"
#: How every runbook_url starts: the daemon's runbook base (live, else the last in a
#: week), else the fallback.
RUNBOOK_PREFIX = ('{{ with query "ncclwatch_daemon_info or last_over_time(ncclwatch_daemon_info[1w])" }}'
                  '{{ . | first | label "runbook_base" }}'
                  '{{ else }}' + RUNBOOK_FALLBACK + '{{ end }}')
DAEMON_URL = '{{ with query "ncclwatch_daemon_info" }}{{ . | first | label "url" }}/'
KINDS = ("checkpoint_gather", "checkpoint_restore", "collective_hang", "desync", "rank_lost")


def _alerts() -> list[dict]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [r for g in groups for r in g["rules"] if "alert" in r]


def test_promtool_check_rules() -> None:
    out = subprocess.run([promtool(), "check", "rules", str(ALERTS), str(RULES / "rules.yaml")],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_promtool_unit_tests_pass() -> None:
    out = subprocess.run([promtool(), "test", "rules", "tests.yaml"], cwd=RULES,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_every_alert_is_tested_firing_and_not_firing() -> None:
    tests = yaml.safe_load((RULES / "tests.yaml").read_text())["tests"]
    cases = [c for t in tests for c in t.get("alert_rule_test", [])]
    for rule in _alerts():
        name = rule["alert"]
        mine = [c for c in cases if c["alertname"] == name]
        assert any(c.get("exp_alerts") for c in mine), f"{name}: no test where it fires"
        assert any(not c.get("exp_alerts") for c in mine), f"{name}: no test where it stays quiet"


def test_alerts_follow_the_mixin_conventions() -> None:
    names = [r["alert"] for r in _alerts()]
    assert len(names) == len(set(names))
    for rule in _alerts():
        name = rule["alert"]
        assert re.fullmatch(r"NCCLWatch(?:[A-Z][a-z0-9]*|NVML|PySpy)+", name), name
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, name
        ann = rule["annotations"]
        assert set(ann) >= {"summary", "description", "runbook_url"}, name
        assert "{{" in ann["description"], f"{name}: description is not templated"


def test_stall_alerts_name_job_culprit_host_and_budget() -> None:
    by_kind = {}
    for rule in _alerts():
        m = re.search(r'kind="(\w+)"', rule["expr"])
        if m and m.group(1) in KINDS:
            by_kind[m.group(1)] = rule
    assert set(by_kind) == set(KINDS), "one alert per stall kind"
    for kind, rule in by_kind.items():
        text = rule["annotations"]["summary"] + rule["annotations"]["description"]
        assert "$labels.job_id" in text, kind
        assert "humanizeDuration" in text, f"{kind}: remaining seconds missing"
        if kind != "rank_lost":  # no culprit from missing data
            assert "$labels.rank" in text and "$labels.host" in text, kind
        assert rule["annotations"]["runbook_url"] == RUNBOOK_PREFIX + f"{kind}.md", kind


def test_runbook_links_resolve_to_files_and_anchors() -> None:
    for rule in _alerts():
        url = rule["annotations"]["runbook_url"]
        assert url.startswith(RUNBOOK_PREFIX), url
        path, _, anchor = url[len(RUNBOOK_PREFIX):].partition("#")
        pages = ([f"{k}.md" for k in KINDS] if path == "{{ $labels.kind }}.md" else [path])
        for name in pages:
            page = ROOT / "docs" / "runbooks" / name
            assert page.exists(), f"{rule['alert']}: {name} missing"
            if anchor:
                assert f'<a id="{anchor}"></a>' in page.read_text(), f"{url}: no such anchor"


def test_every_alert_links_to_the_daemon_page_of_its_job() -> None:
    for rule in _alerts():
        url = rule["annotations"].get("daemon_url", "")
        assert url.startswith(DAEMON_URL), rule["alert"]
        about_a_job = "$labels.job_id" in rule["annotations"]["summary"]
        assert ("#job-{{ $labels.job_id | urlquery }}" in url) == about_a_job, rule["alert"]


def test_the_training_job_label_is_job_id_and_job_is_the_scrape_job() -> None:
    text = ALERTS.read_text()
    assert "$labels.job " not in text and "$labels.job}" not in text
    assert re.findall(r'\bjob="([^"]*)"', text) == ["ncclwatch"] * text.count('job="')
    assert "(job)" not in text and "honor_labels: true" not in text


def test_at_risk_and_confirmed_hangs_page() -> None:
    by_name = {r["alert"]: r for r in _alerts()}
    risk = by_name["NCCLWatchStallAtRisk"]
    assert risk["labels"]["severity"] == "critical"
    assert "ncclwatch_stall_at_risk" in risk["expr"]
    assert "$value | humanizeDuration" in risk["annotations"]["summary"]  # time left
    assert "ncclwatch_stall_advice_info" in risk["annotations"]["description"]
    assert by_name["NCCLWatchCollectiveHang"]["labels"]["severity"] == "critical"
    for rule in _alerts():  # every stall alert says what to do now
        if re.search(r'kind="(\w+)"', rule["expr"]) or rule["alert"] == "NCCLWatchStallAtRisk":
            if "ncclwatch_stall_culprit_info" in rule["expr"] or "stall_active" in rule["expr"] \
                    or rule["alert"] == "NCCLWatchStallAtRisk":
                assert "ncclwatch_stall_advice_info" in rule["annotations"]["advice"], rule["alert"]


def test_the_daemon_exports_the_links_the_rules_use() -> None:
    from ncclwatch.daemon.core import Daemon, DaemonConfig
    from ncclwatch.daemon.export import DaemonCollector

    d = Daemon(DaemonConfig(http="0.0.0.0:7471", external_url="https://ncclwatch.example/"))
    text = DaemonCollector(d).exposition().decode()
    assert ('ncclwatch_daemon_info{url="https://ncclwatch.example",'
            'runbook_base="https://ncclwatch.example/runbooks/"} 1.0') in text
    d = Daemon(DaemonConfig(runbook_url="https://wiki.example/rb"))
    assert 'runbook_base="https://wiki.example/rb/"' in DaemonCollector(d).exposition().decode()


def amtool() -> str:
    return need_system("amtool", "prometheus-alertmanager")


AM_EXAMPLE = RULES / "alertmanager.example.yml"


def test_alertmanager_example_config_is_valid() -> None:
    out = subprocess.run([amtool(), "check-config", str(AM_EXAMPLE)], capture_output=True,
                         text=True)
    assert out.returncode == 0 and "SUCCESS" in out.stdout, out.stdout + out.stderr


@pytest.mark.parametrize("labels,receiver", [
    ({"alertname": "NCCLWatchWatchdogForecastOverrun", "severity": "critical"}, "ncclwatch-pager"),
    ({"alertname": "NCCLWatchStallAtRisk", "severity": "critical"}, "ncclwatch-pager"),
    ({"alertname": "NCCLWatchCollectiveHang", "severity": "critical"}, "ncclwatch-pager"),
    ({"alertname": "NCCLWatchRankLost", "severity": "critical"}, "ncclwatch-pager"),
    ({"alertname": "NCCLWatchCheckpointGatherStall", "severity": "warning"}, "ncclwatch-chat"),
    ({"alertname": "NCCLWatchJobConfigDefeatsWatchdog", "severity": "info"}, "ncclwatch-ticket"),
])
def test_alertmanager_example_routes_by_severity(labels: dict, receiver: str) -> None:
    severities = {r["alert"]: r["labels"]["severity"] for r in _alerts()}
    assert severities[labels["alertname"]] == labels["severity"], "routing test is stale"
    out = subprocess.run([amtool(), "config", "routes", "test", f"--config.file={AM_EXAMPLE}",
                          *(f"{k}={v}" for k, v in labels.items()), "job_id=j1"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip() == receiver


def test_the_daemon_serves_the_runbooks_alerts_link_to() -> None:
    """runbook_base defaults to <daemon>/runbooks/: every page an alert names is there,
    the same text as docs/runbooks (the health page is shipped in the package)."""
    import urllib.error
    import urllib.request

    from ncclwatch.daemon.core import Daemon
    from ncclwatch.daemon.http import HttpServer

    srv = HttpServer(Daemon(), "127.0.0.1", 0, lambda fn: fn())
    srv.start()
    try:
        names = {re.sub(r"#.*", "", r["annotations"]["runbook_url"][len(RUNBOOK_PREFIX):])
                 for r in _alerts()} - {"{{ $labels.kind }}.md"} | {f"{k}.md" for k in KINDS}
        for name in sorted(names):
            with urllib.request.urlopen(f"http://127.0.0.1:{srv.port}/runbooks/{name}") as r:
                assert r.read().decode() == (ROOT / "docs" / "runbooks" / name).read_text(), name
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"http://127.0.0.1:{srv.port}/runbooks/../../etc/passwd")
        assert err.value.code == 404
        # A browser gets HTML, every heading an alert's anchor names with its id, under
        # the headers of every page (no script, no framing); the bare name is the page too.
        for name in sorted(names):
            for path, accept in ((name, "text/html,*/*;q=0.8"), (name[:-3], "*/*")):
                req = urllib.request.Request(f"http://127.0.0.1:{srv.port}/runbooks/{path}",
                                             headers={"Accept": accept})
                with urllib.request.urlopen(req) as r:
                    html, headers = r.read().decode(), r.headers
                assert headers["Content-Type"] == "text/html; charset=utf-8", path
                assert "script-src 'none'" in headers["Content-Security-Policy"]
                assert "frame-ancestors 'none'" in headers["Content-Security-Policy"]
                assert headers["X-Content-Type-Options"] == "nosniff"
                assert "<script" not in html and "<!--" not in html
                for anchor in re.findall(r'<a id="([^"]+)"></a>',
                                         (ROOT / "docs" / "runbooks" / name).read_text()):
                    assert f'id="{anchor}"' in html, (name, anchor)
        linked = {tuple(r["annotations"]["runbook_url"][len(RUNBOOK_PREFIX):].split("#"))
                  for r in _alerts() if "#" in r["annotations"]["runbook_url"]
                  and "{{" not in r["annotations"]["runbook_url"][len(RUNBOOK_PREFIX):]}
        for name, anchor in linked:
            with urllib.request.urlopen(urllib.request.Request(
                    f"http://127.0.0.1:{srv.port}/runbooks/{name}",
                    headers={"Accept": "text/html"})) as r:
                assert f'id="{anchor}"' in r.read().decode(), (name, anchor)
    finally:
        srv.stop()


def test_with_no_daemon_seen_the_runbook_link_is_the_installed_copy() -> None:
    """Never a relative path: the copy `ncclwatch install runbooks` puts on the host
    (deploy/generate.py swaps in the daemons' Service for the cluster)."""
    from deploy import generate
    from ncclwatch.install import KINDS

    assert RUNBOOK_FALLBACK == f"file://{KINDS['runbooks'].dest}/" == generate.RUNBOOK_FALLBACK
    assert not [r["alert"] for r in _alerts() if "docs/runbooks" in r["annotations"]["runbook_url"]]


def test_config_warnings_are_exported_with_the_level_the_alert_selects() -> None:
    """`level`, not `severity` (the alert's own label); the alert selects a level the
    job lint gives, and the daemon exports it for a real warning."""
    from ncclwatch.daemon.core import Daemon, DaemonConfig
    from ncclwatch.daemon.export import DaemonCollector
    from ncclwatch.envlint import RULES as LINT
    from ncclwatch.model import RankState
    from tests.harness.reports import report, sample

    (rule,) = [r for r in _alerts() if r["alert"] == "NCCLWatchJobConfigDefeatsWatchdog"]
    levels = re.findall(r'ncclwatch_job_config_warning\{level="(\w+)"\}', rule["expr"])
    assert levels == ["warning"] and set(levels) <= {r.severity for r in LINT}
    d = Daemon(DaemonConfig())
    s = sample("job-1", 0, 1, RankState.COMPUTE, timeout=60.0)
    s.job.env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "0"
    d.ingest(report([s]), now=10.0)
    d.tick(now=10.5)
    text = DaemonCollector(d, lambda fn: fn()).exposition().decode()
    assert ('ncclwatch_job_config_warning{job_id="job-1",code="watchdog_cannot_abort",'
            'level="warning"} 1.0') in text


def test_a_culprits_gpu_is_exported_with_dcgm_exporters_labels() -> None:
    """Hostname (the node), gpu (the index) and UUID: dcgm-exporter's names, so the
    culprit's DCGM_FI_DEV_* series join on them (rules.yaml)."""
    from ncclwatch.daemon.core import Daemon, DaemonConfig
    from ncclwatch.daemon.export import DaemonCollector
    from ncclwatch.v1 import collector_pb2 as pb
    from tests.harness.reports import checkpoint_job

    d = Daemon(DaemonConfig(stall_threshold=5.0))
    req = checkpoint_job("job-1", 4, node="gpu-node-7")
    req.report.samples[0].gpu.append(pb.GpuMemory(
        device_index=3, device_uuid="GPU-5fd4b6a2-0c1e-4a8f-9b0e-3d2f1a6c7e88",
        used_bytes=1 << 30, device_total_bytes=80 << 30, device_used_bytes=2 << 30))
    req.report.samples[1].gpu.append(pb.GpuMemory(device_index=1, device_uuid="GPU-other"))
    d.ingest(req, now=100.0)
    d.tick(now=100.5)
    text = DaemonCollector(d, lambda fn: fn()).exposition().decode()
    lines = [x for x in text.splitlines() if x.startswith("ncclwatch_culprit_gpu_info{")]
    assert lines == ['ncclwatch_culprit_gpu_info{job_id="job-1",rank="0",Hostname="gpu-node-7",'
                     'gpu="3",UUID="GPU-5fd4b6a2-0c1e-4a8f-9b0e-3d2f1a6c7e88",'
                     'rank_namespace="",rank_pod=""} 1.0'], text


def test_a_culprits_gpu_carries_its_pod_for_dcgm_exporters_pod_join() -> None:
    """In a pod, the culprit's GPU names the pod under rank_ names (the scrape's target
    labels namespace and pod are the daemon's own, dcgm-exporter's pod mapping arrives
    as exported_*): rules.yaml joins them where dcgm-exporter's Hostname is not the node.
    The pod is the node's word (cgroup, kubelet), not the one the rank declares."""
    from ncclwatch.daemon.core import Daemon, DaemonConfig
    from ncclwatch.daemon.export import DaemonCollector
    from ncclwatch.v1 import collector_pb2 as pb
    from tests.harness.reports import checkpoint_job

    d = Daemon(DaemonConfig(stall_threshold=5.0))
    req = checkpoint_job("job-1", 4, node="gpu-node-7")
    for i, s in enumerate(req.report.samples):
        s.identity.container.CopyFrom(pb.ContainerInfo(
            container_pid=7, hostname=f"trainer-{i}", runtime="containerd", pod_uid=f"uid-{i}",
            namespace="team", pod=f"trainer-{i}", declared_namespace="elsewhere",
            declared_pod="not-me"))
        s.gpu.append(pb.GpuMemory(device_index=i, device_uuid=f"GPU-{i}", used_bytes=1 << 30))
    d.ingest(req, now=100.0)
    d.tick(now=100.5)
    text = DaemonCollector(d, lambda fn: fn()).exposition().decode()
    lines = [x for x in text.splitlines() if x.startswith("ncclwatch_culprit_gpu_info{")]
    assert lines == ['ncclwatch_culprit_gpu_info{job_id="job-1",rank="0",Hostname="gpu-node-7",'
                     'gpu="0",UUID="GPU-0",rank_namespace="team",rank_pod="trainer-0"} 1.0'], text
    # the same pod as the culprit's own series says
    assert 'rank_namespace="team",rank_pod="trainer-0"} 1.0' in next(
        x for x in text.splitlines() if x.startswith("ncclwatch_stall_culprit_info{"))


def test_labelled_counters_start_at_zero_for_every_known_value() -> None:
    """rate() and increase() need a series before the first event: a fresh daemon
    exports every counter at 0 for each label value it knows in advance (only the
    per-node and per-worker ones wait for a node or a worker)."""
    from ncclwatch.daemon import export
    from ncclwatch.daemon.core import Daemon, DaemonConfig
    from ncclwatch.daemon.validate import REJECT_CODES

    fams = {f.name: f for f in export.DaemonCollector(Daemon(DaemonConfig()),
                                                      lambda fn: fn()).collect()
            if f.type == "counter"}
    per_node_or_worker = {name for name, _, type_, _ in export._AGENT_FAMILIES
                          if type_ == "counter"} | {
        "ncclwatch_agent_rank_budget_hits", "ncclwatch_agent_parts_left_out",
        "ncclwatch_daemon_ingest_worker_reports",
        "ncclwatch_daemon_ingest_worker_cpu_seconds", "ncclwatch_daemon_ingest_worker_restarts",
        "ncclwatch_daemon_node_faults"}   # per node: nodes x reasons at 0 would be thousands
    empty = {name for name, f in fams.items() if not f.samples}
    assert empty == per_node_or_worker, empty ^ per_node_or_worker
    for f in fams.values():
        assert all(s.value == 0 for s in f.samples if s.name.endswith("_total")), f.name
    for name in ("ncclwatch_daemon_rejected_reports", "ncclwatch_daemon_rejected_job_samples"):
        assert [s.labels["code"] for s in fams[name].samples
                if s.name.endswith("_total")] == list(REJECT_CODES)
