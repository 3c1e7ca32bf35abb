"""``ncclwatch install`` (often run as root) never writes or chmods through a
symlink planted at a destination file or folder, and replaces a file whole
(temporary file, rename) instead of writing into whatever inode is there."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ncclwatch import install
from ncclwatch.cli import main

VICTIM = "the victim's own file\n"


def plant_victim(tmp_path: Path) -> Path:
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "victim"
    victim.write_text(VICTIM)
    victim.chmod(0o600)
    return victim


def untouched(victim: Path) -> bool:
    return victim.read_text() == VICTIM and victim.stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("kind,extra", [
    ("dashboards", []),               # always overwritten
    ("config", []),                   # kept if present
    ("slurm", ["--force"]),           # kept if present, but --force
])
def test_a_symlink_at_a_destination_file_is_refused(tmp_path, capsys, kind, extra) -> None:
    victim = plant_victim(tmp_path)
    dest = tmp_path / "dest"
    dest.mkdir()
    first = install.KINDS[kind].name(install.sources(kind)[0].name)
    (dest / first).symlink_to(victim)
    assert main(["install", kind, "--dest", str(dest), *extra]) == 1
    err = capsys.readouterr().err
    assert f"{dest / first}: is a symlink: not followed nor replaced" in err, err
    assert untouched(victim) and (dest / first).is_symlink()


def test_a_dangling_symlink_is_refused_not_written_through(tmp_path, capsys) -> None:
    """A config kept if present: a link to nothing is not 'absent'."""
    dest = tmp_path / "dest"
    dest.mkdir()
    name = install.sources("config")[0].name
    (dest / name).symlink_to(tmp_path / "made-by-us")
    assert main(["install", "config", "--dest", str(dest)]) == 1
    assert "is a symlink" in capsys.readouterr().err
    assert not (tmp_path / "made-by-us").exists()


def test_a_symlink_at_the_destination_folder_is_refused(tmp_path, capsys) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    for name, target in (("dest", outside), ("dangling", tmp_path / "none")):
        link = tmp_path / name
        link.symlink_to(target)
        assert main(["install", "dashboards", "--dest", str(link)]) == 1
        assert f"{link}: is a symlink: not followed" in capsys.readouterr().err
    assert list(outside.iterdir()) == [] and not (tmp_path / "none").exists()
    # Under --root too: the kind's own folder is the last component.
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc/slurm").symlink_to(outside)
    assert main(["install", "slurm", "--root", str(root)]) == 1
    assert list(outside.iterdir()) == []


def test_a_file_is_replaced_whole_not_written_in_place(tmp_path, capsys) -> None:
    """A hard link to the old file (another name for its inode) keeps the old
    bytes and mode: the new file is a new inode renamed over; no temporary file
    stays behind; the mode is the kind's whatever the umask."""
    dest = tmp_path / "dest"
    assert main(["install", "slurm", "--dest", str(dest)]) == 0
    prolog = dest / "ncclwatch-task-prolog.sh"
    prolog.write_text("#!/bin/sh\n# the site's\n")
    prolog.chmod(0o700)
    other = tmp_path / "other-name"
    os.link(prolog, other)
    old = os.umask(0o077)
    try:
        assert main(["install", "slurm", "--dest", str(dest), "--force"]) == 0
    finally:
        os.umask(old)
    assert other.read_text() == "#!/bin/sh\n# the site's\n"
    assert other.stat().st_mode & 0o777 == 0o700
    assert prolog.read_bytes() == install.sources("slurm")[0].read_bytes()
    assert prolog.stat().st_mode & 0o777 == 0o755
    assert [p.name for p in dest.iterdir()] == [prolog.name]
