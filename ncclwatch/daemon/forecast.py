"""Forecasts from a rank's evidence curve: when the save ends, when memory runs out.

"rank 0 is writing 140 GB at 300 MB/s, it needs 470 s more, you have 410 s"
is the product: the watchdog budget alone says how long the others can wait,
these say how long they will have to. Rates are least-squares slopes over
the last ``WINDOW`` seconds of the curve (robust to one late report); in a
save's first seconds, before a fit has its points, the rate is what is
already known: the file's growth since the agent first saw it.

The size a save will reach comes, most trusted first, from the file itself
as the agent read it (its torch.save / safetensors header, or the file a
copy reads: exact), the previous checkpoint beside it, then the host memory
the rank gathered (a first-order guess).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from ncclwatch.daemon.curve import CURVE_DETAIL, Point
from ncclwatch.daemon.records import RankRecord
from ncclwatch.savefit import save_seconds

#: Seconds of curve a rate is fitted over (the curve keeps detail that long).
WINDOW = 15.0
assert WINDOW <= CURVE_DETAIL
#: A forecast needs at least this many points spanning this many seconds.
MIN_POINTS = 3
MIN_SPAN = 2.0
#: Growth below this (bytes/s) is noise, not a trend toward a limit.
MIN_GROWTH = 256 * 1024
#: Gathered bytes count as the expected checkpoint size above this.
MIN_GATHERED = 1 << 20
#: An early rate (before a fit) needs the file seen this far apart.
EARLY_SPAN = 0.9
#: Sizes read from the file itself: a forecast on them may overrule the
#: "half the budget is gone" rule (diagnosis.RISK_FRACTION).
EXACT_SOURCES = frozenset({"torch_zip_header", "safetensors_header", "copy_source",
                           "file_closed"})


@dataclass(frozen=True)
class WriteForecast:
    """How far the culprit's checkpoint write is and when it will end."""

    rank: int
    path: str
    written_bytes: int
    expected_bytes: int | None
    #: torch_zip_header | safetensors_header | copy_source | previous_checkpoint
    #: | gathered_bytes | file_closed | "" (unknown)
    expected_source: str
    previous_path: str
    rate_bytes_per_second: float
    eta_seconds: float | None     # None: size or rate unknown
    rate_source: str = ""         # fit | since_first_seen | write_calls | ""

    @property
    def exact(self) -> bool:
        """The expected size is the file's own (header, copy source, closed)."""
        return self.expected_source in EXACT_SOURCES


@dataclass(frozen=True)
class MemoryForecast:
    """When a growing rank reaches its nearest memory bound."""

    rank: int
    device: str                   # host | cgroup | address_space | gpu<i>
    used_bytes: int
    limit_bytes: int
    rate_bytes_per_second: float
    eta_seconds: float | None     # None: not growing

    @property
    def headroom_bytes(self) -> int:
        return max(0, self.limit_bytes - self.used_bytes)


def slope(points: Sequence[Point], value: Callable[[Point], float | None], now: float,
          window: float = WINDOW) -> float | None:
    """Least-squares rate of ``value`` over the recent points, or None.

    Points where ``value`` is None (the reading did not exist yet) are left out.
    """
    pts = [(p.t, v) for p in points if now - p.t <= window and (v := value(p)) is not None]
    if len(pts) < MIN_POINTS or pts[-1][0] - pts[0][0] < MIN_SPAN:
        return None
    n = len(pts)
    mt = sum(t for t, _ in pts) / n
    mv = sum(v for _, v in pts) / n
    den = sum((t - mt) ** 2 for t, _ in pts)
    if den <= 0:
        return None
    return sum((t - mt) * (v - mv) for t, v in pts) / den


#: How far past the previous checkpoint's size a file may grow and still be read
#: as ending (zip records, a few new keys): 2% and 64 KiB.
PAST_PREVIOUS_RATIO = 0.02
PAST_PREVIOUS_BYTES = 64 << 10


def write_forecast(rec: RankRecord, now: float) -> WriteForecast | None:
    """Forecast of the checkpoint file the rank is writing (None: no file)."""
    if not rec.files:
        return _closed_write(rec, now)
    path, size, prev_path, prev_size, exact, exact_source = rec.files[0]
    if exact > 0 and size > exact:
        # The file outgrew the size its header gave: the header described only
        # its first record (DCP's .distcp files hold one per item), not the file.
        exact, exact_source = 0, ""
    first_path, first_written, first_size = rec.file_first
    if exact > 0 and first_path == path and first_size == exact == size:
        # Full-size from the first look (preallocated: safetensors and others set
        # the length, then fill it): the size says nothing; the bytes the rank
        # has pushed through write() since say how far it got.
        size = min(exact, max(0, rec.io_write_bytes - first_written))
        rate, rate_source = _write_call_rate(rec, path, now)
    else:
        rate, rate_source = write_rate(rec, path, size, now)
    expected, source = None, ""
    gathered = gathered_bytes(rec)
    if exact > 0 and exact_source:
        expected, source = max(exact, size), exact_source
    elif prev_size > 0 and prev_size >= size:
        expected, source = prev_size, "previous_checkpoint"
    elif gathered >= MIN_GATHERED and gathered >= size:
        expected, source = gathered, "gathered_bytes"
    elif prev_size > 0 and size <= prev_size * (1 + PAST_PREVIOUS_RATIO) + PAST_PREVIOUS_BYTES:
        # Just past the previous checkpoint's size (zip records, a few new keys):
        # the write is at its end, not of unknown length. Far past it, the
        # "previous" file was another thing (DCP: a peer rank's small shard of
        # this very save) and says nothing: the size is unknown.
        expected, source = size, "previous_checkpoint"
    eta = save_seconds(expected, size, rate)
    return WriteForecast(rank=rec.rank, path=path, written_bytes=size, expected_bytes=expected,
                         expected_source=source, previous_path=prev_path if prev_size else "",
                         rate_bytes_per_second=rate, eta_seconds=eta, rate_source=rate_source)


def _write_call_rate(rec: RankRecord, path: str, now: float) -> tuple[float, str]:
    """Bytes/s the rank pushes through write() while ``path`` is open: a fit, or
    early on its writes since the first point with the file."""
    same = [p for p in rec.curve.recent() if p.file == path]
    rate = slope(same, lambda p: p.written, now)
    if rate is not None and rate > 0:
        return rate, "write_calls"
    if same and rec.seen - same[0].t >= EARLY_SPAN and rec.io_write_bytes > same[0].written:
        return (rec.io_write_bytes - same[0].written) / (rec.seen - same[0].t), "write_calls"
    return 0.0, ""


def write_rate(rec: RankRecord, path: str, size: int, now: float) -> tuple[float, str]:
    """Bytes/s the rank writes ``path`` at, and how that was estimated.

    A least-squares fit needs MIN_POINTS points over MIN_SPAN seconds, which a
    save only has after a few seconds, and with a tight budget those are the
    seconds that matter. Until then, use what is known: the file's growth from
    the first time the agent saw it to the latest report (a steady writer's
    rate from its second report on). If the file does not grow visibly
    (a buffered writer), the bytes the process pushed through write() since.
    """
    recent = rec.curve.recent()
    same = [p for p in recent if p.file == path]
    rate = slope(same, lambda p: p.file_size, now)
    if rate is not None and rate > 0:
        return rate, "fit"
    if same and rec.seen - same[0].t >= EARLY_SPAN and size > same[0].file_size:
        return (size - same[0].file_size) / (rec.seen - same[0].t), "since_first_seen"
    # Only points since the file appeared: the seconds before the save (nothing
    # written) would dilute the rate and make the save look longer than it is.
    since = [p for p in recent if p.t >= same[0].t] if same else recent
    rate = slope(since, lambda p: p.written, now)
    if rate is not None and rate > 0:
        return rate, "write_calls"
    return 0.0, ""


def _closed_write(rec: RankRecord, now: float) -> WriteForecast | None:
    """The file the rank just closed: its write is over (eta 0), not unknown.

    /proc is read every round but stacks less often, so a rank can still
    look "saving" for a round or two after torch.save closed its file.
    """
    last = next((p for p in reversed(rec.curve.recent()) if p.file), None)
    if last is None or now - last.t > WINDOW:
        return None
    return WriteForecast(rank=rec.rank, path=last.file, written_bytes=last.file_size,
                         expected_bytes=last.file_size, expected_source="file_closed",
                         previous_path="", rate_bytes_per_second=0.0, eta_seconds=0.0)


def gathered_bytes(rec: RankRecord) -> int:
    """Host memory the rank took on since it started checkpoint work.

    The curve's lowest RSS before ``since`` is the rank's steady state; what
    it holds above that now is, to first order, the state it gathered.
    """
    before = [rss for t, rss in rec.curve.rss_points() if t <= rec.since]
    base = min(before) if before else (rec.curve.first_rss() if rec.curve else rec.rss_bytes)
    return max(0, rec.rss_bytes - base)


def memory_forecasts(rec: RankRecord, now: float) -> list[MemoryForecast]:
    """One forecast per memory bound of the rank, nearest exhaustion first."""
    out = []
    recent = rec.curve.recent() if rec.limits else []
    for device, used, limit in rec.limits:
        rate = slope(recent, _used_of(device), now)
        eta = None
        if rate is not None and rate >= MIN_GROWTH:
            eta = max(0.0, (limit - used) / rate)
        out.append(MemoryForecast(rank=rec.rank, device=device, used_bytes=used,
                                  limit_bytes=limit, rate_bytes_per_second=rate or 0.0,
                                  eta_seconds=eta))
    out.sort(key=lambda f: (f.eta_seconds is None, f.eta_seconds or 0.0, f.headroom_bytes))
    return out


def _used_of(device: str) -> Callable[[Point], float | None]:
    def used(p: Point) -> float | None:
        for d, u, _ in p.limits:
            if d == device:
                return u
        return None
    return used
