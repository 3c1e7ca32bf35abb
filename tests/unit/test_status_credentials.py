"""``ncclwatch status`` sends basic-auth credentials only to the origins the user typed.

Real HTTP servers on 127.0.0.1, each port its own origin: a daemon whose shard
map names another origin (as the sharded manifests do, over http), and a
daemon that redirects to another origin. Neither other origin ever sees the
Authorization header; the typed one does.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

import pytest

from ncclwatch import status

AUTH = "Basic b3BzOnMzY3JldA=="  # ops:s3cret


class Fake:
    """An HTTP server that records each request's Authorization header and
    answers with ``respond(handler)``."""

    def __init__(self, respond: Callable[[BaseHTTPRequestHandler], None]) -> None:
        self.seen: list[tuple[str, str | None]] = []
        fake = self

        class H(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                fake.seen.append((self.path, self.headers.get("Authorization")))
                respond(self)

            def log_message(self, *a: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _json(h: BaseHTTPRequestHandler, obj: Any) -> None:
    body = json.dumps(obj).encode()
    h.send_response(200)
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    h.wfile.write(body)


def _view(jobs: list[str], shards: dict | None = None) -> dict:
    return {"jobs": [{"job": j, "stalls": [], "ranks": []} for j in jobs], "agents": [],
            "next_cursor": None, **({"shards": shards} if shards else {})}


@pytest.fixture
def fakes():
    made: list[Fake] = []
    yield lambda respond: made.append(Fake(respond)) or made[-1]
    for f in made:
        f.close()


def test_a_shard_listed_on_another_origin_gets_no_credentials(fakes) -> None:
    other = fakes(lambda h: _json(h, _view(["job-b"])))
    typed = fakes(lambda h: _json(h, _view(["job-a"], {
        "count": 2, "self": 0, "urls": [[typed.url], [other.url]]})))
    user_url = typed.url.replace("http://", "http://ops:s3cret@")
    view, errors = status.fetch_shards(user_url)
    assert not errors and sorted(j["job"] for j in view["jobs"]) == ["job-a", "job-b"]
    assert typed.seen and all(a == AUTH for _, a in typed.seen)
    assert other.seen and all(a is None for _, a in other.seen), other.seen


def test_env_credentials_never_go_to_a_listed_origin(fakes) -> None:
    other = fakes(lambda h: _json(h, _view(["job-b"])))
    typed = fakes(lambda h: _json(h, _view(["job-a"], {
        "count": 2, "self": 0, "urls": [[typed.url], [other.url]]})))
    view, errors = status.fetch_shards(typed.url, auth="ops:s3cret")
    assert not errors and len(view["jobs"]) == 2
    assert all(a == AUTH for _, a in typed.seen)
    assert all(a is None for _, a in other.seen)


def test_credentials_go_to_every_origin_the_user_typed(fakes) -> None:
    a = fakes(lambda h: _json(h, _view(["job-a"])))
    b = fakes(lambda h: _json(h, _view(["job-b"])))
    view, errors = status.fetch_shards(f"{a.url};{b.url}", auth="ops:s3cret")
    assert not errors and len(view["jobs"]) == 2
    assert [x for _, x in a.seen + b.seen] == [AUTH, AUTH]


def test_https_typed_does_not_send_credentials_to_http_of_the_same_host() -> None:
    creds = status.Credentials(["https://ops:pw@collector:7471"])
    assert creds.for_url("https://collector:7471") == "ops:pw"
    assert creds.for_url("http://collector:7471") is None
    assert creds.for_url("https://collector:7472") is None
    assert creds.for_url("https://other:7471") is None
    assert status.Credentials(["https://c"], "u:p").for_url("https://c:443/x") == "u:p"


def test_a_cross_origin_redirect_is_not_followed_with_credentials(fakes) -> None:
    other = fakes(lambda h: _json(h, _view(["job-elsewhere"])))

    def redirect(h: BaseHTTPRequestHandler) -> None:
        h.send_response(302)
        h.send_header("Location", other.url + h.path)
        h.send_header("Content-Length", "0")
        h.end_headers()

    typed = fakes(redirect)
    view = status.fetch(typed.url, auth="ops:s3cret")
    assert [j["job"] for j in view["jobs"]] == ["job-elsewhere"]
    assert typed.seen[0][1] == AUTH
    assert other.seen and all(a is None for _, a in other.seen), other.seen


def test_a_same_origin_redirect_keeps_the_credentials(fakes) -> None:
    def redirect(h: BaseHTTPRequestHandler) -> None:
        if h.path.startswith("/moved"):
            _json(h, _view(["job-here"]))
            return
        h.send_response(302)
        h.send_header("Location", "/moved" + h.path)
        h.send_header("Content-Length", "0")
        h.end_headers()

    typed = fakes(redirect)
    view = status.fetch(typed.url, auth="ops:s3cret")
    assert [j["job"] for j in view["jobs"]] == ["job-here"]
    assert [a for _, a in typed.seen] == [AUTH, AUTH]
