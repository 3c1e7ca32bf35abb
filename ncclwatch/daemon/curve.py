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
#: Device-name tuples of memory bounds, shared between points (bounded).
_SHAPES: dict[tuple[str, ...], tuple[str, ...]] = {}


class Curve:
    """A rank's evidence curve, kept as machine numbers rather than objects.

    Every rank has one (any rank can turn culprit, and its forecast then
    needs the minute before), so at 16k ranks the curves are most of the
    daemon's memory. A curve of ``Point`` objects with their tuples cost
    ~80 KiB per rank; here it is two rings of ``array`` values:

    - time and RSS of the last ``CURVE_POINTS`` points (``gathered_bytes``
      looks for the RSS before the rank's state began);
    - bytes written, the file being written and the memory bounds for the
      points within ``CURVE_DETAIL`` seconds of the newest (rate fits).

    ``recent()`` rebuilds those points as ``Point`` objects on demand:
    forecasts run for culprits only.
    """

    __slots__ = ("t", "rss", "_written", "_file", "_shape", "_bounds", "_detail")

    def __init__(self) -> None:
        self.t = array("d")
        self.rss = array("Q")
        self._detail = 0                          # points with detail: the newest ones
        self._written = array("Q")
        self._file: list[tuple[str, int] | None] = []
        self._shape: list[tuple[str, ...]] = []   # device names of each point's bounds
        self._bounds = array("Q")                 # used, limit per device, point after point

    def __len__(self) -> int:
        return len(self.t)

    def add(self, t: float, rss: int, written: int,
            files: tuple[tuple[str, int, str, int, int, str], ...],
            limits: tuple[tuple[str, int, int], ...]) -> None:
        """Append a point unless the newest is less than ``CURVE_STEP`` old."""
        ts = self.t
        if ts and t - ts[-1] < CURVE_STEP:
            return
        ts.append(t)
        self.rss.append(rss)
        old = 0
        while len(ts) - old > CURVE_POINTS or ts[old] < t - CURVE_SPAN:
            old += 1  # never the newest: t - CURVE_SPAN < t
        if old:
            del ts[:old]
            del self.rss[:old]
        self._written.append(written)
        self._file.append((files[0][0], files[0][1]) if files else None)
        names = tuple([d for d, _, _ in limits])
        self._shape.append(_SHAPES.setdefault(names, names) if len(_SHAPES) < 4096 else names)
        for _, used, limit in limits:
            self._bounds.append(used)
            self._bounds.append(limit)
        self._detail += 1
        # Drop detail older than CURVE_DETAIL (and any the time ring has dropped).
        first = len(ts) - self._detail
        while self._detail > 1 and (first < 0 or t - ts[first] > CURVE_DETAIL):
            del self._written[0]
            del self._file[0]
            del self._bounds[:2 * len(self._shape.pop(0))]
            self._detail -= 1
            first += 1

    def recent(self) -> list[Point]:
        """The points within ``CURVE_DETAIL`` of the newest, oldest first."""
        out, j = [], 0
        first = len(self.t) - self._detail
        b = self._bounds
        for i in range(self._detail):
            names = self._shape[i]
            limits = tuple([(d, b[j + 2 * k], b[j + 2 * k + 1]) for k, d in enumerate(names)])
            j += 2 * len(names)
            f = self._file[i]
            out.append(Point(self.t[first + i], self.rss[first + i], self._written[i],
                             f[0] if f else "", f[1] if f else 0, limits))
        return out

    def rss_points(self) -> zip:
        """(time, RSS) of every point, oldest first."""
        return zip(self.t, self.rss)
