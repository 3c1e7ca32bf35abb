"""The debug-info pipe: real FIFOs, real reader processes, a real stalled gloo job."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from ncclwatch.agent.frpipe import (
    DumpWatcher,
    PipeUnavailable,
    dump_candidates,
    dump_path,
    pipe_path,
    request_dump,
    trigger,
)
from ncclwatch.flightrec import analyze
from tests.harness import paths
from tests.harness.paths import ROOT

DATA = paths.DATA / "flightrec"

# One gloo rank with a reader thread doing what ProcessGroupNCCL's DumpPipe and
# HeartbeatMonitor do (gloo has no pipe of its own): unlink + mkfifo
# <stem><rank>.pipe (0666), keep it open O_RDONLY|O_NONBLOCK, read up to 128
# bytes every second (TORCH_NCCL_COORD_CHECK_MILSEC), and on any byte dump the
# Flight Recorder to <prefix><rank>, truncating and rewriting the file in place
# as DebugInfoWriter's std::ofstream does. The last rank never joins the third
# collective (a long save); the others block in it.
RANK_SCRIPT = textwrap.dedent('''
    import datetime, os, sys, threading, time
    rank, world, port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    os.environ["TORCH_FR_BUFFER_SIZE"] = "2000"
    import torch
    import torch.distributed as dist

    def dump_pipe_reader(stem, prefix):
        filename = f"{stem}{rank}.pipe"
        try:
            os.unlink(filename)
        except FileNotFoundError:
            pass
        os.mkfifo(filename, 0o666)
        fd = os.open(filename, os.O_RDONLY | os.O_NONBLOCK)
        print("PIPE", filename, flush=True)
        while True:
            time.sleep(1.0)
            try:
                got = os.read(fd, 128)
            except BlockingIOError:
                continue
            if got:
                trace = torch._C._distributed_c10d._dump_fr_trace()
                with open(f"{prefix}{rank}", "wb") as f:
                    f.write(trace)
                print("DUMPED", len(trace), flush=True)

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=30))
    threading.Thread(target=dump_pipe_reader, daemon=True,
                     args=(os.environ["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"],
                           os.environ["TORCH_FR_DUMP_TEMP_FILE"])).start()
    t = torch.ones(4)
    dist.all_reduce(t)
    dist.barrier()
    if rank == world - 1:
        print("SAVING", flush=True)
        time.sleep(60)
    else:
        print("BLOCKING", flush=True)
        dist.all_reduce(t)
    os._exit(0)
''')

# A reader that holds the FIFO, takes the first byte and goes away without dumping.
VANISHING_READER = textwrap.dedent('''
    import os, sys, time
    fd = os.open(sys.argv[1], os.O_RDONLY | os.O_NONBLOCK)
    print("READY", flush=True)
    while True:
        try:
            if os.read(fd, 128):
                os._exit(0)
        except BlockingIOError:
            pass
        time.sleep(0.05)
''')


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Lines:
    """A child's stdout, read by a thread; wait_for() a line with a prefix."""

    def __init__(self, popen: subprocess.Popen) -> None:
        self.popen = popen
        self.lines: list[str] = []
        self.eof = False
        self._cv = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.popen.stdout:
            with self._cv:
                self.lines.append(line.rstrip("\n"))
                self._cv.notify_all()
        with self._cv:
            self.eof = True
            self._cv.notify_all()

    def wait_for(self, prefix: str, timeout: float, count: int = 1) -> str:
        end = time.monotonic() + timeout
        with self._cv:
            while True:
                found = [line for line in self.lines if line.startswith(prefix)]
                if len(found) >= count:
                    return found[-1]
                left = end - time.monotonic()
                if left <= 0 or self.eof:
                    raise AssertionError(f"no {prefix!r} line (x{count}); output:\n" + "\n".join(self.lines))
                self._cv.wait(min(left, 0.2))


def _spawn(argv: list[str], env: dict[str, str] | None = None) -> Lines:
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env={**os.environ, **(env or {})}, cwd=ROOT, start_new_session=True)
    return Lines(p)


def _kill(lines: Lines) -> None:
    if lines.popen.poll() is None:
        lines.popen.kill()
    lines.popen.wait(10)


# ------------------------------------------------------------------ paths


def test_pipe_path():
    assert pipe_path({}, 3) is None
    assert pipe_path({"TORCH_NCCL_DEBUG_INFO_PIPE_FILE": ""}, 3) is None
    env = {"TORCH_NCCL_DEBUG_INFO_PIPE_FILE": "/run/fr/pipe_"}
    assert pipe_path(env, 3) == "/run/fr/pipe_3.pipe"
    assert pipe_path({**env, "TORCH_FR_BUFFER_SIZE": "2000"}, 0) == "/run/fr/pipe_0.pipe"
    # an explicit 0 buffer: torch makes no pipe (TORCH_FR_BUFFER_SIZE is read first)
    assert pipe_path({**env, "TORCH_NCCL_TRACE_BUFFER_SIZE": "0"}, 0) is None
    assert pipe_path({**env, "TORCH_FR_BUFFER_SIZE": "0", "TORCH_NCCL_TRACE_BUFFER_SIZE": "10"}, 0) is None
    assert pipe_path({**env, "TORCH_FR_BUFFER_SIZE": "10", "TORCH_NCCL_TRACE_BUFFER_SIZE": "0"}, 0) is not None


def test_dump_path_env_and_defaults():
    home = {"HOME": "/home/u"}
    assert dump_path({**home, "TORCH_FR_DUMP_TEMP_FILE": "/d/fr_"}, 5) == "/d/fr_5"
    assert dump_path({**home, "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/d/old_"}, 5) == "/d/old_5"
    both = {**home, "TORCH_FR_DUMP_TEMP_FILE": "/d/fr_", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/d/old_"}
    assert dump_candidates(both, 1) == ["/d/fr_1", "/d/old_1"]
    dyn = {**home, "TORCH_FR_DUMP_TEMP_FILE": "/d/one_file", "TORCH_FR_DUMP_DYNAMIC_FILE_NAME": "1"}
    assert dump_path(dyn, 5) == "/d/one_file"
    # defaults by torch version; the newest when unknown
    assert dump_path(home, 2) == "/home/u/.cache/torch/comm_lib_trace_rank_2"
    assert dump_path(home, 2, "2.13.0+cpu") == "/home/u/.cache/torch/comm_lib_trace_rank_2"
    assert dump_path({**home, "XDG_CACHE_HOME": "/x"}, 2) == "/x/torch/comm_lib_trace_rank_2"
    assert dump_path(home, 2, "2.8.0") == "/home/u/.cache/torch/nccl_trace_rank_2"
    assert dump_path(home, 2, (2, 5)) == "/tmp/nccl_trace_rank_2"
    assert dump_path({}, 2, "2.9") == "/tmp/.cache/torch/comm_lib_trace_rank_2"   # HOME unset: /tmp
    cands = dump_candidates(home, 2)
    assert cands[0].endswith("comm_lib_trace_rank_2") and "/tmp/nccl_trace_rank_2" in cands
    assert len(cands) == len(set(cands))


# ---------------------------------------------------------------- trigger


def test_trigger_without_a_reader_is_false_at_once(tmp_path):
    fifo = tmp_path / "pipe_0.pipe"
    os.mkfifo(fifo)
    t = time.monotonic()
    assert trigger(str(fifo)) is False          # ENXIO: nobody holds it open
    assert trigger(str(tmp_path / "absent.pipe")) is False
    assert time.monotonic() - t < 0.5
    env = {"TORCH_NCCL_DEBUG_INFO_PIPE_FILE": str(tmp_path / "pipe_"),
           "TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "dump_")}
    t = time.monotonic()
    assert request_dump(env, 0, timeout=5.0) is None
    assert request_dump(env, 1, timeout=5.0) is None   # no FIFO at all
    assert time.monotonic() - t < 0.5


def test_trigger_writes_one_byte_to_a_live_reader(tmp_path):
    fifo = tmp_path / "pipe_0.pipe"
    os.mkfifo(fifo)
    rfd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        assert trigger(str(fifo)) is True
        assert os.read(rfd, 128) == b"1"
    finally:
        os.close(rfd)


def test_trigger_never_writes_into_something_else(tmp_path):
    regular = tmp_path / "pipe_0.pipe"
    regular.write_bytes(b"keep me")
    before = regular.stat()
    assert trigger(str(regular)) is False
    after = regular.stat()
    assert regular.read_bytes() == b"keep me"
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    # a symlink to a FIFO that has a reader: refused too, nothing arrives
    fifo = tmp_path / "real.pipe"
    os.mkfifo(fifo)
    link = tmp_path / "pipe_1.pipe"
    link.symlink_to(fifo)
    rfd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        assert trigger(str(link)) is False
        assert os.read(rfd, 128) == b""          # no writer ever came: EOF, no byte
    finally:
        os.close(rfd)
    assert trigger(str(tmp_path)) is False      # a directory


def test_request_dump_gives_up_at_its_timeout(tmp_path):
    """A reader that takes the byte and never dumps: None after `timeout`, not later."""
    stem = str(tmp_path / "pipe_")
    os.mkfifo(f"{stem}0.pipe")
    rfd = os.open(f"{stem}0.pipe", os.O_RDONLY | os.O_NONBLOCK)
    try:
        env = {"TORCH_NCCL_DEBUG_INFO_PIPE_FILE": stem, "TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "d_")}
        t = time.monotonic()
        assert request_dump(env, 0, timeout=0.6) is None
        elapsed = time.monotonic() - t
        assert 0.5 <= elapsed < 1.2, elapsed
        assert os.read(rfd, 128) == b"1"             # exactly one byte was sent
    finally:
        os.close(rfd)


def test_not_configured_is_pipe_unavailable():
    with pytest.raises(PipeUnavailable, match="TORCH_NCCL_DEBUG_INFO_PIPE_FILE"):
        request_dump({"HOME": "/tmp"}, 0)


def test_a_reader_that_vanishes_ends_the_wait_early(tmp_path):
    stem = str(tmp_path / "pipe_")
    fifo = f"{stem}0.pipe"
    os.mkfifo(fifo)
    reader = _spawn([sys.executable, "-c", VANISHING_READER, fifo])
    try:
        reader.wait_for("READY", 20)
        env = {"TORCH_NCCL_DEBUG_INFO_PIPE_FILE": stem, "TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "d_")}
        t = time.monotonic()
        assert request_dump(env, 0, timeout=20.0) is None
        assert time.monotonic() - t < 3.0        # POLLERR on the write end, not the 20 s timeout
        assert reader.popen.wait(5) == 0
    finally:
        _kill(reader)


# ---------------------------------------------------------------- watcher


def test_watcher_waits_for_a_complete_rewrite(tmp_path):
    dump_file = tmp_path / "comm_lib_trace_rank_1"
    first = (DATA / "real" / "hang" / "comm_lib_trace_rank_1").read_bytes()
    second = (DATA / "real" / "healthy" / "comm_lib_trace_rank_1").read_bytes()
    dump_file.write_bytes(first)
    w = DumpWatcher(str(dump_file))
    assert w.poll() is None                      # unchanged since the watcher was made
    with open(dump_file, "wb") as f:             # truncate and rewrite in place, as torch does
        f.write(second[: len(second) // 2])
        f.flush()
        assert w.poll() is None                  # half-written: not a dump, not an error
        assert w.poll() is None
        f.write(second[len(second) // 2:])
    d = w.poll()
    assert d is not None and d.rank == 1 and d.path == str(dump_file)
    assert [e.op for e in d.entries][-1] == "barrier"      # the healthy dump, not the old one
    assert w.poll() is None                      # returned once per rewrite
    os.utime(dump_file, ns=(1, 1))
    dump_file.write_bytes(first)
    again = w.poll()
    assert again is not None and again.entries[-1].op == "all_reduce"


def test_watcher_over_candidates_and_never_reads_a_fifo(tmp_path):
    fifo = tmp_path / "trace_0"
    os.mkfifo(fifo)                              # opening it for reading would block: it must not
    other = tmp_path / "other_0"
    w = DumpWatcher([str(fifo), str(other)], rank=0)
    t = time.monotonic()
    assert w.poll() is None
    other.write_bytes((DATA / "real" / "hang" / "comm_lib_trace_rank_0").read_bytes())
    d = w.poll()
    assert d is not None and d.path == str(other) and d.rank == 0
    assert time.monotonic() - t < 1.0


# ------------------------------------------------------- a real stalled job


# A real stalled job, end to end. It counts the dumps it asked for, so no other
# test's agent may see it: make test runs each worker in its own pid namespace
# (--ns-workers); once, beside the matrix, the matrix's agent saw the stall and
# asked for a dump through the same pipe.
@pytest.mark.e2e
def test_request_dump_from_a_stalled_gloo_job(tmp_path):
    """Rank 1 never joins the third all_reduce; rank 0 blocks in it. Through each
    rank's pipe, request_dump gets real dumps, and analyze() names rank 1."""
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    world, port = 2, _free_port()
    env = {"TORCH_NCCL_DEBUG_INFO_PIPE_FILE": str(tmp_path / "pipe_"),
           "TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "comm_lib_trace_rank_"),
           "OMP_NUM_THREADS": "1"}
    ranks = [_spawn([sys.executable, str(script), str(r), str(world), str(port)], env) for r in range(world)]
    try:
        for r in ranks:
            r.wait_for("PIPE", 90)
        ranks[0].wait_for("BLOCKING", 60)
        ranks[1].wait_for("SAVING", 60)
        time.sleep(1.5)   # rank 0 has recorded the third collective (slack for a loaded machine)
        results: dict[int, object] = {}

        def ask(rank: int) -> None:
            results[rank] = request_dump(env, rank, timeout=10.0)

        # A collective's completion reaches the Flight Recorder from gloo's own
        # thread after the call returned: on a loaded machine rank 1's barrier can
        # still read as started-not-completed a moment after it printed SAVING, so
        # ask again (each ask is one real dump) until both records have settled.
        asked = 0
        for _ in range(5):
            threads = [threading.Thread(target=ask, args=(r,)) for r in range(world)]
            t0 = time.monotonic()
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            asked += 1
            assert time.monotonic() - t0 < 10.0
            dumps = [results[r] for r in range(world)]
            assert all(d is not None for d in dumps), results
            if dumps[0].status["0"] == (3, -1, 2) and dumps[1].status["0"] == (2, -1, 2):
                break
            time.sleep(1.0)
        assert [d.rank for d in dumps] == [0, 1]
        assert dumps[0].path == env["TORCH_FR_DUMP_TEMP_FILE"] + "0"
        assert dumps[0].status["0"] == (3, -1, 2) and dumps[1].status["0"] == (2, -1, 2)

        a = analyze(dumps)
        assert a.missing_ranks() == [1]
        s = a.stuck[0]
        assert (s.seq, s.op, s.waiting_ranks, s.missing_ranks, s.timeout_ms) == (
            3, "all_reduce", (0,), (1,), 30_000)

        # the training went on; a second request gets a fresh rewrite of the same file
        before = dumps[0].entries[-1].time_created_ns
        again = request_dump(env, 0, timeout=10.0)
        assert again is not None and again.entries[-1].time_created_ns == before
        assert ranks[0].popen.poll() is None and ranks[1].popen.poll() is None
        ranks[0].wait_for("DUMPED", 5, count=asked + 1)  # one dump per request, no more
        time.sleep(1.2)
        assert sum(line.startswith("DUMPED") for line in ranks[0].lines) == asked + 1
    finally:
        for r in ranks:
            _kill(r)
