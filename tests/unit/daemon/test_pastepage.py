"""``POST /api/v1/diagnose`` and the paste page over real HTTP(S) on loopback.

The verdict over HTTP is the verdict of ``ncclwatch diagnose`` on the same
file; the body is streamed (chunked, gzip) into the scanner, not held whole
and not written anywhere; limits answer 413 with a message; bad input 400;
the web config's TLS and basic auth guard the page and the API.
"""

from __future__ import annotations

import base64
import gzip
import http.client
import json
import logging
import ssl
import tempfile
import tracemalloc
from pathlib import Path

import pytest

from ncclwatch.daemon import pastepage, webconfig
from ncclwatch.diagnose import diagnose
from tests.harness import paths
from tests.harness.credentials import HASH, PASSWORD, write_config
from tests.harness.daemons import serving

DATA = paths.DATA / "diagnose"
LIMIT = 1 << 20
#: A public log (pasted by a user into an issue) and a gloo job's console made here.
PUBLIC = DATA / "public" / "accelerate_2000_saving_fsdp_model" / "console.log"
MADE = DATA / "cases" / "crash_exception" / "console.log"


def _conn(port: int, ca: Path | None = None) -> http.client.HTTPConnection:
    if ca is None:
        return http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    return http.client.HTTPSConnection("127.0.0.1", port, timeout=60,
                                       context=ssl.create_default_context(cafile=str(ca)))


def post(port: int, body, headers: dict | None = None, ca: Path | None = None,
         path: str = pastepage.API_PATH) -> tuple[int, dict, dict]:
    """POST ``body`` (bytes, or an iterable of bytes: sent chunked)."""
    c = _conn(port, ca)
    try:
        h = dict(headers or {})
        if not isinstance(body, bytes):
            h["Transfer-Encoding"] = "chunked"
            c.request("POST", path, body=body, headers=h, encode_chunked=True)
        else:
            c.request("POST", path, body=body, headers=h)
        r = c.getresponse()
        raw = r.read()
        ctype = r.getheader("Content-Type", "")
        return r.status, dict(r.getheaders()), json.loads(raw) if "json" in ctype else \
            {"text": raw.decode()}
    finally:
        c.close()


@pytest.fixture(scope="module")
def port():
    with serving(diagnose_max_bytes=LIMIT) as p:
        yield p


@pytest.mark.parametrize("log", [PUBLIC, MADE], ids=["public", "made"])
def test_verdict_json_is_the_cli_verdict(port, log) -> None:
    code, headers, v = post(port, log.read_bytes(), {"Content-Type": "text/plain"})
    assert code == 200, v
    assert headers["Content-Type"] == "application/json"
    # The CLI names the file by its path, the API by the name the page gave it.
    cli = json.loads(json.dumps(diagnose([log]).to_json()).replace(str(log), "pasted log"))
    for key in ("class", "title", "summary", "initiating_ranks", "collateral_ranks",
                "initiator_among", "root_cause", "missing_evidence", "collect_next_time",
                "notes", "timeout_seconds"):
        assert v[key] == cli[key], key
    assert v["class"] not in ("none", "unknown")
    assert v["root_cause"]["fix"] and v["evidence"]
    # The same evidence lines, named after the pasted log rather than a path.
    assert [e["why"] for e in v["evidence"]] == [e["why"] for e in cli["evidence"]]
    assert all(e["where"].startswith("pasted log:") for e in v["evidence"])
    assert v["inputs"]["files"] == ["pasted log"] and v["inputs"]["bytes"] == log.stat().st_size
    assert v["report"].startswith(v["title"]) and v["root_cause"]["id"] in v["report"]


def test_dropped_file_name_and_gzip(port) -> None:
    text = MADE.read_bytes()
    want = diagnose([MADE]).to_json()
    # gzip by magic bytes, and by Content-Encoding; the name is the file's base name.
    for headers in ({"X-Log-Name": "../../etc/console.log.gz"},
                    {"X-Log-Name": "console.log", "Content-Encoding": "gzip"}):
        code, _, v = post(port, gzip.compress(text), headers)
        assert code == 200, v
        assert (v["class"], v["initiating_ranks"]) == (want["class"], want["initiating_ranks"])
        assert v["inputs"]["files"][0] in ("console.log.gz", "console.log")
        assert v["inputs"]["bytes"] == len(text)
    # Two gzip members (a rotated log concatenated) read as one log.
    half = len(text) // 2
    cut = text.rfind(b"\n", 0, half) + 1
    code, _, v = post(port, gzip.compress(text[:cut]) + gzip.compress(text[cut:]))
    assert code == 200 and v["inputs"]["bytes"] == len(text) and v["class"] == want["class"]


def test_a_big_log_is_streamed_not_held(port) -> None:
    """160 MiB of step lines, then the failure, sent chunked from a generator: the
    verdict finds the failure, and peak Python memory (daemon and client) stays
    at a few of the scanner's 8 MiB blocks, whatever the log's size."""
    tail = MADE.read_bytes()
    filler = b"".join(b"[rank%d]: step %07d loss 1.2345 lr 3e-4 tokens/s 81234.5\n" % (i % 4, i)
                      for i in range(20000))
    n = (160 << 20) // len(filler)

    def body():
        for _ in range(n):
            yield filler
        yield tail

    size = n * len(filler) + len(tail)
    with serving(diagnose_max_bytes=256 << 20) as big:
        tracemalloc.start()
        try:
            code, _, v = post(big, body())
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert code == 200, v
    assert v["inputs"]["bytes"] == size
    assert v["class"] == "rank_crash" and v["initiating_ranks"] == [1]
    print(f"\n{size / 2**20:.0f} MiB streamed in {v['inputs']['seconds']:.2f} s, "
          f"peak traced memory {peak / 2**20:.1f} MiB")
    assert peak < 48 << 20, f"peak {peak / 2**20:.0f} MiB for a {size / 2**20:.0f} MiB log"


def test_oversize_is_413_with_the_limit(port) -> None:
    msg = "larger than this daemon accepts (1 MiB, --diagnose-max-bytes)"
    # Content-Length over the limit: refused before reading (then drained).
    code, _, v = post(port, b"x" * (LIMIT + 1))
    assert code == 413 and msg in v["error"], v
    # Chunked, no length said: refused once the limit is passed.
    code, _, v = post(port, iter([b"y" * 65536] * 20))
    assert code == 413 and msg in v["error"], v
    # A gzip bomb: 3 KiB on the wire, 3 MiB of text. Refused on what it inflates to.
    bomb = gzip.compress(b"a" * (3 << 20))
    assert len(bomb) < LIMIT
    code, _, v = post(port, bomb)
    assert code == 413 and msg in v["error"], v
    # The daemon still answers (nothing stuck, the lock released).
    assert post(port, PUBLIC.read_bytes())[0] == 200


@pytest.mark.parametrize("body, headers, code, words", [
    (b"", {}, 400, "empty body"),
    (b"\x00\x01\x02 not text" * 50, {}, 400, "binary, not a log"),
    (b"\x80\x04\x95" + b"pickle" * 50, {}, 400, "Flight Recorder dump"),
    (b"\x1f\x8b\x08garbage that is no deflate stream", {}, 400, "not valid gzip"),
    (gzip.compress(b"text\n" * 1000, mtime=0)[:-20], {}, 400, "gzip stream ended"),
    (b"text", {"Content-Encoding": "br"}, 415, "plain or gzip"),
])
def test_bad_input_is_4xx_with_a_message(port, body, headers, code, words) -> None:
    got, _, v = post(port, body, headers)
    assert got == code and words in v["error"], v


def test_no_length_is_411_and_bad_length_400(port) -> None:
    for head, want in (("", 411), ("Content-Length: abc\r\n", 400)):
        c = _conn(port)
        c.connect()
        c.sock.sendall(f"POST {pastepage.API_PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\n{head}"
                       "Connection: close\r\n\r\n".encode())
        resp = c.sock.recv(65536).decode()
        c.close()
        assert resp.startswith(f"HTTP/1.0 {want}"), resp


def test_unknown_post_path_is_404(port) -> None:
    assert post(port, b"x", path="/api/v1/jobs")[0] == 404


def test_one_diagnosis_at_a_time() -> None:
    page = pastepage.PastePage(LIMIT)
    raw = pastepage.open_body({"Content-Length": "5"}, _Bytes(b"hello"))
    with page._busy:
        with pytest.raises(pastepage.RequestError) as e:
            page.diagnose({}, raw)
    assert e.value.status == 503
    assert page.diagnose({}, raw)["class"] == "none"


class _Bytes:
    def __init__(self, b: bytes) -> None:
        self.b = b

    def read(self, n: int) -> bytes:
        out, self.b = self.b[:n], self.b[n:]
        return out


def test_the_log_is_not_stored_or_logged(port, tmp_path, monkeypatch, caplog) -> None:
    """No temporary file is made and no line of the body reaches the daemon's log."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    secret = b"customer-secret-7f3a9 " * 3
    body = MADE.read_bytes().replace(b"Batch at step", secret + b"Batch at step")
    with caplog.at_level(logging.DEBUG):
        code, _, v = post(port, body)
    assert code == 200 and secret.decode()[:20] in json.dumps(v)  # the verdict quotes it
    assert list(tmp_path.iterdir()) == []
    assert b"customer-secret" not in caplog.text.encode()


def test_the_page_talks_only_to_this_daemon(port) -> None:
    c = _conn(port)
    c.request("GET", pastepage.PAGE_PATH)
    r = c.getresponse()
    html = r.read().decode()
    csp = r.getheader("Content-Security-Policy")
    c.close()
    assert r.status == 200 and "<textarea id='log'" in html and "type='file'" in html
    assert "1 MiB" in html  # the limit, told before the user tries
    assert "connect-src 'self'" in csp and "default-src 'none'" in csp
    assert "unsafe-inline" not in csp  # the one script, by its hash
    assert "http://" not in html and "https://" not in html  # loads nothing from elsewhere


def test_behind_tls_and_basic_auth(web_pki, tmp_path) -> None:
    cfg = write_config(web_pki / "web-paste.yml", f"""
tls_server_config:
  cert_file: daemon.pem
  key_file: daemon-key.pem
basic_auth_users:
  ops: {HASH}
""")
    web = webconfig.load(cfg)
    ca = web_pki / "ca.pem"
    good = {"Authorization": "Basic " + base64.b64encode(f"ops:{PASSWORD}".encode()).decode()}
    bad = {"Authorization": "Basic " + base64.b64encode(b"ops:wrong").decode()}
    with serving(web, diagnose_max_bytes=LIMIT) as port:
        for headers in ({}, bad):
            code, h, _ = post(port, PUBLIC.read_bytes(), headers, ca=ca)
            assert code == 401 and h["WWW-Authenticate"].startswith("Basic "), code
            c = _conn(port, ca)
            c.request("GET", pastepage.PAGE_PATH, headers=headers)
            assert c.getresponse().status == 401
            c.close()
        code, _, v = post(port, PUBLIC.read_bytes(), good, ca=ca)
        assert code == 200 and v["class"] == "checkpoint_gather_timeout", v
        c = _conn(port, ca)
        c.request("GET", pastepage.PAGE_PATH, headers=good)
        assert c.getresponse().status == 200
        c.close()
        # Plain HTTP to the HTTPS port gets no verdict.
        with pytest.raises((ConnectionError, OSError, http.client.HTTPException)):
            post(port, PUBLIC.read_bytes(), good)
