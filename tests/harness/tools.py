"""The real tools a test runs, found or a clear failure naming what installs them."""

from __future__ import annotations

import os
import shutil

import pytest

from tests.harness.paths import BIN


def need(binary: str) -> str:
    """A program of the running venv (``make test`` installs it)."""
    path = BIN / binary
    if not path.exists():
        pytest.fail(f"{binary} is missing from {BIN}: run `make test` (it installs it)")
    return str(path)


def need_system(binary: str, package: str) -> str:
    """A tool from a Debian package (make test installs it); a clear failure if absent."""
    path = shutil.which(binary)
    if path is None:
        pytest.fail(f"{binary} not found: install Debian's `{package}` package "
                    f"(make test does: apt-get install -y {package})")
    return path


def py_spy_available() -> None:
    if shutil.which("py-spy", path=str(BIN)) is None:
        pytest.fail("py-spy is missing from the venv: run `make test`")


def promtool() -> str:
    return need_system("promtool", "prometheus")


def systemd_analyze() -> str:
    path = shutil.which("systemd-analyze") or "/usr/bin/systemd-analyze"
    if not os.access(path, os.X_OK):
        pytest.fail("systemd-analyze is missing: install the Debian package `systemd` "
                    "(apt-get install systemd) to check the units")
    return path


def setpriv(caps: list[str]) -> list[str]:
    """Root keeps only `caps` (bounding set: what root's exec can hold), as the
    container runtime does with drop ALL + add; no_new_privs as allowPrivilegeEscalation."""
    path = shutil.which("setpriv")
    if path is None:
        pytest.fail("setpriv missing: install Debian's util-linux")
    spec = ",".join(["-all"] + [f"+{c}" for c in caps])
    return [path, "--bounding-set", spec, "--inh-caps", "-all", "--no-new-privs"]
