"""What a rank has imported, from evidence the node has (frameworks.py decides by it).

A directory's name is the rank's text (``/home/alice/megatron/train.py``); an
import is not. Two things on the node show one: the shared objects the
process maps (``/proc/PID/maps``: ``.../site-packages/deepspeed/ops/...so``),
and the files its stacks run. A file under ``site-packages``/``dist-packages``
names its top-level package by where it is installed; a file elsewhere (a
source checkout on ``PYTHONPATH``) is in a package only if its directory has
an ``__init__.py``, looked up as the rank sees it (``rankfs``, inside its
root) and walked up to the highest such directory: that directory's name is
the package.
"""

from __future__ import annotations

import posixpath
import re

from ncclwatch.agent import rankfs
from ncclwatch.frameworks import installed_package

#: At most this many packages are reported per rank (a bound, not a policy).
MAX_PACKAGES = 64
#: Directories walked up from a frame's file looking for the package's top.
MAX_DEPTH = 12
_IDENT = re.compile(r"^[A-Za-z_]\w{0,63}$")
_MAPPED = re.compile(r"\s(/\S*-packages/\S+)$", re.M)


def of_maps(maps: str) -> frozenset[str]:
    """Top-level packages with a shared object mapped (``/proc/PID/maps`` text)."""
    out = set()
    for m in _MAPPED.finditer(maps):
        p = installed_package(m.group(1))
        if p:
            out.add(p)
    return frozenset(sorted(out)[:MAX_PACKAGES])


class FramePackages:
    """Per rank: the packages its stacks' files are in, each file looked up once."""

    def __init__(self) -> None:
        self._dirs: dict[tuple[int, str], str | None] = {}

    def of_files(self, pid: int, files: list[str]) -> set[str]:
        out = set()
        for f in files:
            p = installed_package(f) or self._source_package(pid, f)
            if p:
                out.add(p)
        return out

    def _source_package(self, pid: int, path: str) -> str | None:
        if not path.startswith("/"):
            return None
        d = posixpath.dirname(posixpath.normpath(path))
        key = (pid, d)
        if key not in self._dirs:
            if len(self._dirs) > 4096:
                self._dirs.clear()
            self._dirs[key] = self._top(pid, d)
        return self._dirs[key]

    @staticmethod
    def _top(pid: int, d: str) -> str | None:
        top = None
        for _ in range(MAX_DEPTH):
            if d in ("/", "") or not _has_init(pid, d):
                break
            top = posixpath.basename(d)
            d = posixpath.dirname(d)
        return top if top and _IDENT.match(top) else None

    def forget(self, pid: int) -> None:
        for k in [k for k in self._dirs if k[0] == pid]:
            del self._dirs[k]


def _has_init(pid: int, d: str) -> bool:
    """``d/__init__.py`` is a regular file in the rank's root (named, never opened)."""
    return rankfs.regular_in_root(pid, d.rstrip("/") + "/__init__.py")
