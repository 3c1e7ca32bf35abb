"""One rank never blinds its node, nor stalls its agent's round.

A deep recursion (py-spy gives up to 4,096 frames), a job with many process
groups, a malformed report, an environment of 256 ``NCCL_*`` variables of
16 KiB: each once cost every other rank and job on the node its watch. The
agent now trims what it sends under the daemon's defaults, the daemon drops
only the offending stack or summary, a refused report is dropped (never sent
again), and every per-rank read has a budget, each cut counted.
"""

from __future__ import annotations

import asyncio

import grpc

from ncclwatch import envpolicy
from ncclwatch.agent import caps, rankenv
from ncclwatch.agent.discover import RankProcess
from ncclwatch.agent.report import stack_pb
from ncclwatch.agent.uplink import POISON_STRIKES, Uplink
from ncclwatch.contract.bounds import Bounds
from ncclwatch.daemon.core import Daemon, DaemonConfig
from ncclwatch.daemon.server import DaemonServer
from ncclwatch.contract.limits import MAX_FRAMES
from ncclwatch.daemon.admission import Admission, admit
from ncclwatch.jobid import RankIdentity
from ncclwatch.model import CollectiveOp, RankState
from ncclwatch.signatures import DEFAULT_CLASSIFIER
from ncclwatch.stacks import Frame, Stack, ThreadDump, stack_id
from ncclwatch.v1 import collector_pb2 as pb
from tests.harness.reports import BARRIER, report, sample

C10D = "/x/torch/distributed/distributed_c10d.py"


def _deep(n: int) -> tuple[Frame, ...]:
    """A rank in barrier under ``n`` frames of its own recursion (innermost first)."""
    return (Frame("barrier", C10D, 10), *(Frame("recurse", "/job/deep.py", 7)
                                          for _ in range(n - 2)),
            Frame("<module>", "/job/deep.py", 20))


def test_a_stack_of_5000_frames_is_trimmed_head_tail_and_marker() -> None:
    frames = _deep(5000)
    sent = stack_pb(Stack(frames, "MainThread"))
    got = [Frame(f.name, f.filename, f.line) for f in sent.frames]
    assert len(got) <= caps.STACK_FRAMES <= MAX_FRAMES // 2
    assert sum(len(f.name) + len(f.filename) for f in got) <= caps.STACK_TEXT
    markers = [i for i, f in enumerate(got) if f.filename == caps.MARKER_FILE]
    assert len(markers) == 1
    i = markers[0]
    left_out = 5000 - (len(got) - 1)
    assert got[i].name == f"<{left_out} frames left out>"
    assert got[:i] == list(frames[:i]) and got[i + 1:] == list(frames[-(len(got) - i - 1):])
    assert got[0].name == "barrier" and got[-1].name == "<module>"
    # The daemon takes it as sent, whole: its id is that of the frames sent.
    req = report([], stacks=[sent])
    assert sent.id == stack_id(got) and admit(req) == Admission()
    # Classified from the kept frames: the innermost says barrier.
    trimmed = caps.trim_threads([ThreadDump(1, 1, "MainThread", True,
                                            Stack(frames, "MainThread"))])
    assert len(trimmed[0].stack.frames) == len(got)
    c, _ = DEFAULT_CLASSIFIER.classify_rank(trimmed, 1)
    assert (c.state, c.op) == (RankState.COLLECTIVE, CollectiveOp.BARRIER)


def test_long_frame_text_is_cut_under_the_stack_text_cap() -> None:
    frames = tuple(Frame(f"step_{i}_" + "forward_" * 120, "/x/" + "model/" * 160, i)
                   for i in range(400))
    sent = stack_pb(Stack(frames))
    text = sum(len(f.name) + len(f.filename) for f in sent.frames)
    assert text <= caps.STACK_TEXT < Bounds().max_stack_bytes
    assert sent.frames[0].name == frames[0].name and sent.frames[-1].name == frames[-1].name


def _pb_stack(frames) -> pb.Stack:
    return pb.Stack(id=stack_id(frames), thread_name="MainThread",
                    frames=[pb.Frame(name=f.name, filename=f.filename, line=f.line)
                            for f in frames])


def test_a_report_with_one_over_bound_stack_is_applied_without_it() -> None:
    d = Daemon()
    deep, ok = _pb_stack(_deep(2000)), _pb_stack(BARRIER)
    samples = [sample("deep", 0, 2, RankState.COMPUTE, stack=deep.id),
               sample("deep", 1, 2, RankState.COLLECTIVE, CollectiveOp.BARRIER, stack=ok.id),
               sample("other", 0, 1, RankState.COMPUTE)]
    samples[2].flight_recorder.groups.extend(      # a summary past its groups bound
        pb.ProcessGroupProgress(pg_id=str(i), pg_name=str(i)) for i in range(300))
    resp = d.ingest(report(samples, stacks=[deep, ok]), now=10.0)
    assert [(p.what, p.stack_id, p.bound) for p in resp.dropped_parts] == [
        ("stack", deep.id, "stack_frames"), ("flight_recorder", "", "flight_recorder_groups")]
    assert (resp.dropped_parts[1].job_id, resp.dropped_parts[1].rank) == ("other", 0)
    assert set(d.table.jobs) == {"deep", "other"}
    assert set(d.table.jobs["deep"].ranks) == {0, 1} and set(d.table.jobs["other"].ranks) == {0}
    assert ok.id in d.table.stacks and deep.id not in d.table.stacks
    assert deep.id not in resp.missing_stack_ids          # not asked for again
    assert d.bound_hits_total["stack_frames"] == 1
    assert d.bound_hits_total["flight_recorder_groups"] == 1
    assert not d.rejected_total


def test_a_refused_report_is_dropped_not_resent() -> None:
    """Real gRPC over loopback to the real daemon: a malformed report, then good ones."""
    async def go():
        daemon = Daemon(DaemonConfig(grpc="127.0.0.1:0", http="127.0.0.1:0"))
        server = DaemonServer(daemon)
        await server.start()
        up = Uplink(f"127.0.0.1:{server.grpc_port}", {})
        task = asyncio.create_task(up.run())
        try:
            bad = report([sample("j", 0, 1, RankState.COMPUTE)], seq=1).report
            bad.interval_seconds = -1.0          # malformed: INVALID_ARGUMENT
            up.submit(bad)
            for seq in (2, 3):
                up.submit(report([sample("j", 0, 1, RankState.COMPUTE)], seq=seq).report)
            for _ in range(200):
                agent = daemon.table.agents.get("agent-a")
                if agent is not None and agent.last_seq >= 3:
                    break
                await asyncio.sleep(0.05)
            refused = daemon.rejected_total[grpc.StatusCode.INVALID_ARGUMENT.name]
            await asyncio.sleep(1.5)              # time enough to resend, were it requeued
            assert daemon.table.agents["agent-a"].last_seq == 3
            # Once, or twice where the refusal reached the agent as INTERNAL
            # (it still wrote the next reports): never again after.
            assert 1 <= refused <= POISON_STRIKES
            assert daemon.rejected_total == {grpc.StatusCode.INVALID_ARGUMENT.name: refused}
            assert up.refused_total == 1 and up.queue_length == 0
        finally:
            up.stop()
            await task
            await server.stop(grace=0.1)
    asyncio.run(go())


def _huge_env() -> dict[str, str]:
    env = {f"NCCL_HOSTILE_{i:03d}": ("aB3/" * 4096) for i in range(256)}   # 16 KiB each
    env.update(RANK="0", WORLD_SIZE="1", NCCL_DEBUG="INFO")
    return env


def test_a_huge_environment_is_filtered_within_its_budget(monkeypatch) -> None:
    """256 NCCL_* variables of 16 KiB: the redaction looks at a bounded number of
    characters (the cost is linear in them), and the cut is counted."""
    seen = [0]
    redact_value, redact_patterns = envpolicy.redact_value, envpolicy.redact_patterns

    def counted(fn):
        def wrapper(value: str) -> str:
            seen[0] += len(value)
            return fn(value)
        return wrapper

    monkeypatch.setattr(envpolicy, "redact_value", counted(redact_value))
    monkeypatch.setattr(envpolicy, "redact_patterns", counted(redact_patterns))
    before = caps.COUNTS.budget_hits["env_text"]
    proc = RankProcess.of(1, 0.0, RankIdentity("j", "test", 0, 0, 1), _huge_env())
    total = sum(map(len, _huge_env().values()))
    # Each kept value (redact_value runs the patterns too), and the split-key check's pieces (up to 128
    # characters of each end) joined pairwise: a fraction of what the rank set.
    kept = len(proc.env)
    assert kept < 16
    assert seen[0] <= 2 * caps.ENV_TEXT + kept * kept * 4 * 256 + kept * caps.ENV_NAME_CHARS
    assert seen[0] < total / 16
    assert caps.COUNTS.budget_hits["env_text"] == before + 1
    assert proc.env["NCCL_DEBUG"] == "INFO"             # the names first in order stay
    assert sum(map(len, proc.env.values())) <= caps.ENV_TEXT


def test_environ_reads_are_bounded_in_bytes_and_variables() -> None:
    data = b"RANK=0\0" + b"".join(b"NCCL_X%d=%s\0" % (i, b"v" * 1000)
                                  for i in range(6000))
    before = dict(caps.COUNTS.budget_hits)
    env = rankenv.parse_environ(data, limit=1 << 20, max_variables=512)
    assert env["RANK"] == "0" and len(env) == 512
    assert all(v == "v" * 1000 for k, v in env.items() if k != "RANK")   # no half variable
    hits = caps.COUNTS.budget_hits
    assert hits["environ_bytes"] == before.get("environ_bytes", 0) + 1
    assert hits["env_variables"] == before.get("env_variables", 0) + 1


def test_the_budget_counters_reach_metrics() -> None:
    from ncclwatch.daemon.export import _rank_budget_hits
    from ncclwatch.daemon.agents import AgentRecord

    d = Daemon()
    r = report([], seq=1)
    r.report.health.rank_budget_hits.extend(range(1, len(caps.BUDGET_REASONS) + 1))
    r.report.health.reports_refused_total = 2
    d.ingest(r, now=1.0)
    agent: AgentRecord = d.table.agents["agent-a"]
    fam = _rank_budget_hits([agent])
    assert {v[1]: n for v, n in fam.rows} == {reason: i + 1 for i, reason
                                              in enumerate(caps.BUDGET_REASONS)}
