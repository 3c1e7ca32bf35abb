"""Ranks, process groups and times from where launchers and loggers put them.

A line's rank is in its prefix (torchrun's ``[rank3]:``, ``srun --label``'s
``3: ``, a trainer's ``[rank 3]``), in torch's own ``[PG 3 Rank 2]`` tag, or in
the name of a per-rank file; its time is a stamp in one of a few formats.
These are pure functions of text, apart from the scan that calls them.
"""

from __future__ import annotations

import datetime as _dt
import re

from ncclwatch.diagnose import paste
from ncclwatch.diagnose.logsigns import PG_TAG

#: `3: ` (srun --label, task id), then `[rank3]:` / `[default3]:` (torchrun) or a
#: trainer's `[rank 3]`, in that order.
_PREFIX = re.compile(r"^(?:\s*(?P<task>\d{1,9}): )?(?:\[(?P<role>[A-Za-z_]*?)(?P<rank>\d{1,9})\]:"
                     r"|\[[Rr]ank (?P<rank2>\d{1,9})\]:?(?= ))?")
#: A launcher rank prefix anywhere in a sample of bytes (is a file rank-prefixed?).
PREFIX_SAMPLE = re.compile(rb"\[(?:rank|default)(\d{1,9})\]:")
_PG_TAG = re.compile(PG_TAG)
#: Process groups whose ranks are the global ranks.
DEFAULT_PG = frozenset({"0", "default_pg"})
#: An ``srun --label`` task id alone at a line's start.
TASK_PREFIX = re.compile(r"^\s*(\d{1,9}): ")
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
