"""HTTP on 7471: /metrics, /api/v1/jobs, /api/v1/incidents, /api/v1/dump, /healthz and /.

A stdlib threading server; every handler takes what it needs of the
daemon's state on the event loop (``call``), briefly: the per-rank walk,
encoding and JSON of /metrics and /api/v1/jobs run in the handler's thread
over list copies taken there (export.py, api.py), so a 16k-rank render does
not hold the loop that ingests reports. /healthz is a round trip through the
loop.
With a web config (webconfig.py) it speaks HTTPS, the TLS handshake done in
the connection's own thread (a slow or plain-HTTP client cannot stall the
accept loop), and asks for basic auth on everything but /healthz, which
liveness probes must reach without credentials.

``allowed_hosts`` (on by default: loopback's names for ``run``; for the daemon
also its external URL's host and this machine's names; IP addresses always)
answers 403 to a request of any method whose Host header names another host,
before the method is looked at: a web page that rebinds its own DNS name to
127.0.0.1 can neither read the API nor make the daemon parse a
paste (a POST body is dropped unread, up to 1 MiB, else the connection closed).
HEAD is answered for every GET route (headers, no body).

``/api/v1/dump``: GET and HEAD serve the bundle of what the daemon holds;
only a POST asks the job's ranks for fresh evidence, and only past the
guard (dumpguard.py: own origin, header or page token, one dump per job, a
rate per client address), after basic auth as every POST.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import socket
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterator
from urllib.parse import parse_qs, urlsplit

from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ncclwatch import runbooks
from ncclwatch.daemon import api, bundle, dumpguard, page, pastepage, runbookpage
from ncclwatch.daemon.core import Daemon
from ncclwatch.daemon.export import DaemonCollector
from ncclwatch.daemon.pageheaders import NOSNIFF
from ncclwatch.daemon.webconfig import WebConfig

log = logging.getLogger(__name__)

Call = Callable[[Callable[[], Any]], Any]
#: Paths served without basic auth.
OPEN_PATHS = frozenset({"/healthz"})
#: Seconds a client gets for the TLS handshake and each request.
CLIENT_TIMEOUT = 10.0


#: Items of a list encoded per ``json.dumps`` call (see ``json_chunks``).
JSON_CHUNK = 256


def json_chunks(obj: Any) -> Iterator[str]:
    """Compact JSON in pieces: long lists a slice at a time.

    Compact, so that json uses its C encoder (16k ranks: ~10x faster than
    ``indent``); in pieces, because one C call holds the GIL, and with it
    the event loop, for the whole 10 MiB of 16k ranks' detail.
    """
    if isinstance(obj, dict) and obj:
        yield "{"
        for i, (k, v) in enumerate(obj.items()):
            yield ("," if i else "") + json.dumps(str(k)) + ":"
            yield from json_chunks(v)
        yield "}"
    elif isinstance(obj, list) and len(obj) > JSON_CHUNK:
        yield "["
        for i in range(0, len(obj), JSON_CHUNK):
            part = json.dumps(obj[i:i + JSON_CHUNK], separators=(",", ":"))
            yield ("," if i else "") + part[1:-1]
        yield "]"
    else:
        yield json.dumps(obj, separators=(",", ":"))


class _TLSServer(ThreadingHTTPServer):
    """Wraps each accepted connection in TLS inside its request thread."""

    def __init__(self, address: tuple[str, int], handler: type, ctx: ssl.SSLContext) -> None:
        super().__init__(address, handler)
        self.ssl_context = ctx

    def finish_request(self, request: socket.socket, client_address: Any) -> None:
        request.settimeout(CLIENT_TIMEOUT)
        try:
            conn = self.ssl_context.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError) as e:
            log.debug("https %s: handshake failed: %s", client_address[0], e)
            return
        try:
            super().finish_request(conn, client_address)
        finally:
            conn.close()


def host_of(header: str) -> str:
    """The host part of a Host header, lower case: ``[::1]:7471`` -> ``::1``."""
    h = header.strip().lower()
    if h.startswith("["):
        return h[1:].partition("]")[0]
    if h.count(":") == 1:
        h = h.partition(":")[0]
    return h.rstrip(".")


#: The Host names served by default (allowed_hosts unset): loopback's.
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


class HostAllowlist(frozenset):
    """Host names served; ``any_ip``: also any Host that is an IP address (no
    DNS name that a page could rebind: whoever sent it typed the address)."""

    any_ip = False

    def __contains__(self, host: object) -> bool:
        if frozenset.__contains__(self, host):
            return True
        if not self.any_ip or not isinstance(host, str):
            return False
        try:
            ipaddress.ip_address(host)
        except ValueError:
            return False
        return True


def allowed_hosts(names: str | Any, listen_host: str,
                  external_url: str = "") -> frozenset[str] | None:
    """The Host allowlist from a setting ("a,b", a list), with the host the
    server listens on added, and any IP address (no name a page could rebind).
    ``*``: every Host is served (None). Empty: the default, the host of
    ``external_url``, this machine's names and loopback's names."""
    items = names if isinstance(names, (list, tuple, set, frozenset)) else \
        str(names or "").split(",")
    given = [str(n).strip() for n in items if str(n).strip()]
    if given == ["*"]:
        return None
    hosts = {host_of(n) for n in given}
    if not hosts:
        hosts.update(LOOPBACK_NAMES)
        if external_url:
            hosts.add(host_of(urlsplit(external_url).netloc.rpartition("@")[2]))
        hosts.update(host_of(n) for n in (socket.gethostname(), socket.getfqdn()) if n)
    if listen_host not in ("", "0.0.0.0", "::"):
        hosts.add(host_of(listen_host if ":" not in listen_host else f"[{listen_host}]"))
    out = HostAllowlist(hosts)
    out.any_ip = True
    return out


class HttpServer:
    def __init__(self, daemon: Daemon, host: str, port: int, call: Call,
                 web: WebConfig | None = None, hosts: frozenset[str] | None = None) -> None:
        """``hosts``: the Host allowlist (allowed_hosts), None: any Host."""
        #: Who may make the daemon ask a job's ranks for fresh evidence; its
        #: token is this daemon start's, embedded in the page's dump form.
        self.dump_guard = guard = dumpguard.DumpGuard()
        collector = DaemonCollector(daemon, call, dumps=guard)
        auth = web.auth if web else None
        paste = pastepage.PastePage(daemon.config.diagnose_max_bytes)
        self.hosts_refused_total = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            server_version = "ncclwatch"
            timeout = CLIENT_TIMEOUT
            head = False

            def do_HEAD(self) -> None:  # noqa: N802 (stdlib name)
                self.head = True
                try:
                    self.do_GET()
                finally:
                    self.head = False

            def parse_request(self) -> bool:
                """The Host allowlist, for every method (GET, HEAD, POST, any other)."""
                if not super().parse_request():
                    return False
                shown = self.headers.get("Host")
                if hosts is None or shown is None or host_of(shown) in hosts:
                    return True
                server.hosts_refused_total += 1
                self.head = self.command == "HEAD"
                if self.command not in ("GET", "HEAD"):
                    pastepage.discard(self)  # never parsed: dropped, or the connection closed
                self._send(403, "text/plain", b"forbidden: this daemon does not serve "
                           b"that Host (allowed_hosts)\n")
                self.head = False
                return False

            def do_GET(self) -> None:  # noqa: N802 (stdlib name)
                url = urlsplit(self.path)
                path = url.path.rstrip("/") or "/"
                if auth and path not in OPEN_PATHS \
                        and not auth.check(self.headers.get("Authorization")):
                    self._send(401, "text/plain", b"Unauthorized\n",
                               {"WWW-Authenticate": 'Basic realm="ncclwatch", charset="UTF-8"'})
                    return
                try:
                    if path == "/metrics":
                        self._send(200, CONTENT_TYPE_LATEST, collector.exposition())
                    elif path == "/api/v1/jobs":
                        try:
                            q = api.JobsQuery.parse(url.query)
                        except ValueError as e:
                            self._send(400, "text/plain", f"bad request: {e}\n".encode())
                            return
                        self._json(api.finish_jobs(call(lambda: api.collect_jobs(daemon, q))))
                    elif path == "/api/v1/shard":
                        # Which shard owns a job (its page), by the shard map alone:
                        # the page follows an alert's #job-... link to the owner.
                        job = parse_qs(url.query).get("job", [""])[0]
                        shards = daemon.config.shards
                        if shards is None or not job:
                            self._send(404, "text/plain", b"no shard map, or no ?job=\n")
                        else:
                            self._json(shards.job_view(job))
                    elif path == "/api/v1/dump":  # a tar.gz of what is held: no ask
                        self._send(*bundle.serve(daemon, call, url.query))
                    elif path == "/api/v1/incidents":
                        self._json(call(lambda: api.incidents_view(daemon)))
                    elif path.startswith("/runbooks/"):  # alerts link here
                        self._runbook(path.removeprefix("/runbooks/"))
                    elif path == "/healthz":
                        # A round trip through the event loop: a wedged loop fails it.
                        self._send(200, "text/plain", call(lambda: b"ok\n"))
                    elif path == "/":
                        q = api.JobsQuery(limit=api.MAX_JOBS_LIMIT)
                        html = page.render(api.finish_jobs(call(lambda: api.collect_jobs(
                            daemon, q, detail_upto=page.RANK_ROWS))), guard.token)
                        self._send(200, "text/html; charset=utf-8", html.encode(),
                                   page.HEADERS)
                    elif path == pastepage.PAGE_PATH:
                        paste.handle_get(self)
                    else:
                        self._send(404, "text/plain", b"not found\n")
                except Exception as e:  # a broken view must not kill the server
                    log.exception("HTTP %s failed", path)
                    self._send(500, "text/plain", f"internal error: {e}\n".encode())

            def do_POST(self) -> None:  # noqa: N802 (stdlib name)
                path = urlsplit(self.path).path.rstrip("/") or "/"
                if auth and not auth.check(self.headers.get("Authorization")):
                    pastepage.discard(self)  # unread, a body would reset the connection
                    self._send(401, "text/plain", b"Unauthorized\n",
                               {"WWW-Authenticate": 'Basic realm="ncclwatch", charset="UTF-8"'})
                elif path == pastepage.API_PATH:
                    paste.handle_post(self)
                elif path == "/api/v1/dump":
                    self._dump(urlsplit(self.path).query)
                else:
                    pastepage.discard(self)
                    self._send(404, "text/plain", b"not found\n")

            def _dump(self, query: str) -> None:
                """POST /api/v1/dump: the fresh ask, past the guard."""
                form = self._form()
                if form is None:
                    return
                no = guard.check(self.headers, server.scheme,
                                 form.get(dumpguard.TOKEN_FIELD, [""])[-1])
                if no is None:
                    try:
                        job, _ = bundle.parse(query)
                    except ValueError as e:
                        self._send(400, "text/plain", f"bad request: {e}\n".encode())
                        return
                    no = guard.start(self.client_address[0], job)
                if no is not None:
                    self._send(no.status, "text/plain", (no.message + "\n").encode(),
                               dict(no.headers))
                    return
                try:
                    self._send(*bundle.serve(daemon, call, query, fresh_ask=True))
                except Exception as e:  # a broken bundle must not kill the server
                    log.exception("HTTP POST /api/v1/dump failed")
                    self._send(500, "text/plain", f"internal error: {e}\n".encode())
                finally:
                    guard.done(job)

            def _form(self) -> dict[str, list[str]] | None:
                """A small urlencoded body (the page's token), else {} for any
                other type; None: refused, answered here."""
                try:
                    length = int(self.headers.get("Content-Length") or 0)
                except ValueError:
                    length = -1
                if self.headers.get("Transfer-Encoding") or not \
                        0 <= length <= guard.limits.max_form_bytes:
                    pastepage.discard(self)
                    self._send(413, "text/plain", f"the form is larger than "
                               f"{guard.limits.max_form_bytes} bytes\n".encode())
                    return None
                body = self.rfile.read(length) if length else b""
                ctype = (self.headers.get("Content-Type") or "").partition(";")[0].strip()
                if ctype.lower() != "application/x-www-form-urlencoded":
                    return {}
                try:
                    return parse_qs(body.decode("latin-1"), max_num_fields=16)
                except ValueError:
                    self._send(400, "text/plain", b"bad request: too many form fields\n")
                    return None

            def _runbook(self, name: str) -> None:
                """``<kind>.md``: HTML for a browser, the Markdown for anyone else;
                ``<kind>`` (no suffix): HTML."""
                bare = not name.endswith(".md")
                text = runbooks.page(name + ".md" if bare else name)
                if text is None:
                    self._send(404, "text/plain", b"no such runbook\n")
                elif bare or runbookpage.wants_html(self.headers.get("Accept")):
                    self._send(200, "text/html; charset=utf-8",
                               runbookpage.to_html(text).encode(), runbookpage.HEADERS)
                else:
                    self._send(200, "text/plain; charset=utf-8", text.encode())

            def _json(self, obj: Any) -> None:
                self._send(200, "application/json", "".join(json_chunks(obj)).encode())

            def _send(self, code: int, ctype: str, body: bytes,
                      headers: dict[str, str] | None = None) -> None:
                self.send_response(code)
                for k, v in {**NOSNIFF, **(headers or {})}.items():
                    self.send_header(k, v)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                if not self.head:
                    self.wfile.write(body)

            def log_message(self, fmt: str, *args: Any) -> None:
                log.debug("http %s " + fmt, self.address_string(), *args)

        if web and web.ssl_context:
            self.httpd: ThreadingHTTPServer = _TLSServer((host, port), Handler, web.ssl_context)
        else:
            self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.scheme = web.scheme if web else "http"
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever,
                                        name="ncclwatch-http", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
