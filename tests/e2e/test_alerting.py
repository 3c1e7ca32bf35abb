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
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.conftest import ARTIFACTS, ROOT, Proc, free_port, need_system, record
from tests.e2e.test_checkpoint_stall import _job_id

pytestmark = pytest.mark.e2e

PG_TIMEOUT = 90
RULES = ROOT / "dashboards" / "prometheus"
DASHBOARDS = ROOT / "dashboards" / "grafana"


class Webhook:
    """Alertmanager's webhook receiver: keeps every notification it gets."""

    def __init__(self) -> None:
        self.notifications: list[dict] = []
        received = self.notifications

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                received.append({"t": time.time(), "path": self.path, **json.loads(body)})
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def firing(self, alertname: str, path: str | None = None) -> list[tuple[float, dict]]:
        return [(n["t"], a) for n in self.notifications for a in n["alerts"]
                if a["status"] == "firing" and a["labels"].get("alertname") == alertname
                and (path is None or n["path"] == path)]


def _get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def _wait_ready(proc: Proc, url: str, timeout: float = 60.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if not proc.alive():
            break
        time.sleep(0.3)
    pytest.fail(f"{proc.name} did not become ready at {url}:\n{proc.output()[-3000:]}")


@pytest.fixture
def alerting_stack(tmp_path):
    """Alertmanager -> webhook, and a Prometheus pointing at a scrape target given later."""
    procs: list[Proc] = []
    hook = Webhook()

    def start(metrics_hostport: str) -> tuple[str, str, Webhook]:
        am_port, prom_port = free_port(), free_port()
        # The shipped example routing, its receivers pointed at this test's webhook.
        am_cfg = tmp_path / "alertmanager.yml"
        am_cfg.write_text((RULES / "alertmanager.example.yml").read_text()
                          .replace("http://127.0.0.1:9095", hook.url)
                          .replace("group_wait: 10s", "group_wait: 5s"))
        am = Proc([need_system("prometheus-alertmanager", "prometheus-alertmanager"),
                   f"--config.file={am_cfg}", f"--storage.path={tmp_path / 'am'}",
                   f"--web.listen-address=127.0.0.1:{am_port}",
                   "--cluster.listen-address="], name="alertmanager")
        procs.append(am)
        prom_cfg = tmp_path / "prometheus.yml"
        prom_cfg.write_text(json.dumps({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(RULES / "alerts.yaml"), str(RULES / "rules.yaml")],
            "alerting": {"alertmanagers": [
                {"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]},
            # A plain scrape: the training job is `job_id`, `job` stays the scrape job's.
            "scrape_configs": [{"job_name": "ncclwatch",
                                "static_configs": [{"targets": [metrics_hostport]}]}],
        }))
        prom = Proc([need_system("prometheus", "prometheus"), f"--config.file={prom_cfg}",
                     f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                     f"--web.listen-address=127.0.0.1:{prom_port}"], name="prometheus")
        procs.append(prom)
        _wait_ready(am, f"http://127.0.0.1:{am_port}/-/ready")
        _wait_ready(prom, f"http://127.0.0.1:{prom_port}/-/ready")
        return f"http://127.0.0.1:{prom_port}", f"http://127.0.0.1:{am_port}", hook

    yield start
    hook.server.shutdown()
    ARTIFACTS.mkdir(exist_ok=True)
    for p in procs:
        p.stop()
        (ARTIFACTS / f"{p.name}.log").write_text(p.output())
    (ARTIFACTS / "alertmanager-webhook.json").write_text(json.dumps(hook.notifications, indent=1))


def _query(prom: str, expr: str) -> list[dict]:
    out = _get_json(f"{prom}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    assert out["status"] == "success", (expr, out)
    return out["data"]["result"]


def _am_alerts(am: str, alertname: str) -> list[dict]:
    return [a for a in _get_json(f"{am}/api/v2/alerts")
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
    job_id = _job_id(mon, pids)
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
    assert stall, _get_json(f"{am}/api/v2/alerts")
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
            if not any(_query(prom, e) for e in exprs):
                empty.append(f"{path.name}: {title}: {exprs}")
    assert checked >= 30, f"only {checked} panels/annotations found"
    assert not empty, "panels without data during the stall:\n" + "\n".join(empty)


def _by_panel(queries: list[tuple[str, str]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for title, expr in queries:
        out.setdefault(title, []).append(expr)
    return out
