"""docs/development.md's module map names every module of the package, and only those,
and each module's tests.

One line per module (``- `ncclwatch/x.py`: what it is for. Tests: `tests/...`.``)
under the ``## Module map`` heading: a module added without its line, or a line left
behind by a module that moved, fails here with the path to add or remove. Every
test path a line names must be there, and every ``tests/unit`` module must be
named for a module of the package (``tests/unit/<package>/test_<module>[_<topic>].py``,
docs/development.md "Where tests live") and be named on that module's line.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.harness.paths import ROOT

DOC = ROOT / "docs" / "development.md"
HEADING = "## Module map"
#: A map line: the module's path in backquotes, a colon, what it is for.
LINE = re.compile(r"^- `(?P<path>ncclwatch/[^`]+\.py)`: (?P<what>\S.*)$")


def module_map(text: str) -> dict[str, str]:
    """path -> what it is for, from the map section (up to the next heading)."""
    assert HEADING in text, f"docs/development.md has no '{HEADING}' section"
    section = text.split(HEADING, 1)[1]
    section = re.split(r"^#{1,2} ", section, maxsplit=1, flags=re.M)[0]
    out: dict[str, str] = {}
    for line in section.splitlines():
        m = LINE.match(line)
        if m:
            assert m["path"] not in out, f"{m['path']} is listed twice in the module map"
            out[m["path"]] = m["what"]
    return out


#: A test path named in a map line.
TEST_PATH = re.compile(r"`(tests/[^`]+\.py)`")
UNIT = ROOT / "tests" / "unit"


def modules() -> set[str]:
    return {p.relative_to(ROOT).as_posix() for p in (ROOT / "ncclwatch").rglob("*.py")
            if "__pycache__" not in p.parts}


def problems(listed: dict[str, str], present: set[str]) -> list[str]:
    """One sentence per module missing from the map or listed but gone."""
    where = f"docs/development.md's '{HEADING}'"
    out = [f"{p} has no line in {where}: add '- `{p}`: <what it is for>' (in path order)"
           for p in sorted(present - set(listed))]
    out += [f"{p} is in {where} but not in the tree: remove its line (or fix the path)"
            for p in sorted(set(listed) - present)]
    return out


def test_every_module_has_a_line_and_every_line_a_module() -> None:
    found = problems(module_map(DOC.read_text()), modules())
    assert not found, "\n".join(found)


def test_map_lines_say_something_and_keep_path_order() -> None:
    listed = module_map(DOC.read_text())
    assert all(len(what) >= 10 for what in listed.values()), \
        [p for p, what in listed.items() if len(what) < 10]
    assert list(listed) == sorted(listed), "keep the module map in path order"


def test_the_check_names_a_missing_and_a_stale_module() -> None:
    listed = module_map(DOC.read_text())
    dropped, gone = sorted(listed)[0], "ncclwatch/no_such_module.py"
    lines = [f"- `{p}`: {w}" for p, w in listed.items() if p != dropped]
    lines.append(f"- `{gone}`: a module that is no longer there.")
    text = (f"# Development\n\n{HEADING}\n\n" + "\n".join(lines)
            + "\n\n## Next\n\n- `ncclwatch/x.py`: after the map, not in it.\n")
    found = problems(module_map(text), set(listed))
    assert len(found) == 2, found
    assert found[0].startswith(f"{dropped} has no line") and f"'- `{dropped}`: " in found[0]
    assert found[1].startswith(f"{gone} is in")


# -- each module's tests ------------------------------------------------------------

def module_of(test: str, present: set[str]) -> str | None:
    """The module a ``tests/unit`` file tests, by its path: tests/unit/<dirs>/test_<name>.py
    is about ncclwatch/<dirs>/<module>.py (or the package ncclwatch/<dirs>/<module>/)
    where <name> is <module> or <module>_<topic>; the longest such module. None: no module."""
    parts = Path(test).relative_to("tests/unit").parts
    name = parts[-1].removeprefix("test_").removesuffix(".py")
    where = "/".join(("ncclwatch", *parts[:-1]))
    found = []
    for m in present:
        folder, _, file = m.rpartition("/")
        if file == "__init__.py":  # a package: its tests sit beside its folder
            folder, _, stem = folder.rpartition("/")
        else:
            stem = file.removesuffix(".py")
        if folder == where and (name == stem or name.startswith(stem + "_")):
            found.append((len(stem), m))
    return max(found)[1] if found else None


def unit_tests() -> list[str]:
    return sorted(p.relative_to(ROOT).as_posix() for p in UNIT.rglob("test_*.py"))


def map_test_problems(listed: dict[str, str], present: set[str], tests: list[str],
                  exists) -> list[str]:
    """One sentence per test path named but not there, per tests/unit file named for
    no module, and per tests/unit file its module's line does not name."""
    named = {p: set(TEST_PATH.findall(what)) for p, what in listed.items()}
    out = [f"{p}'s line names {t}, which is not there: fix the path"
           for p, ts in sorted(named.items()) for t in sorted(ts) if not exists(t)]
    for t in tests:
        m = module_of(t, present)
        if m is None:
            out.append(f"{t} is named for no module of ncclwatch/ (tests/unit/<package>/"
                       "test_<module>[_<topic>].py): rename it, or move it to tests/repo or e2e")
        elif t not in named.get(m, set()):
            out.append(f"{t} tests {m}: name it on that module's line ('Tests: `{t}`')")
    return out


def test_every_test_path_named_is_there_and_every_unit_test_is_named_on_its_module() -> None:
    found = map_test_problems(module_map(DOC.read_text()), modules(), unit_tests(),
                          lambda t: (ROOT / t).is_file())
    assert not found, "\n".join(found)


def test_a_unit_test_maps_to_its_module_by_path_alone() -> None:
    present = {"ncclwatch/stillness.py", "ncclwatch/daemon/waits.py", "ncclwatch/daemon/core.py",
               "ncclwatch/daemon/detect/__init__.py", "ncclwatch/daemon/detect/hang.py",
               "ncclwatch/agent/ranklearn.py", "ncclwatch/agent/rankfs.py"}
    assert module_of("tests/unit/test_stillness.py", present) == "ncclwatch/stillness.py"
    assert module_of("tests/unit/daemon/test_waits_gpu_shapes.py", present) == \
        "ncclwatch/daemon/waits.py"
    assert module_of("tests/unit/daemon/test_detect.py", present) == \
        "ncclwatch/daemon/detect/__init__.py"
    assert module_of("tests/unit/daemon/detect/test_hang_late_rank.py", present) == \
        "ncclwatch/daemon/detect/hang.py"
    # the longest module wins; a name that only starts like one is no match
    assert module_of("tests/unit/agent/test_rankfs_root.py", present) == "ncclwatch/agent/rankfs.py"
    assert module_of("tests/unit/agent/test_ranklearner.py", present) is None
    assert module_of("tests/unit/test_waits.py", present) is None  # not where waits.py is


def test_the_check_names_a_missing_test_an_unmapped_one_and_an_unnamed_one() -> None:
    listed = {"ncclwatch/stillness.py": "The rule. Tests: `tests/unit/test_stillness.py`, "
                                        "`tests/e2e/test_gone.py`.",
              "ncclwatch/daemon/waits.py": "The waits."}
    tests = ["tests/unit/test_stillness.py", "tests/unit/daemon/test_waits.py",
             "tests/unit/daemon/test_nothing.py"]
    found = map_test_problems(listed, set(listed), tests, lambda t: t != "tests/e2e/test_gone.py")
    assert len(found) == 3, found
    assert found[0].startswith("ncclwatch/stillness.py's line names tests/e2e/test_gone.py")
    assert found[1].startswith("tests/unit/daemon/test_waits.py tests ncclwatch/daemon/waits.py")
    assert found[2].startswith("tests/unit/daemon/test_nothing.py is named for no module")
