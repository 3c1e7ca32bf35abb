"""procstat: the one parser of /proc/PID/stat, counted after the command name."""

from __future__ import annotations

import os

import psutil
import pytest

from ncclwatch.agent import procstat
from ncclwatch.agent.discover import proc_id
from ncclwatch.agent.sample import thread_cpu
from ncclwatch.agent.viewhelper import start_time

#: A real stat line's shape (proc(5)), with a command name that a process may set.
HOSTILE = (b"4242 (x) 3 (y z)) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 3 0 "
           b"987654 1000000 100 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n")


def _fake(tmp_path, pid: int, line: bytes, tid: int = 0):
    d = tmp_path / str(pid) / "task" / str(tid) if tid else tmp_path / str(pid)
    d.mkdir(parents=True)
    (d / "stat").write_bytes(line)
    return str(tmp_path)


def test_fields_are_counted_after_the_last_parenthesis_of_the_name(tmp_path) -> None:
    proc = _fake(tmp_path, 4242, HOSTILE)
    fs = procstat.fields(4242, proc=proc)
    assert procstat.field(fs, procstat.STATE) == b"S"
    assert procstat.field(fs, procstat.UTIME) == b"250"
    assert procstat.field(fs, procstat.STIME) == b"75"
    assert procstat.start_ticks(4242, proc) == 987654


def test_each_reader_takes_its_field_from_the_one_parser(tmp_path) -> None:
    proc = _fake(tmp_path, 4242, HOSTILE)
    _fake(tmp_path / "t", 4242, HOSTILE, tid=4243)
    assert proc_id(4242, proc)[0] == 987654
    cpu, state = thread_cpu(4242, 4243, str(tmp_path / "t"))
    assert state == "S" and cpu == pytest.approx(325 / os.sysconf("SC_CLK_TCK"))


def test_the_live_process_start_agrees_with_psutil() -> None:
    ticks = procstat.start_ticks(os.getpid())
    started = psutil.boot_time() + ticks / os.sysconf("SC_CLK_TCK")
    assert started == pytest.approx(psutil.Process().create_time(), abs=1.0)
    assert start_time(os.getpid()) == ticks


@pytest.mark.parametrize("line", [b"", b"4242 (x S 1", b"4242 (x) S 1\n"])
def test_a_short_or_broken_line_raises_what_the_readers_catch(tmp_path, line) -> None:
    proc = _fake(tmp_path, 4242, line)
    with pytest.raises((ValueError, IndexError)):
        procstat.start_ticks(4242, proc)
    assert proc_id(4242, proc) == (0, -1)


def test_a_gone_process_raises_oserror(tmp_path) -> None:
    with pytest.raises(OSError):
        procstat.fields(4242, proc=str(tmp_path))
    assert thread_cpu(4242, 4243, str(tmp_path)) == (None, "")
