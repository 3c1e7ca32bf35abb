"""docs/development.md's module map names every module of the package, and only those.

One line per module (``- `ncclwatch/x.py`: what it is for``) under the
``## Module map`` heading: a module added without its line, or a line left
behind by a module that moved, fails here with the path to add or remove.
"""

from __future__ import annotations

import re
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
