"""One ingest step (daemon/ingest.py) for every road a report takes into the daemon.

The in-process gRPC service, the ingest workers and the core's pool call the
same step: the same script of reports and DumpStacks calls, good and bad,
gives the same answers, status codes, messages, counters and table through
the step called directly, through the in-process service and through a real
ingest worker process. And the three modules share no private names.
"""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import grpc

from ncclwatch.daemon import ingest
from ncclwatch.daemon.core import Daemon, DaemonConfig
from ncclwatch.daemon.server import DaemonServer
from ncclwatch.daemon.validate import ReportError
from ncclwatch.model import RankState
from ncclwatch.v1 import collector_pb2 as pb
from tests.harness.daemons import until
from tests.harness.reports import BARRIER, SAVE, report, sample, stack_pb

DAEMON = Path(ingest.__file__).parent
#: The modules that take reports in, and the shared step.
INGEST_MODULES = ("service", "ingestworker", "ingestpool", "ingest", "ingestlink")


def _compute(seq: int, *, world: int = 4, node: str = "node-a", agent: str = "agent-a",
             stacks=()) -> pb.ReportRequest:
    return report([sample("job-1", r, world, RankState.COMPUTE) for r in range(world)],
                  node=node, agent=agent, seq=seq, stacks=stacks)


#: (what, messages): a Report stream (a list of raw reports) or one DumpStacks call.
SCRIPT = [
    ("report", [_compute(1, stacks=[stack_pb(SAVE), stack_pb(BARRIER)]).SerializeToString(),
                _compute(2).SerializeToString()]),
    ("dump", pb.DumpStacksRequest(job_id="job-1", reason="look").SerializeToString()),
    ("dump", pb.DumpStacksRequest(reason="no job").SerializeToString()),
    ("dump", b"\xff\xff\xff"),
    ("dump", pb.DumpStacksRequest(job_id="nope").SerializeToString()),
    ("report", [_compute(3).SerializeToString()]),  # carries the queued command
    # A world size that contradicts job-1's: that job is left out, the report acked.
    ("report", [_compute(1, world=8, node="node-b", agent="agent-b").SerializeToString()]),
    ("report", [b"\xff\xff\xff\x00garbage"]),
    ("report", [_compute(4).SerializeToString(), b"\x0a\xff",
                _compute(5).SerializeToString()]),
    # The node's own fault (its interval): refused whole.
    ("report", [report([sample("job-x", 0, 4, RankState.COMPUTE)], agent="agent-x",
                       interval=float("nan")).SerializeToString()]),
    ("report", [pb.ReportRequest(protocol_version=99, report=pb.NodeReport(
        node="n", agent_id="a")).SerializeToString()]),
    ("report", [report([], stacks=[pb.Stack(id="x", frames=[pb.Frame(
        name="f", filename="/" + "p" * 2000)] * 200)]).SerializeToString()]),  # 400 kB
]


def _state(d: Daemon) -> dict:
    return {
        "rejected": dict(d.rejected_total),
        "rejected_jobs": dict(d.rejected_jobs_total),
        "bound_hits": dict(d.bound_hits_total),
        "jobs": {j: {r: (rec.node, rec.state) for r, rec in job.ranks.items()}
                 for j, job in d.table.jobs.items()},
        "agents": {a: (ag.last_seq, ag.connected) for a, ag in d.table.agents.items()},
        "reports": d.table.reports_total,
    }


async def _play(report_stream, dump) -> list:
    """The script's answers: per call, the bytes answered or (status name, message)."""
    out = []
    for what, msg in SCRIPT:
        out.append(await (report_stream(msg) if what == "report" else dump(msg)))
    return out


def _direct() -> tuple[list, dict]:
    """The step called alone, as the core calls it."""
    d = Daemon(DaemonConfig())
    rejections = ingest.RejectionLog()

    async def report_stream(raws):
        st, got = ingest.Stream(d, "peer", None, rejections), []
        try:
            for raw in raws:
                got.append(st.report(raw))
        except ReportError as e:
            got.append((e.code.name, e.message))
        finally:
            st.close()
        return got

    async def dump(raw):
        try:
            return ingest.dump_stacks(d, ingest.dump_request(raw), None)
        except ReportError as e:
            return e.code.name, e.message
    return asyncio.run(_play(report_stream, dump)), _state(d)


def _over_grpc(workers: int) -> tuple[list, dict]:
    """Through a real DaemonServer: in process (0) or one ingest worker process."""
    async def go():
        d = Daemon(DaemonConfig(grpc="127.0.0.1:0", http="127.0.0.1:0",
                                ingest_workers=workers))
        server = DaemonServer(d)
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as ch:
                report_call = ch.stream_stream("/ncclwatch.v1.CollectorService/Report")
                dump_call = ch.unary_unary("/ncclwatch.v1.CollectorService/DumpStacks")

                async def report_stream(raws):
                    # In lock step, as the agent's acks pace it: a grpc.aio client
                    # that writes after the server ended the stream can be told
                    # INTERNAL "Internal error from Core" in place of the server's
                    # status (grpc/grpc#36066; the agent allows for it: uplink.POISON).
                    # That client race is not what this test compares.
                    got, call = [], report_call()
                    try:
                        for raw in raws:
                            await call.write(raw)
                            got.append(await call.read())
                        await call.done_writing()
                        assert await call.read() is grpc.aio.EOF
                    except grpc.aio.AioRpcError as e:
                        got.append((e.code().name, e.details()))
                    return got

                async def dump(raw):
                    try:
                        return await dump_call(raw)
                    except grpc.aio.AioRpcError as e:
                        return e.code().name, e.details()
                answers = await _play(report_stream, dump)
            # Wide bounds (polled, so they cost nothing when met): the ends
            # cross a worker process and its link, slow beside a loaded run.
            await until(lambda: not any(a.connected for a in d.table.agents.values()),
                        timeout=60, what="the streams' ends to reach the core")
            if workers:  # every call's stream, DumpStacks' included, is forgotten
                pool = server._pool
                await until(lambda: not any(p.streams for p in pool.current), timeout=60,
                            what="the pool to forget every call")
            return answers, _state(d)
        finally:
            await server.stop(grace=0.1)
    return asyncio.run(go())


def test_the_step_answers_alike_in_process_and_through_a_worker() -> None:
    direct, direct_state = _direct()
    # The script's answers, read once: acks, the command, the status codes.
    oks = [[pb.ReportResponse.FromString(b) for b in a if isinstance(b, bytes)]
           if isinstance(a, list) else a for a in direct]
    assert [r.ack_seq for r in oks[0]] == [1, 2]
    assert pb.DumpStacksResponse.FromString(direct[1]).agents == 1
    assert direct[2] == ("INVALID_ARGUMENT", "job_id is required")
    assert direct[3][0] == "INVALID_ARGUMENT" and "ncclwatch.v1.DumpStacksRequest" in direct[3][1]
    assert direct[4][0] == "NOT_FOUND"
    assert [c.dump_stacks.reason for c in oks[5][0].commands] == ["look"]
    assert [(j.job_id, j.code) for j in oks[6][0].rejected_jobs] == \
        [("job-1", "FAILED_PRECONDITION")]
    assert direct[7][0][0] == "INVALID_ARGUMENT"
    assert [type(x) for x in direct[8]] == [bytes, tuple]  # acked, then refused: stream ends
    assert [a[-1][0] for a in direct[9:11]] == ["INVALID_ARGUMENT", "FAILED_PRECONDITION"]
    # A stack over its bound is left out alone, named in the answer; the report is applied.
    [big] = direct[11]
    [part] = pb.ReportResponse.FromString(big).dropped_parts
    assert (part.stack_id, part.bound) == ("x", "stack_bytes")
    assert direct_state["rejected"] == {"INVALID_ARGUMENT": 3, "FAILED_PRECONDITION": 1}
    assert direct_state["bound_hits"] == {"stack_bytes": 1}
    assert direct_state["rejected_jobs"] == {"FAILED_PRECONDITION": 1}

    for workers in (0, 1):
        answers, state = _over_grpc(workers)
        assert answers == direct, f"ingest_workers={workers}"
        assert state == direct_state, f"ingest_workers={workers}"


def _imports(path: Path) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(module, name) imported from ncclwatch.daemon's ingest modules, and
    (alias, attribute) read off those modules imported whole."""
    tree = ast.parse(path.read_text())
    names, aliases = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                if node.module == "ncclwatch.daemon" and a.name in INGEST_MODULES:
                    aliases[a.asname or a.name] = a.name
                elif node.module.rpartition(".")[2] in INGEST_MODULES \
                        and node.module.startswith("ncclwatch.daemon."):
                    names.append((node.module, a.name))
    attrs = [(aliases[n.value.id], n.attr) for n in ast.walk(tree)
             if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
             and n.value.id in aliases]
    return names, attrs


def test_the_ingest_modules_share_no_private_name() -> None:
    for mod in INGEST_MODULES:
        names, attrs = _imports(DAEMON / f"{mod}.py")
        private = [x for x in names + attrs if x[1].startswith("_")]
        assert not private, f"{mod}.py uses private names of another ingest module: {private}"


def test_only_the_step_parses_and_applies() -> None:
    """Daemon.ingest, operator_request_stacks and the protobuf parse are called in
    ingest.py alone; the three roads call it."""
    step_calls = {"ingest", "operator_request_stacks", "FromString"}
    for mod in ("service", "ingestworker", "ingestpool"):
        tree = ast.parse((DAEMON / f"{mod}.py").read_text())
        called = {n.func.attr for n in ast.walk(tree)
                  if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
        assert not called & step_calls, f"{mod}.py does the step itself: {called & step_calls}"
        _, attrs = _imports(DAEMON / f"{mod}.py")
        assert ("ingest", "parse") in attrs or ("ingest", "Stream") in attrs or \
            ("ingest", "dump_request") in attrs, f"{mod}.py does not call the step"
