"""Which of the paths given to ``diagnose`` are logs, and opening one.

Paths are files or directories of them, plain or gzip. A file named on the
command line is always read; one met in a directory is skipped when its
start shows it is no log (a JSON document, Python source), and a Flight
Recorder dump (a pickle) is handed back by path. What a file holds decides,
never its name.
"""

from __future__ import annotations

import os
import re
import zlib
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator

from ncclwatch.logstream import GZIP_MAGIC, SNIFF, Gunzip


class LogInputError(ValueError):
    """A path that cannot be read as a log (missing, unreadable, not text)."""


def is_fr_dump(head: bytes) -> bool:
    """A Flight Recorder dump: a pickle (protocol 2 to 5)."""
    return len(head) > 2 and head[0] == 0x80 and 2 <= head[1] <= 5


def expand_found(paths: Iterable[str | os.PathLike]) -> Iterator[tuple[Path, bool]]:
    """(file, found in a directory rather than named) for every file under the paths."""
    for p in paths:
        path = Path(p)
        if path.is_dir():
            for root, dirs, files in os.walk(path):
                dirs.sort()
                for name in sorted(files):
                    yield Path(root) / name, True
        elif path.exists():
            yield path, False
        else:
            raise LogInputError(f"{p}: no such file or directory")


#: Files met in a directory that are not logs, by what they hold (not by name): a JSON
#: or YAML document (a verdict, a config; JSON *lines* logs are logs), Python source.
NOT_A_LOG: tuple[tuple[str, re.Pattern[bytes]], ...] = (
    ("a JSON document, not a log", re.compile(rb"\A\s*[\[{]\s*(?:\n|\"[^\n]*\":\s*[\[{]?\s*\n)")),
    ("Python source, not a log", re.compile(rb"\A(?:#![^\n]*python|(?:\"\"\"|import |from [\w.]+ import ))")),
)


def not_a_log(sniff: bytes) -> str | None:
    """Why a file found in a directory is no log (None: read it)."""
    for why, rx in NOT_A_LOG:
        if rx.match(sniff):
            return why
    return None


def open_log(path: Path) -> tuple[BinaryIO, bytes]:
    """The file as log text (gunzipped where gzip) and its first SNIFF bytes, read
    ahead; LogInputError when they cannot be read (OSError when it cannot be opened)."""
    f: BinaryIO = open(path, "rb")
    head = f.read(2)
    f.seek(0)
    if head == GZIP_MAGIC:
        f = Gunzip(f)  # type: ignore[assignment]
    try:
        sniff = f.read(SNIFF)
    except (OSError, EOFError, zlib.error) as e:
        f.close()
        raise LogInputError(f"{path}: cannot read: {e}") from None
    return f, sniff
