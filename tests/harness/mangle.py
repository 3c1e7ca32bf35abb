"""What terminals, notebooks, CI logs and issue trackers do to a log on its way to a paste.

One table of transformations (``TABLE``), each a function of the log's text and a
seeded ``random.Random``. tests/data/diagnose/make_twins.py writes the corpus's
mangled twins with them (``TWINS``: which rows make each twin),
tests/unit/test_logstream_mangled.py mixes them as a property, and
tests/unit/diagnose/test_paste.py damages the corpus with its rows (``PASTE_ROWS``).
They live in tests, not in the product: ``ncclwatch.logstream.Normaliser`` undoes
what they do, and the two are written apart so that one is a check on the other.

The shapes are the field's: tqdm redraws its bar with a carriage return and a
line printed meanwhile by another rank lands right after the bar (tqdm's
``\\r`` + bar, no newline); rich clears the line first (``\\r\\x1b[2K``) and
colours numbers, paths and levels, links paths with OSC 8; a terminal or a
CI viewer cuts lines at a fixed column, counting display cells (colour codes
take none, East Asian wide characters two, a carriage return goes back to
column 0); GitHub quotes with ``> ``, pages copied from HTML keep ``&lt;``
and ``&quot;``, Markdown drops indentation and leaves fences; Windows ends
lines with ``\\r\\n``.
"""

from __future__ import annotations

import html
import random
import re
import unicodedata
from typing import Callable

Transform = Callable[[str, random.Random], str]

_ESC = re.compile(r"\x1b(?:\[[0-9;?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")


def _lines(text: str) -> tuple[list[str], bool]:
    lines = text.split("\n")
    tail = lines[-1] == ""
    return (lines[:-1] if tail else lines), tail


def _join(lines: list[str], tail: bool) -> str:
    return "\n".join(lines) + ("\n" if tail else "")


# -- the program's own output: colours and progress bars ------------------------------

_LEVEL = re.compile(r"\b(ERROR|WARNING|WARN|INFO|CRITICAL|FATAL|DEBUG)\b")
_NUMBER = re.compile(r"(?<![\w.])(\d+)(?![\w.])")
_PATH = re.compile(r"(/[\w.-]+){2,}")
_COLOURS = ("31", "32", "33", "34", "35", "36", "1;31", "1;36", "2", "1")


def colour(text: str, rng: random.Random) -> str:
    """rich / a coloured logger: a window title (OSC 0) first, levels and numbers
    coloured (rich's highlighter colours numbers anywhere, inside a message too),
    paths linked (OSC 8), some lines coloured whole."""
    lines, tail = _lines(text)
    out = []
    for ln in lines:
        r = rng.random()
        if r < 0.3:
            ln = _NUMBER.sub(lambda m: f"\x1b[1;36m{m.group(1)}\x1b[0m", ln)
        elif r < 0.5:
            c = rng.choice(_COLOURS)
            ln = f"\x1b[{c}m{ln}\x1b[0m" if ln else ln
        elif r < 0.65:
            ln = _PATH.sub(lambda m: f"\x1b]8;;file://{m.group(0)}\x1b\\{m.group(0)}\x1b]8;;\x1b\\",
                           ln, count=1)
        ln = _LEVEL.sub(lambda m: f"\x1b[{rng.choice(_COLOURS)}m{m.group(1)}\x1b[0m", ln)
        out.append(ln)
    if out:
        out[0] = "\x1b]0;train.sh\x07" + out[0]
    return _join(out, tail)


def _bar(n: int, total: int, rng: random.Random) -> str:
    pct = 100 * n // total
    fill = "█" * (pct // 10) + ("▋" if pct % 10 >= 5 else "")
    rate = f"{rng.uniform(1, 9):.2f}it/s"
    return f"Training: {pct:3d}%|{fill:<10}| {n}/{total} [00:{n % 60:02d}<03:06, {rate}]"


#: How a record starts (this file's own, rough test): a progress bar lands before a record
#: the program printed, never inside a line a terminal had already wrapped (a paste that
#: was wrapped before it reached the corpus keeps its pieces).
_RECORD = re.compile(r"\s*(?:\[|\(|\d{4}-\d\d-\d\d|[IWEF]\d{4} |\d+: |[A-Z]{3,}\b|Traceback|File "
                     r"\"|[\w.]*(?:Error|Exception)\b|[\w.-]+ \[std|[\w.-]+: |\S+\.py:\d+: )")


def _starts_record(lines: list[str], i: int) -> bool:
    prev = lines[i - 1] if i else ""
    return bool(_RECORD.match(lines[i])) or len(prev.rstrip()) < 60


def redrawn_bar(text: str, rng: random.Random) -> str:
    """A progress bar redrawn with carriage returns (tqdm; rich clearing the line
    with ESC[2K first) on the terminal the job writes to: lines printed while it
    runs land after the bar's last redraw, on its line; some redraws end up on
    lines of their own."""
    lines, tail = _lines(text)
    if not lines:
        return text
    total = rng.randrange(50, 2000)
    n = rng.randrange(1, total // 2)
    rich = rng.random() < 0.4
    out = []
    starts = [i for i in range(len(lines)) if _starts_record(lines, i)] or [0]
    picked = {i for i in starts if rng.random() < 0.35} or {rng.choice(starts)}
    for i, ln in enumerate(lines):
        if i in picked:
            redraws = []
            for _ in range(rng.randrange(1, 4)):
                n = min(total - 1, n + rng.randrange(1, 9))
                redraws.append(("\r\x1b[2K" if rich else "\r") + _bar(n, total, rng))
            if rng.random() < 0.2:
                out.append("".join(redraws))  # the bar on a line of its own
                out.append(ln)
            else:
                out.append("".join(redraws) + ln)
        else:
            out.append(ln)
    return _join(out, tail)


# -- the terminal: hard wraps -----------------------------------------------------------

def _cells(ch: str) -> int:
    if ch == "\t":
        return 8  # (a tab's stop, counted whole: close enough for a cut point)
    if unicodedata.combining(ch):
        return 0
    return 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1


def hard_wrap(text: str, width: int) -> str:
    """A terminal (or a CI log viewer) cutting every line at ``width`` display cells:
    colour and OSC sequences take no cells, a carriage return goes back to column 0,
    a wide character that does not fit goes to the next row."""
    lines, tail = _lines(text)
    out = []
    for ln in lines:
        rows, cur, col, i = [], [], 0, 0
        while i < len(ln):
            m = _ESC.match(ln, i) if ln[i] == "\x1b" else None
            if m:
                cur.append(m.group(0))
                i = m.end()
                continue
            ch = ln[i]
            if ch == "\r":
                cur.append(ch)
                col = 0
                i += 1
                continue
            w = _cells(ch)
            if col + w > width:
                rows.append("".join(cur))
                cur, col = [], 0
            cur.append(ch)
            col += w
            i += 1
        rows.append("".join(cur))
        out.extend(rows)
    return _join(out, tail)


def wrap80(text: str, rng: random.Random) -> str:
    return hard_wrap(text, 80)


def wrap120(text: str, rng: random.Random) -> str:
    return hard_wrap(text, 120)


def wrap_any(text: str, rng: random.Random) -> str:
    """A terminal of any common width (80 to 200 columns)."""
    return hard_wrap(text, rng.randrange(80, 201))


# -- the paste: Markdown, HTML, Windows ------------------------------------------------

def unindent(text: str, rng: random.Random) -> str:
    """Markdown outside a code block: leading whitespace dropped."""
    lines, tail = _lines(text)
    return _join([ln.lstrip(" \t") for ln in lines], tail)


def entities(text: str, rng: random.Random) -> str:
    """Copied from a page's HTML (or an e-mail of it): &, <, >, quotes as entities."""
    return html.escape(text, quote=True)


def quote(text: str, rng: random.Random) -> str:
    """GitHub's quote reply: ``> `` before every line (``>`` alone on an empty one)."""
    lines, tail = _lines(text)
    return _join([f"> {ln}" if ln else ">" for ln in lines], tail)


def fence(text: str, rng: random.Random) -> str:
    """A code fence around the paste, a language tag on the opening one."""
    lines, tail = _lines(text)
    return _join([rng.choice(["```", "```text", "```shell", "```python"]), *lines, "```"], tail)


def crlf(text: str, rng: random.Random) -> str:
    """Windows line endings."""
    return text.replace("\n", "\r\n")


# -- launchers and viewers: tags in front of lines ------------------------------------

_LAUNCHER = re.compile(r"^\[(?:rank|default)(\d+)\]:")


def _by_lines(fn: Callable[[list[str], random.Random], list[str]]) -> Transform:
    def transform(text: str, rng: random.Random) -> str:
        lines, tail = _lines(text)
        return _join(fn(lines, rng), tail)
    transform.__doc__ = fn.__doc__
    return transform


@_by_lines
def line_numbers(lines: list[str], rng: random.Random) -> list[str]:
    """A log viewer's line numbers (``[80746] ``) copied with the text."""
    start = rng.randrange(1, 90000)
    return [f"[{start + i}] {ln}" for i, ln in enumerate(lines)]


@_by_lines
def mpi_tags(lines: list[str], rng: random.Random) -> list[str]:
    """mpirun --tag-output's ``[1,N]<stdout>:`` where torchrun put ``[rankN]:``."""
    return [_LAUNCHER.sub(lambda m: f"[1,{m.group(1)}]<stdout>:", ln) for ln in lines]


@_by_lines
def time_host(lines: list[str], rng: random.Random) -> list[str]:
    """A time and a host (or a Ray actor) in front of the launcher's prefix."""
    host = rng.choice(["gpu-node-07", "bench.cn-d004 [stderr]", "(RayWorker pid=4009)"])
    return [f"{rng.randrange(24):02d}:{rng.randrange(60):02d}:07.512 {host} {ln}"
            if _LAUNCHER.match(ln) else ln for ln in lines]


@_by_lines
def ansi_prefixed(lines: list[str], rng: random.Random) -> list[str]:
    """A colour around each rank-prefixed line."""
    return [f"\x1b[3{rng.randrange(8)}m{ln}\x1b[0m" if _LAUNCHER.match(ln) else ln
            for ln in lines]


@_by_lines
def glued_bar(lines: list[str], rng: random.Random) -> list[str]:
    """A finished bar's last draw with one rank-prefixed line glued right after it."""
    idx = [i for i, ln in enumerate(lines) if _LAUNCHER.match(ln)]
    if not idx:
        return lines
    out = list(lines)
    i = rng.choice(idx)
    n = rng.randrange(1, 999)
    out[i] = f" {n // 10}%|▋         | {n}/1000 [00:14<03:06,  4.99it/s]" + out[i]
    return out


def _triggers() -> list[str]:
    from ncclwatch.diagnose.matcher import matcher  # (the product's own triggers)
    return [t.decode() for t in matcher().triggers]


#: A line is wrapped where it is at least this wide, and cut at least this far in.
_CUT_FROM = 60


@_by_lines
def wrap_in_trigger(lines: list[str], rng: random.Random) -> list[str]:
    """One long line that holds a sign's trigger cut in two inside a word, the cut at
    least 60 visible columns in (a trigger cut in two is found)."""
    triggers = _triggers()
    choices = []
    for i, ln in enumerate(lines):
        if len(ln) < 100 or not any(t in _ESC.sub("", ln) for t in triggers):
            continue
        cuts = [c for c in range(_CUT_FROM + 1, len(ln) - 1)
                if len(_ESC.sub("", ln[:c])) > _CUT_FROM
                and ln[c - 1].islower() and ln[c].islower()]
        if cuts:
            choices.append((i, cuts))
    if not choices:
        return lines
    i, cuts = rng.choice(choices)
    c = rng.choice(cuts)
    return lines[:i] + [lines[i][:c], lines[i][c:]] + lines[i + 1:]


#: Every transformation, in the order a log meets them (the program, the launcher, the
#: terminal, the viewer, the paste): a mix applies its rows in this order.
TABLE: dict[str, Transform] = {
    "colour": colour,
    "ansi_prefixed": ansi_prefixed,
    "redrawn_bar": redrawn_bar,
    "glued_bar": glued_bar,
    "mpi_tags": mpi_tags,
    "time_host": time_host,
    "wrap80": wrap80,
    "wrap120": wrap120,
    "wrap_any": wrap_any,
    "wrap_in_trigger": wrap_in_trigger,
    "line_numbers": line_numbers,
    "unindent": unindent,
    "entities": entities,
    "quote": quote,
    "fence": fence,
    "crlf": crlf,
}

#: The corpus's twins: a twin's name, and the rows of TABLE that make it.
TWINS: dict[str, tuple[str, ...]] = {
    "wrap80": ("wrap80",),
    "wrap120": ("wrap120",),
    "bar": ("redrawn_bar",),
    "colour": ("colour",),
    "markdown": ("unindent", "entities", "quote"),
}

#: Rows that exclude each other in one mix (one terminal width).
EXCLUSIVE: tuple[frozenset[str], ...] = (
    frozenset({"wrap80", "wrap120", "wrap_any", "wrap_in_trigger"}),)
#: The rows of the issue-tracker damage whose verdict must stay the same in any order
#: (tests/unit/diagnose/test_paste.py: the launcher's and the viewer's tags, quoting, a bar
#: glued after a finished one, a wrap inside a trigger, Windows line ends, a fence).
PASTE_ROWS = ("quote", "line_numbers", "mpi_tags", "time_host", "ansi_prefixed", "glued_bar",
              "wrap_in_trigger", "crlf", "fence")


def mangle(text: str, rows: list[str] | tuple[str, ...], seed: int) -> str:
    """``text`` through the rows of TABLE named, in TABLE's order, with one seeded rng."""
    rng = random.Random(seed)
    for name in TABLE:
        if name in rows:
            text = TABLE[name](text, rng)
    return text
