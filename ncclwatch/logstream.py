"""One reader of a log that arrives as a stream: plain or gzip, its head read ahead.

``ncclwatch diagnose`` (files, stdin) and the daemon's paste page (an upload)
both get bytes whose first few must be seen before the rest is read: gzip's
magic number decides whether to gunzip, and a scanner sniffs the start for a
Flight Recorder dump or binary. The bytes read ahead are put back in front
(``Prefixed``) and gzip is undone as it streams (``Gunzip``), never holding a
log whole: each read's output is bounded, so a gzip bomb costs no memory.
Here, not in diagnose/, because the daemon's page reads uploads with it and
must not load the diagnose package to start.

``Normaliser`` undoes, chunk by chunk, what a log meets between the job and a
user's paste: carriage-return redraws (tqdm, rich), ANSI and OSC escape
sequences, Windows line endings, HTML entities, Markdown quoting and fences,
and a terminal's hard wraps. A line joined from wrapped pieces is one line;
the normaliser says where it joined (``joins``), so a reader maps its lines
back and every finding points at the user's own line numbers. Each step
costs one memchr-like search of the chunk where its bytes are absent, so a
clean log pays next to nothing.
"""

from __future__ import annotations

import html
import re
import unicodedata
import zlib
from typing import BinaryIO, Callable, NamedTuple

#: gzip's magic number: a stream that starts with it is gunzipped.
GZIP_MAGIC = b"\x1f\x8b"
#: Bytes of a log's start read ahead to judge what it is.
SNIFF = 8192


class Prefixed:
    """A stream with bytes already read put back in front of it."""

    def __init__(self, head: bytes, rest: BinaryIO) -> None:
        self.head, self.rest = head, rest

    def read(self, n: int) -> bytes:
        if self.head:
            out, self.head = self.head[:n], self.head[n:]
            return out
        return self.rest.read(n)

    def close(self) -> None:
        pass


class Gunzip:
    """gzip as a stream that keeps everything up to a truncation (gzip.open loses
    the last read's data when the stream ends early), members concatenated. A
    truncated stream raises EOFError after its last data, bad data zlib.error."""

    def __init__(self, raw: BinaryIO) -> None:
        self.raw = raw
        self.z = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self.buf = b""
        self.truncated = False

    def read(self, n: int) -> bytes:
        # Output is bounded by n (max_length): a gzip bomb costs no memory.
        while len(self.buf) < n:
            if self.z.eof and self.z.unused_data:  # the next member of the file
                data = self.z.unused_data
                self.z = zlib.decompressobj(16 + zlib.MAX_WBITS)
            else:
                data = self.z.unconsumed_tail or self.raw.read(1 << 18)
            if not data:
                if not self.z.eof and not self.truncated:
                    self.buf += self.z.flush()
                    self.truncated = True
                break
            self.buf += self.z.decompress(data, n - len(self.buf))
        out, self.buf = self.buf[:n], self.buf[n:]
        if not out and self.truncated:
            self.truncated = False
            raise EOFError("compressed file ended before the end-of-stream marker")
        return out

    def __enter__(self) -> "Gunzip":
        return self

    def __exit__(self, *exc: object) -> None:
        self.raw.close()

    def close(self) -> None:
        self.raw.close()


def read_head(f: BinaryIO, n: int = SNIFF) -> bytes:
    """Up to ``n`` bytes of ``f`` (fewer only at its end): a stream may answer a
    read with less."""
    got = b""
    while len(got) < n:
        b = f.read(n - len(got))
        if not b:
            break
        got += b
    return got


class Opened(NamedTuple):
    #: The log's text: the stream with its head put back, gunzipped where gzip.
    text: BinaryIO
    #: The bytes read ahead, as they came (compressed where gzip).
    head: bytes
    gzip: bool


def open_stream(stream: BinaryIO, gzip: bool = False, ahead: int = SNIFF) -> Opened:
    """``stream`` as log text: ``ahead`` bytes read to see whether it is gzip (its
    magic number; ``gzip``: the sender said so, a Content-Encoding), then read on."""
    head = read_head(stream, ahead)
    text: BinaryIO = Prefixed(head, stream)  # type: ignore[assignment]
    gz = gzip or head[:2] == GZIP_MAGIC
    if gz:
        text = Gunzip(text)  # type: ignore[assignment]
    return Opened(text, head, gz)



# -- the normalising reader -------------------------------------------------------------

#: Escape sequences a terminal acts on and a paste keeps: CSI (colours, erasing, cursor
#: moves), OSC up to BEL or ST (window titles, OSC 8 hyperlinks; one left open ends at
#: the line's end), DCS/SOS/PM/APC strings, and the two-byte ones (charsets, keypad).
ESCAPES = re.compile(rb"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b\n]*(?:\x07|\x1b\\)?"
                     rb"|[PX^_][^\x1b\n]*(?:\x1b\\)?|[ -/]*[0-~])")
#: A line holding a carriage return that is not its end (a redraw).
_CR_LINE = re.compile(rb"[^\n]*\r[^\n]*")
#: A whole progress bar (tqdm's ``45%|███``, rich's ``━━━``): a part of a redrawn line
#: holding one is superseded by the next. (A bar's tail alone, ``4.99it/s]``, is kept:
#: a line cut by a wrap may hold one, and the pieces must keep their width.)
_REDRAW = re.compile(r"\d%\||━{3}")
#: A launcher's label at a line's start (srun --label, torchrun, mpirun --tag-output): it
#: is written once per line, so a redraw after it still belongs to it.
_LABEL = re.compile(r"\s*(?:\d{1,9}: |\[(?:rank|default)\d{1,9}\]:|\[\d+,\d+\]<std\w+>: ?)")
#: An HTML entity (named, decimal or hex).
_ENTITY = re.compile(rb"&(?:#[0-9]{1,7}|#[xX][0-9a-fA-F]{1,6}|[A-Za-z][A-Za-z0-9]{1,31});")
#: Markdown: a quote (``> ``, nested, up to 3 spaces of indent) and a fence line.
_QUOTE = re.compile(rb"^[ \t]{0,3}(?:>[ \t]?)+")
_FENCE = re.compile(rb"^[ \t]{0,3}(?:`{3,}|~{3,})[\w+.-]*[ \t]*$")
#: How a log record starts (a launcher tag, a time stamp, a level letter with its date,
#: a logger's level, a traceback, an exception line, NCCL's host:pid:tid): a line that
#: starts so is never the rest of a line the terminal wrapped.
RECORD_START = re.compile(
    r"\s*(?:\[(?:rank|default)\d+\]:|\[\d+,\d+\]<std|\d{1,9}: |\[?\d{4}-\d\d-\d\d[ T_]\d\d:"
    r"|\d\d/\d\d/\d{4} |[IWEF]\d{4} \d\d:|\[[IWEF]\d{4} |\[?(?:INFO|WARNING|WARN|ERROR|DEBUG"
    r"|CRITICAL|FATAL)\b|\[[IWEF] [\w.]+:\d+\]|Traceback \(|File \"|[\w.]*(?:Error|Exception"
    r"|Interrupt)\b:|[\w.-]*[A-Za-z][\w.-]*:\d+:\d+ \[\d+\]|\(\w+ pid=\d+|(?:srun|slurmstepd): "
    r"|[A-Za-z][\w.-]*\d: )")
#: Widths a terminal wraps at are within these (the scanner's triggers are at most 40
#: characters: a terminal narrower than that is not read); a wrapped paste has no line
#: wider than its width.
WRAP_WIDTHS = (40, 400)
#: At most this many pieces of one wrapped line are joined.
WRAP_PIECES = 16
#: Bytes of a big chunk looked at to tell whether it is wrapped (a paste is read whole).
WRAP_SAMPLE = 1 << 16


def cells(text: str) -> int:
    """Display cells a terminal gives the text (East Asian wide characters two)."""
    if text.isascii():
        return len(text)
    return sum(0 if unicodedata.combining(c) else
               2 if unicodedata.east_asian_width(c) in ("W", "F") else 1 for c in text)


def shown_width(line: str) -> int:
    """The columns a line took on the terminal: from its last carriage return on (a
    carriage return goes back to column 0; the text it overwrote took no new ones)."""
    return cells(line.rpartition("\r")[2])


def resolve_redraws(line: str) -> str:
    """A line a program redrew with carriage returns, as it was left: its last text.
    An earlier part that is no redraw (a line another process printed before the bar
    came back) is kept in front of it, a carriage return between them, and a launcher's
    label on the line's first part stays at its start."""
    parts = [p for p in line.split("\r") if p.strip()]
    if not parts:
        return ""
    last = parts[-1]
    # (A counter redrawn as "step 12 ..." then "step 13 ...": the same head.)
    keep = [p for p in parts[:-1] if not _REDRAW.search(p) and p.lstrip()[:6] != last.lstrip()[:6]]
    out = "\r".join(keep + [last])
    label = _LABEL.match(parts[0])
    if label and not _LABEL.match(out):
        out = label.group(0) + out
    return out


def _unentity(m: re.Match[bytes]) -> bytes:
    raw = m.group(0).decode("ascii")
    text = html.unescape(raw)
    if text == raw:
        return m.group(0)
    # A character entity for a line end or a control character must not add a line.
    return "".join(" " if c < " " or c == "\xa0" else c for c in text).encode()


class Normaliser:
    """What pastes do to a log, undone before any rule reads it (see the module
    docstring). One per file: it learns the width a terminal wrapped the file at.
    ``continues`` and ``ends_line`` (optional): the scanner's own, stricter tests of a
    line that can be the rest of the one before (a line starting with any bracket or
    an indent is taken for a record) and of a line that is complete; they tell a
    wrapped file from a log whose lines are one width, and a redrawn line that is a
    piece of a wrap (left whole, for the scanner to join) from one that is not.
    ``spaced`` (optional): whether a blank belongs between two pieces it joins, where
    the terminal cut at one and a Markdown paste dropped it from the next piece's
    start (the scanner's: one of its triggers spans the cut only with a blank)."""

    def __init__(self, continues: Callable[[str], bool] | None = None,
                 ends_line: Callable[[str], bool] | None = None,
                 spaced: Callable[[str, str], bool] | None = None) -> None:
        self.continues, self.ends_line, self.spaced = continues, ends_line, spaced
        #: The wrap width found (None: none seen).
        self.width: int | None = None
        #: The last chunk's joins: (index of the joined line in the chunk returned, how
        #: many lines of the input it took beyond its first).
        self.joins: list[tuple[int, int]] = []

    def __call__(self, chunk: bytes) -> bytes:
        self.joins = []
        if b"\x1b" in chunk:
            chunk = ESCAPES.sub(b"", chunk)
        if b"\r" in chunk:
            chunk = chunk.replace(b"\r\n", b"\n")
        if b"&" in chunk:
            chunk = _ENTITY.sub(_unentity, chunk)
        if b">" in chunk[:4] or b"\n>" in chunk or b"\n >" in chunk or b"`" in chunk \
                or b"~~~" in chunk:
            chunk = self._markdown(chunk)
        chunk = self._unwrap(chunk)  # (pieces measured as the terminal showed them)
        if b"\r" in chunk:
            chunk = _CR_LINE.sub(lambda m: self._redrawn(chunk, m), chunk)
        return chunk

    def _redrawn(self, chunk: bytes, m: re.Match[bytes]) -> bytes:
        line = m.group(0).decode("utf-8", "replace")
        if len(line) >= WRAP_WIDTHS[0]:
            # What may be a piece of a line wrapped at a width not found (the next line
            # starts no record) keeps its width: the scanner's own joining measures it.
            ne = chunk.find(b"\n", m.end() + 1)
            nxt = chunk[m.end() + 1:len(chunk) if ne < 0 else ne].decode("utf-8", "replace")
            if nxt.strip() and (nxt[:1].isspace() or not RECORD_START.match(nxt)):
                return m.group(0)
        return resolve_redraws(line).encode()

    @staticmethod
    def _markdown(chunk: bytes) -> bytes:
        lines = chunk.split(b"\n")
        out = []
        for ln in lines:
            if ln[:8].lstrip()[:1] == b">":
                ln = _QUOTE.sub(b"", ln, count=1)
            if b"`" in ln or b"~~~" in ln:
                if _FENCE.match(ln):
                    ln = b""
                else:
                    body = ln.lstrip(b" \t")
                    if body[:1] == b"`":  # a line quoted as inline code
                        ln = body.lstrip(b"`")
                        end = ln.rstrip()
                        if end.endswith(b"`"):
                            ln = end.rstrip(b"`")
            out.append(ln)
        return b"\n".join(out)

    # -- hard wraps --------------------------------------------------------------------

    def _find_width(self, lines: list[str]) -> int | None:
        """The width the terminal wrapped at: the widest lines' width, where at least two
        of them, and most, run on into a line that starts no record."""
        widths = [shown_width(ln) for ln in lines]
        inside = [w for w in widths if w <= WRAP_WIDTHS[1]]
        if not inside:
            return None
        top = max(inside)
        if top < WRAP_WIDTHS[0]:
            return None
        full = [i for i, w in enumerate(widths) if w == top and i + 1 < len(lines)
                and lines[i + 1].strip()]
        cut = sum(1 for i in full if self._continuation(lines[i + 1]))
        # (Most of the widest lines running into records: a log's own width.)
        return top if cut >= 2 and 2 * cut >= len(full) else None

    def _continuation(self, nxt: str) -> bool:
        # (A terminal cuts at a column, a blank or not; a next line that starts with two
        # blanks is a log's own indented line, "  warnings.warn(...)" under a warning.)
        if nxt[:2].isspace() or RECORD_START.match(nxt):
            return False
        return self.continues is None or self.continues(nxt)

    def _unwrap(self, chunk: bytes) -> bytes:
        sample = chunk if len(chunk) <= WRAP_SAMPLE * 4 else chunk[:WRAP_SAMPLE]
        lines = sample.decode("utf-8", "replace").split("\n")
        if sample is not chunk:
            lines = lines[:-1]
        width = self._find_width(lines)
        if width is not None:
            self.width = width
        if self.width is None:
            return chunk
        if sample is not chunk:
            lines = chunk.decode("utf-8", "replace").split("\n")
        return self._join(lines, self.width).encode()

    def _join(self, lines: list[str], width: int) -> str:
        out: list[str] = []
        i, n = 0, len(lines)
        while i < n:
            cur = lines[i]
            j = i
            while j + 1 < n and j - i < WRAP_PIECES and _runs_on(lines[j], lines[j + 1], width):
                j += 1
                if self.spaced is not None and self.spaced(cur, lines[j]):
                    cur += " "
                cur += lines[j]
            if j > i:
                self.joins.append((len(out), j - i))
            out.append(cur)
            i = j + 1
        return "\n".join(out)


def _runs_on(line: str, nxt: str, width: int) -> bool:
    """Whether ``nxt`` is the rest of ``line``, cut by a terminal ``width`` wide: the line
    fills the width (a wide character that did not fit leaves one cell free) and the
    next starts no record."""
    if not nxt or RECORD_START.match(nxt):
        return False
    w = shown_width(line)
    return w == width or len(line) == width or (w == width - 1 and not line.isascii())
