"""High availability, Prometheus style: one agent, two daemons, kill -9 one mid-stall.

Rank 0 of a real torch job stalls in a checkpoint that outlasts its 60 s
process-group timeout. One real agent reports to two real daemons
(``--collector a,b``); a real Prometheus scrapes both (two targets, told
apart by a ``replica`` target label) with the shipped rules, and a real
Alertmanager with the shipped routing sends to this test's webhook. Once the
page is out, daemon a is killed with SIGKILL. The page must have fired once
(one notification, one alert without replica labels), keep firing from
daemon b, and resolve once after the watchdog ends the job. The dashboards'
replica variable must show the job once per replica, and the dead replica
is a warning (NCCLWatchDaemonReplicaDown), not a page.
"""

from __future__ import annotations

import json
import signal
import time

import pytest

from tests.harness.alerting import DASHBOARDS, RULES, Webhook, query, start_alerting
from tests.harness.artifacts import keep, record, stop_keeping_logs
from tests.harness.monitor import Monitor, job_id_of, wait_healthy
from tests.harness.procs import Proc, free_port
from tests.harness.tools import need

pytestmark = pytest.mark.e2e

PG_TIMEOUT = 60
PAGE = "NCCLWatchStallAtRisk"  # the page; it inhibits the forecast alerts behind it


def _daemon(name: str) -> tuple[Proc, str, int]:
    grpc_port, http_port = free_port(), free_port()
    proc = Proc([need("ncclwatch"), "daemon", "--grpc", f"127.0.0.1:{grpc_port}",
                 "--http", f"127.0.0.1:{http_port}"], name=f"ncclwatch-daemon-{name}")
    return proc, f"127.0.0.1:{http_port}", grpc_port


@pytest.fixture
def ha_pair(tmp_path):
    """Two daemons, one agent reporting to both, Prometheus on both, Alertmanager."""
    procs: list[Proc] = []
    hook = Webhook()
    (a, a_http, a_grpc), (b, b_http, b_grpc) = _daemon("a"), _daemon("b")
    procs += [a, b]
    mon_a, mon_b = Monitor([a], f"http://{a_http}"), Monitor([b], f"http://{b_http}")
    wait_healthy(mon_a)
    wait_healthy(mon_b)
    agent = Proc([need("ncclwatch"), "agent", "--collector",
                  f"127.0.0.1:{a_grpc},127.0.0.1:{b_grpc}"], name="ncclwatch-agent-ha")
    procs.append(agent)
    # The shipped routing, its waits short. As the shipped PodMonitor's targets are
    # scraped (docs/deploy-kubernetes.md#7-prometheus-alertmanager-grafana): the
    # Operator's job name and target labels, the pods' ncclwatch.io/replica label, and the PodMonitor's own relabelings.
    prom, _ = start_alerting(tmp_path, hook, [{
        "job_name": "podMonitor/ncclwatch/ncclwatch-daemon/0",
        "static_configs": [_pod_target(a_http, "a"), _pod_target(b_http, "b")],
        "relabel_configs": _podmonitor_relabelings()}],
        procs, suffix="-ha", group_wait="2s", group_interval="5s")
    yield mon_a, mon_b, prom, hook
    hook.server.shutdown()
    stop_keeping_logs(procs)
    keep("alertmanager-webhook-ha.json", json.dumps(hook.notifications, indent=1))


#: The target labels the Prometheus Operator gives every target of a PodMonitor.
OPERATOR_LABELS = ("namespace", "pod", "container", "endpoint")


def _pod_target(address: str, replica: str) -> dict:
    """One daemon pod as Kubernetes service discovery and the Operator's own
    relabelings present it (namespace, pod, container, endpoint)."""
    return {"targets": [address], "labels": {
        "namespace": "ncclwatch", "pod": f"ncclwatch-daemon-{replica}-6f7b9c",
        "container": "daemon", "endpoint": "http",
        "__meta_kubernetes_pod_label_ncclwatch_io_replica": replica}}


def _podmonitor_relabelings() -> list[dict]:
    """The shipped PodMonitor's relabelings, in Prometheus's own spelling."""
    import yaml  # noqa: PLC0415
    spec = yaml.safe_load((RULES.parents[1] / "deploy" / "kubernetes" / "podmonitor.yaml")
                          .read_text())
    keys = {"sourceLabels": "source_labels", "targetLabel": "target_label"}
    return [{keys.get(k, k): v for k, v in r.items()}
            for r in spec["spec"]["podMetricsEndpoints"][0]["relabelings"]]


def _page_notifications(hook: Webhook, job_id: str) -> list[dict]:
    return [n for n in hook.notifications if n["path"] == "/pager"
            and n["groupLabels"].get("alertname") == PAGE
            and n["groupLabels"].get("job_id") == job_id]


def _firing_alerts(prom: str, job_id: str) -> list[dict]:
    return query(prom, f'ALERTS{{alertname="{PAGE}",alertstate="firing",job_id="{job_id}"}}')


def test_the_page_survives_kill_9_of_one_daemon_and_fires_and_resolves_once(
        ha_pair, torch_job) -> None:
    t0 = time.time()
    mon_a, mon_b, prom, hook = ha_pair
    job = torch_job("slow-save", 2, {"NCCLWATCH_PG_TIMEOUT_S": str(PG_TIMEOUT)},
                    "--model-mb", "16", "--save-seconds", "150",
                    "--pg-timeout", str(PG_TIMEOUT))
    job.wait_marker("ready", timeout=120, count=2)
    pids = job.pids()
    job_id = job_id_of(mon_a, pids)
    assert job_id_of(mon_b, pids) == job_id  # both daemons judge the job
    t_save = job.wait_marker("save_start", timeout=120)[0]["t"]

    # Both daemons export the stall; the page goes out once.
    deadline = t_save + PG_TIMEOUT - 10
    while time.time() < deadline and not _page_notifications(hook, job_id):
        assert job.proc.alive(), job.proc.output()[-3000:]
        time.sleep(0.5)
    pages = _page_notifications(hook, job_id)
    assert pages, f"no page within the budget; webhook got {hook.notifications}"
    t_page = time.time()
    overrun = query(prom, f'ncclwatch_watchdog_forecast_overrun_seconds{{job_id="{job_id}"}}')
    assert sorted(s["metric"]["replica"] for s in overrun) == ["a", "b"], overrun
    firing = _firing_alerts(prom, job_id)
    assert len(firing) == 1, firing
    assert "instance" not in firing[0]["metric"] and "replica" not in firing[0]["metric"]
    assert not set(OPERATOR_LABELS) & set(firing[0]["metric"]), firing
    assert {s["metric"]["pod"] for s in overrun} == {"ncclwatch-daemon-a-6f7b9c",
                                                     "ncclwatch-daemon-b-6f7b9c"}, overrun
    # Both replicas export the stall; the dashboards pick one and count it once.
    both = query(prom, f'sum(ncclwatch_stall_active{{job_id="{job_id}"}})')
    assert float(both[0]["value"][1]) == 2, both
    from dashboards.queries import panel_queries  # noqa: PLC0415 - the repo's dashboards/
    for replica in ("a", "b"):
        q = dict(panel_queries(DASHBOARDS / "ncclwatch-fleet.json", job_id=job_id,
                               replica=replica))
        stalls = query(prom, q["Active stalls"])
        assert float(stalls[0]["value"][1]) == 1, (replica, stalls)
        ranks = query(prom, q["Ranks by state"])
        assert sum(float(s["value"][1]) for s in ranks) == 2, (replica, ranks)

    # kill -9 daemon a mid-stall.
    assert mon_a.procs[0].stop(signal.SIGKILL) == -signal.SIGKILL
    t_kill = time.time()
    up_a = lambda: query(prom, 'up{job="ncclwatch",replica="a"}')[0]["value"][1]  # noqa: E731
    while time.time() < t_kill + 30 and up_a() != "0":
        time.sleep(0.5)
    assert up_a() == "0", "Prometheus still scrapes the killed daemon"
    # It keeps firing, from b alone, while the job stalls (until the watchdog).
    up_b = lambda: query(prom, 'up{job="ncclwatch",replica="b"}')[0]["value"][1]  # noqa: E731
    checked = missed = 0
    while time.time() < t_save + PG_TIMEOUT - 3 and job.proc.alive():
        firing = _firing_alerts(prom, job_id)
        assert len(firing) == 1, f"{time.time() - t_kill:.0f}s after the kill: {firing}"
        left = query(prom, f'ncclwatch_watchdog_forecast_overrun_seconds{{job_id="{job_id}"}}')
        replicas = [s["metric"]["replica"] for s in left]
        # b's series lapse only with a scrape of b that failed (a slow answer under load).
        assert replicas == ["b"] or (not replicas and up_b() == "0"), (left, up_b())
        missed += not replicas
        checked += 1
        time.sleep(1.0)
    assert checked >= 5, f"only {checked} checks between the kill and the watchdog"
    assert missed <= checked // 4, f"b's series missing in {missed} of {checked} checks"

    # The watchdog ends the job; the page resolves, once.
    job.proc.popen.wait(PG_TIMEOUT)
    t_end = time.time()
    resolved: list[dict] = []
    while time.time() < t_end + 75 and not resolved:
        resolved = [n for n in _page_notifications(hook, job_id) if n["status"] == "resolved"]
        time.sleep(0.5)
    assert resolved, f"the page never resolved; webhook got {hook.notifications}"
    time.sleep(6)  # past a group_interval: a duplicate would have arrived by now
    pages = _page_notifications(hook, job_id)
    assert [n["status"] for n in pages] == ["firing", "resolved"], pages
    assert len({n["groupKey"] for n in pages}) == 1
    for n in pages:
        assert len(n["alerts"]) == 1, n["alerts"]  # one alert: the pair deduplicated
        labels = n["alerts"][0]["labels"]
        assert labels["job_id"] == job_id and "replica" not in labels and "instance" not in labels
        assert not set(OPERATOR_LABELS) & set(labels), labels
    # One replica down is a warning, not a page (NCCLWatchDaemonDown waits for both).
    while time.time() < t_kill + 70:
        time.sleep(1)
    alerts = {a["metric"]["alertname"]: a["metric"]["alertstate"]
              for a in query(prom, 'ALERTS{alertname=~"NCCLWatchDaemon.*"}')}
    assert alerts == {"NCCLWatchDaemonReplicaDown": "firing"}, alerts
    record("ha_failover", {"page_after_save_start_s": round(t_page - t_save, 1),
                           "killed_after_page_s": round(t_kill - t_page, 1),
                           "firing_checks_after_kill": checked,
                           "resolved_after_job_end_s": round(time.time() - 6 - t_end, 1),
                           "test_wall_s": round(time.time() - t0, 1)})
