"""Stream job logs once and keep only the lines that are evidence.

A failed job's logs are large (every rank's step lines, for days) and the
evidence is a few dozen lines. The scanner reads each file in chunks of
bytes, finds every trigger of the sign table (logsigns.py) in one
Aho-Corasick pass (ahocorasick-rs, in Rust, about a GB/s), and decodes only
the lines that hold one. Python tracebacks are the exception: after a
``Traceback`` line the scanner reads line by line, per rank, until the
exception line, so the frames say what the rank was doing when it died.

A terminal that hard-wrapped a line may have cut a trigger in two: the
automaton also holds every trigger's prefixes anchored at a line's end and
suffixes anchored at a line's start, so a cut costs nothing where there is
none. Colours are removed before matching. Lines over MAX_LINE are read in
pieces, and numbers over MAX_DIGITS digits skip their line (hostile input is
data, never a crash).

Ranks come from where launchers put them: torchrun's ``[rank3]:`` and
``[default3]:`` line prefixes, ``srun --label``'s ``3: ``, per-rank file
names (``rank3.log``, torchrun's ``--log-dir .../attempt_0/3/stderr.log``),
and the ``[Rank 3]`` inside torch's own messages. Inputs may be plain text,
gzip, or directories of both; Flight Recorder dumps found among them are
handed back by path (flightrec.py reads them).
"""

from __future__ import annotations

import datetime as _dt
import zlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator

import ahocorasick_rs

from ncclwatch.diagnose import logsigns, paste
from ncclwatch.diagnose.logsigns import MAX_TRIGGER, PG_TAG, SIGNS, Event, LogSign
from ncclwatch.stacks import Frame

CHUNK = 8 << 20
#: A line longer than this is read in pieces of it (memory stays flat on a 1 GiB
#: line); a trigger across a piece's edge is still found (the pieces overlap).
MAX_LINE = 1 << 20
#: Digits of a number a sign may capture (a rank, a sequence id, a timeout): a longer
#: one is no number a job printed, and its line is skipped (and counted).
MAX_DIGITS = 18
#: A traceback whose exception line has not come after this many lines is
#: closed as truncated (a killed process prints half a traceback).
TRACEBACK_MAX_LINES = 3000
#: Longest line kept as evidence text.
MAX_TEXT = 600
#: Files larger than this inside a directory are still read (streaming);
#: binary files other than Flight Recorder dumps are skipped.
_SNIFF = 8192


class LogInputError(ValueError):
    """A path that cannot be read as a log (missing, unreadable, not text)."""


@dataclass
class Evidence:
    """One matched line."""

    sign: str
    event: Event
    file: str
    line: int
    rank: int | None
    ts: float | None
    text: str
    fields: dict[str, str]
    #: The ``srun --label`` task id (a node, where torchrun runs per node).
    task: int | None = None
    #: The process group of torch's own ``[PG 3 Rank 2]`` tag (id, or its description)
    #: and the rank inside it; None where the message has no tag.
    pg: str | None = None
    pg_rank: int | None = None
    #: Where ``rank`` came from: "prefix" (launcher), "file" (per-rank file name),
    #: "message" (torch's ``[Rank N]`` of the default or an unnamed group), None.
    rank_from: str | None = None
    #: The line's own time stamp (``ts`` falls back to the last stamp before it, for
    #: ordering; a timeline shows only a line's own).
    stamp: float | None = None

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass
class PyTraceback:
    """A Python traceback of one rank: frames outermost first, as printed."""

    file: str
    line: int
    rank: int | None
    ts: float | None
    frames: list[Frame] = field(default_factory=list)
    #: The exception line. A chained exception ("During handling of the above
    #: exception ...") prints a traceback of its own: it is a PyTraceback of its own.
    exception: str = ""
    end_line: int = 0
    stamp: float | None = None

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"

    def innermost_first(self) -> list[Frame]:
        return self.frames[::-1]


@dataclass
class FailureEntry:
    """One failure of torchrun's ChildFailedError summary."""

    file: str
    line: int
    root: bool = False
    host: str = ""
    rank: int | None = None
    local_rank: int | None = None
    exitcode: int | None = None
    pid: int | None = None
    signame: str = ""
    #: The table's "time : 2026-12-03_12:36:12" (when torchrun saw the failure).
    stamp: float | None = None

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass
class ScanResult:
    evidence: list[Evidence] = field(default_factory=list)
    tracebacks: list[PyTraceback] = field(default_factory=list)
    failures: list[FailureEntry] = field(default_factory=list)
    ranks_seen: set[int] = field(default_factory=set)
    world_sizes: set[int] = field(default_factory=set)
    fr_dumps: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    bytes_read: int = 0
    lines_read: int = 0
    #: Every sign matched: its first line (where, text) and how many lines matched it.
    hits: dict[str, tuple[str, str]] = field(default_factory=dict)
    hit_counts: dict[str, int] = field(default_factory=dict)
    #: Bounds the input hit ("a line longer than 1 MiB ..."), once per kind and file.
    bounded: list[str] = field(default_factory=list)


# -- sign matching ---------------------------------------------------------------------

class _Matcher:
    """All triggers of all signs in one automaton; patterns compiled once.

    ``ac`` finds whole triggers (used per line, overlapping). ``scan_ac`` (used over
    whole chunks, leftmost-longest) also holds every prefix and suffix of every
    trigger of at least FRAGMENT characters: a terminal that hard-wraps a line
    inside a trigger leaves a prefix at the end of one line and the suffix at the
    start of the next, one of them at least that long (logsigns.MAX_TRIGGER)."""

    def __init__(self, signs: Iterable[LogSign] = SIGNS) -> None:
        self.signs = tuple(signs)
        triggers: list[str] = []
        self.by_trigger: list[list[int]] = []
        index: dict[str, int] = {}
        for i, sign in enumerate(self.signs):
            for t in sign.triggers:
                if t not in index:
                    index[t] = len(triggers)
                    triggers.append(t)
                    self.by_trigger.append([])
                self.by_trigger[index[t]].append(i)
        self.triggers = [t.encode() for t in triggers]
        self.ac = ahocorasick_rs.BytesAhoCorasick(self.triggers)
        self.patterns = [s.compile() for s in self.signs]
        # Pattern index of scan_ac -> (whole trigger?, a trigger's start at a line's end?,
        # a trigger's end at a line's start?). The pieces carry their newline, so they
        # match only where a wrap could have cut (a word inside a line costs nothing).
        roles: dict[bytes, list[bool]] = {t: [True, False, False] for t in self.triggers}
        for t in self.triggers:
            for n in range(logsigns.FRAGMENT, len(t)):
                for eol in (b"\n", b"\r\n"):
                    roles.setdefault(t[:n] + eol, [False, False, False])[1] = True
                # After a newline, a markdown quote, or a log viewer's "[88716] ".
                for bol in (b"\n", b"\n> ", b"] "):
                    roles.setdefault(bol + t[len(t) - n:], [False, False, False])[2] = True
        self.scan_patterns = list(roles)
        self.roles = [tuple(roles[p]) for p in self.scan_patterns]
        self.scan_ac = ahocorasick_rs.BytesAhoCorasick(
            self.scan_patterns, matchkind=ahocorasick_rs.MatchKind.LeftmostLongest)

    def signs_in(self, line: bytes) -> list[int]:
        """Indexes of the signs whose triggers occur in ``line``, in table order."""
        hit: set[int] = set()
        for t, _s, _e in self.ac.find_matches_as_indexes(line, overlapping=True):
            hit.update(self.by_trigger[t])
        return sorted(hit)


_MATCHER: _Matcher | None = None


def matcher() -> _Matcher:
    global _MATCHER
    if _MATCHER is None:
        _MATCHER = _Matcher()
    return _MATCHER


# -- ranks and times from a line's prefix -----------------------------------------------

#: `3: ` (srun --label, task id), then `[rank3]:` / `[default3]:` (torchrun) or a
#: trainer's `[rank 3]`, in that order.
_PREFIX = re.compile(r"^(?:\s*(?P<task>\d{1,9}): )?(?:\[(?P<role>[A-Za-z_]*?)(?P<rank>\d{1,9})\]:"
                     r"|\[[Rr]ank (?P<rank2>\d{1,9})\]:?(?= ))?")
_PREFIX_SAMPLE = re.compile(rb"\[(?:rank|default)(\d{1,9})\]:")
_PG_TAG = re.compile(PG_TAG)
#: Process groups whose ranks are the global ranks.
DEFAULT_PG = frozenset({"0", "default_pg"})
_TASK = re.compile(r"^\s*(\d{1,9}): ")
_ISO = re.compile(r"(\d{4})-(\d{2})-(\d{2})[ T_](\d{2}):(\d{2}):(\d{2})(?:[.,](\d{1,6}))?")
_GLOG = re.compile(r"\b[IWEF](\d{2})(\d{2}) (\d{2}):(\d{2}):(\d{2})\.(\d{1,6})")
_FILE_RANK = (
    re.compile(r"attempt_\d+/(\d{1,9})/(?:stdout|stderr)\.log$"),  # torchrun --log-dir
    re.compile(r"(?:^|[/_.\-])rank[_\-]?(\d{1,9})(?:[/_.\-]|$)", re.I),
    re.compile(r"(?:^|[/_.\-])(?:trace_rank_|node_?rank_?)(\d{1,9})(?!\d)", re.I),
)


def rank_of_path(path: str) -> int | None:
    """The rank a per-rank log file belongs to, from its path (None if shared)."""
    p = path.replace("\\", "/")
    name = p.rsplit("/", 2)
    tail = "/".join(name[-2:]) if len(name) > 1 else p
    for rx in _FILE_RANK:
        m = rx.search(p if rx is _FILE_RANK[0] else tail)
        if m:
            return int(m.group(1))
    return None


def split_prefix(line: str, task_is_rank: bool = True) -> tuple[int | None, str]:
    """(rank, rest) for one line: the innermost launcher prefix wins.

    ``task_is_rank``: an ``srun --label`` task id stands for the rank (one task
    per rank); where torchrun runs per node the task id is the node, not a rank.
    Paste decoration (paste.py) is removed first; a launcher prefix behind other
    decoration (a host, a Ray actor, a time) is found near the start of the line.
    """
    line = paste.undecorate(line)
    rank, rest = paste.mpi_rank(line)
    if rank is not None:
        return rank, rest
    m = _PREFIX.match(line)
    if m and m.group("rank") is not None:
        return int(m.group("rank")), line[m.end():]
    if m and m.group("rank2") is not None:  # a trainer's own "[rank 3] ..." lines
        return int(m.group("rank2")), line[m.end():]
    rank, rest = paste.launcher_prefix(line)
    if rank is not None:
        return rank, rest
    if not m or m.end() == 0:
        return None, line
    return (int(m.group("task")) if task_is_rank else None), line[m.end():]


def pg_of(text: str) -> tuple[str | None, int | None]:
    """(process group, rank inside it) of torch's first ``[PG .. Rank N]`` tag."""
    m = _PG_TAG.search(text)
    if m is None:
        return None, None
    pg = m.group("pg_desc") or m.group("pg")
    if m.group("pg") == "0" and not m.group("pg_desc"):
        pg = "0"
    return pg, int(m.group("rank"))


_MONTHS = {m: i + 1 for i, m in enumerate(("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul",
                                            "Aug", "Sep", "Oct", "Nov", "Dec"))}
#: Time stamps a log line may start with, tried in order: ISO 8601 and Python
#: logging (torch's ``[2024-05-01 10:00:00,123]``, Kubernetes, JSON "time"), glog
#: (``W1203 12:33:03.313000``: c10d and torchrun), US dates (HF's logging
#: ``12/03/2026 12:32:43``) and syslog / ``dmesg -T`` (``Dec  3 12:33:03``). A line
#: with none (dmesg's seconds since boot included) has no time.
STAMPS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("iso", _ISO), ("glog", _GLOG),
    ("us", re.compile(r"\b(\d{2})/(\d{2})/(\d{4})[ ,T]+(\d{2}):(\d{2}):(\d{2})(?:[.,](\d{1,6}))?")),
    ("syslog", re.compile(r"\b(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) {1,2}(\d{1,2}) "
                          r"(\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,6}))?(?: (\d{4})\b)?")),
)


def parse_ts(text: str, year: int) -> float | None:
    """Seconds since the epoch of the first time stamp on the line (UTC assumed; a
    stamp without a year takes the file's)."""
    head = text[:300]
    for kind, rx in STAMPS:
        m = rx.search(head)
        if m is None:
            continue
        g = m.groups()
        if kind == "iso":
            y, mo, d, h, mi, sec, frac = int(g[0]), int(g[1]), int(g[2]), *map(int, g[3:6]), g[6]
        elif kind == "glog":
            y, mo, d, h, mi, sec, frac = year, int(g[0]), int(g[1]), *map(int, g[2:5]), g[5]
        elif kind == "us":
            y, mo, d, h, mi, sec, frac = int(g[2]), int(g[0]), int(g[1]), *map(int, g[3:6]), g[6]
        else:
            y = int(g[6]) if g[6] else year
            mo, d, h, mi, sec, frac = _MONTHS[g[0]], int(g[1]), *map(int, g[2:5]), g[5]
        try:
            t = _dt.datetime(y, mo, d, h, mi, sec, tzinfo=_dt.timezone.utc).timestamp()
        except (ValueError, OverflowError):
            return None
        return t + (int(frac) / 10 ** len(frac) if frac else 0.0)
    return None


# -- inputs ----------------------------------------------------------------------------

def _is_fr_dump(head: bytes) -> bool:
    return len(head) > 2 and head[0] == 0x80 and 2 <= head[1] <= 5


def expand_found(paths: Iterable[str | os.PathLike]) -> Iterator[tuple[Path, bool]]:
    """(file, found in a directory rather than named) for every file under the paths."""
    for p in paths:
        path = Path(p)
        if path.is_dir():
            for root, dirs, files in os.walk(path):
                dirs.sort()
                for name in sorted(files):
                    yield Path(root) / name, True
        elif path.exists():
            yield path, False
        else:
            raise LogInputError(f"{p}: no such file or directory")


#: Files met in a directory that are not logs, by what they hold (not by name): a JSON
#: or YAML document (a verdict, a config; JSON *lines* logs are logs), Python source.
NOT_A_LOG: tuple[tuple[str, re.Pattern[bytes]], ...] = (
    ("a JSON document, not a log", re.compile(rb"\A\s*[\[{]\s*(?:\n|\"[^\n]*\":\s*[\[{]?\s*\n)")),
    ("Python source, not a log", re.compile(rb"\A(?:#![^\n]*python|(?:\"\"\"|import |from [\w.]+ import ))")),
)


def not_a_log(sniff: bytes) -> str | None:
    """Why a file found in a directory is no log (None: read it)."""
    for why, rx in NOT_A_LOG:
        if rx.match(sniff):
            return why
    return None


class _Gunzip:
    """gzip as a stream that keeps everything up to a truncation (gzip.open loses
    the last read's data when the stream ends early), members concatenated."""

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

    def __enter__(self) -> "_Gunzip":
        return self

    def __exit__(self, *exc: object) -> None:
        self.raw.close()

    def close(self) -> None:
        self.raw.close()


def _open(path: Path) -> tuple[BinaryIO, bytes]:
    f: BinaryIO = open(path, "rb")
    head = f.read(2)
    f.seek(0)
    if head == b"\x1f\x8b":
        f = _Gunzip(f)  # type: ignore[assignment]
    try:
        sniff = f.read(_SNIFF)
    except (OSError, EOFError, zlib.error) as e:
        f.close()
        raise LogInputError(f"{path}: cannot read: {e}") from None
    return f, sniff


# -- the scan ---------------------------------------------------------------------------

class _OpenTb:
    __slots__ = ("tb", "since")

    def __init__(self, tb: PyTraceback, since: int) -> None:
        self.tb, self.since = tb, since


def _logical(chunk: bytes, ls: int, le: int, back: bool = True,
             wrapped: bool = False) -> tuple[bytes, int]:
    """The logical line around chunk[ls:le]: a hard-wrapped line's pieces joined (the
    wrap cut inside a word, so no separator; each piece's paste decoration, a quote or
    a viewer line number, dropped). ``back``: also join pieces before it. Returns
    (bytes, its end)."""
    def text(a: int, b: int) -> str:
        return paste.undecorate(chunk[a:b].decode("utf-8", "replace").rstrip("\r"))

    start = ls
    if back and paste.continues(text(ls, le)):
        for _ in range(paste.WRAP_MAX):
            if start == 0:
                break
            ps = chunk.rfind(b"\n", 0, start - 1) + 1
            prev = text(ps, start - 1)
            if paste.ends_line(prev):
                break
            start = ps
            if not paste.continues(prev):
                break
    end = le
    for _ in range(paste.WRAP_MAX):
        if end >= len(chunk):
            break
        if paste.ends_line(text(chunk.rfind(b"\n", 0, end) + 1, end),
                           wrapped=wrapped or start != ls or end != le):
            break
        ne = chunk.find(b"\n", end + 1)
        if ne < 0:
            ne = len(chunk)
        nxt = text(end + 1, ne)
        if not nxt or not paste.continues(nxt):
            break
        end = ne
    if start == ls and end == le:
        return chunk[ls:le], le
    pieces = chunk[start:end].split(b"\n")
    first = pieces[0].rstrip(b"\r")
    rest = [paste.undecorate(p.decode("utf-8", "replace").rstrip("\r")).encode() for p in pieces[1:]]
    return first + b"".join(rest), end


def _joined(chunk: bytes, start: int, end: int) -> bytes:
    """The physical lines chunk[start:end] as one, each piece's paste decoration dropped."""
    pieces = chunk[start:end].split(b"\n")
    return pieces[0].rstrip(b"\r") + b"".join(
        paste.undecorate(p.decode("utf-8", "replace").rstrip("\r")).encode() for p in pieces[1:])


#: At most this many pieces of one terminal-wrapped line are joined.
WRAP_PIECES = 12


def _wrap_span(chunk: bytes, ls: int, le: int) -> tuple[int, int]:
    """The lines around ls..le that a terminal wrapped from one: every piece but the
    last has one width (at least logsigns.MAX_TRIGGER columns). ls is a full-width
    piece, or the last one (then the width is the piece's before it)."""
    def width(a: int, b: int) -> int:
        return len(chunk[a:b].rstrip(b"\r"))

    def span(w: int, start: int, end: int) -> tuple[int, int]:
        for _ in range(WRAP_PIECES):  # pieces before, each of that width
            if start == 0:
                break
            ps = chunk.rfind(b"\n", 0, start - 1) + 1
            if width(ps, start - 1) != w:
                break
            start = ps
        pe = chunk.rfind(b"\n", 0, end) + 1
        for _ in range(WRAP_PIECES):  # pieces after, while the one before is full width
            if end >= len(chunk) or width(pe, end) != w:
                break
            ne = chunk.find(b"\n", end + 1)
            pe, end = end + 1, len(chunk) if ne < 0 else ne
        return start, end

    first_end = chunk.find(b"\n", ls)
    first_end = len(chunk) if first_end < 0 else first_end
    w = width(ls, first_end)
    if w >= MAX_TRIGGER and first_end < len(chunk):
        ne = chunk.find(b"\n", first_end + 1)
        if width(first_end + 1, len(chunk) if ne < 0 else ne) <= w:
            got = span(w, ls, first_end)
            if got != (ls, first_end):
                return got[0], max(got[1], le)
    if ls > 0:  # ls as the last piece
        ps = chunk.rfind(b"\n", 0, ls - 1) + 1
        pw = width(ps, ls - 1)
        if pw >= max(w, MAX_TRIGGER):
            got = span(pw, ps, ls - 1)
            return got[0], max(first_end, le)
    return ls, le


def _message_rank(fields: dict[str, str], pg: str | None,
                  pg_rank: int | None) -> tuple[int | None, str | None]:
    """The global rank a message names itself, if it names one: torch's ``[Rank N]``
    is the rank inside a process group, global only for the default group."""
    if pg is not None:
        return (pg_rank, "message") if pg in DEFAULT_PG else (None, None)
    if "rank" in fields:
        return int(fields["rank"]), "message"
    if pg_rank is not None:
        return pg_rank, "message"
    return None, None


_ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]*)", line (?P<line>\d{1,9}), in (?P<func>.+?)\s*$')


class Scanner:
    """Scans files into one ScanResult (see the module docstring)."""

    def __init__(self, result: ScanResult | None = None) -> None:
        self.r = result if result is not None else ScanResult()
        self.m = matcher()

    def scan_paths(self, paths: Iterable[str | os.PathLike]) -> ScanResult:
        for path, found in expand_found(paths):
            self.scan_file(path, found)
        return self.r

    def scan_file(self, path: Path, found: bool = False) -> None:
        name = str(path)
        try:
            f, sniff = _open(path)
        except OSError as e:
            self.r.skipped.append((name, f"cannot read: {e.strerror or e}"))
            return
        except LogInputError as e:
            self.r.skipped.append((name, str(e)))
            return
        with f:
            if _is_fr_dump(sniff):
                self.r.fr_dumps.append(name)
                return
            if b"\x00" in sniff:
                self.r.skipped.append((name, "binary, not a log or a Flight Recorder dump"))
                return
            why = not_a_log(sniff) if found else None
            if why is not None:  # a named file is always read: the user said so
                self.r.skipped.append((name, why))
                return
            self.r.files.append(name)
            try:
                year = _dt.datetime.fromtimestamp(path.stat().st_mtime, _dt.timezone.utc).year
            except OSError:
                year = _dt.datetime.now(_dt.timezone.utc).year
            fs = _FileScan(self, name, rank_of_path(name), year)
            try:
                fs.run(f, sniff)
            except (OSError, EOFError, zlib.error) as e:  # a truncated .gz, a vanished file
                self.r.skipped.append((name, f"read stopped early ({e}); the lines before "
                                             "it were used"))

    def scan_stream(self, name: str, stream: BinaryIO) -> ScanResult:
        """A log that is no file (a paste, an upload): read once in chunks, never held
        whole, never written anywhere; plain or gzip. A stream that is not text (a
        Flight Recorder dump, binary) raises LogInputError: dumps are read from files.
        ``name`` counts as a file name does (``rank3.log`` is rank 3's log)."""
        def sniff(f: BinaryIO) -> bytes:
            got = b""
            while len(got) < _SNIFF:  # a stream may answer a read with less
                b = f.read(_SNIFF - len(got))
                if not b:
                    break
                got += b
            return got

        first = sniff(stream)
        f: BinaryIO = _Prefixed(first, stream)  # type: ignore[assignment]
        if first[:2] == b"\x1f\x8b":
            f = _Gunzip(f)  # type: ignore[assignment]
            try:
                first = sniff(f)
            except (OSError, EOFError, zlib.error) as e:
                raise LogInputError(f"{name}: cannot read the gzip stream ({e})") from None
        else:
            first = f.read(len(first))
        if _is_fr_dump(first):
            raise LogInputError(f"{name}: a Flight Recorder dump (pickle); give dumps to "
                                "`ncclwatch diagnose` on the command line")
        if b"\x00" in first:
            raise LogInputError(f"{name}: binary, not a log")
        self.r.files.append(name)
        fs = _FileScan(self, name, rank_of_path(name), _dt.datetime.now(_dt.timezone.utc).year)
        try:
            fs.run(f, first)
        except (OSError, EOFError, zlib.error) as e:
            self.r.skipped.append((name, f"read stopped early ({e}); the lines before it were "
                                         "used"))
        return self.r


class _Prefixed:
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


class _FileScan:
    def __init__(self, scanner: Scanner, name: str, file_rank: int | None, year: int) -> None:
        self.s, self.r, self.m = scanner, scanner.r, scanner.m
        self.name, self.file_rank, self.year = name, file_rank, year
        self.open: dict[int | None, _OpenTb] = {}
        self.entry: FailureEntry | None = None
        self.root_next = False
        self.last_ts: float | None = None
        self.stamp: float | None = None
        self.summary_stamp: float | None = None
        #: srun task ids are ranks unless the file also has torchrun's rank prefixes.
        self.task_is_rank = True
        self.task: int | None = None
        if file_rank is not None:
            self.r.ranks_seen.add(file_rank)

    def _bound(self, what: str) -> None:
        note = f"{self.name}: {what}"
        kind = what.split(" (")[0]
        if not any(b.startswith(f"{self.name}: {kind}") for b in self.r.bounded):
            self.r.bounded.append(note)

    def _read(self, f: BinaryIO) -> bytes:
        """Up to CHUNK bytes; a stream that breaks (truncated .gz) keeps what it gave."""
        parts, n = [], 0
        while n < CHUNK:
            try:
                b = f.read(min(1 << 20, CHUNK - n))
            except (OSError, EOFError, zlib.error) as e:
                self.error = e
                break
            if not b:
                break
            parts.append(b)
            n += len(b)
        return b"".join(parts)

    def run(self, f: BinaryIO, first: bytes) -> None:
        carry = first
        line_no = 1
        self.error: Exception | None = None
        while True:
            block = self._read(f) if self.error is None else b""
            data = carry + block
            if not block:
                if data:
                    line_no = self._chunk(data, line_no)
                break
            cut = data.rfind(b"\n")
            if cut < 0:
                if len(data) > MAX_LINE:  # one huge line: read it in pieces that overlap
                    self._bound(f"a line longer than {MAX_LINE >> 20} MiB (line {line_no}): "
                                "read in pieces")
                    keep = 4 * MAX_TRIGGER
                    self._chunk(data, line_no)
                    self.r.bytes_read -= keep  # read again at the start of the next piece
                    carry = data[-keep:]
                else:
                    carry = data
                continue
            line_no = self._chunk(data[: cut + 1], line_no)
            carry = data[cut + 1:]
        self._close_all(line_no)
        if self.error is not None:
            raise self.error

    # A chunk holds whole lines; returns the number of the line after it.
    def _chunk(self, chunk: bytes, line_no: int) -> int:
        self.r.bytes_read += len(chunk)
        if b"\x1b" in chunk:  # colours go first: a colour code may sit inside a trigger
            chunk = _ANSI.sub(b"", chunk)
        for m in _PREFIX_SAMPLE.finditer(chunk, 0, 65536):
            self.r.ranks_seen.add(int(m.group(1)))
            self.task_is_rank = False
        if line_no == 1 and self.task_is_rank and _PREFIX_SAMPLE.search(chunk):
            self.task_is_rank = False  # torchrun prefixes anywhere in the first chunk
        cur_pos, cur_line = 0, line_no
        pos = 0
        if self.open:
            pos, cur_line = self._sequential(chunk, 0, line_no)
            cur_pos = pos
        for t, s, e in self.m.scan_ac.find_matches_as_indexes(chunk):
            # A trigger's end at a line's start begins with the newline before that line:
            # the line is still unread when the one before it was read alone.
            if s + (chunk[s:s + 1] == b"\n") < pos:
                continue
            if self.m.roles[t][0]:
                ls = chunk.rfind(b"\n", 0, s) + 1
                le = chunk.find(b"\n", s)
                if le < 0:
                    le = len(chunk)
                first, last = ls, le
            else:
                cut = self._cut_trigger(chunk, t, s, e, pos)
                if cut is None:
                    continue
                first, last = cut
                ls = first
                le = chunk.find(b"\n", first)
                le = len(chunk) if le < 0 else le
            if last == le < len(chunk):  # another trigger may start here, cut at the end
                ne = chunk.find(b"\n", le + 1)
                ne = len(chunk) if ne < 0 else ne
                if self._crosses(chunk, ls, le, ne):
                    last = ne
            cur_line += chunk.count(b"\n", cur_pos, first)
            cur_pos = first
            if (first, last) == (ls, le):
                raw, le = _logical(chunk, ls, le)
            else:  # a trigger cut by a hard wrap: its pieces joined, and what follows
                _raw, le = _logical(chunk, first, last, back=False, wrapped=True)
                raw = _joined(chunk, first, le)
            matched, missed = self._line(raw, cur_line)
            if missed and not self.open:
                # A trigger whose pattern found too little: a narrow terminal wrapped the
                # line (pieces of one width); read it whole for the signs not yet read.
                a, b = _wrap_span(chunk, first, le)
                # A later line of the run holding a trigger of its own is no piece of
                # this one (as wide by chance): it is read on its own.
                ps = le + 1
                while ps < b:
                    pe = chunk.find(b"\n", ps)
                    pe = b if pe < 0 or pe > b else pe
                    if self.m.signs_in(chunk[ps:pe]):
                        # ...unless the run read whole completes a specific sign this
                        # line missed (a generic failure shape completes by chance):
                        # then the line is a piece after all.
                        whole = self._decode(_joined(chunk, a, b))
                        if not any(self.m.patterns[i].search(whole)
                                   for i in self.m.signs_in(chunk[first:le + 1])
                                   if self.m.signs[i].id in missed
                                   and self.m.signs[i].event is not Event.ERROR):
                            b = max(le, ps - 1)
                        break
                    ps = pe + 1
                if (a, b) != (first, le):
                    whole = _joined(chunk, a, b)
                    # Cited at the trigger's line: the run may reach back over lines that
                    # only happen to be as wide (a log's own lines of that width).
                    got, _m = self._line(whole, cur_line, only={
                        self.m.signs[i].id for i in self.m.signs_in(whole)} - matched)
                    if got:  # else the lines after it were no wrap: each is read itself
                        le = max(le, b)
            pos = le + 1
            if self.open:
                cur_pos, cur_line = pos, cur_line + 1 + chunk.count(b"\n", first, le)
                pos, cur_line = self._sequential(chunk, pos, cur_line)
                cur_pos = pos
        total = line_no + chunk.count(b"\n")
        self.r.lines_read += total - line_no
        return total

    def _cut_trigger(self, chunk: bytes, t: int, s: int, e: int,
                     pos: int) -> tuple[int, int] | None:
        """For a piece of a trigger at a line's end or start (chunk[s:e], newline
        included): the span of the two lines where a hard wrap cut a trigger there; else
        the span of the line if it holds a whole trigger the piece hid; else None."""
        _whole, starts, _ends = self.m.roles[t]
        if starts:  # "...Watchdog caught colle\n": the line ending here
            le = chunk.rfind(b"\n", s, e)
            ls = chunk.rfind(b"\n", 0, s) + 1
        else:  # "\nctive operation timeout: ...": the line starting here
            ls = chunk.rfind(b"\n", 0, s + 1) + 1
            le = chunk.find(b"\n", s + 1)
            le = len(chunk) if le < 0 else le
            head = chunk[ls:chunk.find(b" ", s) + 1 if chunk[s:s + 1] == b"]" else ls]
            if ls > 0 and not paste.undecorate(head.decode("utf-8", "replace")).strip():
                ps = chunk.rfind(b"\n", 0, ls - 1) + 1
                if ps >= pos and self._crosses(chunk, ps, ls - 1, le):
                    return ps, le
        # (Leftmost matching may have hidden another piece or a whole trigger.)
        if le < len(chunk):
            ne = chunk.find(b"\n", le + 1)
            ne = len(chunk) if ne < 0 else ne
            if self._crosses(chunk, ls, le, ne):
                return ls, ne
        if self.m.signs_in(chunk[ls:le]):
            return ls, le
        return None

    def _crosses(self, chunk: bytes, a: int, cut: int, b: int) -> bool:
        """Whether lines a..cut and cut+1..b joined hold a trigger neither holds alone."""
        both = set(self.m.signs_in(_joined(chunk, a, b)))
        return bool(both - set(self.m.signs_in(chunk[a:cut])) - set(self.m.signs_in(chunk[cut + 1:b])))

    def _sequential(self, chunk: bytes, pos: int, line_no: int) -> tuple[int, int]:
        """Line by line from ``pos`` while a traceback is open; returns (pos, line_no)."""
        n = len(chunk)
        while self.open and pos < n:
            le = chunk.find(b"\n", pos)
            if le < 0:
                le = n
            raw, end = _logical(chunk, pos, le, back=False)
            if end == le < n and le - pos >= MAX_TRIGGER:
                # A wrapped exception line whose rest holds the sign ("...third_party/gl" +
                # "oo/.../unbound_buffer.cc:78] Timed out waiting ..."): one line.
                ne = chunk.find(b"\n", le + 1)
                ne = n if ne < 0 else ne
                nxt = paste.undecorate(self._decode(chunk[le + 1:ne]))
                _r, body = split_prefix(self._decode(chunk[pos:le]), self.task_is_rank)
                body = body[1:] if body.startswith(" ") and not body.startswith("  ") else body
                if nxt and not nxt[:1].isspace() and body and not body[:1].isspace() \
                        and paste.continues(nxt) and self.m.signs_in(nxt.encode()) \
                        and not paste.ends_line(body.rstrip(), wrapped=True):
                    raw, end = _joined(chunk, pos, ne), ne
            self._traceback_line(raw, line_no)
            pos, line_no = end + 1, line_no + 1 + chunk.count(b"\n", le, end)
            for rank, ot in list(self.open.items()):
                if line_no - ot.since > TRACEBACK_MAX_LINES:
                    self._finish(rank, "(traceback truncated)", line_no)
        return pos, line_no

    def _decode(self, raw: bytes) -> str:
        return raw.decode("utf-8", "replace").rstrip("\r")

    def _traceback_line(self, raw: bytes, line_no: int) -> None:
        parts = paste.split_glued(self._decode(raw))
        if len(parts) == 1:
            self._traceback_part(raw, parts[0], line_no)
            return
        for part in parts:
            self._traceback_part(part.encode(), part, line_no)

    def _traceback_part(self, raw: bytes, text: str, line_no: int) -> None:
        if paste.is_progress_bar(text):
            if self.m.signs_in(raw):
                self._line(raw, line_no)
            return
        rank, rest = split_prefix(text, self.task_is_rank)
        if rank is None:
            rank = self.file_rank
        ot = self.open.get(rank)
        if ot is not None:
            # A prefix may be followed by one space ("[default0]: "); frames are
            # indented two more, source lines four.
            body = rest[1:] if rest.startswith(" ") and not rest.startswith("  ") else rest
            stripped = body.strip()
            fm = _FRAME.match(body)
            if fm:
                ot.tb.frames.append(Frame(fm.group("func"), fm.group("file"), int(fm.group("line"))))
                return
            if not stripped or body[:1].isspace():
                if stripped and self.m.signs_in(raw):  # an indented exception line (torchrun's summary)
                    self._line(raw, line_no)
                return
            # A new "Traceback" line is the TRACEBACK event's to handle (below).
            if not stripped.startswith("Traceback (most recent call last)") and ot.tb.frames:
                self._finish(rank, stripped, line_no)
                # The exception line is evidence too (OOM, timeouts, NCCL errors).
                if self.m.signs_in(raw):
                    self._line(raw, line_no)
                return
        if self.m.signs_in(raw):
            self._line(raw, line_no)

    def _finish(self, rank: int | None, exception: str, line_no: int) -> None:
        ot = self.open.pop(rank, None)
        if ot is None:
            return
        tb = ot.tb
        tb.exception = exception[:MAX_TEXT]
        tb.end_line = line_no
        self.r.tracebacks.append(tb)

    def _close_all(self, line_no: int) -> None:
        for rank in list(self.open):
            self._finish(rank, "(traceback cut off at end of file)", line_no)

    def _line(self, raw: bytes, line_no: int,
              only: set[str] | None = None) -> tuple[set[str], set[str]]:
        """Read one logical line; returns the signs matched, and those whose trigger it
        holds but whose pattern did not match."""
        text = paste.unjson(self._decode(raw[:MAX_LINE]))
        tm = _TASK.match(text)
        self.task = int(tm.group(1)) if tm else None
        matched: set[str] = set()
        missed: set[str] = set()
        for part in paste.split_glued(text):
            missed |= self._part(part, line_no, only, matched)
        return matched, missed - matched

    def _part(self, text: str, line_no: int, only: set[str] | None = None,
              matched: set[str] | None = None) -> set[str]:
        rank, rest = split_prefix(text, self.task_is_rank)
        rank_from = "prefix" if rank is not None else None
        if rank is None and self.file_rank is not None:
            rank, rank_from = self.file_rank, "file"
        rest = rest.strip()
        ts = self.stamp = parse_ts(text, self.year)
        if ts is None:
            ts = self.last_ts
        else:
            self.last_ts = ts
        if rank is not None:
            self.r.ranks_seen.add(rank)
        pg, pg_rank = pg_of(rest)
        missed: set[str] = set()
        for i in self.m.signs_in(text.encode()):
            sign = self.m.signs[i]
            if only is not None and sign.id not in only:
                continue
            mt = self.m.patterns[i].search(rest)
            if mt is None:
                missed.add(sign.id)
                continue
            fields = {k: v for k, v in mt.groupdict().items() if v is not None}
            if any(len(v) > MAX_DIGITS and v.lstrip("-").isdigit() for v in fields.values()):
                self._bound(f"a number of more than {MAX_DIGITS} digits (line {line_no}): "
                            "the line was skipped")
                continue
            if matched is not None:
                matched.add(sign.id)
            if sign.id not in self.r.hits:
                self.r.hits[sign.id] = (f"{self.name}:{line_no}", rest[:MAX_TEXT])
            self.r.hit_counts[sign.id] = self.r.hit_counts.get(sign.id, 0) + 1
            ev_rank, ev_from = rank, rank_from
            if ev_rank is None:
                ev_rank, ev_from = _message_rank(fields, pg, pg_rank)
            self._event(sign, fields, ev_rank, ts, rest, line_no, pg, pg_rank, ev_from)
        return missed

    def _event(self, sign: LogSign, fields: dict[str, str], rank: int | None, ts: float | None,
               text: str, line_no: int, pg: str | None = None, pg_rank: int | None = None,
               rank_from: str | None = None) -> None:
        ev = sign.event
        if ev is Event.TRACEBACK:
            if rank in self.open:
                if not self.open[rank].tb.frames:
                    return  # the same header twice: keep the open one
                self._finish(rank, "(traceback truncated)", line_no)
            self.open[rank] = _OpenTb(PyTraceback(self.name, line_no, rank, ts,
                                                  stamp=self.stamp), line_no)
            return
        if ev is Event.SUMMARY_ROOT:
            self.root_next = True
            return
        if ev is Event.SUMMARY:
            self._summary(sign.id, fields, line_no)
            return
        if ev is Event.WORLD:
            self.r.world_sizes.add(int(fields["world"]))
            return
        if rank is not None and rank_from == "message":
            self.r.ranks_seen.add(rank)
        self.r.evidence.append(Evidence(sign.id, ev, self.name, line_no, rank, ts,
                                        text[:MAX_TEXT], fields, self.task, pg, pg_rank,
                                        rank_from, self.stamp))

    def _summary(self, sid: str, fields: dict[str, str], line_no: int) -> None:
        if sid == "summary_time":  # printed above the host line of its entry
            self.summary_stamp = parse_ts(fields.get("time", ""), self.year)
            return
        if sid == "summary_host" or self.entry is None:
            self.entry = FailureEntry(self.name, line_no, root=self.root_next,
                                      stamp=self.summary_stamp)
            self.summary_stamp = None
            self.root_next = False
            self.r.failures.append(self.entry)
        e = self.entry
        if sid == "summary_host":
            e.host = fields.get("host", "")
        elif sid == "summary_rank":
            e.rank, e.local_rank = int(fields["rank"]), int(fields["local_rank"])
            self.r.ranks_seen.add(e.rank)
        elif sid == "summary_exitcode":
            e.exitcode, e.pid = int(fields["exitcode"]), int(fields["pid"])
        elif sid == "summary_signal":
            e.signame = fields.get("signame", "")



def scan(paths: Iterable[str | os.PathLike]) -> ScanResult:
    """Scan log files and directories (plain or gzip) into evidence."""
    return Scanner().scan_paths(paths)
