"""What one rank may cost the agent: its part of a report, and of a round.

A rank chooses how deep its stack is, how many process groups its Flight
Recorder lists, how large its environment is. Left unbounded, one deep
recursion made the daemon refuse the node's whole report every round (every
other rank and job on the node unwatched), and one environment of 256
``NCCL_*`` variables of 16 KiB cost the round half a minute of CPU.

Two kinds of cap, each in this one module:

- **What is sent** stays under the daemon's *default* bounds
  (``contract.bounds.Bounds``, ``contract.limits``), derived from them here
  and never written twice: a stack keeps its innermost and outermost frames
  with one marker frame between, its text under half of ``max_stack_bytes``;
  a Flight Recorder summary keeps its waiting groups first.
- **What is read and parsed** of a rank per round has a budget in bytes and
  items, checked before any regex; a rank past one loses that part (or that
  look) for the round, counted by reason (``BUDGET_REASONS``, sent in the
  agent's health, exported as ``ncclwatch_agent_rank_budget_hits_total``).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, replace

from ncclwatch.contract import health, limits
from ncclwatch.contract.bounds import Bounds
from ncclwatch.stacks import Frame, Stack, ThreadDump

_DAEMON = Bounds()

# -- what is sent: under the daemon's default bounds ---------------------------------

#: Frames of one stack (the daemon refuses a stack of more than MAX_FRAMES).
STACK_FRAMES = limits.MAX_FRAMES // 2
#: Frames kept from the innermost end of a trimmed stack (what it does now);
#: the rest of STACK_FRAMES, less the marker, from the outermost (how it got there).
STACK_HEAD = STACK_FRAMES * 3 // 4
#: Characters of function and file names in one stack.
STACK_TEXT = _DAEMON.max_stack_bytes // 2
#: Characters of stack text attached to one report (more wait for the next).
REPORT_STACK_TEXT = _DAEMON.max_report_stack_bytes // 2
#: Stacks attached to one report.
REPORT_STACKS = limits.MAX_STACKS // 2
#: Process groups of one Flight Recorder summary, and ranks they list in all.
FR_GROUPS = min(limits.MAX_PROCESS_GROUPS, _DAEMON.max_flight_recorder_groups) // 2
FR_RANKS = _DAEMON.max_flight_recorder_ranks // 2

#: The file name of the marker frame that stands for the frames left out.
MARKER_FILE = "<ncclwatch>"

# -- what is read of a rank per round ------------------------------------------------

#: Bytes of /proc/PID/environ read (the kernel allows a quarter of the stack rlimit).
ENVIRON_BYTES = 4 << 20
#: Variables parsed from it.
ENVIRON_VARIABLES = 8192
#: Characters of a variable name looked at (the allowlist's regex runs on no longer one).
ENV_NAME_CHARS = 256
#: Characters of one allowlisted value redacted (the gate's cut before redaction).
ENV_VALUE_CHARS = 16 * 1024
#: Characters of allowlisted values redacted in all, per rank: the redaction's
#: cost is linear in it (about a second of one core per MB at worst).
ENV_TEXT = 64 * 1024
#: Bytes of one py-spy dump's output parsed (all threads' frames as JSON).
PYSPY_OUTPUT_BYTES = 16 << 20
#: Bytes of /proc/PID/maps read (its torch and packages are looked up in it).
MAPS_BYTES = 16 << 20
#: A rank's /proc/PID/task/TID/syscall and wchan (what its thread is blocked
#: in, sample.blocked_in) are read each round it sits still, and otherwise at
#: most this often (seconds, the slow stack round's default): two small reads
#: that pause nothing, but not every round of every busy rank.
BLOCKED_IN_EVERY = 30.0
#: Share of the round's interval the scan may spend looking at new processes;
#: the rest wait for the next round.
SCAN_SHARE = 0.5

#: Why a rank's work was cut or skipped, in AgentHealth.rank_budget_hits order
#: (the daemon exports them: their home is the contract's).
BUDGET_REASONS = health.BUDGET_REASONS


@dataclass
class CapCounts:
    """What the caps did, process-wide (the agent reports it in its health)."""

    stacks_trimmed_total: int = 0
    flight_recorder_trimmed_total: int = 0
    budget_hits: collections.Counter = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        self.budget_hits = collections.Counter()

    def hit(self, reason: str, n: int = 1) -> None:
        assert reason in BUDGET_REASONS, reason
        self.budget_hits[reason] += n

    def budget_list(self) -> list[int]:
        return [self.budget_hits[r] for r in BUDGET_REASONS]


COUNTS = CapCounts()


def marker(left_out: int) -> Frame:
    return Frame(f"<{left_out} frames left out>", MARKER_FILE, 0)


def trim_frames(frames: tuple[Frame, ...], max_frames: int = STACK_FRAMES,
                max_text: int = STACK_TEXT) -> tuple[Frame, ...]:
    """``frames`` (innermost first) within ``max_frames`` and ``max_text``
    characters of names: the innermost and outermost kept, one marker frame
    between them saying how many were left out. Unchanged when within both."""
    text = sum(len(f.name) + len(f.filename) for f in frames)
    if len(frames) <= max_frames and text <= max_text:
        return frames
    budget = max_text - 64    # the marker's own text
    room = max(2, max_frames - 1)
    head_n = min(len(frames), max(1, room * STACK_HEAD // STACK_FRAMES))
    tail_n = room - head_n
    head, used = [], 0
    for f in frames[:head_n]:
        cost = len(f.name) + len(f.filename)
        if used + cost > budget * 3 // 4 and head:
            break
        head.append(f)
        used += cost
    tail: list[Frame] = []
    for f in reversed(frames[len(head):][-tail_n:] if tail_n else ()):
        cost = len(f.name) + len(f.filename)
        if used + cost > budget:
            break
        tail.append(f)
        used += cost
    tail.reverse()
    left_out = len(frames) - len(head) - len(tail)
    if not left_out:
        return frames
    return (*head, marker(left_out), *tail)


def trim_threads(threads: list[ThreadDump]) -> list[ThreadDump]:
    """Every thread's stack within the caps before it is classified: the
    signatures then look at no more than STACK_FRAMES frames a thread."""
    out = []
    for t in threads:
        frames = trim_frames(t.stack.frames)
        out.append(t if frames is t.stack.frames else
                   replace(t, stack=Stack(frames, t.stack.thread_name)))
    return out
