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


class Curve(array):
    """A rank's evidence curve, kept as machine numbers rather than objects.

    Every rank has one (any rank can turn culprit, and its forecast then
    needs the minute before), so at 16k ranks the curves are a large part of
    the daemon's memory. A curve of ``Point`` objects with their tuples cost
    ~80 KiB per rank; here it is one array and its flat detail:

    - the curve is itself the ``array`` of the time and RSS of the last
      ``CURVE_POINTS`` points, interleaved (``gathered_bytes`` looks for the
      RSS before the rank's state began);
    - for the points within ``CURVE_DETAIL`` seconds of the newest, the bytes
      written, the file being written and the memory bounds, three items a
      point, flat (no tuple per point): a tuple while it is one point's (a
      steady rank's), a list while more: references to the record's own
      tuples of that sample (immutable), not copies.

    ``recent()`` rebuilds those points as ``Point`` objects on demand:
    forecasts run for culprits only. A steady rank (protocol 2 sends it in
    full once a snapshot) holds two or three points and one point's detail.
    """

    __slots__ = ("_n", "_detail")

    def __new__(cls) -> "Curve":
        return super().__new__(cls, "d")   # t0, rss0, t1, rss1, ...: oldest first

    def __init__(self) -> None:
        self._n = 0           # points (the array holds two numbers a point)
        #: written, the file's (path, size, ...) or None, limits: of each of
        #: the newest points, oldest first, flat (a tuple for one point)
        self._detail: tuple | list = ()

    def __len__(self) -> int:
        return self._n

    def __bool__(self) -> bool:
        return self._n > 0

    @property
    def t(self) -> array:
        """The points' times, oldest first (a copy: a plain array)."""
        return self[0::2]

    @property
    def rss(self) -> list[int]:
        """The points' RSS, oldest first (a copy)."""
        return [int(x) for x in self[1::2]]

    def add(self, t: float, rss: int, written: int,
            files: tuple[tuple[str, int, str, int, int, str], ...],
            limits: tuple[tuple[str, int, int], ...]) -> None:
        """Append a point unless the newest is less than ``CURVE_STEP`` old."""
        n = self._n
        if n and t - self[-2] < CURVE_STEP:
            return
        self.append(t)
        self.append(rss)
        n, old = n + 1, 0
        while n - old > CURVE_POINTS or self[2 * old] < t - CURVE_SPAN:
            old += 1  # never the newest: t - CURVE_SPAN < t
        if old:
            del self[:2 * old]
            n -= old
        self._n = n
        detail = self._detail
        if not detail:
            self._detail = (written, files[0] if files else None, limits)
            return
        if type(detail) is tuple:      # one point's, the point before this one
            if n < 2 or t - self[2 * n - 4] > CURVE_DETAIL:   # dropped: a steady rank
                self._detail = (written, files[0] if files else None, limits)
                return
            detail = self._detail = list(detail)      # a list while there are more
        detail += (written, files[0] if files else None, limits)
        # Drop detail older than CURVE_DETAIL (and any the time ring has dropped).
        kept = len(detail) // 3
        first, drop = n - kept, 0
        while kept - drop > 1 and (first < 0 or t - self[2 * first] > CURVE_DETAIL):
            drop += 1
            first += 1
        if drop:
            del detail[:3 * drop]
            if kept - drop == 1:
                self._detail = tuple(detail)

    def recent(self) -> list[Point]:
        """The points within ``CURVE_DETAIL`` of the newest, oldest first."""
        detail = self._detail
        k = 2 * (self._n - len(detail) // 3)
        out = []
        for i in range(0, len(detail), 3):
            written, f, limits = detail[i:i + 3]
            out.append(Point(self[k], int(self[k + 1]), written, f[0] if f else "",
                             f[1] if f else 0, limits))
            k += 2
        return out

    def rss_points(self) -> zip:
        """(time, RSS) of every point, oldest first."""
        return zip(self[0::2], map(int, self[1::2]))

    def first_rss(self) -> int:
        """The RSS of the oldest point (the curve holds one)."""
        return int(self[1])
