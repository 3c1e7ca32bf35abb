"""Ingest workers (``--ingest-workers N``): real worker processes serve the agents'
gRPC on the daemon's port and forward reports to the core (this test's process,
so its job table can be read directly), over real gRPC on loopback.

What must hold: every report acked was applied, in order, with the in-process
service's answers (rejections, rejected jobs, commands, DumpStacks, mTLS
identity); a worker killed with SIGKILL is started again and its agents come
back by themselves; no worker outlives the core, stopped or killed.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import urllib.request

import grpc
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ncclwatch.agent.uplink import Uplink
from ncclwatch.daemon import ingestlink as L
from ncclwatch.daemon.core import Daemon, DaemonConfig
from ncclwatch.daemon.server import DaemonServer
from ncclwatch.model import CollectiveOp, RankState
from ncclwatch.tls import server_tls
from ncclwatch.v1 import collector_pb2 as pb
from ncclwatch.v1 import collector_pb2_grpc as pb_grpc
from tests.harness.credentials import client
from tests.harness.daemons import until
from tests.harness.paths import ROOT
from tests.harness.procs import free_port
from tests.harness.reports import BARRIER, checkpoint_job, report, sample, stack_pb

#: Each channel its own TCP connection, so SO_REUSEPORT spreads them over the workers.
OWN_CONNECTION = (("grpc.use_local_subchannel_pool", 1),)


def _run(coro):
    return asyncio.run(coro)


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


class Workers:
    """A core (here, in process) with ``n`` ingest worker processes."""

    def __init__(self, n: int = 2, tls=None) -> None:
        self.daemon = Daemon(DaemonConfig(grpc="127.0.0.1:0", http="127.0.0.1:0",
                                          ingest_workers=n, tls=tls))
        self.server = DaemonServer(self.daemon)

    async def __aenter__(self) -> "Workers":
        await self.server.start()
        self.target = f"127.0.0.1:{self.server.grpc_port}"
        self.pids = {w.pid for w in self.daemon.ingest_workers}
        return self

    async def __aexit__(self, *exc) -> None:
        pids = self.pids | {w.pid for w in self.daemon.ingest_workers}
        await self.server.stop(grace=0.2)
        left = [p for p in pids if not gone(p)]
        assert not left, f"ingest workers left after stop: {left}"

    def channel(self) -> grpc.aio.Channel:
        return grpc.aio.insecure_channel(self.target, options=OWN_CONNECTION)

    async def send(self, *reqs: pb.ReportRequest, channel=None) -> list[pb.ReportResponse]:
        async with (channel or self.channel()) as ch:
            call = pb_grpc.CollectorServiceStub(ch).Report(iter(reqs))
            return [r async for r in call]

    def metrics(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.server.http_port}/metrics",
                                    timeout=10) as r:
            text = r.read().decode()
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for f in text_string_to_metric_families(text) for s in f.samples}


def node_reports(node: int, seqs) -> list[pb.ReportRequest]:
    """Node ``node`` of job "wide" (2 ranks per node, 8 nodes), one report per seq."""
    return [report([sample("wide", 2 * node + r, 16, RankState.COLLECTIVE, CollectiveOp.BARRIER,
                           stack=stack_pb(BARRIER).id) for r in range(2)],
                   node=f"node-{node}", agent=f"agent-{node}", seq=seq,
                   stacks=[stack_pb(BARRIER)] if seq == 1 else []) for seq in seqs]


def test_frames_survive_any_split_and_batch() -> None:
    """The framing alone: frames cut at every byte, and several in one read."""
    frames = [(L.REPORT, 7, b"x" * 300), (L.CLOSE, 7, b""), (L.OK, 1 << 31, b"\0\n")]
    wire = b"".join(L.HEADER.pack(len(b), k, s) + b for k, s, b in frames)
    for cut in range(len(wire) + 1):
        r = L.FrameReader()
        assert r.feed(wire[:cut]) + r.feed(wire[cut:]) == frames
    r = L.FrameReader()
    assert [f for i in range(len(wire)) for f in r.feed(wire[i:i + 1])] == frames


def test_every_report_of_many_agents_is_acked_and_applied_in_order() -> None:
    async def go():
        async with Workers(2) as w:
            assert len(w.pids) == 2 and all(not gone(p) for p in w.pids)
            resps = await asyncio.gather(*(w.send(*node_reports(n, range(1, 6)))
                                           for n in range(8)))
            assert [[r.ack_seq for r in rs] for rs in resps] == [[1, 2, 3, 4, 5]] * 8
            job = w.daemon.table.jobs["wide"]
            assert sorted(job.ranks) == list(range(16))
            assert {w.daemon.table.agents[f"agent-{n}"].last_seq for n in range(8)} == {5}
            assert w.daemon.table.reports_total == 40
            stats = w.daemon.ingest_workers
            assert sum(s.forwarded_total for s in stats) == 40
            # Clean reports: the workers ran the table-free checks (precheck.py).
            assert sum(s.prechecked_total for s in stats) == 40
            await until(lambda: not any(a.connected for a in w.daemon.table.agents.values()),
                        what="streams' ends to reach the core")
            m = await asyncio.to_thread(w.metrics)
            assert m[("ncclwatch_daemon_ingest_workers", ())] == 2
            assert sum(m[("ncclwatch_daemon_ingest_worker_reports_total", (("worker", str(i)),))]
                       for i in range(2)) == 40
            await until(lambda: all(s.cpu_seconds_total > 0 for s in stats), what="CPU stats")
            assert m[("ncclwatch_daemon_rank_samples_total", ())] == 80
    _run(go())


def test_bad_reports_are_rejected_as_in_process() -> None:
    """Not protobuf: the worker says INVALID_ARGUMENT itself (counted in the core);
    a node's own fault: the core's refusal, through the worker; one rank's
    fault: its sample dropped, the report applied."""
    async def go():
        async with Workers(2) as w:
            async with w.channel() as ch:
                call = ch.stream_stream("/ncclwatch.v1.CollectorService/Report",
                                        request_serializer=None, response_deserializer=None)
                with pytest.raises(grpc.aio.AioRpcError) as ei:
                    async for _ in call(iter([b"\xff\xff\xff"])):
                        pass
            assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "not a valid ncclwatch.v1.ReportRequest" in ei.value.details()
            await until(lambda: w.daemon.rejected_total["INVALID_ARGUMENT"] == 1,
                        what="the worker's rejection to be counted")
            assert sum(s.forwarded_total for s in w.daemon.ingest_workers) == 0

            with pytest.raises(grpc.aio.AioRpcError) as ei:
                await w.send(report([sample("job-x", 0, 4, RankState.COMPUTE)],
                                    interval=float("nan")))
            assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "job-x" not in w.daemon.table.jobs
            assert w.daemon.rejected_total["INVALID_ARGUMENT"] == 2
            (resp,) = await w.send(report([sample("job-x", 9, 4, RankState.COMPUTE),
                                           sample("job-y", 0, 1, RankState.COMPUTE)],
                                          agent="agent-y"))
            assert [(p.what, p.job_id) for p in resp.dropped_parts] == [("rank_sample", "job-x")]
            # Neither came as clean: the core ran every check of both itself.
            assert sum(s.prechecked_total for s in w.daemon.ingest_workers) == 0
            assert "job-x" not in w.daemon.table.jobs and "job-y" in w.daemon.table.jobs
            # An answer the stream got before the bad report stands; nothing after it.
            good, bad = checkpoint_job(seq=1), report([sample("j", 0, 4, RankState.COMPUTE)],
                                                     seq=2, interval=-1.0)
            got = []
            with pytest.raises(grpc.aio.AioRpcError):
                async with w.channel() as ch:
                    async for r in pb_grpc.CollectorServiceStub(ch).Report(
                            iter([good, bad, checkpoint_job(seq=3)])):
                        got.append(r.ack_seq)
            assert got == [1] and w.daemon.table.agents["agent-a"].last_seq == 1
    _run(go())


def test_rejected_jobs_commands_and_dump_stacks_round_trip() -> None:
    async def go():
        async with Workers(2) as w:
            (first,) = await w.send(checkpoint_job(node="node-a", agent="agent-a"))
            assert first.ack_seq == 1 and not first.rejected_jobs
            # Another live node claims job-1's ranks (no newer process): set aside,
            # never refused (ownership.py); a conflicting world size is left out.
            (resp,) = await w.send(checkpoint_job(node="node-b", agent="agent-b"))
            assert not resp.rejected_jobs
            assert {r.node for r in w.daemon.table.jobs["job-1"].ranks.values()} == {"node-a"}
            assert w.daemon.ownership.claims_total["kept"] == 4
            (resp,) = await w.send(checkpoint_job(world=8, node="node-b", agent="agent-b",
                                                  seq=2))
            assert [(j.job_id, j.code) for j in resp.rejected_jobs] == \
                [("job-1", "FAILED_PRECONDITION")]
            assert w.daemon.rejected_jobs_total["FAILED_PRECONDITION"] == 1

            # A command queued in the core reaches the real agent uplink through a worker.
            got: list[pb.Command] = []
            up = Uplink(w.target, {}, on_command=got.append)
            task = asyncio.create_task(up.run())
            try:
                up.submit(checkpoint_job(seq=2).report)
                await until(lambda: w.daemon.table.agents["agent-a"].last_seq == 2)
                assert w.daemon.request_stacks("job-1", "test asks") == 1
                up.submit(checkpoint_job(seq=3).report)
                # The daemon's own ticks may queue stack requests of this stalled job
                # too (at once, when a report completes its evidence): find ours.
                ours = lambda reason: [c for c in got if c.dump_stacks.reason == reason]  # noqa: E731
                await until(lambda: ours("test asks"), what="the DumpStacks command at the agent")
                assert ours("test asks")[0].dump_stacks.job_id == "job-1"
                # DumpStacks called on the daemon's port: answered by the core via a worker.
                async with w.channel() as ch:
                    stub = pb_grpc.CollectorServiceStub(ch)
                    answer = await stub.DumpStacks(pb.DumpStacksRequest(job_id="job-1"))
                    assert answer.agents == 1
                    with pytest.raises(grpc.aio.AioRpcError) as ei:
                        await stub.DumpStacks(pb.DumpStacksRequest(job_id="nope"))
                    assert ei.value.code() == grpc.StatusCode.NOT_FOUND
                up.submit(checkpoint_job(seq=4).report)
                await until(lambda: ours("operator request"), what="the RPC's command at the agent")
            finally:
                up.stop()
                await task
    _run(go())


def test_mtls_reaches_the_workers_and_names_are_checked_in_the_core(pki) -> None:
    async def go():
        d = pki / "ca"
        tls = server_tls({"tls_cert": str(d / "daemon.pem"), "tls_key": str(d / "daemon-key.pem"),
                          "tls_client_ca": str(d / "ca.pem")})
        async with Workers(2, tls=tls) as w:
            target = f"localhost:{w.server.grpc_port}"

            def secure(node):
                c = client(pki, node)
                return grpc.aio.secure_channel(target, c.credentials(),
                                               options=OWN_CONNECTION + c.options())
            (resp,) = await w.send(checkpoint_job(node="node-a"), channel=secure("node-a"))
            assert resp.ack_seq == 1 and w.daemon.table.jobs["job-1"].ranks[0].node == "node-a"
            with pytest.raises(grpc.aio.AioRpcError) as ei:
                await w.send(checkpoint_job(node="node-b", agent="agent-b"),
                             channel=secure("node-a"))
            assert ei.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "certificate for 'node-a' cannot report for node 'node-b'" in \
                ei.value.details()
            with pytest.raises(grpc.aio.AioRpcError) as ei:  # no client certificate
                await w.send(checkpoint_job(), channel=grpc.aio.insecure_channel(target))
            assert ei.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "agent-b" not in w.daemon.table.agents
    _run(go())


@pytest.mark.parametrize("how", ["SIGKILL", "SIGSTOP"])
def test_a_killed_or_wedged_worker_is_restarted_and_its_agents_come_back(how: str) -> None:
    """SIGKILL: the worker ends, and is started again. SIGSTOP: a wedged worker (it
    stops saying its CPU every second) is killed by the core, then started again."""
    async def go():
        async with Workers(2) as w:
            w.server._pool.wedged_after = 2.0
            ups = [Uplink(w.target, {}) for _ in range(6)]
            tasks = [asyncio.create_task(u.run()) for u in ups]
            seq = [0] * 6

            async def feed():
                while True:
                    for n, u in enumerate(ups):
                        seq[n] += 1
                        u.submit(node_reports(n, [seq[n]])[0].report)
                    await asyncio.sleep(0.1)
            feeder = asyncio.create_task(feed())
            agents = w.daemon.table.agents
            try:
                await until(lambda: len(agents) == 6 and all(a.connected for a in agents.values()),
                            what="six agents connected")
                stats = w.daemon.ingest_workers
                victim = max(stats, key=lambda s: s.forwarded_total)
                old_pid, before = victim.pid, victim.forwarded_total
                assert before > 0
                os.kill(old_pid, getattr(signal, how))
                await until(lambda: victim.restarts_total == 1 and victim.listening,
                            what="the worker's restart")
                assert victim.pid != old_pid and not gone(victim.pid)
                assert gone(old_pid)
                # Every agent reports again (the victim's reconnected: to either worker).
                mark = {a.agent_id: a.last_seq for a in agents.values()}
                await until(lambda: all(a.last_seq >= mark[a.agent_id] + 3 and a.connected
                                        for a in agents.values()), timeout=15,
                            what="all agents' reports applied after the restart")
                assert w.daemon.ingest_workers[victim.index] is victim
                m = await asyncio.to_thread(w.metrics)
                assert m[("ncclwatch_daemon_ingest_workers", ())] == 2
                assert m[("ncclwatch_daemon_ingest_worker_restarts_total",
                          (("worker", str(victim.index)),))] == 1
                w.pids.add(victim.pid)
            finally:
                feeder.cancel()
                for u in ups:
                    u.stop()
                await asyncio.gather(*tasks, feeder, return_exceptions=True)
    _run(go())


def _daemon_proc(*extra: str) -> tuple[subprocess.Popen, list[psutil.Process]]:
    """``ncclwatch daemon --ingest-workers 2`` as a process; it and its workers."""
    grpc_port, http_port = free_port(), free_port()
    p = subprocess.Popen([sys.executable, "-m", "ncclwatch.cli", "daemon", "--ingest-workers",
                          "2", "--grpc", f"127.0.0.1:{grpc_port}", "--http",
                          f"127.0.0.1:{http_port}", *extra], cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)},
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    end = time.monotonic() + 20
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=2) as r:
                if b"ncclwatch_daemon_ingest_workers 2.0" in r.read():
                    break
        except OSError:
            pass
        time.sleep(0.1)
    else:
        p.kill()
        raise AssertionError(f"daemon not ready: {p.communicate()[1][-2000:]}")
    kids = psutil.Process(p.pid).children()
    assert len(kids) == 2 and all("ncclwatch.daemon.ingestworker" in " ".join(k.cmdline())
                                  for k in kids)
    return p, kids


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_no_worker_outlives_the_daemon_process(how: str) -> None:
    """SIGTERM: the core stops its workers and exits 0. SIGKILL of the core: each
    worker sees its link's EOF and exits by itself."""
    p, kids = _daemon_proc()
    try:
        p.send_signal(getattr(signal, how))
        rc = p.wait(timeout=20)
        assert rc == (0 if how == "SIGTERM" else -signal.SIGKILL)
        _, alive = psutil.wait_procs(kids, timeout=10)
        assert not alive, [k.pid for k in alive]
    finally:
        for k in kids:
            if k.is_running():
                k.kill()
        if p.poll() is None:
            p.kill()
        p.wait()


def test_a_port_taken_by_another_program_fails_the_start_and_leaves_no_worker() -> None:
    """SO_REUSEPORT shares the port among the workers only: a port another
    program holds is still 'cannot listen', as without workers."""
    import socket

    async def go():
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen(1)
            port = taken.getsockname()[1]
            d = Daemon(DaemonConfig(grpc=f"127.0.0.1:{port}", http="127.0.0.1:0",
                                    ingest_workers=2))
            server = DaemonServer(d)
            with pytest.raises(OSError, match=f"cannot listen for gRPC on 127.0.0.1:{port}"):
                await server.start()
            pids = [w.pid for w in d.ingest_workers if w.pid]
            assert pids and all(gone(p) for p in pids)
    _run(go())


def test_frames_sent_in_one_turn_of_the_loop_go_out_in_one_write() -> None:
    """A real socketpair: 50 answers queued in one turn cost one write, and arrive
    whole and in order."""
    import socket

    async def go():
        loop = asyncio.get_running_loop()
        a, b = socket.socketpair()
        got: list = []
        _, left = await loop.create_unix_connection(lambda: L.Link(lambda f: None, lambda: None),
                                                    sock=a)
        _, right = await loop.create_unix_connection(lambda: L.Link(got.extend, lambda: None),
                                                     sock=b)
        for i in range(50):
            left.send(L.OK, i, b"r" * i)
        assert left.writes == 0  # queued until the loop turns
        await until(lambda: len(got) == 50, what="50 frames")
        assert left.writes == 1
        assert got == [(L.OK, i, b"r" * i) for i in range(50)]
        left.close()
        right.close()
    _run(go())
