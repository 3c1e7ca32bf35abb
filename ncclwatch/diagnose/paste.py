"""What pasting does to log lines, undone before a line is read as evidence.

Logs reach ``diagnose`` through terminals, issue trackers and log viewers:
quoted with ``> ``, numbered by a viewer (``[80746] [rank0]:...``), tagged by
MPI (``[1,0]<stdout>:``), Ray (``(RayWorkerWrapper pid=4009)``, ``[repeated 7x
across cluster]``), Kubernetes (CRI files, JSON log lines) or a cluster tool
(``node.cn-d004 [stderr]``), timestamped, coloured (ANSI
escapes, or their remnants ``[36m`` once the escape byte is lost),
hard-wrapped at the terminal width (inside a word), and glued to the
previous line when a progress bar did not end its line. The tables here
name those forms; logscan.py uses the functions on the few lines that
hold a sign, so none of this costs anything on the bulk of a log.
"""

from __future__ import annotations

import json
import re

from ncclwatch.diagnose import severity

#: Decoration in front of the launcher's prefix, removed in this order.
DECORATION: tuple[tuple[str, str], ...] = (
    ("ansi", r"\x1b\[[0-9;]*[A-Za-z]"),
    ("ansi remnant", r"(?<![\w\]])\[\d{1,3}(?:;\d{1,3})*m"),
    ("markdown quote or code", r"^[ \t]*(?:>[ \t]?)+|^`+"),
    ("viewer line number", r"^\[\d+\][ \t]"),
    # Kubernetes' CRI log files: "2024-05-01T10:00:00.123456789Z stderr F <line>".
    ("kubernetes CRI", r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d) "
                       r"(?:stdout|stderr) [FP] "),
    # Ray's actor tag without a rank in it: "(RayTrainWorker pid=4009, ip=10.0.0.7) ".
    ("ray actor", r"^\s*\(\w+ pid=\d+(?:, ip=[\d.]+)?\)\s?"),
    # Ray's log deduplication: "... [repeated 7x across cluster]".
    ("ray repeat", r"\s*\[repeated \d+x across cluster\]\s*$"),
)
_DECORATION = [re.compile(rx) for _name, rx in DECORATION]
#: Rows of DECORATION a launcher or a log collector writes once per record, before any
#: terminal wraps it: a piece that starts with one starts a record. (The others a paste
#: puts on every piece, a quote or a viewer's line number, or a terminal anywhere.)
RECORD_TAGS = ("kubernetes CRI", "ray actor")
_PIECE_DECORATION = [rx for (name, _rx), rx in zip(DECORATION, _DECORATION)
                     if name not in RECORD_TAGS]
_RECORD_TAG = re.compile("|".join(f"(?:{rx})" for name, rx in DECORATION if name in RECORD_TAGS))
#: A Kubernetes CRI line that is a part of a record (tag P): the next tagged line goes on
#: with it.
_CRI_PARTIAL = re.compile(r"^\d{4}-\d\d-\d\dT\S+ (?:stdout|stderr) P ")

#: Launcher prefixes that may stand after other decoration (a host, a Ray actor, a
#: time): torchrun's ``[rank3]:`` / ``[default3]:``, ``[rank=3]`` (Determined, Ray
#: actor names), searched near the start of the line.
_LAUNCHER = re.compile(r"\[(?:rank|default)(?P<rank>\d{1,9})\]:|\[rank=(?P<rank_eq>\d{1,9})\]")
#: How far into a line a launcher prefix may start (after host, pid, time decoration).
PREFIX_REACH = 240
#: OpenMPI's --tag-output: ``[jobid,rank]<stdout>:``, also behind --timestamp-output's
#: ``2019-06-02T16:13:44.884Z: `` (kept in front of the rest: the line's time).
_MPI = re.compile(r"^(?P<time>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z?: )?"
                  r"\[\d+,(?P<rank>\d{1,9})\]<std(?:out|err|diag)>:\s?")
#: A progress bar that did not end its line: the next line's text follows it.
_PROGRESS_TAIL = re.compile(r"\d+%\|[^|]*\||/s\]|/it\]")
_PROGRESS_BAR = re.compile(r"\d+%\|[^|]*\|")
#: The end of a progress bar with more text glued right after it.
_GLUED_AFTER = re.compile(r"(?:\d+%\|[^|]*\|(?: *\d+/\d+ \[[^\]]*\])?|/s\]|/it\])(?=\S)")

#: How a log line starts (launcher prefixes, timestamps, NCCL's host:pid:tid, Python's
#: traceback lines, C++ frames). A line that starts otherwise, after a long line that
#: did not end a sentence, is the rest of that line, cut by a hard wrap.
LINE_STARTS: tuple[str, ...] = (
    r"\s*$", r"[\[(<>`{\x1b]", r"\d+: ", r"\d{4}-\d\d-\d\d", r"\d\d:\d\d:\d\d",
    r"[IWEF]\d{4} ", r"[\w.-]+:\d+:\d+ ", r"\s*File \"", r"\s*Traceback ",
    r"During handling", r"The above exception", r"[\w.]*(?:Error|Exception|Warning|Interrupt)\b:",
    r"(?:INFO|WARNING|WARN|ERROR|DEBUG|CRITICAL|FATAL)\b", r"frame #\d", r"Exception raised from",
    r"terminate called", r"\s*what\(\)", r"\s{4}", r"\w[\w ]{0,40}\|", r"\s*\d+%",
    # A progress bar with its description ("Map (num_proc=32):  91%|███", tqdm's form).
    r"[^|\n]{0,80}?\d{1,3}%\|",
    # How a process's death is printed (issue 28): the shell, libc, faulthandler, Slurm.
    r"Killed\b", r"Segmentation fault", r"Aborted \(", r"Fatal Python error", r"Error \w",
    r"(?:srun|slurmstepd): ",
    # Python's threading and unraisable hooks start their own line ("Exception in thread
    # Thread-3 (_pin_memory_loop):", "Exception ignored in: ..."); a pdsh-style host tag
    # ("worker-3: ", "node12: ", as pdsh and DeepSpeed's multi-node runner print it).
    r"Exception (?:in|ignored in)\b", r"[A-Za-z][\w.-]*\d: ",
    # nccl-tests' tables and comments ("#       size         count      type   redop").
    r"#",
    # A Python warnings-module line ("/venv/.../_initialize.py:25: UserWarning: ...").
    r"\S+\.py:\d+: \w*Warning: ",
    # A row of torchrun's failure table, its indent lost or not ("host      : node7",
    # torch 1.9's "rank: 0 (local_rank: 0)").
    r"\s*(?:time\s*: \d{4}-|host\s+: |rank\s*: \d+ \(local_rank: |exitcode\s*: -?\d+ \(pid: "
    r"|error_file\s*: |traceback\s*: |msg: \")",
)
#: ...and every launcher or platform tag the severity grammar skips (TorchX's
#: ``trainer/0 [1]:``, a syslog host, dmesg's seconds) starts one too.
_LINE_START = re.compile("|".join(f"(?:{s})" for s in LINE_STARTS
                                  + tuple(rx for _n, rx, _e in severity.TAGS)))
#: A wrapped line is long; shorter ones ended where they did.
WRAP_MIN = 60
#: At most this many wrapped lines are joined to a line.
WRAP_MAX = 4


#: Keys of structured (JSON) log lines that hold the line the program printed:
#: Docker's json-file "log", most collectors' "message"/"msg".
JSON_TEXT_KEYS = ("log", "message", "msg", "MESSAGE", "textPayload")
#: Keys holding the line's time.
JSON_TIME_KEYS = ("time", "timestamp", "ts", "@timestamp", "asctime")


def unjson(line: str) -> str:
    """The printed line inside a structured log line (Docker, Kubernetes collectors,
    JSON loggers), its time in front; other lines unchanged."""
    core = line.strip()
    if not (core.startswith("{") and core.endswith("}")):
        return line
    try:
        obj = json.loads(core)
    except ValueError:
        return line
    if not isinstance(obj, dict):
        return line
    text = next((obj[k] for k in JSON_TEXT_KEYS if isinstance(obj.get(k), str)), None)
    if text is None:
        return line
    when = next((obj[k] for k in JSON_TIME_KEYS if isinstance(obj.get(k), str)), "")
    text = text.rstrip("\n")
    return f"{when} {text}" if when and when not in text else text


def _strip(line: str, rows: list[re.Pattern[str]]) -> str:
    for _ in range(3):  # (in any nesting: a viewer's numbers on a quote, a quote of them)
        before = line
        for rx in rows:
            line = rx.sub("", line)
        if line == before:
            break
    return line


def undecorate(line: str) -> str:
    """The line without ANSI colours, quoting and viewer line numbers (in any nesting:
    a viewer's numbers on a quoted paste, a quote of numbered lines)."""
    return _strip(line, _DECORATION)


def undecorate_piece(line: str) -> str:
    """The line without what a paste or a terminal puts on every piece (colours, quotes,
    a viewer's line numbers); the tags of RECORD_TAGS kept."""
    return _strip(line, _PIECE_DECORATION)


def tagged(line: str, prev: str = "") -> bool:
    """Whether a physical line starts with a tag written once per record (RECORD_TAGS),
    behind a paste's own decoration: it starts a record, whatever text follows the tag
    (a terminal's wrap never puts one in front of a piece). ``prev``: the line before
    it (a line after a CRI partial one, tag P, goes on with it)."""
    if not _RECORD_TAG.match(undecorate_piece(line)):
        return False
    return not (prev and _CRI_PARTIAL.match(undecorate_piece(prev)))


def is_progress_bar(part: str) -> bool:
    """A progress bar split off a glued line (it is no line of a traceback)."""
    return bool(_PROGRESS_BAR.search(part) and _PROGRESS_TAIL.search(part))


def mpi_rank(line: str) -> tuple[int | None, str]:
    """(rank, rest) for an OpenMPI ``--tag-output`` line, else (None, line)."""
    m = _MPI.match(line)
    return (int(m.group("rank")), (m.group("time") or "") + line[m.end():]) if m \
        else (None, line)


def launcher_prefix(line: str) -> tuple[int | None, str]:
    """(rank, rest) where a launcher prefix follows other decoration near the start."""
    found = [m for m in _LAUNCHER.finditer(line, 0, PREFIX_REACH)
             if not _PROGRESS_TAIL.search(line, 0, m.start())]
    if not found:
        return None, line
    # torchrun's own "[rank3]:" is the innermost prefix; "[rank=3]" only where it is alone.
    m = next((m for m in found if m.group("rank") is not None), found[0])
    rank = m.group("rank") or m.group("rank_eq")
    return int(rank), line[m.end():]


def split_glued(line: str) -> list[str]:
    """A progress bar that did not end its line has the next line glued on: all parts.
    A carriage return (tqdm redrawing its bar) ends a line too, and so does another
    rank's torchrun prefix inside a line that starts with one (two ranks writing to
    one console at once: "[rank0]: saving[rank1]:[E...] Watchdog caught ...")."""
    if "\r" in line.rstrip("\r"):
        segs = [seg for seg in line.split("\r") if seg.strip()]
        return [p for seg in segs or [""] for p in split_glued(seg)]
    out, start = [], 0
    first = _LAUNCHER.match(line)
    for m in _LAUNCHER.finditer(line, 1):
        if _PROGRESS_TAIL.search(line, start, m.start()) or (
                first is not None and m.group("rank") is not None and m.start() > first.end()):
            out.append(line[start:m.start()])
            start = m.start()
    tail = line[start:]
    bar = None
    for bar in _GLUED_AFTER.finditer(tail):
        pass
    if bar is not None and bar.end() < len(tail):
        out += [tail[:bar.end()], tail[bar.end():]]
    else:
        out.append(tail)
    return out


#: A Python frame line, whole: it ends where the function's name does (the source line
#: after it, its indent lost in a paste, is no rest of it).
_FRAME_LINE = re.compile(r'File "[^"]*", line \d+, in [\w<>.]+\s*$')


def ends_line(line: str, wrapped: bool = False) -> bool:
    """Whether a physical line is complete (short, padded, ending a sentence, or a whole
    traceback frame). ``wrapped``: it is itself the last piece of a wrap, so short says
    nothing."""
    core = line.rstrip()
    if (len(core) < WRAP_MIN and not wrapped) or len(line) - len(core) >= 2:
        return True
    return core.endswith((".", "!", "?", ")", "]", "}")) or bool(_FRAME_LINE.search(core))


def continues(line: str) -> bool:
    """Whether a physical line can be the rest of the previous one (hard wrap)."""
    return not _LINE_START.match(line)
