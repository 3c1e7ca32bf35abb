"""What a scan of job logs keeps: the evidence lines, tracebacks and torchrun's table.

The scanner (logscan.py) fills a ScanResult; facts.py files its rows under
ranks. The types live apart from the scanner so that the rules and facts,
which only read them, do not depend on how logs are read.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ncclwatch.diagnose.signtypes import Event
from ncclwatch.stacks import Frame


@dataclass
class Evidence:
    """One matched line."""

    sign: str
    event: Event
    file: str
    line: int
    rank: int | None
    ts: float | None
    text: str
    fields: dict[str, str]
    #: The ``srun --label`` task id (a node, where torchrun runs per node).
    task: int | None = None
    #: The process group of torch's own ``[PG 3 Rank 2]`` tag (id, or its description)
    #: and the rank inside it; None where the message has no tag.
    pg: str | None = None
    pg_rank: int | None = None
    #: Where ``rank`` came from: "prefix" (launcher), "file" (per-rank file name),
    #: "message" (torch's ``[Rank N]`` of the default or an unnamed group), "task" (a
    #: Slurm task's own line, in a file whose tasks are ranks), None.
    rank_from: str | None = None
    #: The line's own time stamp (``ts`` falls back to the last stamp before it, for
    #: ordering; a timeline shows only a line's own).
    stamp: float | None = None

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass
class PyTraceback:
    """A Python traceback of one rank: frames outermost first, as printed."""

    file: str
    line: int
    rank: int | None
    ts: float | None
    frames: list[Frame] = field(default_factory=list)
    #: The exception line. A chained exception ("During handling of the above
    #: exception ...") prints a traceback of its own: it is a PyTraceback of its own.
    exception: str = ""
    end_line: int = 0
    stamp: float | None = None

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"

    def innermost_first(self) -> list[Frame]:
        return self.frames[::-1]


@dataclass
class FailureEntry:
    """One failure of torchrun's ChildFailedError summary."""

    file: str
    line: int
    root: bool = False
    host: str = ""
    rank: int | None = None
    local_rank: int | None = None
    exitcode: int | None = None
    pid: int | None = None
    signame: str = ""
    #: The table's "time : 2026-12-03_12:36:12" (when torchrun saw the failure).
    stamp: float | None = None

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass
class ScanResult:
    evidence: list[Evidence] = field(default_factory=list)
    tracebacks: list[PyTraceback] = field(default_factory=list)
    failures: list[FailureEntry] = field(default_factory=list)
    ranks_seen: set[int] = field(default_factory=set)
    world_sizes: set[int] = field(default_factory=set)
    fr_dumps: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    bytes_read: int = 0
    lines_read: int = 0
    #: Every sign matched: its first line (where, text) and how many lines matched it.
    hits: dict[str, tuple[str, str]] = field(default_factory=dict)
    hit_counts: dict[str, int] = field(default_factory=dict)
    #: Bounds the input hit ("a line longer than 1 MiB ..."), once per kind and file.
    bounded: list[str] = field(default_factory=list)
