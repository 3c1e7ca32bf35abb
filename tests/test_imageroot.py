"""deploy.imageroot reads the Containerfile itself: what it cannot build stops
the build with the line that says so, and ``COPY . .`` leaves out what
.dockerignore names, as an engine does. (tests/e2e/test_image.py builds it.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from deploy import imageroot
from tests.conftest import ROOT


def test_the_shipped_containerfile_parses_into_its_stages() -> None:
    stages = imageroot.stages((ROOT / "Containerfile").read_text())
    assert [s.name for s in stages][:2] == ["base", "build"]
    assert imageroot.DEBIAN_SLIM.match(stages[0].base)
    final = stages[-1]
    assert [i.op for i in final.steps if i.op in ("USER", "ENTRYPOINT", "CMD")] == [
        "USER", "ENTRYPOINT", "CMD"]
    copy = next(i for i in final.steps if i.op == "COPY")
    assert copy.args.startswith("--from=build ")


@pytest.mark.parametrize("line", [
    "ADD https://example.com/x /x",          # a download the build cannot pin
    "HEALTHCHECK CMD true",
    "ONBUILD RUN true",
    "SHELL [\"/bin/bash\", \"-c\"]",
])
def test_an_instruction_it_does_not_know_stops_the_build(line: str) -> None:
    text = f"FROM docker.io/library/debian:bookworm-slim\nRUN true\n{line}\n"
    with pytest.raises(imageroot.BuildError, match=r"Containerfile:3: .* not an instruction"):
        imageroot.stages(text)


def test_continuations_and_comments_inside_them_are_joined() -> None:
    text = ("# top\nARG S=bookworm\nFROM debian:${S}-slim AS base\n"
            "RUN a \\\n# a comment between\n && b\n")
    [stage] = imageroot.stages(text)
    assert stage.base == "debian:bookworm-slim" and stage.name == "base"
    [run] = stage.steps
    assert run.op == "RUN" and run.args.split() == ["a", "&&", "b"] and run.line == 4


def test_bases_it_cannot_make_are_refused_by_name(tmp_path: Path) -> None:
    b = imageroot.Builder(tmp_path, tmp_path / "w")
    with pytest.raises(imageroot.BuildError, match="python:3.12-slim.*only debian"):
        b._base("docker.io/library/python:3.12-slim", tmp_path / "r")
    with pytest.raises(imageroot.BuildError, match="FROM IMAGE"):
        imageroot.stages("FROM a b\n")
    with pytest.raises(imageroot.BuildError, match="before FROM"):
        imageroot.stages("RUN true\n")


@pytest.mark.parametrize(("rel", "skip"), [
    (".git", True), (".git/config", True), (".venv/bin/python", True),
    ("ncclwatch/__pycache__/x.pyc", True), ("ncclwatch.egg-info/PKG-INFO", True),
    ("artifacts/e2e.log", True), ("ncclwatch/agent/agent.py", False),
    ("docs/build.md", False),            # "build" is the top folder only
    ("requirements/runtime.lock", False),
])
def test_dockerignore_rules(rel: str, skip: bool) -> None:
    assert imageroot.ignored(rel, imageroot.ignore_patterns(ROOT)) is skip


def test_copy_leaves_out_ignored_paths_and_stays_in_the_context(tmp_path: Path) -> None:
    ctx = tmp_path / "ctx"
    (ctx / "pkg" / "__pycache__").mkdir(parents=True)
    (ctx / "pkg" / "a.py").write_text("x")
    (ctx / "pkg" / "__pycache__" / "a.pyc").write_text("x")
    (ctx / ".git").mkdir()
    (ctx / ".git" / "HEAD").write_text("x")
    (ctx / ".dockerignore").write_text(".git\n**/__pycache__\n")
    root = tmp_path / "root"
    root.mkdir()
    b = imageroot.Builder(ctx, tmp_path / "w")
    b._copy(". .", root, "/src", "Containerfile:1")
    got = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    assert got == ["src/.dockerignore", "src/pkg/a.py"]
    with pytest.raises(imageroot.BuildError, match="outside the build context"):
        b._copy("../ctx2 /x", root, "/", "Containerfile:2")
    with pytest.raises(imageroot.BuildError, match="no such earlier stage"):
        b._copy("--from=nope /dist/ /dist/", root, "/", "Containerfile:3")


def test_the_build_trusts_what_the_host_trusts(monkeypatch, tmp_path: Path) -> None:
    """RUN steps download through whatever this host's pip would (a site's
    intercepting proxy included): a bundle named by a variable, else the system's."""
    for name in ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"):
        monkeypatch.delenv(name, raising=False)
    system = imageroot.HOST_BUNDLE if Path(imageroot.HOST_BUNDLE).is_file() else ""
    assert imageroot.host_ca() == system
    mine = tmp_path / "ca.pem"
    mine.write_text("x")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(mine))
    assert imageroot.host_ca() == str(mine)
    monkeypatch.setenv("PIP_CERT", str(tmp_path / "missing.pem"))   # not a file: skipped
    assert imageroot.host_ca() == str(mine)
