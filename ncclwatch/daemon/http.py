"""HTTP on 7471: /metrics, /api/v1/jobs, /api/v1/incidents, /healthz and /.

A stdlib threading server; every handler reads the daemon's state on the
event loop (``call``), so the tables are never touched from two threads.
"""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable
from urllib.parse import urlsplit

from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from ncclwatch.daemon import api, page
from ncclwatch.daemon.core import Daemon
from ncclwatch.daemon.export import make_registry

log = logging.getLogger(__name__)

Call = Callable[[Callable[[], Any]], Any]


class HttpServer:
    def __init__(self, daemon: Daemon, host: str, port: int, call: Call) -> None:
        registry = make_registry(daemon, call)

        class Handler(BaseHTTPRequestHandler):
            server_version = "ncclwatch"

            def do_GET(self) -> None:  # noqa: N802 (stdlib name)
                path = urlsplit(self.path).path.rstrip("/") or "/"
                try:
                    if path == "/metrics":
                        self._send(200, CONTENT_TYPE_LATEST, generate_latest(registry))
                    elif path == "/api/v1/jobs":
                        self._json(call(lambda: api.jobs_view(daemon)))
                    elif path == "/api/v1/incidents":
                        self._json(call(lambda: api.incidents_view(daemon)))
                    elif path == "/healthz":
                        self._send(200, "text/plain", b"ok\n")
                    elif path == "/":
                        html = page.render(call(lambda: api.jobs_view(daemon)))
                        self._send(200, "text/html; charset=utf-8", html.encode())
                    else:
                        self._send(404, "text/plain", b"not found\n")
                except Exception as e:  # a broken view must not kill the server
                    log.exception("HTTP %s failed", path)
                    self._send(500, "text/plain", f"internal error: {e}\n".encode())

            def _json(self, obj: Any) -> None:
                self._send(200, "application/json", json.dumps(obj, indent=1).encode())

            def _send(self, code: int, ctype: str, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, fmt: str, *args: Any) -> None:
                log.debug("http %s " + fmt, self.address_string(), *args)

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever,
                                        name="ncclwatch-http", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
