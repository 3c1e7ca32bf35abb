"""``ncclwatch diagnose`` on a hostile evidence bundle: bounded, and exit 2 in one line.

A bundle is a file someone hands over: a tar.gz of 400k empty members once
took 224 MiB and 7 s, and a truncated one ended in a traceback with exit 1
(diagnose's "failure found"). The archives are built here byte by byte, as
an attacker would: the members are walked as they come, within
bundle.CAPS, and every malformed archive is "an input cannot be read" (2).
"""

from __future__ import annotations

import gzip
import io
import json
import subprocess
import sys
import tarfile
import zlib
from pathlib import Path

import pytest

from ncclwatch.diagnose import LogInputError, bundle

HEAD = {"format": bundle.FORMAT, "job": "job-1", "created_at": 1000.0}


def _member(name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE,
            size: int | None = None, link: str = "") -> bytes:
    """One member's header block (and its data, padded), as tar writes it."""
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    info.size = len(data) if size is None else size
    body = data + b"\0" * (-len(data) % 512)
    return info.tobuf(tarfile.GNU_FORMAT) + (body if size is None else b"")


def _docs() -> bytes:
    return _member("b/bundle.json", json.dumps(HEAD).encode()) + \
        _member("b/verdict.json", b'{"stalls": []}')


def _write(tmp_path: Path, name: str, tar: bytes, *, end: bool = True) -> Path:
    p = tmp_path / name
    p.write_bytes(gzip.compress(tar + (b"\0" * 1024 if end else b""), mtime=0))
    return p


def _diagnose(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ncclwatch", "diagnose", str(path)],
                          capture_output=True, text=True, timeout=120)


def test_many_tiny_members_stop_at_the_member_cap(tmp_path) -> None:
    """50k empty members (the 400k of the finding, cheaper) under a cap of 5000."""
    p = _write(tmp_path, "many.tar.gz", _member("b/stacks/x.txt") * 50_000 + _docs())
    caps = bundle.Caps(members=5000)
    with pytest.raises(bundle.BundleError, match="more than 5000 members"):
        bundle.read(p, caps)
    # The same documents first: found, and the 50k after them never walked.
    q = _write(tmp_path, "docs_first.tar.gz", _docs() + _member("b/job.json", b"{}")
               + _member("b/stacks/x.txt") * 50_000)
    v = bundle.read(q, caps)
    assert v is not None and v.job == "job-1"


def test_at_the_real_cap_the_walk_stops_before_the_rest(tmp_path) -> None:
    """CAPS.members + 100 members, then the gzip stream cut off: had the walk
    gone on past the cap it would have met the cut and said so instead."""
    n = bundle.CAPS.members
    z = zlib.compressobj(wbits=31)            # gzip, whole up to the cut
    p = tmp_path / "cap.tar.gz"
    p.write_bytes(z.compress(_member("b/stacks/x.txt") * (n + 100))
                  + z.flush(zlib.Z_FULL_FLUSH))
    with pytest.raises(bundle.BundleError, match=f"more than {n} members"):
        bundle.read(p)
    with pytest.raises(bundle.BundleError, match="cannot read the archive"):
        bundle.read(p, bundle.Caps(members=n + 200))    # the cut, had it gone on


@pytest.mark.parametrize("name,tar,end,said", [
    ("dotdot", _docs() + _member("b/../../etc/cron.d/x", b"x"), True, "with '..'"),
    ("absolute", _member("/etc/passwd", b"x") + _docs(), True, "absolute"),
    ("symlink", _member("b/job.json", kind=tarfile.SYMTYPE, link="/etc/shadow") + _docs(),
     True, "is a link"),
    ("hardlink", _docs() + _member("b/job.json", kind=tarfile.LNKTYPE, link="b/bundle.json"),
     True, "is a link"),
    ("fifo", _member("b/pipe", kind=tarfile.FIFOTYPE) + _docs(), True,
     "neither a file nor a folder"),
    ("oversized", _member("b/verdict.json", size=(64 << 20) + 1) + _docs(), True,
     "over the cap of 64 MiB a member"),
    ("bad_json", _member("b/bundle.json", b"[" * 200_000), True, "bundle.json is not JSON"),
    ("no_format", _member("b/bundle.json", b'{"job": "j"}'), True, "does not state"),
])
def test_a_malformed_bundle_exits_2_in_one_line(tmp_path, name, tar, end, said) -> None:
    r = _diagnose(_write(tmp_path, f"{name}.tar.gz", tar, end=end))
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("ncclwatch diagnose: ") and said in r.stderr, r.stderr
    assert not r.stdout


def test_a_truncated_or_non_gzip_bundle_exits_2_in_one_line(tmp_path) -> None:
    whole = gzip.compress(_docs() + _member("b/job.json", b"{}") + b"\0" * 1024, mtime=0)
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(whole[:len(whole) // 2])
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"not gzip at all\n" * 64)
    for p, said in ((cut, "cannot read the archive"), (junk, "not gzip")):
        r = _diagnose(p)
        assert r.returncode == 2 and "Traceback" not in r.stderr, (p, r.returncode, r.stderr)
        assert r.stderr.count("\n") == 1 and said in r.stderr, r.stderr


def test_a_header_cannot_read_past_the_total_cap(tmp_path) -> None:
    """A GNU long name of 3 MiB (tarfile holds it whole) under a total cap of 1 MiB."""
    long = tarfile.TarInfo("././@LongLink")
    long.type, long.size = tarfile.GNUTYPE_LONGNAME, 3 << 20
    tar = long.tobuf(tarfile.GNU_FORMAT) + b"a" * (3 << 20) + _docs()
    p = _write(tmp_path, "long.tar.gz", tar)
    with pytest.raises(bundle.BundleError, match="over the cap of a bundle"):
        bundle.read(p, bundle.Caps(total_bytes=1 << 20))


def test_an_archive_is_known_by_its_bytes_or_its_name(tmp_path) -> None:
    """A gzip log is no bundle (None: scanned as a log); a tar without
    bundle.json neither; a bundle's errors are LogInputError (the CLI's exit 2)."""
    log = tmp_path / "rank0.log.gz"
    log.write_bytes(gzip.compress(b"[rank0]: hello\n"))
    assert bundle.read(log) is None
    plain = tmp_path / "logs.tar"
    plain.write_bytes(_member("logs/rank0.log", b"hello\n") + b"\0" * 1024)
    assert bundle.read(plain) is None
    assert issubclass(bundle.BundleError, LogInputError)
    named = tmp_path / "plain.tgz"
    named.write_bytes(io.BytesIO(b"x" * 600).getvalue())
    with pytest.raises(bundle.BundleError, match="not gzip"):
        bundle.read(named)
