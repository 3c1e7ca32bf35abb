"""The throttled FUSE mount really slows writes, and keeps the file operations
the frameworks' save paths use (rename over a file, move across filesystems,
fsync, truncate)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time

import pytest

from ncclwatch.demo.throttlefs import Pacer

RATE = 4_000_000  # bytes/s


def _write(path, n: int, fsync: bool = True) -> float:
    block = os.urandom(1 << 20)
    t0 = time.monotonic()
    with open(path, "wb") as f:
        for i in range(0, n, len(block)):
            f.write(block[: min(len(block), n - i)])
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    return time.monotonic() - t0


def test_pacer_shares_one_budget():
    p = Pacer(10_000_000)
    t0 = time.monotonic()
    for _ in range(4):
        p.account(1_000_000)
    assert time.monotonic() - t0 >= 0.35  # 4 MB at 10 MB/s, whoever asks
    with pytest.raises(ValueError):
        Pacer(0)


def test_write_is_slowed_to_the_rate(throttlefs, tmp_path):
    m = throttlefs(write_rate=RATE)
    n = 8 * RATE // 4  # 2 s worth at the limit
    fast = _write(tmp_path / "plain.bin", n)
    slow = _write(m.mount / "paced.bin", n)
    rate = n / slow
    # generous bounds: the shared 2-core machine can only make it slower
    assert 0.3 * RATE <= rate <= 1.25 * RATE, (rate, slow)
    assert slow > 5 * fast, (slow, fast)
    assert (m.backing / "paced.bin").stat().st_size == n


def test_file_operations_of_the_save_paths(throttlefs):
    m = throttlefs(write_rate=50_000_000)
    d = m.mount / "ckpt"
    d.mkdir()
    # write a temp file, fsync, then rename over the real name (HF, torch DCP, Lightning)
    (d / "model.safetensors").write_bytes(b"old")
    tmp = d / "tmp-model.safetensors"
    with open(tmp, "wb") as f:
        f.write(b"x" * 100_000)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, d / "model.safetensors")
    assert (m.backing / "ckpt" / "model.safetensors").stat().st_size == 100_000
    assert not tmp.exists()
    # truncate in place and through an open handle
    os.truncate(d / "model.safetensors", 10)
    assert (d / "model.safetensors").stat().st_size == 10
    with open(d / "model.safetensors", "r+b") as f:
        f.truncate(4)
        f.seek(0)
        f.write(b"ab")
        f.seek(0)
        assert f.read() == b"abxx"
    # a move from another filesystem: copy (sendfile) + copystat, as fsspec's commit does
    with tempfile.NamedTemporaryFile(delete=False) as src:
        src.write(b"y" * 300_000)
    shutil.move(src.name, d / "moved.ckpt")
    assert (m.backing / "ckpt" / "moved.ckpt").read_bytes() == b"y" * 300_000
    # rotation: rmtree of an old checkpoint dir, rename of a dir
    (d / "sub").mkdir()
    (d / "sub" / "f").write_bytes(b"1")
    os.rename(d / "sub", d / "sub2")
    assert (m.backing / "ckpt" / "sub2" / "f").exists()
    shutil.rmtree(d / "sub2")
    assert sorted(os.listdir(d)) == ["model.safetensors", "moved.ckpt"]
    os.symlink("moved.ckpt", d / "last.ckpt")
    assert os.readlink(d / "last.ckpt") == "moved.ckpt"
    assert (d / "last.ckpt").read_bytes()[:1] == b"y"


def test_read_rate_paces_reads(throttlefs):
    m = throttlefs(read_rate=RATE)
    n = RATE  # 1 s at the limit
    (m.backing / "r.bin").write_bytes(os.urandom(n))
    t0 = time.monotonic()
    assert len((m.mount / "r.bin").read_bytes()) == n
    took = time.monotonic() - t0
    assert took >= 0.7, took


def test_unmounted_even_when_the_test_fails():
    from tests.harness.throttlefs import mounted
    with pytest.raises(RuntimeError):
        with mounted(write_rate=RATE) as m:
            f = open(m.mount / "open-while-failing", "wb")  # a busy mount, too
            f.write(b"x")
            raise RuntimeError("test body failed")
    with contextlib.suppress(OSError):  # its filesystem is gone (lazy unmount)
        f.close()
    assert not os.path.ismount(m.mount)
    assert not m.mount.exists() and m.proc.poll() is not None
