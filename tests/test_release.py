"""A release a team can install and pin: one version, a changelog entry for
it, and a lock of every runtime dependency, pinned and hashed, that agrees
with pyproject's bounds."""

from __future__ import annotations

import re
import subprocess
import sys

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.version import Version

import ncclwatch
from tests.conftest import ROOT

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

LOCK = ROOT / "requirements" / "runtime.lock"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _lock() -> dict[str, tuple[Version, list[str]]]:
    """name -> (pinned version, hashes), from pip-compile's format."""
    text = re.sub(r"\\\n\s*", " ", LOCK.read_text())
    out = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.match(r"([A-Za-z0-9._-]+)==(\S+)\s*(.*)", line)
        assert m, f"not a pinned requirement in {LOCK.name}: {line}"
        out[m.group(1).lower().replace("_", "-")] = (
            Version(m.group(2)), re.findall(r"--hash=sha256:([0-9a-f]{64})", m.group(3)))
    return out


def test_one_version_everywhere() -> None:
    assert PYPROJECT["project"]["dynamic"] == ["version"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "ncclwatch.__version__"}
    out = subprocess.run([sys.executable, "-m", "ncclwatch", "--version"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.stdout.strip() == f"ncclwatch {ncclwatch.__version__}", out
    # Newest first: an "Unreleased" section (what main holds beyond the release)
    # may lead; the first version is this one.
    heads = re.findall(r"^## (\S+)$", (ROOT / "CHANGELOG.md").read_text(), re.M)
    numbered = [h for h in heads if h != "Unreleased"]
    assert heads[:1] in (["Unreleased"], numbered[:1]), heads
    assert numbered and numbered[0] == ncclwatch.__version__, "CHANGELOG.md: newest first"
    for f in [ROOT / "Containerfile", *ROOT.glob("deploy/kubernetes/**/*.yaml")]:
        for tag in re.findall(r"ncclwatch:(\d+\.\d+\.\d+)|newTag: (\S+)", f.read_text()):
            assert ncclwatch.__version__ in tag, (f, tag)


def test_every_runtime_dependency_is_bounded_pinned_and_hashed() -> None:
    lock = _lock()
    env = {**default_environment(), "python_version": "3.12", "python_full_version": "3.12.0"}
    for spec in PYPROJECT["project"]["dependencies"]:
        req = Requirement(spec)
        assert any(s.operator in ("<", "<=", "==", "~=") for s in req.specifier), \
            f"{req.name}: no upper bound in pyproject"
        if req.marker and not req.marker.evaluate(env):
            continue                       # tomli: Python 3.10 only
        name = req.name.lower().replace("_", "-")
        assert name in lock, f"{name} is not in {LOCK.name}: make lock"
        assert req.specifier.contains(lock[name][0], prereleases=True), \
            f"{name}=={lock[name][0]} in {LOCK.name} is outside pyproject's {req.specifier}"
    for name, (_, hashes) in lock.items():
        assert hashes, f"{name} has no hash in {LOCK.name}"
