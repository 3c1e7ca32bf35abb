"""`make demo` installs the monitor and the workload extra only; `make test`
everything. The Makefile is read by make itself (-n, in a copy: nothing runs),
and the code the demo runs imports with every other extra's packages blocked."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.conftest import ROOT, need_system

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

#: Distribution -> import name of every package the demo must not need.
NOT_FOR_THE_DEMO = {
    "lightning": "lightning", "pytorch-lightning": "pytorch_lightning",
    "transformers": "transformers", "accelerate": "accelerate", "safetensors": "safetensors",
    "deepspeed": "deepspeed", "pytest": "pytest", "hypothesis": "hypothesis",
    "grpcio-tools": "grpc_tools", "grafana-foundation-sdk": "grafana_foundation_sdk",
    "promql-parser": "promql_parser", "fusepy": "fuse", "kubernetes-validate": "kubernetes_validate",
}
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


def test_the_blocklist_covers_every_extra_the_demo_skips() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    demo = {re.split(r"[<>=!;\[ ]", r)[0] for r in extras["workload"]}
    skipped = {re.split(r"[<>=!;\[ ]", r)[0] for name in ("test", "frameworks") for r in extras[name]}
    assert skipped - demo == set(NOT_FOR_THE_DEMO), "update NOT_FOR_THE_DEMO"


def test_demo_and_monitor_import_without_the_other_extras() -> None:
    script = textwrap.dedent(f"""
        import importlib, importlib.abc, pkgutil, sys
        BLOCKED = {sorted(set(NOT_FOR_THE_DEMO.values()))!r}
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
