"""Each rank's evidence curve: memory, I/O and the file it writes, over time.

The forecasts (forecast.py) read it: whether a save finishes before the
watchdog, whether a gather runs out of memory first. Bounded per rank in
points and in span, so a steady rank keeps a handful of points, not 90.
"""

from __future__ import annotations

from array import array

#: Evidence curve per rank: points at least this far apart, this many kept.
CURVE_STEP = 0.9
CURVE_POINTS = 90
#: ... and none older than this before the newest: a steady rank (protocol 2
#: sends it in full once a snapshot) keeps a handful of points, not 90.
CURVE_SPAN = CURVE_POINTS * CURVE_STEP


class Point:
    """One point of a rank's evidence curve (memory, I/O, the file it writes)."""

    __slots__ = ("t", "rss", "written", "file", "file_size", "limits")

    def __init__(self, t: float, rss: int, written: int, file: str, file_size: int,
                 limits: tuple[tuple[str, int, int], ...]) -> None:
        self.t, self.rss, self.written = t, rss, written
        self.file, self.file_size = file, file_size
        self.limits = limits


#: Detail (all but time and RSS) is kept for points this close to the newest:
#: forecasts fit over the last forecast.WINDOW seconds before "now" (never
#: earlier than the newest point), so older detail is never read.
CURVE_DETAIL = 15.0


class Curve:
    """A rank's evidence curve, kept as machine numbers rather than objects.

    Every rank has one (any rank can turn culprit, and its forecast then
    needs the minute before), so at 16k ranks the curves are a large part of
    the daemon's memory. A curve of ``Point`` objects with their tuples cost
    ~80 KiB per rank; here it is two containers:

    - time and RSS of the last ``CURVE_POINTS`` points, interleaved in one
      fixed-width ``array`` (``gathered_bytes`` looks for the RSS before the
      rank's state began);
    - for the points within ``CURVE_DETAIL`` seconds of the newest, the bytes
      written, the file being written and the memory bounds: references to
      the record's own tuples of that sample (immutable), not copies.

    ``recent()`` rebuilds those points as ``Point`` objects on demand:
    forecasts run for culprits only. A steady rank (protocol 2 sends it in
    full once a snapshot) holds two or three points.
    """

    __slots__ = ("_tr", "_detail")

    def __init__(self) -> None:
        self._tr = array("d")     # t0, rss0, t1, rss1, ...: oldest first
        #: (written, the file's (path, size, ...) or None, limits) of the newest points
        self._detail: list[tuple[int, tuple | None, tuple[tuple[str, int, int], ...]]] = []

    def __len__(self) -> int:
        return len(self._tr) >> 1

    @property
    def t(self) -> array:
        """The points' times, oldest first (a copy)."""
        return self._tr[0::2]

    @property
    def rss(self) -> list[int]:
        """The points' RSS, oldest first (a copy)."""
        return [int(x) for x in self._tr[1::2]]

    def add(self, t: float, rss: int, written: int,
            files: tuple[tuple[str, int, str, int, int, str], ...],
            limits: tuple[tuple[str, int, int], ...]) -> None:
        """Append a point unless the newest is less than ``CURVE_STEP`` old."""
        tr = self._tr
        if tr and t - tr[-2] < CURVE_STEP:
            return
        tr.append(t)
        tr.append(rss)
        n, old = len(tr) >> 1, 0
        while n - old > CURVE_POINTS or tr[2 * old] < t - CURVE_SPAN:
            old += 1  # never the newest: t - CURVE_SPAN < t
        if old:
            del tr[:2 * old]
            n -= old
        detail = self._detail
        detail.append((written, files[0] if files else None, limits))
        # Drop detail older than CURVE_DETAIL (and any the time ring has dropped).
        first, drop = n - len(detail), 0
        while len(detail) - drop > 1 and (first < 0 or t - tr[2 * first] > CURVE_DETAIL):
            drop += 1
            first += 1
        if drop:
            del detail[:drop]

    def recent(self) -> list[Point]:
        """The points within ``CURVE_DETAIL`` of the newest, oldest first."""
        tr = self._tr
        first = (len(tr) >> 1) - len(self._detail)
        out = []
        for i, (written, f, limits) in enumerate(self._detail):
            k = 2 * (first + i)
            out.append(Point(tr[k], int(tr[k + 1]), written, f[0] if f else "",
                             f[1] if f else 0, limits))
        return out

    def rss_points(self) -> zip:
        """(time, RSS) of every point, oldest first."""
        tr = self._tr
        return zip(tr[0::2], map(int, tr[1::2]))

    def first_rss(self) -> int:
        """The RSS of the oldest point (the curve holds one)."""
        return int(self._tr[1])
