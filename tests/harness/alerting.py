"""The operators' tools, real: the shipped rules and dashboards, Prometheus and Alertmanager
started on loopback, and a webhook receiver that keeps what Alertmanager sends."""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tests.harness.paths import ROOT
from tests.harness.procs import Proc, free_port, wait_ready
from tests.harness.tools import need_system

#: The shipped Prometheus rules, their promtool tests and the example Alertmanager routing.
RULES = ROOT / "dashboards" / "prometheus"
#: The committed Grafana dashboards.
DASHBOARDS = ROOT / "dashboards" / "grafana"
#: Where the alerts' runbook links point when no daemon URL is configured.
RUNBOOK_FALLBACK = "file:///usr/local/share/doc/ncclwatch/runbooks/"


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


def start_alerting(tmp_path: Path, hook: Webhook, scrape_configs: list[dict], procs: list[Proc],
                   *, suffix: str = "", group_wait: str = "5s",
                   group_interval: str | None = None) -> tuple[str, str]:
    """Alertmanager with the shipped example routing, its receivers ``hook``
    (``group_wait`` and, if given, ``group_interval`` shortened), and Prometheus
    (1 s scrape and evaluation, the shipped rules) scraping ``scrape_configs``;
    both ready. Each process is added to ``procs`` as it starts (the caller stops
    them), named alertmanager``suffix`` and prometheus``suffix``. Returns the
    Prometheus and the Alertmanager URL."""
    am_port, prom_port = free_port(), free_port()
    routing = ((RULES / "alertmanager.example.yml").read_text()
               .replace("http://127.0.0.1:9095", hook.url)
               .replace("group_wait: 10s", f"group_wait: {group_wait}"))
    if group_interval is not None:
        routing = routing.replace("group_interval: 1m", f"group_interval: {group_interval}")
    am_cfg = tmp_path / "alertmanager.yml"
    am_cfg.write_text(routing)
    am = Proc([need_system("prometheus-alertmanager", "prometheus-alertmanager"),
               f"--config.file={am_cfg}", f"--storage.path={tmp_path / 'am'}",
               f"--web.listen-address=127.0.0.1:{am_port}", "--cluster.listen-address="],
              name=f"alertmanager{suffix}")
    procs.append(am)
    prom_cfg = tmp_path / "prometheus.yml"
    prom_cfg.write_text(json.dumps({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES / "alerts.yaml"), str(RULES / "rules.yaml")],
        "alerting": {"alertmanagers": [
            {"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]},
        "scrape_configs": scrape_configs,
    }))
    prom = Proc([need_system("prometheus", "prometheus"), f"--config.file={prom_cfg}",
                 f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{prom_port}"], name=f"prometheus{suffix}")
    procs.append(prom)
    wait_ready(am, f"http://127.0.0.1:{am_port}/-/ready")
    wait_ready(prom, f"http://127.0.0.1:{prom_port}/-/ready")
    return f"http://127.0.0.1:{prom_port}", f"http://127.0.0.1:{am_port}"


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def query(prom: str, expr: str) -> list[dict]:
    """An instant PromQL query's result vector."""
    out = get_json(f"{prom}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    assert out["status"] == "success", (expr, out)
    return out["data"]["result"]
