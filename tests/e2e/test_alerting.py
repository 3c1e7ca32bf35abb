"""End to end through the operators' tools: Prometheus, Alertmanager, Grafana's queries.

A real Prometheus (1 s scrape and evaluation) scrapes ``ncclwatch run`` with
the shipped rules; a real Alertmanager routes to a webhook receiver in this
test. Rank 0 of a real torch job stalls in a checkpoint that will outlast
its 90 s process-group timeout: the page must reach the webhook, with the
culprit's labels, long before the watchdog would fire. While the stall
lasts, every panel of the committed dashboards must get data from that
Prometheus.
"""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request

import pytest

from tests.harness.alerting import DASHBOARDS, Webhook, get_json, query, start_alerting
from tests.harness.artifacts import keep, record, stop_keeping_logs
from tests.harness.monitor import job_id_of
from tests.harness.procs import Proc

pytestmark = pytest.mark.e2e

PG_TIMEOUT = 90


@pytest.fixture
def alerting_stack(tmp_path):
    """Alertmanager -> webhook, and a Prometheus pointing at a scrape target given later."""
    procs: list[Proc] = []
    hook = Webhook()

    def start(metrics_hostport: str) -> tuple[str, str, Webhook]:
        # A plain scrape: the training job is `job_id`, `job` stays the scrape job's.
        prom, am = start_alerting(tmp_path, hook, [{
            "job_name": "ncclwatch", "static_configs": [{"targets": [metrics_hostport]}]}],
            procs)
        return prom, am, hook

    yield start
    hook.server.shutdown()
    stop_keeping_logs(procs)
    keep("alertmanager-webhook.json", json.dumps(hook.notifications, indent=1))


def _am_alerts(am: str, alertname: str) -> list[dict]:
    return [a for a in get_json(f"{am}/api/v2/alerts")
            if a["labels"].get("alertname") == alertname]


def test_checkpoint_stall_pages_through_alertmanager_before_the_watchdog(
        ncclwatch_run, torch_job, alerting_stack) -> None:
    mon = ncclwatch_run()
    prom, am, hook = alerting_stack(mon.http.removeprefix("http://"))
    job = torch_job("slow-save", 3, {"NCCLWATCH_PG_TIMEOUT_S": str(PG_TIMEOUT),
                                     # a setting the config-warning panel must show
                                     "TORCH_NCCL_TRACE_BUFFER_SIZE": "0"},
                    "--model-mb", "16", "--save-seconds", "150",
                    "--pg-timeout", str(PG_TIMEOUT))
    job.wait_marker("ready", timeout=120, count=3)
    pids = job.pids()
    job_id = job_id_of(mon, pids)
    t_save = job.wait_marker("save_start", timeout=120)[0]["t"]

    deadline = t_save + PG_TIMEOUT - 10
    page = []
    while time.time() < deadline and not page:
        assert job.proc.alive(), job.proc.output()[-3000:]
        page = hook.firing("NCCLWatchStallAtRisk", "/pager")
        time.sleep(0.5)
    assert page, f"no page within the budget; webhook got {hook.notifications}"
    t_page, alert = page[0]
    host = mon.job_of(pids)["stalls"][0]["culprits"][0]["host"]
    labels, ann = alert["labels"], alert["annotations"]
    assert labels["job_id"] == job_id and labels["job"] == "ncclwatch"
    assert labels["severity"] == "critical" and labels["kind"] == "checkpoint_gather"
    assert "left to act" in ann["summary"] and "Do now: " in ann["description"], ann
    # Links: the daemon's own page of the job, and the runbook it serves.
    assert ann["runbook_url"] == f"{mon.http}/runbooks/checkpoint_gather.md#what-to-do-now"
    anchor = "job-" + urllib.parse.quote_plus(job_id, safe="")
    assert ann["daemon_url"] == f"{mon.http}/#{anchor}", ann
    with urllib.request.urlopen(ann["daemon_url"], timeout=10) as r:
        assert f"id='{anchor}'" in r.read().decode()
    with urllib.request.urlopen(ann["runbook_url"], timeout=10) as r:
        assert '<a id="what-to-do-now"></a>' in r.read().decode()
    lead = t_save + PG_TIMEOUT - t_page
    record("alertmanager_page", {"page_after_save_start_s": round(t_page - t_save, 1),
                                 "lead_before_watchdog_s": round(lead, 1)})
    assert lead > PG_TIMEOUT / 2, f"paged only {lead:.0f}s before the watchdog"

    # The stall's own warning carries the culprit as labels and reached
    # Alertmanager, which inhibits it (the page says it all): no chat noise.
    stall: list[dict] = []
    while time.time() < deadline and not stall:
        stall = _am_alerts(am, "NCCLWatchCheckpointGatherStall")
        time.sleep(0.5)
    assert stall, get_json(f"{am}/api/v2/alerts")
    assert {k: stall[0]["labels"][k] for k in ("job_id", "rank", "host", "node", "kind",
                                               "severity")} == {
        "job_id": job_id, "rank": "0", "host": host, "node": host, "kind": "checkpoint_gather",
        "severity": "warning"}
    assert "Root cause: save_overruns_watchdog" in stall[0]["annotations"]["description"]
    assert stall[0]["status"]["state"] == "suppressed" and stall[0]["status"]["inhibitedBy"]
    time.sleep(6)  # past the chat route's group_wait
    assert not hook.firing("NCCLWatchCheckpointGatherStall"), hook.notifications

    # Grafana's view of the same moment: every panel must have data (but those that
    # join another exporter's series: there is no dcgm-exporter here).
    from dashboards.generate import BOARDS  # noqa: PLC0415 - the repo's dashboards/
    from dashboards.queries import panel_queries  # noqa: PLC0415 - the repo's dashboards/
    foreign = {t for make in BOARDS.values() for t in make().foreign}
    empty, checked = [], 0
    scope = {"job_id": job_id, "instance": mon.http.removeprefix("http://"), "node": host}
    paths = sorted(DASHBOARDS.glob("*.json"))
    assert len(paths) >= 2, f"no dashboards in {DASHBOARDS}: run `make dashboards`"
    for path in paths:
        for title, exprs in _by_panel(panel_queries(path, annotations=True, **scope)).items():
            if title in foreign:
                continue
            checked += 1
            if not any(query(prom, e) for e in exprs):
                empty.append(f"{path.name}: {title}: {exprs}")
    assert checked >= 30, f"only {checked} panels/annotations found"
    assert not empty, "panels without data during the stall:\n" + "\n".join(empty)


def _by_panel(queries: list[tuple[str, str]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for title, expr in queries:
        out.setdefault(title, []).append(expr)
    return out
