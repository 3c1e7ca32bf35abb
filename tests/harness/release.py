"""The runtime lock as pip reads it: its pins, and those that install on each Python."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from packaging.markers import Marker, default_environment
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.harness.paths import ROOT

LOCK = ROOT / "requirements" / "runtime.lock"


def build_wheel(tmp: Path) -> Path:
    """This checkout's wheel in ``tmp/dist``, built as a release is (``python -m
    build --wheel --no-isolation``: setuptools from this venv, no download) from a
    copy in ``tmp/src`` (setuptools leaves build/ and *.egg-info behind)."""
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".venv", ".git", "artifacts", "build", "*.egg-info", "__pycache__", ".pytest_cache",
        ".hypothesis", "certs"))
    out = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation",
                          "--outdir", str(tmp / "dist"), str(src)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"wheel build:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    [wheel] = list((tmp / "dist").glob("ncclwatch-*.whl"))
    return wheel


#: The Pythons a node may run ncclwatch on: the one lock installs on each (its
#: every wheel downloaded below), the oldest is requires-python's floor and the
#: Python `make lock` resolves from, and docs/support.md names exactly these.
PYTHONS = ("3.10", "3.11", "3.12", "3.13", "3.14")


@dataclass(frozen=True)
class Pin:
    """One line of a lock: name==version, the marker it holds under, its hashes."""
    name: str
    version: Version
    marker: Marker | None
    hashes: tuple[str, ...]


def pins(lock: Path = LOCK) -> list[Pin]:
    """Every line of a lock in pip-compile's or uv's format (one name may have
    several lines, under markers that never hold together)."""
    text = re.sub(r"\\\n\s*", " ", lock.read_text())
    out = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9._-]+)==([^\s;]+)\s*(?:;\s*(.*?))?\s*"
                         r"((?:--hash=sha256:[0-9a-f]{64}\s*)*)", line)
        assert m, f"not a pinned requirement in {lock.name}: {line}"
        out.append(Pin(canonicalize_name(m.group(1)), Version(m.group(2)),
                       Marker(m.group(3)) if m.group(3) else None,
                       tuple(re.findall(r"[0-9a-f]{64}", m.group(4)))))
    return out


def environment(python: str) -> dict[str, str]:
    """The marker variables of CPython ``python`` on this machine's platform."""
    return {**default_environment(), "python_version": python,
            "python_full_version": f"{python}.0", "implementation_name": "cpython",
            "platform_python_implementation": "CPython"}


def pins_for(python: str, lock: Path = LOCK) -> dict[str, Pin]:
    """name -> the line pip installs on CPython ``python``: those whose marker holds."""
    out: dict[str, Pin] = {}
    for pin in pins(lock):
        if pin.marker is None or pin.marker.evaluate(environment(python)):
            assert pin.name not in out, f"{pin.name}: two lines of {lock.name} for {python}"
            out[pin.name] = pin
    return out
