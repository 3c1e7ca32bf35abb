"""Pauses of a rank, seen from outside: who ptrace-stopped it, and for how long.

A Python dump (``py-spy dump --nonblocking``) reads a rank's memory without
stopping it; a native dump (``--native``) attaches with ptrace and stops every
thread while it unwinds (ncclwatch/agent/pyspy.py). So a rank is paused exactly
while ``/proc/PID/status`` names a tracer (``TracerPid``) or shows it stopped
(``t``). Polling that every 10 ms measures the agent's pauses of each rank
without asking the agent: what the benchmark reports per rank-hour and what the
matrix asserts for healthy jobs (a native dump stops a rank 0.2-1 s; a pause
under one poll can be missed, not invented).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

POLL_SECONDS = 0.01


@dataclass
class Pause:
    rank: int
    pid: int
    start: float                  # time.time() of the first poll that saw it
    end: float | None = None      # of the first poll that no longer did
    tracer: str = ""              # the tracer's command line, as far as read
    #: The tracer's pid and its ancestors' (whose py-spy it was: which agent).
    tracer_chain: tuple[int, ...] = ()

    @property
    def seconds(self) -> float:
        return (self.end if self.end is not None else time.time()) - self.start

    @property
    def native_dump(self) -> bool:
        return "py-spy" in self.tracer and "--native" in self.tracer


def traced(pid: int) -> int | None:
    """The tracer's pid (-1: stopped, tracer unnamed); 0: running free; None: gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            status = dict(line.split(":", 1) for line in f if ":" in line)
    except (OSError, ValueError):
        return None
    tracer = int(status.get("TracerPid", "0").strip() or 0)
    if tracer:
        return tracer
    return -1 if status.get("State", "").strip().startswith("t") else 0


def _ancestors(pid: int, depth: int = 5) -> tuple[int, ...]:
    """``pid`` and the pids above it, nearest first (as far as /proc still shows)."""
    chain = [pid]
    while len(chain) < depth:
        try:
            with open(f"/proc/{chain[-1]}/status") as f:
                ppid = next(int(x.split(":")[1]) for x in f if x.startswith("PPid:"))
        except (OSError, StopIteration, ValueError):
            break
        if ppid <= 1:
            break
        chain.append(ppid)
    return tuple(chain)


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


@dataclass
class PauseWatch:
    """Polls the ranks {rank: pid} in a thread until ``stop()``."""

    pids: dict[int, int]
    interval: float = POLL_SECONDS
    pauses: list[Pause] = field(default_factory=list)
    started: float = 0.0
    stopped: float | None = None

    def __post_init__(self) -> None:
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pausewatch", daemon=True)

    def start(self) -> "PauseWatch":
        self.started = time.time()
        self._thread.start()
        return self

    def stop(self) -> "PauseWatch":
        self._done.set()
        self._thread.join(5)
        self.stopped = time.time()
        for p in self.pauses:
            if p.end is None:
                p.end = self.stopped
        return self

    def __enter__(self) -> "PauseWatch":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _run(self) -> None:
        open_: dict[int, Pause] = {}
        while not self._done.is_set():
            for rank, pid in list(self.pids.items()):
                tracer = traced(pid)
                now = time.time()
                if tracer:  # traced (a pid) or stopped (-1)
                    if rank not in open_:
                        p = Pause(rank, pid, now, tracer=_cmdline(tracer) if tracer > 0 else "",
                                  tracer_chain=_ancestors(tracer) if tracer > 0 else ())
                        open_[rank] = p
                        self.pauses.append(p)
                elif rank in open_:
                    open_.pop(rank).end = now
            time.sleep(self.interval)

    # -- what it saw ------------------------------------------------------------

    def of(self, ranks: set[int] | None = None, by: int | None = None) -> list[Pause]:
        """Pauses of ``ranks`` (all), by a tracer under process ``by`` (any tracer)."""
        return [p for p in self.pauses if (ranks is None or p.rank in ranks)
                and (by is None or by in p.tracer_chain)]

    def summary(self, ranks: set[int] | None = None, by: int | None = None) -> dict:
        """Counts and seconds, per rank and in all, with the window watched; with
        ``by``, only pauses by that process's tracers (an agent's py-spy), and how
        many others stopped these ranks (another agent on a shared machine)."""
        ps = self.of(ranks, by)
        window = (self.stopped or time.time()) - self.started
        per_rank: dict[int, dict] = {}
        for p in ps:
            d = per_rank.setdefault(p.rank, {"pauses": 0, "native_dumps": 0, "seconds": 0.0})
            d["pauses"] += 1
            d["native_dumps"] += p.native_dump
            d["seconds"] = round(d["seconds"] + p.seconds, 3)
        return {"window_seconds": round(window, 1), "ranks": len(ranks or self.pids),
                "pauses": len(ps), "native_dumps": sum(p.native_dump for p in ps),
                "paused_seconds": round(sum(p.seconds for p in ps), 3),
                "per_rank": {str(r): v for r, v in sorted(per_rank.items())},
                "by_others": len(self.of(ranks)) - len(ps),
                "tracers": sorted({p.tracer for p in ps})[:5]}
