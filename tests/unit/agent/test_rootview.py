"""The root the agent builds for py-spy when a rank's root was changed with
chroot: when one is needed, and what it holds (recorded /proc-like trees; the
view itself is run against real chroot'd processes in
tests/e2e/test_chroot_stacks.py and tests/e2e/test_containers.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ncclwatch.agent import rootview
from ncclwatch.agent.rootview import (
    REAL, chroot_depth, layout, libpython_paths, missing_capabilities, needed,
)

LIB = "/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0"


def maps_line(perms: str, path: str) -> str:
    return f"7f0000000000-7f0000100000 {perms} 00000000 fe:00 1234                 {path}"


@pytest.mark.parametrize("link,depth", [
    ("/", 0),                              # the host, or a pivot_root container
    ("/img", 1),                           # chroot /img inside a container
    ("/var/lib/shifter/udiRoot", 4),       # a chroot on the host's tree
    ("/tmp/x/ctr-root/", 3),
    ("", 0), ("relative", 0),              # not a path: nothing to climb
])
def test_chroot_depth(link, depth) -> None:
    assert chroot_depth(link) == depth


@pytest.mark.parametrize("lines,found", [
    ([maps_line("r-xp", LIB)], [LIB]),
    ([maps_line("r--p", LIB), maps_line("r-xp", LIB)], [LIB]),         # the code mapping
    ([maps_line("r-xp", "/ctr/py/lib/libpython3.9d.so.1.0")], ["/ctr/py/lib/libpython3.9d.so.1.0"]),
    ([maps_line("r-xp", "/usr/bin/python3.11")], []),                  # a static interpreter
    ([maps_line("r-xp", "/usr/lib/libpython3.so")], []),               # the stable-ABI stub
    ([maps_line("r-xp", "/srv/my dir/libpython3.12.so.1.0")], ["/srv/my dir/libpython3.12.so.1.0"]),
    (["7f0000000000-7f0000001000 rw-p 00000000 00:00 0"], []),       # anonymous
])
def test_libpython_paths_as_py_spy_picks_them(lines, found) -> None:
    assert libpython_paths("\n".join(lines)) == found


def _view(root_link: str = "/img", **kw) -> rootview.View:
    args = dict(root_link=root_link, exe_link="/img/py/bin/python3.11",
                entries=["maps", "exe", "root", "task", "ns", "status", "mem", "cwd"],
                tids=["42", "43", "44"], top_names=["usr", "img", "proc", "etc"],
                mount_at="/tmp")
    args.update(kw)
    return layout(42, **args)


def test_the_view_points_proc_pid_root_at_the_top_of_the_ranks_tree() -> None:
    links = dict(_view("/a/b/c").links)
    # /proc/42/root: up through the real root, one level per chroot level and one more.
    assert links["proc/42/root"] == f"{REAL}/root/../../../.."
    assert dict(_view("/").links)["proc/42/root"] == f"{REAL}/root/.."


def test_the_exe_link_reads_as_the_ranks_own() -> None:
    # py-spy matches readlink(/proc/PID/exe) against the maps: the same text.
    assert dict(_view().links)["proc/42/exe"] == "/img/py/bin/python3.11"


def test_every_other_entry_is_the_ranks_real_one() -> None:
    v = _view()
    links = dict(v.links)
    for name in ("maps", "task", "ns", "status", "mem", "cwd"):
        assert links[f"proc/42/{name}"] == f"{REAL}/{name}"
    assert (f"/proc/42", f"proc/42/{REAL}") in v.binds
    # py-spy's own /proc/self, and the rank's threads as /proc/<tid>.
    assert ("/proc/self", "proc/self") in v.binds
    assert links["proc/43"] == "42/task/43" and links["proc/44"] == "42/task/44"
    assert "proc/42" not in links                 # the rank itself is the directory


def test_top_level_names_lead_into_the_ranks_tree_and_proc_stays_the_views() -> None:
    links = dict(_view().links)
    assert links["usr"] == "/proc/42/root/usr" and links["img"] == "/proc/42/root/img"
    assert "proc" not in links


def test_nothing_in_the_view_leads_outside_the_rank_or_py_spy_itself() -> None:
    """Every link resolves inside the view: relative within /proc, or under the
    rank's own tree; the only binds are the rank's /proc dir and py-spy's own."""
    v = _view(top_names=["usr", "etc", "..", ".", "a/b", "proc"],
              entries=["maps", "../1", ".hidden", "root", "exe"], tids=["x", "43", "42"])
    for path, text in v.links:
        if path == "proc/42/exe":
            continue  # resolved through the top-level links below
        assert not text.startswith("/") or text.startswith("/proc/42/root/"), (path, text)
        assert ".." not in Path(path).parts, path
    assert {src for src, _ in v.binds} == {"/proc/42", "/proc/self"}
    names = {p for p, _ in v.links if "/" not in p}
    assert names == {"usr", "etc"}
    assert not any(p.endswith("/../1") or p.endswith(".hidden") for p, _ in v.links)


def test_top_level_names_are_bounded() -> None:
    many = [f"d{i}" for i in range(rootview.MAX_TOP_NAMES + 50)]
    names = [p for p, _ in _view(top_names=many).links if "/" not in p]
    assert len(names) == rootview.MAX_TOP_NAMES


def _proc(tmp: Path, root_target: str, maps: list[str]) -> Path:
    d = tmp / "proc" / "7"
    d.mkdir(parents=True)
    os.symlink(root_target, d / "root")
    (d / "maps").write_text("\n".join(maps) + "\n")
    return tmp / "proc"


def test_a_rank_at_the_top_of_its_tree_needs_no_view(tmp_path) -> None:
    proc = _proc(tmp_path, "/", [maps_line("r-xp", "/nowhere/libpython3.11.so.1.0")])
    assert not needed(7, str(proc))


def test_a_chroot_whose_libpython_is_not_under_root_plus_its_path_needs_one(tmp_path) -> None:
    image = tmp_path / "image"
    (image / "usr/lib").mkdir(parents=True)
    (image / "usr/lib/libpython3.11.so.1.0").write_bytes(b"\x7fELF")
    # The maps say <image>/usr/lib/...: under the root, that path is not there.
    proc = _proc(tmp_path, str(image), [maps_line("r-xp", f"{image}/usr/lib/libpython3.11.so.1.0")])
    assert needed(7, str(proc))


def test_a_chroot_where_py_spy_finds_libpython_needs_none(tmp_path) -> None:
    image = tmp_path / "image"
    (image / "usr/lib").mkdir(parents=True)
    (image / "usr/lib/libpython3.11.so.1.0").write_bytes(b"\x7fELF")
    proc = _proc(tmp_path, str(image), [maps_line("r-xp", "/usr/lib/libpython3.11.so.1.0")])
    assert not needed(7, str(proc))


def test_a_static_interpreter_in_a_chroot_needs_none(tmp_path) -> None:
    # py-spy reads the interpreter itself through /proc/PID/exe, whatever the root.
    proc = _proc(tmp_path, str(tmp_path), [maps_line("r-xp", f"{tmp_path}/usr/bin/python3.11")])
    assert not needed(7, str(proc))


def test_a_gone_rank_needs_none(tmp_path) -> None:
    assert not needed(99, str(tmp_path))


@pytest.mark.parametrize("capeff,lacking", [
    ("000001ffffffffff", []),                                     # root
    ("0000000000080004", ["CAP_SYS_ADMIN", "CAP_SYS_CHROOT"]),    # the unit's pair
    ("00000000002c0004", []),                                     # + SYS_ADMIN + SYS_CHROOT
    ("0000000000280004", ["CAP_SYS_CHROOT"]),
    ("0000000000040000", ["CAP_SYS_ADMIN"]),
])
def test_missing_capabilities(capeff, lacking) -> None:
    assert missing_capabilities(f"Name:\tx\nCapEff:\t{capeff}\n") == lacking


def test_a_symlink_under_the_root_that_leads_out_is_walked_inside_it(tmp_path) -> None:
    """The image's libpython path is a link to a file that exists on the host
    only: followed as the agent's own root resolves it, it read as found (no
    view, and py-spy would read the host's file); walked inside the rank's
    root, it is not there, and the view is taken."""
    host = tmp_path / "host-only"
    host.mkdir()
    (host / "libpython3.11.so.1.0").write_bytes(b"\x7fELF")
    image = tmp_path / "image"
    (image / "usr/lib").mkdir(parents=True)
    os.symlink(host / "libpython3.11.so.1.0", image / "usr/lib/libpython3.11.so.1.0")
    proc = _proc(tmp_path, str(image), [maps_line("r-xp", "/usr/lib/libpython3.11.so.1.0")])
    assert needed(7, str(proc))
    # The same link inside the image's own tree is the rank's file: no view.
    (image / "lib").mkdir()
    (image / "lib/libpython3.11.so.1.0").write_bytes(b"\x7fELF")
    (image / "usr/lib/libpython3.11.so.1.0").unlink()
    os.symlink("/lib/libpython3.11.so.1.0", image / "usr/lib/libpython3.11.so.1.0")
    assert not needed(7, str(proc))


def _write_exec(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    path.chmod(0o755)
    return path


@pytest.mark.parametrize("what,expect", [
    ("py-spy", None),                                   # PyPI's wheel: static-pie
    ("/usr/bin/true", "dynamically linked"),            # PT_INTERP: /lib64/ld-linux...
    ("script", "a script"),                             # #!: an interpreter by path
    ("not-elf", "not a 64-bit"),
    ("truncated", "not a 64-bit"),
])
def test_only_a_static_elf_may_run_in_a_view(tmp_path, what, expect) -> None:
    from tests.harness.tools import need

    path = {
        "py-spy": lambda: Path(need("py-spy")),
        "/usr/bin/true": lambda: Path("/usr/bin/true"),
        "script": lambda: _write_exec(tmp_path / "s", b"#!/bin/sh\nexec py-spy \"$@\"\n"),
        "not-elf": lambda: _write_exec(tmp_path / "n", b"MZ" + b"\0" * 200),
        "truncated": lambda: _write_exec(tmp_path / "t", b"\x7fELF\x02\x01"),
    }[what]()
    fd = os.open(path, os.O_RDONLY)
    try:
        got = rootview.not_static(fd)
    finally:
        os.close(fd)
    assert (got is None) if expect is None else (expect in got), got
