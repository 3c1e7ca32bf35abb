"""Test modules import the harness, the product and bench/, never one another.

What a test starts and observes lives in tests/harness (one home per set-up);
a helper that one test module borrowed from another (a private ``_drive``, a
``Harness`` class, a fixture) made the lender impossible to move or change
alone. Every module under tests/ but the harness, tests/data and
tests/workloads (job programs) is parsed here: an import of another ``tests.*``
module, conftest included (its fixtures come by name), or a bare import of a
module that lives under tests/ (through ``sys.path``), fails with the line.
And no test module sits flat in tests/: each lives in the folder of its kind
(docs/development.md "Where tests live").
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.harness.paths import ROOT

TESTS = ROOT / "tests"
#: Not test modules: the harness itself, recorded data, the jobs the tests run.
OUTSIDE = ("harness", "data", "workloads")


def checked_modules() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py")
                  if p.relative_to(TESTS).parts[0] not in OUTSIDE and "__pycache__" not in p.parts)


def local_names() -> set[str]:
    """Top-level names a ``sys.path`` entry of tests/ (or a folder in it) would make importable."""
    return {p.stem for p in TESTS.rglob("*.py") if p.stem != "__init__"} | \
        {p.name for p in TESTS.rglob("*") if p.is_dir() and (p / "__init__.py").exists()}


def imported(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in ``path``, relative ones resolved, at any depth."""
    package = ".".join(path.relative_to(ROOT).parent.parts)
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            out.append((node.lineno, node.module or ""))
        elif isinstance(node, ast.ImportFrom):  # relative: from the module's own package
            parts = package.split(".")
            base = ".".join(parts[:len(parts) - node.level + 1])
            if node.module:
                out.append((node.lineno, f"{base}.{node.module}"))
            else:
                out += [(node.lineno, f"{base}.{a.name}") for a in node.names]
    return out


def allowed(module: str) -> bool:
    return module == "tests.harness" or module.startswith("tests.harness.")


def violations(path: Path, local: set[str]) -> list[str]:
    rel = path.relative_to(ROOT).as_posix()
    out = []
    for line, module in imported(path):
        top = module.split(".")[0]
        if top == "tests" and module != "tests" and not allowed(module):
            out.append(f"{rel}:{line}: imports {module}: take it from tests.harness")
        elif top != "tests" and top in local and top not in ("bench", "ncclwatch"):
            out.append(f"{rel}:{line}: imports {module} from tests/ through sys.path: "
                       "take it from tests.harness")
    return out


def test_test_modules_import_only_the_harness_the_product_and_bench() -> None:
    local = local_names()
    found = [v for p in checked_modules() for v in violations(p, local)]
    assert not found, "\n".join(found)


#: Where test modules live: unit (mirrors the package), repo, e2e, the scenario matrix.
KINDS = ("unit", "repo", "e2e", "scenarios")


def test_every_test_module_lives_in_the_folder_of_its_kind() -> None:
    flat = sorted(p.relative_to(ROOT).as_posix() for p in TESTS.rglob("test_*.py")
                  if p.relative_to(TESTS).parts[0] not in (*KINDS, *OUTSIDE))
    assert not flat, f"move each into tests/{{{','.join(KINDS)}}}/: {flat}"
    assert sorted(p.name for p in TESTS.glob("*.py")) == ["__init__.py", "conftest.py"]


def test_the_check_sees_each_kind_of_borrowed_import(tmp_path) -> None:
    """Absolute, relative, nested in a function, conftest's, and bare through sys.path."""
    pkg = tmp_path / "tests" / "unit"
    pkg.mkdir(parents=True)
    mod = pkg / "test_x.py"
    mod.write_text("from tests.harness.procs import Proc\n"
                   "from tests.test_grpc import Harness\n"
                   "from tests.conftest import free_port\n"
                   "from ..e2e import test_alerting\n"
                   "def f():\n"
                   "    import tests.factories\n"
                   "    from test_diagnose_fallback import HEALTHY\n"
                   "import ncclwatch.cli, bench.loadgen, pytest\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        found = violations(mod, {"test_diagnose_fallback", "tests"})
    finally:
        ROOT = saved
    assert [v.split(": ", 1)[0] for v in found] == [
        "tests/unit/test_x.py:2", "tests/unit/test_x.py:3", "tests/unit/test_x.py:4",
        "tests/unit/test_x.py:6", "tests/unit/test_x.py:7"], found
    assert "imports tests.e2e:" in found[2], found
