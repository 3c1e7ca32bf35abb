"""A release a team can install and pin: one version, a changelog entry for
it, and a lock of every runtime dependency, pinned and hashed, that agrees
with pyproject's bounds and installs on every Python the support matrix names."""

from __future__ import annotations

import email.parser
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

import ncclwatch
from tests.harness.paths import ROOT
from tests.harness.release import LOCK, PYTHONS, environment, pins, pins_for

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

BUILD_LOCK = ROOT / "requirements" / "build.lock"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _lock(lock: Path = LOCK, python: str = PYTHONS[0]) -> dict[str, tuple[Version, list[str]]]:
    """name -> (pinned version, hashes) of what pip installs on ``python``."""
    return {name: (pin.version, list(pin.hashes)) for name, pin in pins_for(python, lock).items()}


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


@pytest.mark.parametrize("python", PYTHONS)
def test_every_runtime_dependency_is_bounded_pinned_and_hashed(python: str) -> None:
    """On each Python: every dependency pyproject names for it (tomli on 3.10
    alone) has its line, in pyproject's bounds, and every line has hashes."""
    lock = pins_for(python)
    for spec in PYPROJECT["project"]["dependencies"]:
        req = Requirement(spec)
        assert any(s.operator in ("<", "<=", "==", "~=") for s in req.specifier), \
            f"{req.name}: no upper bound in pyproject"
        name = canonicalize_name(req.name)
        if req.marker and not req.marker.evaluate(environment(python)):
            assert name not in lock, f"{name} is in {LOCK.name} for {python}, outside {req.marker}"
            continue
        assert name in lock, f"{name} is not in {LOCK.name} for Python {python}: make lock"
        assert req.specifier.contains(lock[name].version, prereleases=True), \
            f"{name}=={lock[name].version} in {LOCK.name} is outside pyproject's {req.specifier}"
    for pin in pins():
        assert pin.hashes, f"{pin.name} has no hash in {LOCK.name}"


def _wheel_metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as z:
        [name] = [n for n in z.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)]
        return email.parser.BytesParser().parsebytes(z.read(name))


@pytest.mark.parametrize("python", PYTHONS)
def test_the_lock_installs_on_every_supported_python(python: str, tmp_path: Path) -> None:
    """What pip on that Python takes from the lock, downloaded as a node gets it
    (a wheel for that Python, --require-hashes; from PyPI or the local mirror,
    whichever pip is set up for) and closed: every dependency the wheels
    declare for that Python is a line of the lock, at a version they accept.
    pip evaluates a lock's markers for the Python it runs on, not for
    --python-version: the lines for ``python`` are chosen here."""
    lock = pins_for(python)
    req = tmp_path / f"runtime-{python}.txt"
    req.write_text("".join(f"{p.name}=={p.version} "
                           + " ".join(f"--hash=sha256:{h}" for h in p.hashes) + "\n"
                           for p in lock.values()))
    out = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--python-version",
                          python, "--only-binary=:all:", "--no-deps", "--require-hashes",
                          "-r", str(req), "-d", str(tmp_path / "d")],
                         capture_output=True, text=True, timeout=600)
    said = [x for x in (out.stdout + out.stderr).splitlines() if "is ignored" not in x]
    assert out.returncode == 0, f"Python {python}:\n" + "\n".join(said[-40:])
    got = {}
    for wheel in (tmp_path / "d").glob("*.whl"):
        meta = _wheel_metadata(wheel)
        got[canonicalize_name(meta["Name"])] = (Version(meta["Version"]),
                                                meta.get_all("Requires-Dist") or [])
    assert {n: v for n, (v, _) in got.items()} == {n: p.version for n, p in lock.items()}
    for name, (_, requires) in got.items():
        for spec in map(Requirement, requires):
            if spec.marker and not spec.marker.evaluate({**environment(python), "extra": ""}):
                continue
            dep = canonicalize_name(spec.name)
            assert dep in lock, f"{name} needs {spec} on {python}: not in {LOCK.name}"
            assert spec.specifier.contains(lock[dep].version, prereleases=True), \
                f"{name} needs {spec} on {python}; {LOCK.name} pins {lock[dep].version}"


def test_the_support_matrix_names_the_pythons_the_lock_installs_on() -> None:
    """What is promised is what is proven: docs/support.md names exactly PYTHONS,
    pyproject's requires-python starts at the oldest, and `make lock` resolves
    from it."""
    support = (ROOT / "docs" / "support.md").read_text()
    row = re.search(r"^\| ncclwatch itself \| CPython ((?:3\.\d+, )*3\.\d+)[ ;|]", support, re.M)
    assert row, "docs/support.md: the row 'ncclwatch itself' starts 'CPython 3.X, 3.Y, ...'"
    assert tuple(row.group(1).split(", ")) == PYTHONS, row.group(0)
    assert PYPROJECT["project"]["requires-python"] == f">={PYTHONS[0]}"
    make = re.sub(r"\\\n\s*", " ", (ROOT / "Makefile").read_text())
    [compile_] = re.findall(r"^\t.*uv pip compile .*$", make, re.M)
    assert f"--universal --python-version {PYTHONS[0]} " in compile_, compile_
    assert "-o requirements/runtime.lock" in compile_, compile_
    assert f"--python-version {PYTHONS[0]} " in LOCK.read_text().split("\n", 3)[1], \
        f"{LOCK.name} was not made by `make lock`"


def test_the_build_backend_is_pinned_and_hashed() -> None:
    """The image builds the wheel without build isolation, from the backend
    requirements/build.lock pins and hashes (the Containerfile installs it with
    --require-hashes): every [build-system] requirement is there, in bounds."""
    lock = _lock(BUILD_LOCK)
    for spec in PYPROJECT["build-system"]["requires"]:
        req = Requirement(spec)
        name = req.name.lower().replace("_", "-")
        assert name in lock, f"{name} is not in {BUILD_LOCK.name}"
        assert req.specifier.contains(lock[name][0], prereleases=True), \
            f"{name}=={lock[name][0]} in {BUILD_LOCK.name} is outside pyproject's {req.specifier}"
    for name, (_, hashes) in lock.items():
        assert hashes, f"{name} has no hash in {BUILD_LOCK.name}"
    assert "-r requirements/build.lock" in re.sub(r"\\\n\s*", " ",
                                                  (ROOT / "Containerfile").read_text())


def test_the_code_runs_on_the_oldest_supported_python() -> None:
    """Only 3.11 runs here: vermin reads every module for syntax and standard-library
    modules newer than the oldest Python of PYTHONS (a bare ``import tomllib`` once
    made the agent fail to start on 3.10)."""
    oldest = min(PYTHONS, key=lambda v: tuple(map(int, v.split("."))))
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "vermin"), f"-t={oldest}-", "--no-tips",
         "--violations", "--eval-annotations", "ncclwatch"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
