"""A log line that a terminal or a paste cut into pieces, joined again.

Terminals hard-wrap long lines (inside a word, at a fixed width) and pastes
add decoration to each piece (a quote, a viewer's line number). The scanner
asks for the whole line only around a line that holds a trigger or a cut
one, so joining costs nothing on the bulk of a log; paste.py says what a
piece looks like, this module walks the pieces of one chunk of bytes.
"""

from __future__ import annotations

from ncclwatch.diagnose import paste
from ncclwatch.diagnose.logsigns import MAX_TRIGGER
from ncclwatch.diagnose.matcher import matcher
from ncclwatch.logstream import shown_width


def logical(chunk: bytes, ls: int, le: int, back: bool = True,
             wrapped: bool = False) -> tuple[bytes, int]:
    """The logical line around chunk[ls:le]: a hard-wrapped line's pieces joined (the
    wrap cut inside a word, so no separator; each piece's paste decoration, a quote or
    a viewer line number, dropped). ``back``: also join pieces before it. Returns
    (bytes, its end)."""
    def raw(a: int, b: int) -> str:
        return chunk[a:b].decode("utf-8", "replace").rstrip("\r")

    def text(a: int, b: int) -> str:
        return paste.undecorate(raw(a, b))

    def tagged(a: int, b: int) -> bool:  # (a record's own tag leads it: no piece)
        ps = chunk.rfind(b"\n", 0, a - 1) + 1 if a else 0
        return paste.tagged(raw(a, b), raw(ps, a - 1) if a else "")

    start = ls
    if back and paste.continues(text(ls, le)) and not tagged(ls, le):
        for _ in range(paste.WRAP_MAX):
            if start == 0:
                break
            pe = start - 1
            ps = chunk.rfind(b"\n", 0, pe) + 1
            prev = text(ps, pe)
            if paste.ends_line(prev):
                break
            start = ps
            if not paste.continues(prev) or tagged(ps, pe):
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
        if not nxt or not paste.continues(nxt) or tagged(end + 1, ne):
            break
        end = ne
    if start == ls and end == le:
        return chunk[ls:le], le
    pieces = chunk[start:end].split(b"\n")
    first = pieces[0].rstrip(b"\r")
    rest = [paste.undecorate(p.decode("utf-8", "replace").rstrip("\r")).encode() for p in pieces[1:]]
    return first + b"".join(rest), end


def joined(chunk: bytes, start: int, end: int) -> bytes:
    """The physical lines chunk[start:end] as one, each piece's paste decoration dropped."""
    pieces = chunk[start:end].split(b"\n")
    return pieces[0].rstrip(b"\r") + b"".join(
        paste.undecorate(p.decode("utf-8", "replace").rstrip("\r")).encode() for p in pieces[1:])


#: At most this many pieces of one terminal-wrapped line are joined.
WRAP_PIECES = 12


def wrap_spans(chunk: bytes, ls: int, le: int) -> list[tuple[int, int]]:
    """The runs of lines around ls..le that a terminal may have wrapped from one, each
    (start, end): every piece but the last has one width (at least
    logsigns.MAX_TRIGGER columns, as the terminal showed it). First ls as a full-width
    piece, then ls as the last one (the width the piece's before it): a line as wide as
    the one after it may still be the narrower rest of a wider one before it."""
    def width(a: int, b: int) -> int:  # (as the terminal showed it: from a redraw's \r on)
        return shown_width(chunk[a:b].decode("utf-8", "replace").rstrip("\r"))

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

    out: list[tuple[int, int]] = []
    first_end = chunk.find(b"\n", ls)
    first_end = len(chunk) if first_end < 0 else first_end
    w = width(ls, first_end)
    if w >= MAX_TRIGGER and first_end < len(chunk):
        ne = chunk.find(b"\n", first_end + 1)
        if width(first_end + 1, len(chunk) if ne < 0 else ne) <= w:
            got = span(w, ls, first_end)
            if got != (ls, first_end):
                out.append((got[0], max(got[1], le)))
    if ls > 0:  # ls as the last piece
        ps = chunk.rfind(b"\n", 0, ls - 1) + 1
        pw = width(ps, ls - 1)
        if pw >= max(w, MAX_TRIGGER) and (pw > w or not out):
            got = span(pw, ps, ls - 1)
            if (got[0], max(first_end, le)) not in out:
                out.append((got[0], max(first_end, le)))
    return out


def lost_blank(left: str, right: str) -> bool:
    """Whether a blank belongs between two pieces of a wrapped line: the terminal cut
    at a blank, which began the next piece, and a Markdown paste dropped it with the
    piece's indent ("...'s watchdog" + "got stuck for 480 seconds"). Only a sign's own
    trigger says so: one holds the blank with words of it on both sides, and none spans
    the cut without it (a word cut in two: "FAILED (exit" + "code 1)" is torch's own
    "exitcode")."""
    if not left or not right or left[-1].isspace() or right[0].isspace():
        return False
    a, b = left[-MAX_TRIGGER:].encode(), right[:MAX_TRIGGER].encode()
    cut, ac = len(a), matcher().ac

    def spans(text: bytes, end: int) -> bool:
        return any(s < cut and e > end for _t, s, e in
                   ac.find_matches_as_indexes(text, overlapping=True))
    return spans(a + b" " + b, cut + 1) and not spans(a + b, cut)
