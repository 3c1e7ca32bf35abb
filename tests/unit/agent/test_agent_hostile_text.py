"""Bytes from a monitored process are data, never a crash (issue 20, item 1).

One rank with a non-UTF-8 byte in an allowlisted variable, a file open under
a non-UTF-8 name, or a Slurm job whose name is not UTF-8 once made every
round of the agent fail, so every rank of every job on the node went
``unknown``. Here real processes carry those bytes through a real agent
round; property tests feed arbitrary bytes into every field of a sample.
"""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import sys
import time

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from ncclwatch.agent.agent import Agent, AgentConfig
from ncclwatch.agent.discover import RankProcess
from ncclwatch.agent.gpu import NvmlGpuReader
from ncclwatch.agent.report import AgentHealthCounts, build_report, sample_pb, stack_pb
from ncclwatch.agent.sample import MemoryLimit, OpenFile, ProcessSample
from ncclwatch.agent.scheduler import SchedulerJob, SchedulerLookup
from ncclwatch.agent.tracker import RankTracker
from ncclwatch.jobid import RankIdentity
from ncclwatch.sanitize import (COUNTS, MAX_ENV_VALUE, MAX_FRAME, MAX_LABEL, MAX_PATH, TRUNCATED,
                                clean, for_log, is_clean)
from ncclwatch.stacks import Frame, Stack
from ncclwatch.v1 import collector_pb2 as pb
from tests.harness.procs import free_port
from tests.harness.tools import py_spy_available

# -- the sanitiser itself -------------------------------------------------------------


@pytest.mark.parametrize("raw,shown", [
    (b"/tmp/nccl.\xff.log", "/tmp/nccl.\\xff.log"),           # undecodable byte, named
    ("/tmp/nccl.\udcff.log", "/tmp/nccl.\\xff.log"),           # the same, as psutil hands it
    ("job\nINFO fake line", "job\\x0aINFO fake line"),          # a newline cannot forge a line
    ("\x1b[2Jno stall", "\\x1b[2Jno stall"),                    # no terminal escapes
    ("abc\u202egnp.exe", "abc\\u202egnp.exe"),                  # no bidi reordering
    ("half \ud800 surrogate", "half \\ud800 surrogate"),
    ("ok/naïve/日本", "ok/naïve/日本"),                          # valid text stays as it is
])
def test_clean_shows_bytes_and_escapes_controls(raw, shown) -> None:
    assert clean(raw) == shown
    shown.encode("utf-8")


def test_a_long_value_is_cut_and_says_so_never_inside_an_escape() -> None:
    out = clean("a" * 95 + "\x1b" * 10, 100)
    assert len(out) <= 100 and out.endswith(TRUNCATED)
    body = out[:-len(TRUNCATED)]
    assert body.replace("\\x1b", "").strip("a") == ""         # whole escapes only
    assert clean("x" * 10_000_000, 50) == "x" * (50 - len(TRUNCATED)) + TRUNCATED


@given(st.binary(max_size=300), st.integers(min_value=len(TRUNCATED), max_value=400))
def test_clean_is_valid_safe_bounded_and_idempotent(raw, cap) -> None:
    out = clean(raw, cap)
    out.encode("utf-8")                       # never raises
    assert is_clean(out) and len(out) <= cap
    assert clean(out, cap) == out
    if len(raw) <= cap // 4 and b"\\" not in raw:
        assert TRUNCATED not in out


def test_log_helper_escapes_whatever_it_is_given() -> None:
    assert for_log("j1\n2026-12-05 INFO forged") == "j1\\x0a2026-12-05 INFO forged"
    assert for_log(b"n\xfe") == "n\\xfe" and for_log(42) == "42"


# -- a full sample over arbitrary bytes -------------------------------------------------

_TEXT = st.one_of(st.binary(max_size=120).map(lambda b: b.decode("utf-8", "surrogateescape")),
                  st.text(max_size=80),
                  st.sampled_from(["a" * 9000, "/ck/\udcff" * 3000, "\x00\x1b\n" * 50]))


@st.composite
def _tracker(draw) -> tuple[RankTracker, list[Stack]]:
    env = draw(st.dictionaries(st.one_of(st.just("NCCL_DEBUG_FILE"),
                                         _TEXT.map(lambda t: "NCCL_" + t)), _TEXT, max_size=6))
    ident = RankIdentity(job_id=draw(_TEXT), job_source=draw(_TEXT), rank=3, local_rank=0,
                         world_size=8, rank_source=draw(_TEXT))
    proc = RankProcess(pid=4242, create_time=1.0, identity=ident, env=env)
    t = RankTracker(proc, 0.0)
    files = tuple(OpenFile(draw(_TEXT), 10, previous_path=draw(_TEXT),
                           expected_source=draw(_TEXT), copy_source_path=draw(_TEXT),
                           header_error=draw(_TEXT)) for _ in range(draw(st.integers(0, 3))))
    t.observe_process(ProcessSample(pid=4242, cpu_seconds=1.0, rss_bytes=1, io_read_bytes=0,
                                    io_write_bytes=0, num_threads=2, files_writing=files,
                                    memory_limits=(MemoryLimit("host", 1, 2),)), 1.0)
    t.scheduler_job = SchedulerJob("slurm", draw(_TEXT), draw(_TEXT), draw(_TEXT), "scontrol")
    stacks = [Stack(tuple(Frame(draw(_TEXT), draw(_TEXT), 3) for _ in range(2)),
                    thread_name=draw(_TEXT))]
    return t, stacks


def _strings(msg) -> list[str]:
    """Every string field of a message, nested and in maps."""
    out = []
    for fd, value in msg.ListFields():
        values = value if fd.is_repeated else [value]
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            for k, v in value.items():
                out += [k, v]
            continue
        for v in values:
            if isinstance(v, str):
                out.append(v)
            elif hasattr(v, "ListFields"):
                out += _strings(v)
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_tracker(), _TEXT)
def test_a_full_round_over_arbitrary_bytes_never_fails(tracked, node) -> None:
    t, stacks = tracked
    s = sample_pb(t, 2.0, (), {}, with_job=True)
    report = build_report(node=node, agent_id="a", seq=1, now=2.0, wall=2.0, interval=1.0,
                          samples=[s], exited=[t.proc], health=AgentHealthCounts(),
                          ranks_watched=1)
    st_pb = [stack_pb(x) for x in stacks]
    for msg in [report, *st_pb]:
        back = type(msg).FromString(msg.SerializeToString())
        for text in _strings(back):
            assert is_clean(text) and len(text) <= MAX_ENV_VALUE, text[:80]
    # every field made it (nothing needed dropping: the sanitiser made it valid)
    assert s.HasField("process") and s.HasField("job")
    assert len(s.process.files_writing) == len(t.sample.files_writing)
    assert all(len(f.path) <= MAX_PATH for f in s.process.files_writing)
    assert len(s.identity.job_id) <= MAX_LABEL
    assert all(len(f.name) <= MAX_FRAME for x in st_pb for f in x.frames)


def test_a_field_that_cannot_be_built_is_dropped_and_counted_not_the_round() -> None:
    """Whatever slips past the sanitiser (here: a summary with a bad string
    built elsewhere) costs that field of that rank for one round, counted."""
    ident = RankIdentity("j", "explicit", 0, 0, 1)
    t = RankTracker(RankProcess(1, 1.0, ident, {}), 0.0)

    class Broken:
        def SerializeToString(self):
            raise UnicodeEncodeError("utf-8", "\udcff", 0, 1, "surrogates not allowed")
    t.flight_recorder = Broken()
    before = COUNTS.fields_dropped_total
    s = sample_pb(t, 1.0, (), {}, with_job=True)
    assert not s.HasField("flight_recorder") and s.HasField("job")
    assert COUNTS.fields_dropped_total == before + 1


# -- reproductions: real ranks, a real agent round ---------------------------------------

#: Secrets a rank hides where env redaction never looked: a directory of its
#: checkpoint path and the name of the function it waits in.
PATH_TOKEN = "hf_abcdefghijklmnopqrstuvwxyz012345"
FRAME_TOKEN = "ghp_abcdefghijklmnopqrstuvwxyz0123"
#: ... and its thread's name (issue 29): a title escape and a lower-case token.
THREAD_TOKEN = "tok_9f8e7d6c5b4a39281706f5e4"

_RANK = r"""
import os, sys, threading, time
import torch.distributed
threading.current_thread().name = "Main\x1b]0;owned\x07 %s"
d = os.path.join(os.fsencode(sys.argv[1]), b"%s")
os.makedirs(d, exist_ok=True)
f = open(os.path.join(d, b"ck\xff\x1b[2J.pt"), "wb")
f.write(b"x" * 4096); f.flush()
print("ready", flush=True)
def %s():
    while True: time.sleep(0.05)
%s()
""" % (THREAD_TOKEN, PATH_TOKEN, FRAME_TOKEN, FRAME_TOKEN)

_SCONTROL = "#!/bin/sh\nprintf 'JobId=4242 JobName=tr\\377ain\\033[2Jno-stall UserId=an\\376a(1000) " \
            "GroupId=ana(1000)\\n'\n"


@pytest.fixture
def hostile_node(tmp_path, monkeypatch):
    """Two ranks of one job; rank 0 carries every hostile byte, rank 1 none.
    scontrol (found on the agent's PATH) answers with a non-UTF-8 job name."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    scontrol = bindir / "scontrol"
    scontrol.write_text(_SCONTROL)
    scontrol.chmod(scontrol.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    base = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "10.9.9.9", "MASTER_PORT": "29911",
            "SLURM_JOB_ID": "4242"}
    base.pop("SLURM_JOB_NAME", None)
    base.pop("SLURM_JOB_USER", None)
    hostile = {**base, "RANK": "0", "NCCL_DEBUG_FILE": "/tmp/nccl.\udcff.log",
               "NCCL_\udcfeODD": "x\udcff\n", "NCCLWATCH_JOB_ID": "job-\udcff\nINFO forged"}
    procs = [subprocess.Popen([sys.executable, "-c", _RANK, str(tmp_path)], env=hostile,
                              stdout=subprocess.PIPE, start_new_session=True),
             subprocess.Popen([sys.executable, "-c", _RANK, str(tmp_path / "r1")],
                              env={**base, "RANK": "1", "NCCLWATCH_JOB_ID": "job-plain"},
                              stdout=subprocess.PIPE, start_new_session=True)]
    (tmp_path / "r1").mkdir()
    try:
        for p in procs:
            assert p.stdout.readline().strip() == b"ready"
        yield procs
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_hostile_bytes_of_one_rank_blind_nothing(hostile_node, caplog) -> None:
    py_spy_available()
    pids = {p.pid for p in hostile_node}
    stacks: list[pb.Stack] = []

    async def go() -> pb.NodeReport:
        agent = Agent(AgentConfig(collector=f"127.0.0.1:{free_port()}", interval=0.2,
                                  node="node\nforged"), gpu=NvmlGpuReader(),
                      scheduler=SchedulerLookup(timeout=10.0))
        deadline = time.monotonic() + 60
        report = None
        while time.monotonic() < deadline:
            report = await agent.round()          # a round that fails raises here
            mine = [s for s in report.samples if s.identity.pid in pids]
            if len(mine) == 2 and all(s.HasField("process") and s.process.files_writing
                                      and s.stack_id in agent.stacks for s in mine):
                break
            await asyncio.sleep(0.2)
        agent.stop()
        stacks.extend(agent.stacks.values())
        return report

    caplog.set_level("DEBUG", logger="ncclwatch")
    report = asyncio.run(go())
    pb.NodeReport.FromString(report.SerializeToString())
    by_pid = {s.identity.pid: s for s in report.samples}
    bad, good = by_pid[hostile_node[0].pid], by_pid[hostile_node[1].pid]
    assert bad.identity.job_id == "job-\\xff\\x0aINFO forged"
    assert good.identity.job_id == "job-plain" and good.HasField("process")
    assert bad.job.env["NCCL_DEBUG_FILE"] == "/tmp/nccl.\\xff.log"
    assert bad.job.env["NCCL_\\xfeODD"] == "x\\xff\\x0a"
    (f,) = bad.process.files_writing
    assert f.path.endswith("/ck\\xff\\x1b[2J.pt") and f.size_bytes == 4096
    sj = bad.job.scheduler_job
    assert (sj.job_name, sj.user, sj.source) == ("tr\\xffain\\x1b[2Jno-stall", "an\\xfea", "scontrol")
    assert report.node == "node\\x0aforged"
    # a token in a checkpoint path or a function name never leaves the node
    wire = report.SerializeToString() + b"".join(x.SerializeToString() for x in stacks)
    for token in (PATH_TOKEN, FRAME_TOKEN, THREAD_TOKEN):
        assert token[4:16].encode() not in wire, token
    assert "<redacted>" in f.path
    assert any("<redacted>" == fr.name for x in stacks for fr in x.frames), stacks
    mine = [x for x in stacks if x.id == bad.stack_id]
    assert mine and mine[0].thread_name == "Main\\x1b]0;owned\\x07 <redacted>", mine
    # the daemon takes the round whole: the stack's id is that of its frames as sent
    from ncclwatch.daemon.admission import Admission, admit
    sent = pb.NodeReport.FromString(report.SerializeToString())
    sent.stacks.extend(stacks)
    assert admit(pb.ReportRequest(protocol_version=1, report=sent)) == Admission()
    assert report.health.texts_escaped_total >= 5
    # no log line of the agent carries a raw newline or escape from the job
    for rec in caplog.records:
        msg = rec.getMessage()
        assert "\n" not in msg and "\x1b" not in msg, msg


def test_no_ncclwatch_log_line_can_be_forged_by_its_arguments(caplog) -> None:
    import logging

    from ncclwatch.sanitize import install_log_escaping
    install_log_escaping()
    caplog.set_level("INFO")
    logging.getLogger("ncclwatch.agent.x").info("job %s on %s: %s", "j\nERROR forged",
                                                b"n\xff", OSError("/p/\x1b[2J"))
    logging.getLogger("ncclwatch.agent.x").info("rank %d of %(x)s" if False else "rank %d", 3)
    (a, b) = [r.getMessage() for r in caplog.records]
    assert a == "job j\\x0aERROR forged on n\\xff: /p/\\x1b[2J" and b == "rank 3"


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(_TEXT.map(lambda t: "NCCL_" + t), _TEXT, max_size=8),
       st.dictionaries(_TEXT, _TEXT, max_size=4))
def test_a_discovered_environment_is_safe_text_whatever_its_bytes(allowed, other) -> None:
    """What discovery keeps of an environment (RankProcess.env) is valid,
    escaped, capped text, and the identity it builds from the raw bytes can
    be sent."""
    from ncclwatch.jobid import identify
    env = {**other, **allowed, "RANK": "0", "WORLD_SIZE": "1",
           "NCCLWATCH_JOB_ID": next(iter(allowed.values()), "j") or "j"}
    ident = identify(env, "n")
    assert ident is not None
    proc = RankProcess.of(1, 1.0, ident, env)
    for k, v in proc.env.items():
        assert is_clean(k) and is_clean(v) and len(v) <= MAX_ENV_VALUE
    pb.RankIdentity.FromString(sample_pb(RankTracker(proc, 0.0), 1.0, (), {}, True)
                               .identity.SerializeToString())


def test_the_hostile_text_counters_reach_metrics() -> None:
    """The agent's counts travel in its health and the daemon exports them per node."""
    from prometheus_client.parser import text_string_to_metric_families

    from ncclwatch.daemon.core import Daemon
    from ncclwatch.daemon.export import DaemonCollector

    ident = RankIdentity("job-\udcff", "explicit", 0, 0, 1)
    t = RankTracker(RankProcess(7, 1.0, ident, {"NCCL_DEBUG_FILE": "/x/\udcfe"}), 0.0)
    health = AgentHealthCounts(fields_dropped_total=2, texts_escaped_total=5,
                               texts_truncated_total=1)
    r = build_report(node="node-h", agent_id="agent-h", seq=1, now=1.0, wall=time.time(),
                     interval=1.0, samples=[sample_pb(t, 1.0, (), {}, True)], exited=[],
                     health=health, ranks_watched=1)
    d = Daemon()
    d.ingest(pb.ReportRequest(protocol_version=1, report=r))
    got = {(s.name, s.labels.get("node")): s.value
           for fam in text_string_to_metric_families(DaemonCollector(d).exposition().decode())
           for s in fam.samples if s.name.startswith("ncclwatch_agent_")}
    assert got[("ncclwatch_agent_fields_dropped_total", "node-h")] == 2
    assert got[("ncclwatch_agent_texts_escaped_total", "node-h")] == 5
    assert got[("ncclwatch_agent_texts_truncated_total", "node-h")] == 1
    assert "job-\\xff" in d.table.jobs


def test_log_arguments_lose_tokens_but_keep_run_ids(caplog) -> None:
    import logging

    from ncclwatch.sanitize import install_log_escaping
    install_log_escaping()
    caplog.set_level("DEBUG")
    logging.getLogger("ncclwatch.agent.ckptsize").debug(
        "no size from %s (job %s)", "/ck/ghp_abcdefghijklmnopqrstuvwxyz0123/m.pt",
        "Xk3jQ9vLm2Np8Rt5Wz7Yb4Hc6Df1Gs0A")
    (msg,) = [r.getMessage() for r in caplog.records]
    assert "ghp_abcdefghij" not in msg and "<redacted>" in msg
    assert "Xk3jQ9vLm2Np8Rt5Wz7Yb4Hc6Df1Gs0A" in msg
