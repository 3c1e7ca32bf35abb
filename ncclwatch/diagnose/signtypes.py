"""What a log sign is: the events a line can be evidence of, and a sign's row.

The rows themselves are data (logsigns.py); the verdict rules (verdict.py)
say what the events mean together.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Callable


class Event(str, enum.Enum):
    """What a matched line says happened (the verdict reads these)."""

    #: A rank's watchdog (NCCL) or a collective's wait (gloo) gave up waiting.
    TIMEOUT = "timeout"
    #: The watchdog's progress numbers: last enqueued/completed work of a rank.
    PROGRESS = "progress"
    #: A rank told to dump because another timed out, with its own progress (not a wait).
    DUMP_SIGNAL = "dump_signal"
    #: The watchdog took the process down (SIGABRT follows: collateral).
    WATCHDOG_ABORT = "watchdog_abort"
    #: The watchdog thread itself was stuck (heartbeat monitor).
    HEARTBEAT = "heartbeat"
    #: The Flight Recorder was (or was to be) dumped.
    FR_DUMP = "fr_dump"
    #: c10d's own check named the ranks that did not arrive.
    MISSING_RANKS = "missing_ranks"
    #: c10d found ranks running different collectives.
    MISMATCH = "mismatch"
    #: NCCL or transport error.
    NETWORK = "network"
    #: A peer closed the connection (a rank died, or the network did).
    PEER_CLOSED = "peer_closed"
    #: Out of memory (device, host allocator, or the kernel's OOM killer).
    OOM = "oom"
    #: Checkpoint activity a trainer logged (HF, Lightning, DeepSpeed, user).
    CHECKPOINT = "checkpoint"
    #: A checkpoint that finished (the save is not what is stuck).
    CHECKPOINT_DONE = "checkpoint_done"
    #: A rank busy with work only it does (the main process tokenizing a dataset).
    BUSY = "busy"
    #: A rank's GPU failed under NCCL (a CUDA call returned an error): a crash.
    CUDA_ERROR = "cuda_error"
    #: torchrun: a local rank failed (exit code, pid).
    EXIT = "exit"
    #: torchrun stops a surviving worker after another failed (counts the workers).
    TEARDOWN = "teardown"
    #: torchrun's failure summary lines (host / rank / exitcode / signal).
    SUMMARY = "summary"
    #: torchrun's "Root Cause (first observed failure)" marker.
    SUMMARY_ROOT = "summary_root"
    #: A Python traceback starts (the scanner then reads the frames).
    TRACEBACK = "traceback"
    #: The world size, as launchers and trainers print it.
    WORLD = "world"
    #: The job finished (torchrun and trainers say so).
    FINISHED = "finished"
    #: The c10d store or the elastic rendezvous failed (a rank or the agent hosting the
    #: store died, or the network between them): no rule names a class from it alone.
    STORE = "store"
    #: A launcher said the job failed without saying why (torchrun's ChildFailedError).
    FAILED = "failed"
    #: A process died of a fatal signal or a fatal runtime error (segmentation fault,
    #: abort, ``Fatal Python error``, a Ray worker that crashed): a crash, rank unknown.
    CRASH = "crash"
    #: A line shaped like a failure that no other sign explains (an exception line, an
    #: error or fatal log line, a non-zero exit code): never "no failure found".
    ERROR = "error"


@dataclass(frozen=True)
class LogSign:
    id: str
    event: Event
    triggers: tuple[str, ...]
    #: Searched (not anchored) in the line, rank prefixes removed; named
    #: groups become the event's fields.
    pattern: str
    #: Matched case-insensitively (messages whose case changed between versions).
    ignore_case: bool = False
    #: A line in the format the sign is for (tests check the sign finds it, and still
    #: finds it pasted, wrapped, coloured and prefixed by every launcher).
    example: str = ""
    #: Whether the sign alone says the job failed. A log holding one is never "no
    #: failure found" (at least "unknown", with the line quoted). Context signs
    #: (checkpoint and progress lines, NCCL's warnings of a job that went on) are not.
    failure: bool = True
    #: Where a line is read by a function rather than ``pattern`` (the severity grammar):
    #: text -> the event's fields, or None where the line is not this sign's.
    reader: Callable[[str], dict[str, str] | None] | None = None
    #: Triggers shorter than logsigns.MIN_TRIGGER are allowed and matched whole only,
    #: none of their hard-wrap pieces: short level tokens (``[E ``, glog's ``E12``) stand
    #: at a line's head, where a terminal of 40 columns or more does not cut.
    whole_only: bool = False

    def compile(self) -> re.Pattern[str] | ReaderPattern:
        if self.reader is not None:
            return ReaderPattern(self.reader)
        return re.compile(self.pattern, re.IGNORECASE if self.ignore_case else 0)


class ReaderMatch:
    """What a reader found, shaped as the scanner reads a regex match."""

    __slots__ = ("fields",)

    def __init__(self, fields: dict[str, str]) -> None:
        self.fields = fields

    def groupdict(self) -> dict[str, str]:
        return self.fields


class ReaderPattern:
    """A sign's reader where the scanner expects a compiled pattern (``search``)."""

    __slots__ = ("reader",)

    def __init__(self, reader: Callable[[str], dict[str, str] | None]) -> None:
        self.reader = reader

    def search(self, text: str) -> ReaderMatch | None:
        fields = self.reader(text)
        return None if fields is None else ReaderMatch(fields)
