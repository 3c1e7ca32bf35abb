"""Untrusted text on a terminal and in log lines.

Reproductions, with the real daemon process, real gRPC and the real
``ncclwatch status``: a function name that clears the screen and prints
"no stall", escape sequences in the job id and SLURM_JOB_USER, a newline
in a job id or node name that forges daemon log lines.
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import time
import urllib.request

import grpc
import pytest

from ncclwatch import sanitize
from ncclwatch.model import CollectiveOp, RankState
from ncclwatch.v1 import collector_pb2 as pb
from ncclwatch.v1 import collector_pb2_grpc as pb_grpc
from tests.harness.procs import Proc, free_port
from tests.harness.reports import BARRIER, SER, frames, report, sample, stack_pb
from tests.harness.statusview import assert_snippets_as_lines
from tests.harness.tools import need

CLEAR = "\x1b[2J\x1b[H"
FORGED = "1999-01-01 00:00:00,000 WARNING ncclwatch.daemon.core: FORGED"
JOB = f"evil{CLEAR}\n{FORGED} job"
NODE = f"node\n{FORGED} node"
EVIL_FRAMES = frames((f"{CLEAR}no stall\r", SER), ("_save", SER), ("main", "/job/train.py"))


def _hostile_stall() -> pb.ReportRequest:
    s0 = sample(JOB, 0, 4, RankState.SAVING, seconds=20.0, timeout=90.0,
                stack=stack_pb(EVIL_FRAMES).id)
    s0.job.scheduler_job.CopyFrom(pb.SchedulerJob(
        scheduler="slurm", job_id="77", job_name="n\x1b]0;title\x07", user=f"{CLEAR}mallory"))
    rest = [sample(JOB, r, 4, RankState.COLLECTIVE, CollectiveOp.BARRIER, seconds=20.0,
                   timeout=90.0, stack=stack_pb(BARRIER).id) for r in range(1, 4)]
    return report([s0, *rest], node=NODE, agent="agent-evil",
                  stacks=[stack_pb(EVIL_FRAMES), stack_pb(BARRIER)])


def test_status_and_daemon_log_lines_escape_what_jobs_chose() -> None:
    grpc_port, http_port = free_port(), free_port()
    daemon = Proc([need("ncclwatch"), "daemon", "--grpc", f"127.0.0.1:{grpc_port}",
                   "--http", f"127.0.0.1:{http_port}"])
    try:
        async def send():
            async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as ch:
                await asyncio.wait_for(ch.channel_ready(), 30)
                stub = pb_grpc.CollectorServiceStub(ch)
                call = stub.Report(iter([_hostile_stall()]))
                assert [r.ack_seq async for r in call] == [1]
        asyncio.run(send())
        deadline = time.time() + 60  # wide: a loaded machine
        while "stall checkpoint_gather in job" not in daemon.output():
            assert time.time() < deadline and daemon.alive(), daemon.output()
            time.sleep(0.2)
        out = subprocess.run([need("ncclwatch"), "status", "--daemon",
                              f"http://127.0.0.1:{http_port}"],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        text = out.stdout
        assert "STALL checkpoint_gather" in text and "culprit: rank 0" in text
        assert not any(c in text for c in "\x1b\x07\r"), repr(text)
        assert "\\x1b[2J\\x1b[Hno stall\\x0d (" in text  # the frame, visible and inert
        assert "by \\x1b[2J\\x1b[Hmallory" in text and "x1b]0;title" in text
        assert "evil\\x1b[2J\\x1b[H\\x0a1999-01-01" in text  # the job id, one line
        # ncclwatch's own multi-line fixes (not the job's text) print as lines.
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/api/v1/jobs") as r:
            view = json.load(r)
        assert assert_snippets_as_lines(view, text) > 0, text
        lines = text.splitlines() + daemon.output().splitlines()
        assert not [ln for ln in lines if ln.startswith("1999-01-01") or "FORGED" in ln
                    and "\\x0a" not in ln], "\n".join(lines)
        # The daemon's own lines: the node and the job id on the line that names them.
        log = daemon.output()
        assert "on node\\x0a1999-01-01" in log and "in job evil\\x1b[2J" in log, log
        assert "\x1b" not in log
    finally:
        daemon.stop()


@pytest.mark.parametrize("raw, shown", [
    ("job\n1", "job\\x0a1"), ("a\x1b[31mred", "a\\x1b[31mred"), ("tab\there", "tab\\x09here"),
    ("bidi\u202eevil", "bidi\\u202eevil"), ("nel\x85", "nel\\x85"), ("ls\u2028", "ls\\u2028"),
    ("bad\udcffbyte", "bad\\xffbyte"), ("back\\slash ok", "back\\slash ok"),
    ("ünïcode ✓", "ünïcode ✓"),
])
def test_escape_shows_every_unsafe_character(raw, shown) -> None:
    assert sanitize.escape(raw) == shown


def test_log_filter_escapes_and_caps_arguments_not_our_format() -> None:
    rec = logging.LogRecord("ncclwatch", logging.INFO, __file__, 1, "agent %s on %s\n(%d)",
                            ("a\nb", "x" * 2000, 3), None)
    sanitize.EscapeArgs().filter(rec)
    msg = rec.getMessage()
    cut = "x" * (sanitize.MAX_LOG - len(sanitize.TRUNCATED)) + sanitize.TRUNCATED
    assert msg.startswith("agent a\\x0ab on " + cut + "\n")  # capped, marker included
    assert msg.endswith("\n(3)")  # our own format is kept as written
