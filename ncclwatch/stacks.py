"""Python stacks as py-spy reports them, and their interning ids.

A stack is identified by a hash of its frames, so the agent sends a stack's
frames once per stream and refers to it by id afterwards (stack interning),
and the daemon groups ranks with identical stacks.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Iterable


@dataclass(frozen=True, slots=True)
class Frame:
    name: str
    filename: str
    line: int = 0

    @property
    def short(self) -> str:
        """``name (pkg/module.py:line)``, trimmed to the path below site-packages."""
        return f"{self.name} ({short_path(self.filename)}:{self.line})"


@dataclass(frozen=True, slots=True)
class Stack:
    """One thread's frames, innermost first (py-spy's order)."""

    frames: tuple[Frame, ...]
    thread_name: str = ""

    @property
    def id(self) -> str:
        return stack_id(self.frames)


def stack_id(frames: Iterable[Frame]) -> str:
    """Content hash of frames: 16 hex digits of BLAKE2b (64 bits is ample per job)."""
    h = hashlib.blake2b(digest_size=8)
    for f in frames:
        h.update(f"{f.name}\0{f.filename}\0{f.line}\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def short_path(filename: str) -> str:
    """Path below site-packages/dist-packages, else the last three parts."""
    path = filename.replace("\\", "/")
    for marker in ("/site-packages/", "/dist-packages/"):
        i = path.rfind(marker)
        if i >= 0:
            return path[i + len(marker):]
    parts = path.split("/")
    return "/".join(parts[-3:])


@dataclass(frozen=True, slots=True)
class ThreadDump:
    thread_id: int
    os_thread_id: int
    thread_name: str
    active: bool
    stack: Stack


class DumpFormatError(ValueError):
    """py-spy printed something that is not its JSON dump format."""


def parse_pyspy_json(text: str) -> list[ThreadDump]:
    """Parse ``py-spy dump --json`` output (a list of threads)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise DumpFormatError(f"py-spy output is not JSON: {e}") from None
    if not isinstance(data, list):
        raise DumpFormatError("py-spy JSON is not a list of threads")
    threads = []
    for t in data:
        if not isinstance(t, dict) or not isinstance(t.get("frames"), list):
            raise DumpFormatError("py-spy thread entry without frames")
        frames = tuple(_frame(f) for f in t["frames"] if isinstance(f, dict))
        name = t.get("thread_name") or ""
        threads.append(
            ThreadDump(
                thread_id=int(t.get("thread_id") or 0),
                os_thread_id=int(t.get("os_thread_id") or 0),
                thread_name=str(name),
                active=bool(t.get("active")),
                stack=Stack(frames=frames, thread_name=str(name)),
            )
        )
    return threads


def _frame(f: dict[str, Any]) -> Frame:
    return Frame(
        name=str(f.get("name") or "?"),
        filename=str(f.get("filename") or "?"),
        line=int(f.get("line") or 0),
    )


def is_native(f: Frame) -> bool:
    """A C/C++ frame of a ``--native`` dump: py-spy gives them line 0 and a
    shared object (or an address) as file."""
    return f.line == 0 and not f.filename.endswith(".py")


def innermost_python(frames: Iterable[Frame]) -> Frame | None:
    """The innermost Python frame: in a native dump frames[0] is libc's."""
    return next((f for f in frames if not is_native(f)), None)


#: Main threads that only host the rank's own thread: (innermost Python frame
#: name, its file's ending, name prefix of the thread that runs the training).
#: A Ray actor's main thread waits for tasks while Ray Train runs the user's
#: loop in "TrainingThread(<fn>)".
HOSTED_THREADS: tuple[tuple[str, str, str], ...] = (
    ("main_loop", "ray/_private/worker.py", "TrainingThread"),
)

#: Python files whose frames mark a thread as the one that trains, when a host
#: runs it in a thread named otherwise: torch's collectives, modules, optimizers.
TRAINING_PATHS: tuple[str, ...] = (
    "/torch/distributed/", "/torch/nn/", "/torch/optim/", "/torch/autograd/",
    "/torch/_tensor.py", "/torch/serialization.py",
)


def _trains(t: ThreadDump) -> bool:
    return any(not is_native(f) and any(p in f.filename.replace("\\", "/")
                                        for p in TRAINING_PATHS) for f in t.stack.frames)


def main_thread(threads: list[ThreadDump], pid: int) -> ThreadDump | None:
    """The rank's main thread: the one whose OS thread id is the pid (or the
    thread it hosts the training in, HOSTED_THREADS).

    The host is recognised by its innermost *Python* frame (a native dump
    puts libc frames first); its guest by name, else by the frames that
    train (TRAINING_PATHS), a thread on the CPU (py-spy's ``active``) first.
    """
    main = next((t for t in threads if t.os_thread_id == pid), None)
    if main is None:
        main = next((t for t in threads if t.thread_name == "MainThread"),
                    threads[0] if threads else None)
    top = innermost_python(main.stack.frames) if main is not None else None
    if top is None:
        return main
    for name, path, thread in HOSTED_THREADS:
        if top.name.endswith(name) and top.filename.endswith(path):
            hosted = next((t for t in threads if t.thread_name.startswith(thread)), None)
            if hosted is None:
                training = [t for t in threads if t is not main and _trains(t)]
                hosted = max(training, key=lambda t: t.active, default=None)
            if hosted is not None:
                return hosted
    return main
