"""`make demo` installs the monitor and the workload extra only; `make test`
everything. The Makefile is read by make itself (-n, in a copy: nothing runs),
and the code the demo runs imports with every other extra's packages blocked."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path

from tests.harness.paths import ROOT
from tests.harness.tools import need_system

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

#: Modules that need one of them and are not part of the demo (make proto; a test fixture).
EXEMPT = {"ncclwatch.protogen", "ncclwatch.demo.throttlefs"}


def _dry_run(target: str, tmp_path: Path) -> list[str]:
    for name in ("Makefile", "pyproject.toml", "constraints.txt"):
        shutil.copy(ROOT / name, tmp_path / name)
    out = subprocess.run([need_system("make", "make"), "-n", target], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def _extras(lines: list[str]) -> list[set[str]]:
    return [set(m.group(1).split(",")) for ln in lines if "pip install" in ln
            for m in [re.search(r"-e '\.\[([\w,-]+)\]'", ln)] if m]


def test_make_demo_installs_the_workload_extra_only(tmp_path: Path) -> None:
    demo = _dry_run("demo", tmp_path)
    assert _extras(demo) == [{"workload"}], demo
    assert any(ln.endswith("-m ncclwatch.demo") for ln in demo), demo
    test = _dry_run("test", tmp_path)
    assert _extras(test) == [{"test", "workload", "frameworks"}], test


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def not_for_the_demo() -> set[str]:
    """Import names of the packages of the extras `make demo` skips (test,
    frameworks), from the installed distributions' own top-level names."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]

    def names(*groups: str) -> set[str]:
        return {_norm(re.split(r"[<>=!;\[ ]", r)[0]) for g in groups for r in extras[g]}

    skipped = names("test", "frameworks") - names("workload")
    found: dict[str, set[str]] = {}
    for module, dists in metadata.packages_distributions().items():
        for dist in dists:
            if _norm(dist) in skipped and not module.startswith("_"):
                found.setdefault(_norm(dist), set()).add(module)
    assert set(found) == skipped, f"not installed: {skipped - set(found)} (make test installs them)"
    return set().union(*found.values())


def test_demo_and_monitor_import_without_the_other_extras() -> None:
    script = textwrap.dedent(f"""
        import importlib, importlib.abc, pkgutil, sys
        BLOCKED = {sorted(not_for_the_demo())!r}
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in BLOCKED:
                    raise ImportError(f"blocked: {{name}} is not installed by make demo")
        sys.meta_path.insert(0, Block())
        import ncclwatch
        names = [m.name for m in pkgutil.walk_packages(ncclwatch.__path__, "ncclwatch.")
                 if m.name not in {sorted(EXEMPT)!r} and m.name != "ncclwatch.__main__"]
        for name in names:
            importlib.import_module(name)
        print(len(names), "ncclwatch.demo.job" in names)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    count, has_job = out.stdout.split()
    assert int(count) > 50 and has_job == "True", out.stdout
