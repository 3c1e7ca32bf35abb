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

This module is the scan itself; its parts have modules of their own: what it
keeps (scanresult.py), the trigger automaton (matcher.py), ranks and times
from a line (lineprefix.py), which paths are logs (logfiles.py), reading a
plain or gzip stream (ncclwatch/logstream.py) and joining wrapped lines
(wraps.py).
"""

from __future__ import annotations

import bisect
import datetime as _dt
import os
import re
import zlib
from pathlib import Path
from typing import BinaryIO, Iterable

from ncclwatch.diagnose import paste, severity
from ncclwatch.diagnose.lineprefix import (
    DEFAULT_PG,
    PREFIX_SAMPLE,
    TASK_PREFIX,
    parse_ts,
    pg_of,
    rank_of_path,
    split_prefix,
)
from ncclwatch.diagnose.logfiles import (
    LogInputError,
    expand_found,
    is_fr_dump,
    not_a_log,
    open_log,
)
from ncclwatch.diagnose.logsigns import MAX_TRIGGER
from ncclwatch.diagnose.matcher import matcher
from ncclwatch.diagnose.scanresult import (
    Evidence,
    FailureEntry,
    PyTraceback,
    ScanResult,
)
from ncclwatch.diagnose.severity import Level
from ncclwatch.diagnose.signtypes import Event, LogSign
from ncclwatch.diagnose.wraps import joined, logical, lost_blank, wrap_spans
from ncclwatch.logstream import Normaliser, open_stream, read_head
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


class _OpenTb:
    __slots__ = ("tb", "since", "after_frame")

    def __init__(self, tb: PyTraceback, since: int) -> None:
        self.tb, self.since = tb, since
        #: The last line read was a frame: the next may be its source line.
        self.after_frame = False


#: An exception line: a class name (dotted, capitalised) alone or before ": ". A line
#: right after a frame that is not one is the frame's source line, its indent lost
#: (a paste outside a code block); a line of carets (Python 3.11) is decoration.
_EXCEPTION = re.compile(r"(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?::\s|:?$)")
_CARETS = re.compile(r"[\s^~]+$")


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
            f, sniff = open_log(path)
        except OSError as e:
            self.r.skipped.append((name, f"cannot read: {e.strerror or e}"))
            return
        except LogInputError as e:
            self.r.skipped.append((name, str(e)))
            return
        with f:
            if is_fr_dump(sniff):
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
        opened = open_stream(stream)
        f, first = opened.text, opened.head
        if opened.gzip:
            try:
                first = read_head(f)
            except (OSError, EOFError, zlib.error) as e:
                raise LogInputError(f"{name}: cannot read the gzip stream ({e})") from None
        else:
            first = f.read(len(first))
        if is_fr_dump(first):
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
        self.norm = Normaliser(paste.continues, paste.ends_line, lost_blank)
        #: Lines the normaliser joined (wrapped pieces): the scan's line numbers count
        #: the joined lines; _raw maps one back to the user's (its first piece's).
        self.joined_at: list[int] = []
        self.joined_extra: list[int] = []
        if file_rank is not None:
            self.r.ranks_seen.add(file_rank)

    def _raw(self, line_no: int) -> int:
        """The user's own number of a line the scan numbers (see joined_at)."""
        if not self.joined_at:
            return line_no
        i = bisect.bisect_left(self.joined_at, line_no)
        return line_no + (self.joined_extra[i - 1] if i else 0)

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
                    self._bound(f"a line longer than {MAX_LINE >> 20} MiB (line {self._raw(line_no)}): "
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
        # What the paste did goes first (a colour code may sit inside a trigger, a wrap
        # may cut one); the lines keep their numbers.
        chunk = self.norm(chunk)
        for idx, extra in self.norm.joins:
            self.joined_at.append(line_no + idx)
            self.joined_extra.append(extra + (self.joined_extra[-1] if self.joined_extra else 0))
            self.r.lines_read += extra
        for m in PREFIX_SAMPLE.finditer(chunk, 0, 65536):
            self.r.ranks_seen.add(int(m.group(1)))
            self.task_is_rank = False
        if line_no == 1 and self.task_is_rank and PREFIX_SAMPLE.search(chunk):
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
            alone = None
            if (first, last) == (ls, le):
                raw, le = logical(chunk, ls, le)
                if raw != chunk[ls:last]:  # (joined to pieces before or after it)
                    alone = chunk[ls:last]
            else:  # a trigger cut by a hard wrap: its pieces joined, and what follows
                _raw, le = logical(chunk, first, last, back=False, wrapped=True)
                raw = joined(chunk, first, le)
                if le > last:  # (the pieces alone, as above: "]Kill" + "ed" + "Done, ...")
                    alone = joined(chunk, first, last)
            matched, missed = self._line(raw, cur_line)
            if missed and alone is not None and self.m.signs_in(alone):
                # Joining is a guess (a line that ends no sentence, a next one that starts
                # no record: "...5.04it/s]Killed" + "Done, resuming ..."): a sign the
                # line holds whole and reads alone is read alone.
                got, _m = self._line(alone, cur_line, only=missed)
                matched, missed = matched | got, missed - got
            # A line only the severity grammar read (its level token in the first piece)
            # may still be the first piece of a sign a narrow terminal wrapped.
            if (missed or (matched and matched <= self.m.readers)) and not self.open:
                # A trigger whose pattern found too little: a narrow terminal wrapped the
                # line (pieces of one width); read it whole for the signs not yet read.
                le = self._wrapped_run(chunk, first, le, cur_line, matched, missed)
            pos = le + 1
            if self.open:
                cur_pos, cur_line = pos, cur_line + 1 + chunk.count(b"\n", first, le)
                pos, cur_line = self._sequential(chunk, pos, cur_line)
                cur_pos = pos
        total = line_no + chunk.count(b"\n")
        self.r.lines_read += total - line_no
        return total

    def _wrapped_run(self, chunk: bytes, first: int, le: int, cur_line: int,
                     matched: set[str], missed: set[str]) -> int:
        """The trigger's line chunk[first:le] read with the run of pieces a narrow terminal
        cut it into (wraps.wrap_spans: the line as a first or middle piece, else as the
        last), for the signs it missed; returns where what was read ends."""
        for a, b in wrap_spans(chunk, first, le):
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
                    whole_raw = joined(chunk, a, b)
                    whole = self._decode(whole_raw)
                    own = self.m.signs_in(chunk[first:le + 1])
                    cands = [i for i in own if self.m.signs[i].id in missed]
                    # ...or a sign only the join holds (its trigger cut between pieces)
                    seen: set[int] = set()
                    qs = a
                    while qs <= b:
                        qe = chunk.find(b"\n", qs)
                        qe = b if qe < 0 or qe > b else qe
                        seen.update(self.m.signs_in(chunk[qs:qe]))
                        qs = qe + 1
                    cands += [i for i in self.m.signs_in(whole_raw) if i not in seen]
                    # (The grammar reads a level at the head of a line: of the trigger's
                    # line, or of what follows a bar glued to it, never at the head of a
                    # line before it that is only as wide.)
                    head = self._decode(joined(chunk, first, b))
                    if not any(self._reads(i, whole) if self.m.signs[i].event is not Event.ERROR
                               else self.m.signs[i].reader is not None and self._reads(i, head)
                               for i in cands):
                        b = max(le, ps - 1)
                    break
                ps = pe + 1
            if (a, b) == (first, le):
                continue
            whole = joined(chunk, a, b)
            # Cited at the trigger's line: the run may reach back over lines that
            # only happen to be as wide (a log's own lines of that width).
            only = {self.m.signs[i].id for i in self.m.signs_in(whole)} - matched
            graded = only & self.m.readers
            # A level is read at the head of the trigger's line, never lent by a
            # line before it that ended where it did (a sentence, a bracket).
            lent = a != first and paste.ends_line(self._decode(
                chunk[chunk.rfind(b"\n", 0, first - 1) + 1:first - 1]), wrapped=True)
            if lent:
                only -= graded
            got, _m = self._line(whole, cur_line, only=only)
            if lent and graded:
                got |= self._line(joined(chunk, first, b), cur_line, only=graded)[0]
            if got:  # else the lines after it were no wrap: each is read itself
                return max(le, b)
        return le

    def _reads(self, i: int, text: str) -> bool:
        """Whether sign ``i``'s pattern reads ``text`` as a line is read (its JSON, glued
        bars, launcher tags undone: _line, _part), recording nothing."""
        return any(self.m.patterns[i].search(split_prefix(part, self.task_is_rank)[1].strip())
                   for part in paste.split_glued(paste.unjson(text)))

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
        both = set(self.m.signs_in(joined(chunk, a, b)))
        return bool(both - set(self.m.signs_in(chunk[a:cut])) - set(self.m.signs_in(chunk[cut + 1:b])))

    def _sequential(self, chunk: bytes, pos: int, line_no: int) -> tuple[int, int]:
        """Line by line from ``pos`` while a traceback is open; returns (pos, line_no)."""
        n = len(chunk)
        while self.open and pos < n:
            le = chunk.find(b"\n", pos)
            if le < 0:
                le = n
            raw, end = logical(chunk, pos, le, back=False)
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
                    raw, end = joined(chunk, pos, ne), ne
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
                ot.after_frame = True
                return
            if stripped and not body[:1].isspace() and (_CARETS.match(stripped) or (
                    ot.after_frame and not _EXCEPTION.match(stripped))):
                ot.after_frame = False  # a source line or carets, unindented by a paste
                return
            if stripped:
                ot.after_frame = False
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
        tb.end_line = self._raw(line_no)
        self.r.tracebacks.append(tb)

    def _close_all(self, line_no: int) -> None:
        for rank in list(self.open):
            self._finish(rank, "(traceback cut off at end of file)", line_no)

    def _line(self, raw: bytes, line_no: int,
              only: set[str] | None = None) -> tuple[set[str], set[str]]:
        """Read one logical line; returns the signs matched, and those whose trigger it
        holds but whose pattern did not match."""
        text = paste.unjson(self._decode(raw[:MAX_LINE]))
        tm = TASK_PREFIX.match(text)
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
        read = False  # a failure sign of its own read this line: the grammar adds nothing
        for i in self.m.signs_in(text.encode()):
            sign = self.m.signs[i]
            if only is not None and sign.id not in only:
                continue
            if read and sign.reader is not None:
                continue
            mt = self.m.patterns[i].search(rest)
            if mt is None:
                missed.add(sign.id)
                continue
            if sign.event is Event.ERROR and sign.reader is None \
                    and severity.benign(rest, Level.ERROR) is not None:
                continue  # a generic error shape the benign table spares (with its reason)
            fields = {k: v for k, v in mt.groupdict().items() if v is not None}
            if any(len(v) > MAX_DIGITS and v.lstrip("-").isdigit() for v in fields.values()):
                self._bound(f"a number of more than {MAX_DIGITS} digits (line {self._raw(line_no)}): "
                            "the line was skipped")
                continue
            read = read or (sign.reader is None and sign.failure)
            if matched is not None:
                matched.add(sign.id)
            if sign.id not in self.r.hits:
                self.r.hits[sign.id] = (f"{self.name}:{self._raw(line_no)}", rest[:MAX_TEXT])
            self.r.hit_counts[sign.id] = self.r.hit_counts.get(sign.id, 0) + 1
            ev_rank, ev_from = rank, rank_from
            if ev_rank is None:
                ev_rank, ev_from = _message_rank(fields, pg, pg_rank)
            if ev_rank is None and "task" in fields and self.task_is_rank:
                ev_rank, ev_from = int(fields["task"]), "task"  # Slurm's own line for a task
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
            self.open[rank] = _OpenTb(PyTraceback(self.name, self._raw(line_no), rank, ts,
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
        if rank is not None and rank_from in ("message", "task"):
            self.r.ranks_seen.add(rank)
        self.r.evidence.append(Evidence(sign.id, ev, self.name, self._raw(line_no), rank, ts,
                                        text[:MAX_TEXT], fields, self.task, pg, pg_rank,
                                        rank_from, self.stamp))

    def _summary(self, sid: str, fields: dict[str, str], line_no: int) -> None:
        if sid == "summary_time":  # printed above the host line of its entry
            self.summary_stamp = parse_ts(fields.get("time") or fields.get("time19", ""),
                                          self.year)
            return
        # An entry starts at its host line (torch 2.x), or at a rank line where the
        # entry read last has its rank already (torch 1.9's table has no host row).
        if sid == "summary_host" or self.entry is None or (
                sid == "summary_rank" and self.entry.rank is not None):
            self.entry = FailureEntry(self.name, self._raw(line_no), root=self.root_next,
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
