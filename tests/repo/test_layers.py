"""Import layers: the agent and the daemon share the contract, never each other.

Every module under ``ncclwatch/`` is read with ``ast`` (static imports,
function-level ones included; ``if TYPE_CHECKING:`` blocks left out, they
never run). Three rules:

- nothing in ``ncclwatch/agent`` imports ``ncclwatch.daemon``, and nothing in
  ``ncclwatch/daemon`` imports ``ncclwatch.agent``: what both ends need (the
  wire limits, the bounds, the checks of a report's parts) lives in
  ``ncclwatch.contract`` or another neutral module;
- the library modules at the package's top level import neither: they are
  what both ends build on. ``ENTRY`` names the few that start a process or
  print for a user and so may wire both ends together: the CLI and its
  ``__main__``, ``status`` (talks to a daemon, reads the local node as the
  agent does), ``dump`` (asks a daemon as its dump guard expects), ``install`` and ``preflight`` (commands), and the demo;
- no import cycle among modules (a circle through config, agent and daemon
  once made the agent's caps import the daemon's bounds through config). A
  module's import of its own package (``ncclwatch.diagnose.x`` reading
  ``ncclwatch.diagnose``) is Python's order, not a circle; the few
  deliberate function-level back edges are listed (``LAZY_BACK_EDGES``).
"""

from __future__ import annotations

import ast
from pathlib import Path
from tests.harness.paths import ROOT

PKG = ROOT / "ncclwatch"
#: Top-level modules that may import agent and daemon: they start processes.
ENTRY = frozenset({"ncclwatch.cli", "ncclwatch.__main__", "ncclwatch.status",
                   "ncclwatch.dump", "ncclwatch.install", "ncclwatch.preflight"})
#: Packages whose every module is an entry point.
ENTRY_PACKAGES = ("ncclwatch.demo",)
#: Function-level imports that close a circle on purpose: the importer runs
#: them only after both modules are loaded (each names why where it is).
LAZY_BACK_EDGES = frozenset({
    ("ncclwatch.daemon.core", "ncclwatch.daemon.bundle"),     # bundle builds on core
    ("ncclwatch.agent.pyspy", "ncclwatch.agent.viewhelper"),  # the helper runs py-spy
})


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or \
        (isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The ncclwatch modules ``path`` imports, anywhere in it but TYPE_CHECKING blocks."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            for a in node.names:
                out.add(a.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")
                up = up[:len(up) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            out.add(base)
            for a in node.names:    # "from ncclwatch.daemon import validate"
                if f"{base}.{a.name}" in modules:
                    out.add(f"{base}.{a.name}")
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return {m for m in out if m.startswith("ncclwatch") and m != name}


def graph() -> dict[str, set[str]]:
    paths = [p for p in PKG.rglob("*.py") if "__pycache__" not in p.parts]
    modules = {module_name(p) for p in paths}
    out = {}
    for p in paths:
        deps = set()
        for m in imports_of(p, modules):
            # "ncclwatch.daemon.x.Y" or a package: the longest module prefix
            while m not in modules and "." in m:
                m = m.rpartition(".")[0]
            if m in modules and m != module_name(p):
                deps.add(m)
        out[module_name(p)] = deps
    return out


def cycle_graph(g: dict[str, set[str]]) -> dict[str, set[str]]:
    """``g`` without imports of a module's own packages and LAZY_BACK_EDGES."""
    return {m: {d for d in deps if not _under(m, d) and (m, d) not in LAZY_BACK_EDGES}
            for m, deps in g.items()}


def _under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _entry(module: str) -> bool:
    return module in ENTRY or any(_under(module, p) for p in ENTRY_PACKAGES)


def layer_faults(g: dict[str, set[str]]) -> list[str]:
    out = []
    for mod, deps in sorted(g.items()):
        for dep in sorted(deps):
            if _under(mod, "ncclwatch.agent") and _under(dep, "ncclwatch.daemon"):
                out.append(f"{mod} (agent) imports {dep} (daemon)")
            elif _under(mod, "ncclwatch.daemon") and _under(dep, "ncclwatch.agent"):
                out.append(f"{mod} (daemon) imports {dep} (agent)")
            elif mod.count(".") == 1 and not _entry(mod) and \
                    (_under(dep, "ncclwatch.agent") or _under(dep, "ncclwatch.daemon")):
                out.append(f"{mod} (library) imports {dep}")
            elif _under(mod, "ncclwatch.contract") and not _under(dep, "ncclwatch.contract") \
                    and dep.count(".") > 1 and not _under(dep, "ncclwatch.v1"):
                out.append(f"{mod} (contract) imports {dep}: only top-level library modules")
    return out


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per back edge found by a depth-first walk (empty: none)."""
    found: list[list[str]] = []
    state: dict[str, int] = {}      # 1: on the path, 2: done
    path: list[str] = []

    def walk(m: str) -> None:
        state[m] = 1
        path.append(m)
        for d in sorted(g.get(m, ())):
            if state.get(d) == 1:
                found.append(path[path.index(d):] + [d])
            elif d not in state:
                walk(d)
        path.pop()
        state[m] = 2

    for m in sorted(g):
        if m not in state:
            walk(m)
    return found


def test_agent_and_daemon_import_the_contract_never_each_other() -> None:
    faults = layer_faults(graph())
    assert not faults, "\n".join(faults)


def test_no_import_cycle() -> None:
    found = cycles(cycle_graph(graph()))
    assert not found, "\n".join(" -> ".join(c) for c in found)


def test_the_checks_see_a_planted_fault() -> None:
    """The walk is not blind: a made-up graph with each fault is caught."""
    g = {"ncclwatch.agent.x": {"ncclwatch.daemon.y"}, "ncclwatch.daemon.y": {"ncclwatch.config"},
         "ncclwatch.config": {"ncclwatch.agent.x"}, "ncclwatch.cli": {"ncclwatch.agent.x"}}
    assert layer_faults(g) == ["ncclwatch.agent.x (agent) imports ncclwatch.daemon.y (daemon)",
                               "ncclwatch.config (library) imports ncclwatch.agent.x"]
    assert cycles(g) == [["ncclwatch.agent.x", "ncclwatch.daemon.y", "ncclwatch.config",
                          "ncclwatch.agent.x"]]
    here = imports_of(ROOT / "ncclwatch" / "config.py",
                      set(graph()))
    assert "ncclwatch.shard" in here     # a function-level import is seen


def test_the_listed_back_edges_are_function_level_and_still_there() -> None:
    """A back edge listed here that became a module-level import (a real
    circle at import time) or went away fails: the list stays honest."""
    g = graph()
    for mod, dep in LAZY_BACK_EDGES:
        assert dep in g[mod], (mod, dep)
        path = PKG.joinpath(*mod.split(".")[1:]).with_suffix(".py")
        top = ast.parse(path.read_text())
        for node in top.body:
            if isinstance(node, ast.ImportFrom):
                names = {node.module or ""} | {f"{node.module}.{a.name}" for a in node.names}
                assert dep not in names, f"{mod} imports {dep} at module level"
            elif isinstance(node, ast.Import):
                assert dep not in {a.name for a in node.names}, (mod, dep)
