"""The paste-your-log page (``GET /diagnose``) and ``POST /api/v1/diagnose``.

A user who has only a log pastes it, or drops the file, and reads the same
verdict ``ncclwatch diagnose`` prints: class, initiating and collateral ranks,
evidence lines, what to collect next time, the fix.

The log never leaves the machine and is not stored: the request body goes from
the socket, in chunks, straight into the streaming scanner (logscan.py), which
keeps only the evidence lines; no temporary file is written and the body is
never logged. The page loads nothing from elsewhere and its Content-Security-
Policy lets its script talk only to this daemon. A body over ``max_bytes``
(plain, or once ungzipped) is refused with 413 and a message naming the limit;
one diagnosis runs at a time (a second gets 503). The route sits behind the
same web config (TLS, basic auth) as the rest of the HTTP side.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import zlib
from html import escape
from typing import Any, BinaryIO

from ncclwatch.daemon.pageheaders import page_headers
from ncclwatch.daemon.settings import DaemonConfig
from ncclwatch.logstream import GZIP_MAGIC, open_stream

log = logging.getLogger(__name__)

PAGE_PATH = "/diagnose"
API_PATH = "/api/v1/diagnose"
#: Default of ``--diagnose-max-bytes``: the largest log (after gunzip) accepted.
DEFAULT_MAX_BYTES = DaemonConfig.diagnose_max_bytes
#: A refused body up to this many times the limit is read and dropped before the
#: 413, so the client (a browser mid-upload) reads the answer rather than a reset.
DRAIN_FACTOR = 4
#: Bytes read from the socket per read.
READ_CHUNK = 1 << 20
#: The name a pasted log is shown under; a dropped file keeps its own (X-Log-Name).
PASTE_NAME = "pasted log"
_NAME_OK = re.compile(r"[^\w.,+=@ -]")
#: Longest chunk-size line of a chunked body.
_CHUNK_LINE_MAX = 1024


class RequestError(Exception):
    """A request answered with ``status`` and ``message`` (JSON ``{"error": ...}``)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


class TooLarge(RequestError):
    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the log is larger than this daemon accepts "
                              f"({human(limit)}, --diagnose-max-bytes); run `ncclwatch "
                              f"diagnose FILE` on the machine that has it, or raise the limit")


def human(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n} bytes"


# -- the body, as a stream -------------------------------------------------------------

class _LengthBody:
    """Exactly Content-Length bytes of the socket."""

    def __init__(self, rfile: BinaryIO, length: int) -> None:
        self.rfile, self.left, self.length = rfile, length, length

    def read(self, n: int = READ_CHUNK) -> bytes:
        if self.left <= 0:
            return b""
        b = self.rfile.read(min(n, self.left, READ_CHUNK))
        if not b:
            raise RequestError(400, "the request body ended before its Content-Length")
        self.left -= len(b)
        return b


class _ChunkedBody:
    """A ``Transfer-Encoding: chunked`` body (curl -T -, streaming clients)."""

    length = None  # not known ahead

    def __init__(self, rfile: BinaryIO) -> None:
        self.rfile, self.left, self.done = rfile, 0, False

    def read(self, n: int = READ_CHUNK) -> bytes:
        if self.done:
            return b""
        if self.left == 0:
            line = self.rfile.readline(_CHUNK_LINE_MAX)
            try:
                self.left = int(line.split(b";")[0].strip(), 16)
            except ValueError:
                raise RequestError(400, "bad chunked encoding") from None
            if self.left == 0:
                while self.rfile.readline(_CHUNK_LINE_MAX) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                self.done = True
                return b""
        b = self.rfile.read(min(n, self.left, READ_CHUNK))
        if not b:
            raise RequestError(400, "the request body ended inside a chunk")
        self.left -= len(b)
        if self.left == 0:
            self.rfile.readline(_CHUNK_LINE_MAX)  # the CRLF after the chunk
        return b


class _Counted:
    """Raises TooLarge once more than ``limit`` bytes came through."""

    def __init__(self, inner: Any, limit: int) -> None:
        self.inner, self.limit, self.n = inner, limit, 0

    def read(self, n: int = READ_CHUNK) -> bytes:
        b = self.inner.read(n)
        self.n += len(b)
        if self.n > self.limit:
            raise TooLarge(self.limit)
        return b


class _GzipRefused:
    """The gunzipped body, its faults answered 400 (a truncated or broken gzip
    stream is the client's, not a log the scanner read part of)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def read(self, n: int = READ_CHUNK) -> bytes:
        try:
            return self.inner.read(n)
        except EOFError:
            raise RequestError(400, "the gzip stream ended before its end marker") from None
        except zlib.error as e:
            raise RequestError(400, f"not valid gzip: {e}") from None


def drain(raw: Any, upto: int) -> bool:
    """Read and drop what is left of a refused body, up to ``upto`` bytes; False
    where more is coming or it cannot be read (the connection must then close)."""
    if raw is None or (raw.length is not None and raw.left > upto):
        return False
    n = 0
    try:
        while True:
            b = raw.read(READ_CHUNK)
            if not b:
                return True
            n += len(b)
            if n > upto:
                return False
    except (RequestError, OSError):
        return False


def discard(handler: Any, upto: int = 1 << 20) -> None:
    """Before refusing a POST (401, 404): drop a small body, or close after the answer."""
    try:
        raw = open_body(handler.headers, handler.rfile)
    except RequestError:
        raw = None
    if not drain(raw, upto):
        handler.close_connection = True


def open_body(headers: Any, rfile: BinaryIO) -> _LengthBody | _ChunkedBody:
    """The raw request body, framed by Content-Length or chunked; nothing read yet."""
    if (headers.get("Content-Encoding") or "identity").lower() not in GZIP + ("identity",):
        raise RequestError(415, f"Content-Encoding {headers['Content-Encoding']!r}: send "
                                "the log plain or gzip")
    if "chunked" in (headers.get("Transfer-Encoding") or "").lower():
        return _ChunkedBody(rfile)
    if headers.get("Content-Length") is None:
        raise RequestError(411, "send the log with a Content-Length or chunked")
    try:
        length = int(headers["Content-Length"])
    except ValueError:
        raise RequestError(400, "bad Content-Length") from None
    if length < 0:
        raise RequestError(400, "bad Content-Length")
    return _LengthBody(rfile, length)


GZIP = ("gzip", "x-gzip")


def text_stream(raw: Any, gzip_header: bool, max_bytes: int) -> Any:
    """The body as a stream of log text (ungzipped: by the header or the magic
    bytes), refusing more than ``max_bytes`` of it, compressed or not."""
    if raw.length is not None and raw.length > max_bytes:
        raise TooLarge(max_bytes)
    opened = open_stream(_Counted(raw, max_bytes), gzip_header, ahead=len(GZIP_MAGIC))
    if not opened.head:
        raise RequestError(400, "empty body: paste a log or drop a log file")
    if opened.gzip:
        return _Counted(_GzipRefused(opened.text), max_bytes)
    return opened.text


def log_name(header: str | None) -> str:
    """The dropped file's name (its rank, as in ``rank3.log``, counts), made safe."""
    if not header:
        return PASTE_NAME
    name = os.path.basename(header.replace("\\", "/"))[:200]
    name = _NAME_OK.sub("_", name).strip()
    return name or PASTE_NAME


# -- the endpoint ----------------------------------------------------------------------

class PastePage:
    """The page and the endpoint, with their limit; one diagnosis at a time."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._busy = threading.Lock()
        self.html = _page(max_bytes).encode()

    def diagnose(self, headers: Any, raw: Any) -> dict[str, Any]:
        """The verdict on one request's body, read here to its end."""
        from ncclwatch.diagnose import LogInputError, diagnose, render

        if not self._busy.acquire(blocking=False):
            raise RequestError(503, "another log is being diagnosed; try again in a moment")
        try:
            gz = (headers.get("Content-Encoding") or "").lower() in GZIP
            stream = text_stream(raw, gz, self.max_bytes)
            try:
                d = diagnose([], streams=[(log_name(headers.get("X-Log-Name")), stream)])
            except LogInputError as e:
                raise RequestError(400, str(e)) from None
            while stream.read(READ_CHUNK):  # the scanner read to the end: nothing left
                pass
            out = d.to_json()
            out["report"] = render.text(d)
            return out
        finally:
            self._busy.release()

    def handle_post(self, handler: Any) -> None:
        """Answer ``POST /api/v1/diagnose`` on a BaseHTTPRequestHandler."""
        raw = None
        try:
            raw = open_body(handler.headers, handler.rfile)
            code, out = 200, self.diagnose(handler.headers, raw)
        except RequestError as e:
            code, out = e.status, {"error": e.message}
            if not drain(raw, DRAIN_FACTOR * self.max_bytes):
                handler.close_connection = True
        except OSError as e:  # the client went away or stalled mid-upload
            log.debug("diagnose: reading the body failed: %s", e)
            handler.close_connection = True
            return
        except Exception as e:  # a broken verdict must not kill the server
            log.exception("diagnose failed")
            code, out = 500, {"error": f"internal error: {e}"}
            handler.close_connection = True
        body = json.dumps(out, separators=(",", ":")).encode()
        handler._send(code, "application/json", body,
                      {"Connection": "close"} if handler.close_connection else None)

    def handle_get(self, handler: Any) -> None:
        handler._send(200, "text/html; charset=utf-8", self.html, PAGE_HEADERS)


# -- the page --------------------------------------------------------------------------

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;max-width:70em}
h1{font-size:1.3em}h2{font-size:1.05em;margin:1.2em 0 .3em}
textarea{width:100%;height:14em;font:12px monospace}
#drop{border:2px dashed #999;padding:1em;margin:.5em 0;text-align:center;color:#555}
#drop.over{border-color:#06c;background:#eef5ff}
#error{color:#c00;font-weight:bold}.cls{font-size:1.2em;font-weight:bold}
pre{background:#f6f6f6;padding:.5em;overflow:auto;white-space:pre-wrap}
ul{margin:.2em 0}small{color:#666}
"""

_JS = """
const api = document.body.dataset.api, maxBytes = +document.body.dataset.max;
const $ = (id) => document.getElementById(id);
function item(list, text) { const li = document.createElement('li'); li.textContent = text;
  $(list).appendChild(li); }
function show(v) {
  for (const id of ['evidence', 'missing', 'collect', 'notes']) $(id).replaceChildren();
  $('verdict').hidden = false;
  $('cls').textContent = v.title + ' (' + v.class + ')';
  $('cls').dataset.cls = v.class;
  $('summary').textContent = v.summary;
  const r = (a) => (a && a.length) ? a.join(', ') : '-';
  $('initiating').textContent = r(v.initiating_ranks);
  $('among').textContent = r(v.initiator_among);
  $('collateral').textContent = r(v.collateral_ranks);
  for (const e of v.evidence) item('evidence', e.where + '  ' + e.why);
  for (const m of v.missing_evidence) item('missing', m);
  for (const c of v.collect_next_time) item('collect', c);
  for (const n of v.notes) item('notes', n);
  for (const id of ['evidence', 'missing', 'collect', 'notes'])
    $(id).parentElement.hidden = !$(id).children.length;
  const rc = v.root_cause;
  $('fix').textContent = rc ? rc.title + ': ' + rc.fix + (rc.example ? '\\n\\n' + rc.example : '')
                            : '-';
  $('report').textContent = v.report;
}
async function send(body, name) {
  $('error').textContent = ''; $('verdict').hidden = true; $('state').textContent = '';
  if (body.size > 4 * maxBytes) {
    $('error').textContent = 'refused: the log is larger than this daemon accepts (' +
      maxBytes + ' bytes); run `ncclwatch diagnose FILE` where the file is';
    return;
  }
  const shown = name || 'pasted log';
  $('state').textContent = 'diagnosing ' + shown + ' (' + body.size + ' bytes) ...';
  const headers = {'Content-Type': 'application/octet-stream'};
  if (name) headers['X-Log-Name'] = name;
  let resp, v;
  try {
    resp = await fetch(api, {method: 'POST', body, headers, credentials: 'same-origin'});
    v = await resp.json();
  } catch (err) {
    $('state').textContent = '';
    $('error').textContent = 'the request failed: ' + err;
    return;
  }
  $('state').textContent = '';
  if (!resp.ok) { $('error').textContent = 'refused (' + resp.status + '): ' + v.error; return; }
  $('state').textContent = 'read ' + shown + ': ' + v.inputs.lines + ' lines in ' +
    v.inputs.seconds + ' s';
  show(v);
}
$('go').addEventListener('click', () =>
  send(new Blob([$('log').value], {type: 'text/plain'}), ''));
$('file').addEventListener('change', (ev) => {
  const f = ev.target.files[0]; if (f) send(f, f.name); });
document.addEventListener('dragover', (ev) => { ev.preventDefault(); $('drop').classList.add('over'); });
document.addEventListener('dragleave', () => $('drop').classList.remove('over'));
document.addEventListener('drop', (ev) => {
  ev.preventDefault(); $('drop').classList.remove('over');
  const f = ev.dataTransfer.files[0]; if (f) send(f, f.name); });
"""


#: The page may run its own script and style, and talk to this daemon only.
PAGE_HEADERS = page_headers(scripts=[_JS], styles=[_CSS])


def _page(max_bytes: int) -> str:
    from ncclwatch import __version__

    return f"""<!doctype html><html><head><meta charset='utf-8'>
<title>ncclwatch diagnose</title><style>{_CSS}</style></head>
<body data-api='{API_PATH}' data-max='{max_bytes}'>
<h1>ncclwatch diagnose <small>{escape(__version__)}</small></h1>
<p>What killed a distributed job, from its log: paste it, or drop the file (plain or
.gz, up to {escape(human(max_bytes))}). The text goes to this daemon only, is read once
as it arrives and is not stored. <a href='/'>back to the jobs</a></p>
<textarea id='log' placeholder='paste a log here' spellcheck='false'></textarea>
<p><button id='go'>Diagnose the pasted log</button></p>
<div id='drop'>drop a log file anywhere on this page, or
<input type='file' id='file'></div>
<p id='state'></p><p id='error' role='alert'></p>
<section id='verdict' hidden>
<p class='cls' id='cls'></p><p id='summary'></p>
<table>
<tr><th>initiating rank(s)</th><td id='initiating'></td></tr>
<tr><th>initiator among</th><td id='among'></td></tr>
<tr><th>collateral rank(s)</th><td id='collateral'></td></tr>
</table>
<div><h2>Evidence</h2><ul id='evidence'></ul></div>
<div><h2>Notes</h2><ul id='notes'></ul></div>
<div><h2>Missing evidence</h2><ul id='missing'></ul></div>
<div><h2>Collect next time</h2><ul id='collect'></ul></div>
<h2>Fix</h2><pre id='fix'></pre>
<h2>Full report</h2><pre id='report'></pre>
</section>
<script>{_JS}</script>
</body></html>
"""
