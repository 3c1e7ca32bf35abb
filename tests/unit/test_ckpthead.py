"""A checkpoint's size from its header, read while a real process writes it.

Files are real: torch.save archives of several shapes (their final size on
disk is the expected answer), safetensors from the safetensors library, and
files written slowly by a separate Python process (torch.save into the
demo's paced writer, as slow shared storage) that the agent reads through
/proc/PID/fd while only the first megabytes are on disk.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import struct
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ncclwatch.agent.ckptsize import MAX_READS, SizeReader
from ncclwatch.agent.sample import ProcessSampler
from ncclwatch.ckpthead import (ITEMSIZE, MAX_HEAD_BYTES, HeaderError, HeaderIncomplete,
                                expected_size)
from ncclwatch.safepickle import Global, persistent_ids
from tests.harness.paths import ROOT

MiB = 1 << 20


def _saved(obj, path: Path) -> bytes:
    torch.save(obj, path)
    return path.read_bytes()


def _model_and_optimizer() -> dict:
    m = torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(40)])
    opt = torch.optim.AdamW(m.parameters())
    m(torch.randn(2, 32)).sum().backward()
    opt.step()
    return {"model": m.state_dict(), "optimizer": opt.state_dict(), "epoch": 3,
            "lr": 1e-3, "tags": ["a", "b"]}


CASES = {
    "state_dict": lambda: {"w": torch.randn(1024, 256), "b": torch.zeros(256)},
    "model_and_optimizer": _model_and_optimizer,
    "dtypes": lambda: {f"t{i}": torch.zeros(i + 1, dtype=dt) for i, dt in enumerate(
        [torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int8, torch.bool,
         torch.uint8, torch.complex64, torch.uint16, torch.uint32, torch.float8_e4m3fn])},
    "views_share_storage": lambda: (lambda t: {"a": t, "view": t[10:20], "t": t.view(64, 16).t()})(
        torch.randn(1024)),
    "one_tensor": lambda: torch.arange(10),
    "untyped_storage": lambda: torch.zeros(100).untyped_storage(),
    "no_tensors": lambda: {"epoch": 7, "note": "x" * 5000},
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_torch_save_size_is_exact(case: str, tmp_path: Path) -> None:
    data = _saved(CASES[case](), tmp_path / f"{case}-with-a-longer-archive-name.pt")
    hs = expected_size(data[:MAX_HEAD_BYTES], case)
    assert hs.format == "torch_zip"
    assert hs.total_bytes == len(data)
    names = zipfile.ZipFile(io.BytesIO(data)).infolist()
    assert hs.payload_bytes == sum(i.file_size for i in names if "/data/" in i.filename
                                   and not i.filename.endswith("serialization_id"))


def test_torch_save_to_a_buffer_is_the_same_format() -> None:
    buf = io.BytesIO()
    torch.save(CASES["state_dict"](), buf)
    assert expected_size(buf.getvalue()[:MAX_HEAD_BYTES]).total_bytes == len(buf.getvalue())


def test_every_torch_storage_type_has_its_itemsize() -> None:
    from torch.storage import _dtype_to_storage_type_map
    wrong = {name: dt for dt, name in _dtype_to_storage_type_map().items()
             if ITEMSIZE.get(name) != dt.itemsize}
    assert not wrong


def test_a_header_cut_anywhere_is_incomplete_never_a_wrong_size(tmp_path: Path) -> None:
    data = _saved(CASES["dtypes"](), tmp_path / "cut.pt")
    _, stop = persistent_ids(data, "cut", start=struct.unpack_from("<H", data, 26)[0] + 30
                             + struct.unpack_from("<H", data, 28)[0])
    for cut in range(stop):
        with pytest.raises(HeaderIncomplete):
            expected_size(data[:cut])
    assert expected_size(data[:stop]).total_bytes == len(data)


def test_safetensors_size_is_exact(tmp_path: Path) -> None:
    from safetensors.torch import save_file
    path = tmp_path / "model.safetensors"
    save_file({"a": torch.randn(300, 7), "b": torch.zeros(5, dtype=torch.float16)}, path,
              metadata={"format": "pt"})
    data = path.read_bytes()
    hs = expected_size(data[:MAX_HEAD_BYTES])
    assert (hs.format, hs.total_bytes, hs.tensors) == ("safetensors", len(data), 2)
    n = struct.unpack_from("<Q", data)[0]
    with pytest.raises(HeaderIncomplete):
        expected_size(data[:8 + n - 1])


def _st(body: bytes) -> bytes:
    return struct.pack("<Q", len(body)) + body


@pytest.mark.parametrize("head, match", [
    (b"2026-12-04 training log line\n" * 4, "neither a torch.save zip nor safetensors"),
    (b"PK\x03\x04" + b"\x00" * 22 + struct.pack("<HH", 9, 0) + b"model.bin" + b"x" * 40,
     "not <archive>/data.pkl"),
    (_st(b'{"a": {"data_offsets": [5, 2]}}'), "data_offsets"),
    (_st(b'{"a": {"dtype": "F32"}}'), "data_offsets"),
    (_st(b'{"a": {"data_offsets": [0, 1e9]}}'), "data_offsets"),
    (_st(b"{not json}"), "not JSON"),
    (_st(b"{" * 5000 + b"}" * 5000), "not JSON"),
    (_st(b'{"a": 1}' + b" " * 2) [:-1] + b"]", "not JSON"),
    (struct.pack("<Q", MAX_HEAD_BYTES) + b"{" + b" " * 64, "not read"),
])
def test_malformed_headers_are_clear_errors(head: bytes, match: str) -> None:
    with pytest.raises(HeaderError, match=match):
        expected_size(head)


def _zip_with_pickle(payload: bytes, name: str = "archive/data.pkl") -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        z.writestr(name, payload)
    return buf.getvalue()


def test_a_hostile_pickle_is_never_imported_or_called(tmp_path: Path) -> None:
    canary = tmp_path / "called"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {canary}",))

    payload = pickle.dumps({"x": Evil()}, protocol=2)
    payload = payload.replace(b"posix\nsystem", b"ncclwatch_canary_mod\nsystem")
    assert b"ncclwatch_canary_mod" in payload
    hs = expected_size(_zip_with_pickle(payload))
    assert hs.tensors == 0 and not canary.exists()
    assert "ncclwatch_canary_mod" not in sys.modules

    class Marker:
        pass

    class EvilPid(pickle.Pickler):
        def persistent_id(self, obj):
            return ("storage", os.system, "0", "cpu", 1) if isinstance(obj, Marker) else None

    buf = io.BytesIO()
    EvilPid(buf, protocol=2).dump([Marker()])
    with pytest.raises(HeaderError, match="unknown storage type"):
        expected_size(_zip_with_pickle(buf.getvalue()))


def test_a_tuple_bomb_costs_its_size_not_its_expansion() -> None:
    t: tuple = ("storage",)
    for _ in range(200):      # 2**200 leaves once expanded; hashing it would never end
        t = (t, t)
    payload = pickle.dumps(t, protocol=2)
    pids, _ = persistent_ids(b"\x80\x02" + payload[2:-1] + b"Q.", "bomb")
    assert isinstance(pids[0], tuple)
    t0 = time.process_time()
    with pytest.raises(HeaderError, match="not a torch storage"):
        expected_size(_zip_with_pickle(b"\x80\x02" + payload[2:-1] + b"Q."))
    assert time.process_time() - t0 < 1.0


def test_globals_stay_names() -> None:
    payload = pickle.dumps(("storage", torch.FloatStorage), protocol=2)
    pids, end = persistent_ids(payload[:-1] + b"Q.", "g")
    assert pids == [("storage", Global("torch", "FloatStorage"))] and end == len(payload) + 1


_REAL_HEADER = None


def _real_header() -> bytes:
    global _REAL_HEADER
    if _REAL_HEADER is None:
        buf = io.BytesIO()
        torch.save(CASES["model_and_optimizer"](), buf)
        _REAL_HEADER = buf.getvalue()[:8192]
    return _REAL_HEADER


#: No wall-clock deadline (a loaded CI machine stretched one example to 2.8 s):
#: each example's own CPU time is bounded instead, which load does not stretch.
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_fuzz_mutated_torch_headers(data) -> None:
    head = bytearray(_real_header())
    for _ in range(data.draw(st.integers(1, 8))):
        i = data.draw(st.integers(0, len(head) - 1))
        head[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(head)))
    t0 = time.process_time()
    try:
        hs = expected_size(bytes(head[:cut]))
    except HeaderError as e:
        assert str(e)
    else:
        assert hs.total_bytes >= hs.payload_bytes >= 0
    assert time.process_time() - t0 < 0.5


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2048), st.booleans())
def test_fuzz_random_bytes(raw: bytes, as_zip: bool) -> None:
    head = _zip_with_pickle(raw) if as_zip else raw
    t0 = time.process_time()
    try:
        hs = expected_size(head)
    except HeaderError as e:
        assert str(e)
    else:
        assert hs.total_bytes >= 0
    assert time.process_time() - t0 < 0.5


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.integers() | st.text(max_size=8),
                    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c,
                                                                         max_size=4),
                    max_leaves=30))
def test_fuzz_safetensors_json(header) -> None:
    body = json.dumps(header).encode()
    try:
        hs = expected_size(struct.pack("<Q", len(body)) + body)
    except HeaderError as e:
        assert str(e)
    else:
        assert hs.total_bytes >= 8 + len(body)


def _open_for_writing(path: Path, data: bytes) -> int:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.write(fd, data)
    return fd


def test_a_long_header_takes_a_second_bounded_read(tmp_path: Path) -> None:
    state = {f"layer{i}.weight": torch.zeros(2) for i in range(600)}
    data = _saved(state, tmp_path / "many.pt")
    assert 16 * 1024 < zipfile.ZipFile(io.BytesIO(data)).infolist()[0].file_size < MAX_HEAD_BYTES
    fd = _open_for_writing(tmp_path / "being-written.pt", data)
    try:
        reader = SizeReader()
        e = reader.expected(os.getpid(), fd, str(tmp_path / "being-written.pt"), len(data), [])
        assert (e.bytes, e.source, reader.reads_total) == (len(data), "torch_zip_header", 2)
        assert reader.bytes_read_total <= 16 * 1024 + MAX_HEAD_BYTES
    finally:
        os.close(fd)


def test_a_big_log_file_costs_one_small_read(tmp_path: Path) -> None:
    fd = _open_for_writing(tmp_path / "train.log", b"step 1 loss 0.5\n" * 100_000)
    try:
        reader = SizeReader()
        for size in (1_000_000, 1_600_000):       # it grows: still not read again
            e = reader.expected(os.getpid(), fd, str(tmp_path / "train.log"), size, [])
        assert e.bytes == 0 and "neither" in e.error
        assert (reader.reads_total, reader.bytes_read_total) == (1, 16 * 1024)
    finally:
        os.close(fd)


# ------------------------------------------------- a real process writing slowly

_WRITER = textwrap.dedent("""
    import io, os, shutil, sys, time, torch
    from ncclwatch.demo.slow_storage import ThrottledWriter
    kind, path, rate = sys.argv[1], sys.argv[2], float(sys.argv[3])
    state = {"layer%d" % i: torch.randn(1024 * 1024) for i in range(8)}     # 32 MiB
    if kind == "torch":
        buf = io.BytesIO(); torch.save(state, buf)
        print("SIZE", len(buf.getvalue()), flush=True)
        with ThrottledWriter(path, rate) as f:
            torch.save(state, f)
    elif kind == "safetensors":
        from safetensors.torch import save
        data = save(state)
        print("SIZE", len(data), flush=True)
        with ThrottledWriter(path, rate) as f:
            for i in range(0, len(data), 1 << 18):
                f.write(data[i:i + (1 << 18)])
    elif kind == "copy":
        src = path + ".src"
        with open(src, "wb") as f:
            f.write(os.urandom(24 << 20))
        print("SIZE", os.path.getsize(src), flush=True)
        with open(src, "rb") as s, ThrottledWriter(path, rate) as d:
            shutil.copyfileobj(s, d, 1 << 18)
    print("DONE", flush=True)
""")


@pytest.fixture
def writer(tmp_path: Path):
    procs = []

    def start(kind: str, rate: float = 2 * MiB) -> tuple[subprocess.Popen, Path, int]:
        path = tmp_path / {"torch": "ckpt.pt", "safetensors": "model.safetensors",
                           "copy": "copy.ckpt"}[kind]
        p = subprocess.Popen([sys.executable, "-c", _WRITER, kind, str(path), str(rate)],
                             stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
        procs.append(p)
        line = p.stdout.readline()
        assert line.startswith("SIZE"), f"writer failed: {line!r}"
        return p, path, int(line.split()[1])

    yield start
    for p in procs:
        p.kill()
        p.wait()


def _written_file(sampler: ProcessSampler, pid: int, path: Path, deadline: float):
    while time.time() < deadline:
        s = sampler.sample(pid)
        files = [f for f in (s.files_writing if s else ()) if f.path == str(path)]
        if files and files[0].expected_size_bytes:
            return files[0]
        time.sleep(0.2)
    raise AssertionError(f"no expected size for {path} (last: {files})")


@pytest.mark.parametrize("kind, source", [("torch", "torch_zip_header"),
                                          ("safetensors", "safetensors_header"),
                                          ("copy", "copy_source")])
def test_agent_reads_the_size_while_the_file_is_written(writer, kind: str, source: str) -> None:
    proc, path, final = writer(kind)
    sampler = ProcessSampler()
    f = _written_file(sampler, proc.pid, path, time.time() + 30)
    assert f.expected_source == source, f
    assert f.expected_size_bytes == final
    on_disk = path.stat().st_size
    assert on_disk < final / 4, f"read late: {on_disk} of {final} bytes on disk"
    if kind == "torch":
        assert final - 32 * MiB < 4096    # 32 MiB of tensors, read back as exactly that
    if kind == "copy":
        assert f.copy_source_path == str(path) + ".src"
    reads = sampler.sizes.reads_total
    for _ in range(5):                    # known: the file is not read again
        time.sleep(0.3)
        sampler.sample(proc.pid)
    assert sampler.sizes.reads_total == reads
    assert proc.poll() is None, "the writer must still be writing"


def test_files_that_are_not_checkpoints_are_read_once(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    code = ("import sys, time\nf = open(sys.argv[1], 'w')\nfor i in range(400):\n"
            "    f.write('step %d loss 0.1\\n' % i); f.flush(); time.sleep(0.02)\n")
    p = subprocess.Popen([sys.executable, "-c", code, str(log)])
    try:
        reader, sampler = SizeReader(), ProcessSampler()
        sampler.sizes = reader
        deadline = time.time() + 10
        while time.time() < deadline and reader.reads_total == 0:
            sampler.sample(p.pid)
            time.sleep(0.1)
        for _ in range(10):
            s = sampler.sample(p.pid)
            time.sleep(0.1)
        assert reader.reads_total == 1
        f = [f for f in s.files_writing if f.path == str(log)][0]
        assert f.expected_size_bytes == 0 and "neither a torch.save zip" in f.header_error
    finally:
        p.kill()
        p.wait()


def test_a_header_that_never_completes_is_read_a_bounded_number_of_times(tmp_path: Path) -> None:
    path = tmp_path / "slow.pt"
    head = _real_header()
    code = ("import sys, time\nf = open(sys.argv[1], 'wb')\ndata = open(sys.argv[2], 'rb').read()\n"
            "for i in range(1, 200):\n    f.write(data[i - 1:i]); f.flush(); time.sleep(0.01)\n"
            "time.sleep(30)\n")
    src = tmp_path / "head.bin"
    src.write_bytes(head[:400])   # never reaches data.pkl's STOP
    p = subprocess.Popen([sys.executable, "-c", code, str(path), str(src)])
    try:
        reader = SizeReader()
        fd = None
        deadline = time.time() + 10
        while fd is None and time.time() < deadline:
            for name in os.listdir(f"/proc/{p.pid}/fd"):
                if os.path.realpath(f"/proc/{p.pid}/fd/{name}") == str(path):
                    fd = int(name)
            time.sleep(0.05)
        assert fd is not None
        results = []
        for _ in range(60):
            results.append(reader.expected(p.pid, fd, str(path), path.stat().st_size, []))
            time.sleep(0.05)
        assert reader.reads_total <= MAX_READS
        assert results[-1].bytes == 0
    finally:
        p.kill()
        p.wait()
