"""What a rank's thread is blocked in: the syscall tables, the reading of real
sleeping processes, and the reading's way over the wire to the late rank's clause.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ncclwatch import syscalls
from ncclwatch.agent import caps
from ncclwatch.agent.delta import FULL, BRIEF, Sent, how_sent
from ncclwatch.agent.sample import ProcessSampler, blocked_in
from ncclwatch.contract import checks
from ncclwatch.contract.limits import MAX_BLOCKED_IN, STRING_BOUNDS
from ncclwatch.daemon.core import Daemon, DaemonConfig
from ncclwatch.model import CollectiveOp, RankState
from ncclwatch.sanitize import FIELDS
from tests.harness.reports import report, sample

# -- the tables, against the kernel's own -----------------------------------------------

#: The kernel's UAPI headers (Debian's linux-libc-dev): x86_64's table is
#: generated from syscall_64.tbl, arm64 uses the generic one.
HEADERS = {"x86_64": Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
           "aarch64": Path("/usr/include/asm-generic/unistd.h")}


def _header_numbers(path: Path) -> dict[str, int]:
    out = {}
    for m in re.finditer(r"^#define __NR(?:3264)?_(\w+)\s+(\d+)\s*$", path.read_text(), re.M):
        out.setdefault(m.group(1), int(m.group(2)))
    return out


@pytest.mark.parametrize("arch", sorted(HEADERS))
def test_every_number_is_the_kernels(arch: str) -> None:
    if not HEADERS[arch].exists():
        pytest.skip(f"no kernel headers at {HEADERS[arch]} (apt-get install linux-libc-dev)")
    kernel = _header_numbers(HEADERS[arch])
    ours = syscalls.NUMBERS[arch]
    assert {name: kernel.get(name) for name in ours} == ours
    # every call the late-rank clause names is in both tables where the arch has it
    for name in ("read", "write", "pread64", "pwrite64", "futex", "epoll_pwait", "ppoll",
                 "pselect6", "nanosleep", "clock_nanosleep", "recvfrom", "recvmsg", "sendto",
                 "sendmsg", "accept", "accept4", "connect", "openat", "fsync", "fdatasync",
                 "wait4", "ioctl"):
        assert name in ours, name
    # x86_64 alone keeps the old calls
    assert ("epoll_wait" in ours) == ("poll" in ours) == ("select" in ours) == (arch == "x86_64")


def test_known_numbers_are_named_and_others_are_numbers() -> None:
    assert syscalls.call_name(202, "x86_64") == "futex"
    assert syscalls.call_name(98, "aarch64") == "futex"
    assert syscalls.call_name(230, "x86_64") == "clock_nanosleep"
    assert syscalls.call_name(115, "aarch64") == "clock_nanosleep"
    assert syscalls.call_name(0, "x86_64") == "read" and syscalls.call_name(63, "aarch64") == "read"
    assert syscalls.call_name(435, "x86_64") == "syscall 435"        # clone3: not in the table
    assert syscalls.call_name(0, "riscv64") == "syscall 0"           # no table: numbers
    assert syscalls.arch("amd64") == "x86_64" and syscalls.arch("arm64") == "aarch64"
    assert syscalls.arch("ppc64le") == ""


@pytest.mark.parametrize("text, wchan, arch, want", [
    ("running\n", "", "x86_64", "running"),
    ("202 0x7f 0x80 0x0 0x0 0x0 0x0 0x7ffd 0x7f12\n", "futex_wait_queue", "x86_64",
     "futex/futex_wait_queue"),
    ("98 0x1 0x2 0x3 0x4 0x5 0x6 0xff 0xee\n", "futex_wait_queue", "aarch64",
     "futex/futex_wait_queue"),
    ("0 0x3 0x0 0x1 0 0 0 0x1 0x2\n", "pipe_read", "x86_64", "read/pipe_read"),
    ("0 0x3 0x0 0x1 0 0 0 0x1 0x2\n", "0", "x86_64", "read"),          # wchan hidden
    ("-1 0x7ffd 0x401000\n", "folio_wait_bit_common", "x86_64",
     "no_syscall/folio_wait_bit_common"),
    ("435 0 0 0 0 0 0 0 0\n", "do_foo.isra.0", "x86_64", "syscall 435/do_foo.isra.0"),
    ("0 0 0 0 0 0 0 0 0\n", "bad symbol;rm", "x86_64", "read"),         # not a symbol: left out
    ("", "", "x86_64", ""),
    ("garbage", "", "x86_64", ""),
])
def test_reading(text, wchan, arch, want) -> None:
    assert syscalls.reading(text, wchan, arch) == want
    if want:
        assert syscalls.parse(want)[0]


@pytest.mark.parametrize("value, want", [
    ("read/pipe_read", "blocked in read (pipe_read): reading a pipe, socket or file"),
    ("futex/futex_wait_queue", "blocked in futex (futex_wait_queue): waiting on a lock or "
                               "condition"),
    ("futex", "blocked in futex: waiting on a lock or condition"),
    ("clock_nanosleep/hrtimer_nanosleep",
     "blocked in clock_nanosleep (hrtimer_nanosleep): asleep (a sleep or a retry loop)"),
    ("running", "running"),
    ("syscall 435", "blocked in syscall 435"),
    ("", ""),
    ("READ/x", ""),                      # not a reading the agent makes: unknown
    ("read/<script>", ""),
    ("read/" + "x" * 700, ""),
])
def test_words(value, want) -> None:
    assert syscalls.words(value) == want


def test_every_named_call_has_words_or_is_said_by_name() -> None:
    named = {n for table in syscalls.NUMBERS.values() for n in table}
    assert set(syscalls.MEANINGS) <= named
    assert named - set(syscalls.MEANINGS) == set()   # every call in a table has words


# -- real processes ---------------------------------------------------------------------


def _wait_for(pid: int, want: str, timeout: float = 10.0) -> str:
    """The reading once it names ``want`` (the child may still be starting)."""
    deadline, got = time.monotonic() + timeout, ""
    while time.monotonic() < deadline:
        got = blocked_in(pid)
        if got.split("/")[0] == want:
            return got
        time.sleep(0.05)
    return got


def test_a_sleeping_child_reads_as_asleep() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        got = _wait_for(child.pid, "clock_nanosleep")
        # glibc's sleep is clock_nanosleep; an older one calls nanosleep
        assert got.split("/")[0] in ("clock_nanosleep", "nanosleep"), got
        assert "asleep" in syscalls.words(got)
        # reading it paused nothing: the child is still sleeping, not traced
        with open(f"/proc/{child.pid}/status") as f:
            status = f.read()
        assert "\nState:\tS" in status and "\nTracerPid:\t0\n" in status
    finally:
        child.kill()
        child.wait()


def test_a_child_blocked_on_a_pipe_reads_as_read() -> None:
    r, w = os.pipe()
    child = subprocess.Popen([sys.executable, "-c", "import os; os.read(0, 1)"], stdin=r)
    os.close(r)
    try:
        got = _wait_for(child.pid, "read")
        assert got.split("/")[0] == "read", got
        assert syscalls.words(got).startswith("blocked in read")
    finally:
        os.close(w)
        child.wait(timeout=10)
    assert child.returncode == 0    # it read the EOF and ended: it was never stopped


def test_a_spinning_child_reads_as_running() -> None:
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        # mostly "running"; a reading between two slices may catch it preempted
        got = [blocked_in(child.pid) for _ in range(20)]
        assert got.count("running") >= 10, got
    finally:
        child.kill()
        child.wait()


def test_a_gone_process_reads_as_unknown() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert blocked_in(child.pid) == ""


def test_the_sampler_reads_each_still_round_and_a_moving_rank_only_when_due(
        monkeypatch) -> None:
    """A still rank's reading is renewed every round; a rank making progress
    keeps its last one until caps.BLOCKED_IN_EVERY has passed."""
    reads: list[int] = []
    real = blocked_in

    def counting(pid, tid=0, proc="/proc", architecture=None):
        reads.append(pid)
        return real(pid, tid, proc, architecture)

    monkeypatch.setattr("ncclwatch.agent.sample.blocked_in", counting)
    still = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    # a busy writer: many write calls a second, progress every round
    busy = subprocess.Popen([sys.executable, "-c",
                             "import os, time\nwhile True:\n os.write(1, b'x'); time.sleep(0.001)"],
                            stdout=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        sampler = ProcessSampler()
        for _ in range(4):
            a, b = sampler.sample(still.pid), sampler.sample(busy.pid)
            assert a is not None and b is not None
            time.sleep(0.3)
        assert reads.count(still.pid) == 4          # every round: it sits still
        assert reads.count(busy.pid) == 1           # once, then not before it is due
        assert a.blocked_in.startswith(("clock_nanosleep", "nanosleep"))
        assert b.blocked_in                          # the first reading, kept
        monkeypatch.setattr(caps, "BLOCKED_IN_EVERY", 0.0)
        sampler.sample(busy.pid)
        assert reads.count(busy.pid) == 2           # due: read again
    finally:
        for p in (still, busy):
            p.kill()
            p.wait()


# -- on the wire ------------------------------------------------------------------------


def test_the_field_is_bounded_and_gated() -> None:
    assert STRING_BOUNDS["RankSample.blocked_in"] == MAX_BLOCKED_IN >= syscalls.MAX_READING
    assert FIELDS["RankSample.blocked_in"].cap <= MAX_BLOCKED_IN
    s = sample("j", 0, 2, RankState.IDLE)
    s.blocked_in = "x" * MAX_BLOCKED_IN
    assert checks.check_sample(s) is None
    s.blocked_in += "x"
    fault = checks.check_sample(s)
    assert fault is not None and fault.reason == "string_too_long"


def test_a_changed_reading_goes_in_full() -> None:
    s = sample("j", 0, 2, RankState.COLLECTIVE, CollectiveOp.ALL_REDUCE, seconds=3.0)
    s.still_seconds = 3.0
    s.process.cpu_seconds = 1.0
    s.blocked_in = "futex/futex_wait_queue"
    k = Sent(1, s, 100.0)
    assert how_sent(s, k, 100.0)[0] == BRIEF
    s.blocked_in = "running"
    assert how_sent(s, k, 100.0) == (FULL, "blocked_in")


def test_the_daemon_keeps_a_reading_and_drops_what_is_none() -> None:
    d = Daemon(DaemonConfig())
    s = sample("j", 0, 2, RankState.IDLE)
    s.still_seconds = 4.0
    s.blocked_in = "clock_nanosleep/hrtimer_nanosleep"
    d.ingest(report([s], seq=1), now=10.0)
    rec = d.table.jobs["j"].ranks[0]
    assert rec.blocked_in == "clock_nanosleep/hrtimer_nanosleep"
    s.blocked_in = "clock_nanosleep/<b>bold</b>"
    d.ingest(report([s], seq=2), now=11.0)
    assert rec.blocked_in == ""


@pytest.mark.parametrize("reading, asleep", [
    ("clock_nanosleep/hrtimer_nanosleep", True), ("nanosleep", True),
    ("futex/futex_wait_queue", False), ("read/pipe_read", False), ("running", False),
    ("", False), ("clock_nanosleep/\x1b[2J", False),   # not a reading: unknown
])
def test_asleep_is_a_timer_sleep_only(reading: str, asleep: bool) -> None:
    assert syscalls.asleep(reading) is asleep
