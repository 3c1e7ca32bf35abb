"""Adversarial reports through the real gRPC server: no crash, no hang, nothing leaks.

Hypothesis generates raw bytes and structurally valid protobufs with hostile
contents (negative and huge ranks and world sizes, NaN and huge durations,
unicode and oversized names, deep and mismatched stacks, ranks of a job that
another node owns). Every request must be applied or refused with one of the
documented status codes, never UNKNOWN/INTERNAL or a timeout; the healthy
job reported before the storm must come out unchanged.

Examples: 4k in ``make test`` (CI's time); ``make fuzz`` runs 100k (NCCLWATCH_FUZZ_EXAMPLES).
"""

from __future__ import annotations

import asyncio
import math
import os
import threading
import time

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ncclwatch.daemon.core import Daemon, DaemonConfig
from ncclwatch.daemon.server import DaemonServer
from ncclwatch.stacks import Frame, stack_id
from ncclwatch.v1 import collector_pb2 as pb
from tests.harness.reports import checkpoint_job

EXAMPLES = int(os.environ.get("NCCLWATCH_FUZZ_EXAMPLES", "4000"))
ALLOWED = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT,
           grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.FAILED_PRECONDITION,
           grpc.StatusCode.PERMISSION_DENIED}
HEALTHY = "job-1"   # checkpoint_job(): 4 ranks on node-a, rank 0 saving


class Server:
    """The real daemon server on its own event loop thread, for sync callers."""

    def __init__(self) -> None:
        self.daemon = Daemon(DaemonConfig(grpc="127.0.0.1:0", http="127.0.0.1:0"))
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = DaemonServer(self.daemon)
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(30)
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.server.grpc_port}")
        self.seq, self.refreshed = 1, 0.0
        self.call = self.channel.stream_stream("/ncclwatch.v1.CollectorService/Report",
                                               request_serializer=None,
                                               response_deserializer=None)

    def on_loop(self, fn):
        async def run():
            return fn()
        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(10)

    def send(self, payload: bytes) -> grpc.StatusCode:
        try:
            for _ in self.call(iter([payload]), timeout=10):
                pass
        except grpc.RpcError as e:
            return e.code()
        return grpc.StatusCode.OK

    def keep_healthy_alive(self) -> None:
        """The healthy job's agent keeps reporting (else it goes stale and expires)."""
        now = time.monotonic()
        if now - self.refreshed < 2.0:
            return
        self.seq += 1
        assert self.send(checkpoint_job(seq=self.seq, timeout=90).SerializeToString()) \
            == grpc.StatusCode.OK
        self.refreshed = now

    def close(self) -> None:
        self.channel.close()
        asyncio.run_coroutine_threadsafe(self.server.stop(grace=0.1), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def server():
    s = Server()
    assert s.send(checkpoint_job(timeout=90).SerializeToString()) == grpc.StatusCode.OK
    s.on_loop(s.daemon.tick)
    yield s
    s.close()


def _snapshot(d: Daemon) -> dict:
    job = d.table.jobs[HEALTHY]
    return {"world": job.world_size,
            "ranks": {r: (rec.node, rec.pid, rec.state, rec.op, rec.since, rec.stack_id)
                      for r, rec in job.ranks.items()}}


# -- strategies ----------------------------------------------------------------

text = st.text(max_size=24) | st.sampled_from(
    ["", "node-a", HEALTHY, "\x00", "\u202e\u0000evil", "a" * 300, "../../etc/passwd",
     "\U0001f525" * 2100, "x" * 5000])
ints = st.integers(min_value=-(2**31), max_value=2**31 - 1) | st.sampled_from([0, 1, 3, 4, 2**20])
floats = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0.0, 1e9, -1.0])
state = st.integers(min_value=-1, max_value=20)
frames = st.lists(st.tuples(text, text, st.integers(min_value=0, max_value=2**31 - 1)),
                  max_size=8) | st.just([("f", "x.py", 1)] * 1100)


@st.composite
def stacks(draw) -> pb.Stack:
    fr = draw(frames)
    sid = stack_id(Frame(n, f, ln) for n, f, ln in fr)
    if draw(st.booleans()):
        sid = draw(st.sampled_from([sid[:-1] + "0", "", "x" * 100]))
    return pb.Stack(id=sid, thread_name=draw(text),
                    frames=[pb.Frame(name=n, filename=f, line=ln) for n, f, ln in fr])


@st.composite
def samples(draw) -> pb.RankSample:
    world = draw(ints)
    s = pb.RankSample(
        identity=pb.RankIdentity(job_id=draw(text), rank=draw(ints), local_rank=draw(ints),
                                 world_size=max(0, world) if world < 2**32 else 0,
                                 pid=draw(ints)),
        state=draw(state), op=draw(state), state_seconds=draw(floats),
        stack_age_seconds=draw(floats), stack_id=draw(text))
    s.process.cpu_utilization = draw(floats)
    s.job.watchdog_timeout_seconds = draw(floats)
    for k, v in draw(st.lists(st.tuples(text, text), max_size=3)):
        s.job.env[k] = v
    return s


@st.composite
def reports(draw) -> bytes:
    node = draw(text)
    req = pb.ReportRequest(
        protocol_version=draw(st.sampled_from([1, 1, 1, 0, 2, 99])),
        report=pb.NodeReport(node=node, agent_id=draw(text), seq=draw(st.integers(0, 2**63)),
                             agent_monotonic_seconds=draw(floats),
                             interval_seconds=draw(floats), full_round=draw(st.booleans()),
                             samples=draw(st.lists(samples(), max_size=6)),
                             stacks=draw(st.lists(stacks(), max_size=3))))
    return req.SerializeToString()


# Claims on the healthy job from another node, with valid contents otherwise.
intruder = st.builds(lambda rank, node: checkpoint_job(node=node, agent="x").SerializeToString()
                     if rank < 0 else checkpoint_job(node=node, agent="x").SerializeToString(),
                     st.integers(-1, 3), st.sampled_from(["node-b", "evil", "NODE-A"]))
payloads = st.binary(max_size=512) | reports() | intruder


@settings(max_examples=EXAMPLES, deadline=None, derandomize=False,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(payload=payloads)
@pytest.mark.budget(600)  # 4k examples over real gRPC: 65 s at load 10, 437 s at load 25
def test_adversarial_reports_are_refused_cleanly(server, payload: bytes) -> None:
    server.keep_healthy_alive()
    before = server.on_loop(lambda: _snapshot(server.daemon))
    code = server.send(payload)
    assert code in ALLOWED, f"{code} for {payload[:200]!r}"
    assert server.on_loop(lambda: _snapshot(server.daemon)) == before


def test_after_the_storm_the_daemon_still_judges_the_healthy_job(server) -> None:
    server.refreshed = 0.0
    server.keep_healthy_alive()
    server.on_loop(server.daemon.tick)
    active = server.on_loop(lambda: list(server.daemon.incidents.active))
    assert (HEALTHY, "checkpoint_gather") in {(j, k.value) for j, k in active}
    rejected = server.on_loop(lambda: dict(server.daemon.rejected_total))
    assert sum(rejected.values()) > EXAMPLES // 4, rejected  # the storm was mostly refused
    assert math.isfinite(server.daemon.detect_seconds_total)
