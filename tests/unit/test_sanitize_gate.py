"""One gate for every string from a rank (issue 29, item 1).

Every string field of the wire format has a row in the agent's gate
(``sanitize.FIELDS``: cap, redaction) and in the daemon's bounds
(``contract.limits.STRING_BOUNDS``). The proto is walked by descriptor reflection, so
a string field added to any message a NodeReport reaches fails here until it
has both, and the daemon is shown to drop the part (or, for the node's own fields,
refuse the report) one character past each bound and to accept whatever the gate lets through. Then hostile bytes go into
every input of a round (the rank's env, identity, files, stack frames and
thread name, native frame, container and pod, Slurm job, Flight Recorder
dump): what leaves the agent is clean, capped and free of the planted
tokens, the daemon accepts it whole, and what it stores and prints is too.
"""

from __future__ import annotations

import json

import pytest
from google.protobuf.descriptor import FieldDescriptor
from hypothesis import HealthCheck, given, settings, strategies as st

from ncclwatch import sanitize
from ncclwatch.agent.container import ContainerInfo
from ncclwatch.agent.discover import RankProcess
from ncclwatch.agent.frprobe import summary_pb
from ncclwatch.agent.gpu import GpuDevice, GpuProcessMemory
from ncclwatch.agent.report import AgentHealthCounts, build_report, sample_pb, stack_pb
from ncclwatch.agent.sample import MemoryLimit, OpenFile, ProcessSample
from ncclwatch.agent.scheduler import SchedulerJob
from ncclwatch.agent.tracker import RankTracker
from ncclwatch.daemon.api import jobs_view
from ncclwatch.contract.bounds import Bounds
from ncclwatch.daemon.core import Daemon
from ncclwatch.contract.limits import STRING_BOUNDS, string_bound
from ncclwatch.daemon.admission import Admission, admit
from ncclwatch.daemon.validate import ReportError
from ncclwatch.flightrec.model import FrDump, FrEntry, PgInfo
from ncclwatch.jobid import RankIdentity
from ncclwatch.model import CollectiveOp, RankState
from ncclwatch.native_signatures import NativeWait
from ncclwatch.sanitize import FIELDS, is_clean
from ncclwatch.stacks import Frame, Stack, stack_id
from ncclwatch.status import render
from ncclwatch.v1 import collector_pb2 as pb

PACKAGE = "ncclwatch.v1."


def _name(fd: FieldDescriptor) -> str:
    return fd.full_name.removeprefix(PACKAGE)


def string_fields(desc=pb.NodeReport.DESCRIPTOR, seen: set | None = None) -> set[str]:
    """Every string field of every message reachable from ``desc`` (map entries too)."""
    seen = set() if seen is None else seen
    if desc.full_name in seen:
        return set()
    seen.add(desc.full_name)
    out = set()
    for fd in desc.fields:
        if fd.type == FieldDescriptor.TYPE_STRING:
            out.add(_name(fd))
        elif fd.message_type is not None:
            out |= string_fields(fd.message_type, seen)
    return out


WIRE_FIELDS = string_fields()


def test_every_string_field_of_a_report_has_a_gate_rule_and_a_daemon_bound() -> None:
    assert "RankSample.native_frame" in WIRE_FIELDS and "JobInfo.EnvEntry.value" in WIRE_FIELDS
    assert WIRE_FIELDS - set(FIELDS) == set(), "string fields the agent's gate does not know"
    assert WIRE_FIELDS - set(STRING_BOUNDS) == set(), "string fields the daemon does not bound"
    assert set(FIELDS) - WIRE_FIELDS == set() and set(STRING_BOUNDS) - WIRE_FIELDS == set()
    bounds = Bounds()
    over = {f: (FIELDS[f].cap, string_bound(f, bounds)) for f in WIRE_FIELDS
            if FIELDS[f].cap > string_bound(f, bounds)}
    assert not over, f"the gate lets through more than the daemon accepts: {over}"


def test_a_field_missing_from_the_gate_cannot_leave() -> None:
    with pytest.raises(KeyError):
        sanitize.gate("RankSample.new_field", "x")


# -- the daemon enforces every bound ----------------------------------------------------

_FRAMES = [Frame("save", "/job/save.py", 3), Frame("main", "/job/train.py", 9)]


def _full_request() -> pb.ReportRequest:
    """A valid protocol-2 report with every string field of the wire set."""
    ident = pb.RankIdentity(job_id="job-1", rank=0, local_rank=0, world_size=2, pid=100,
                            rank_source="RANK", rank_conflict="a:1 b:2", container=pb.ContainerInfo(
                                container_pid=1, hostname="h", container_id="c", runtime="docker",
                                pod_uid="u", namespace="n", pod="p", declared_namespace="dn",
                                declared_pod="dp"))
    stack = pb.Stack(id=stack_id(_FRAMES), thread_name="MainThread",
                     frames=[pb.Frame(name=f.name, filename=f.filename, line=f.line)
                             for f in _FRAMES])
    s = pb.RankSample(
        identity=ident, state=RankState.SAVING.to_proto(), stack_id=stack.id,
        native_frame="c10d::Work::wait",
        process=pb.ProcessStats(files_writing=[pb.OpenFile(
            path="/ck/a.pt", previous_path="/ck/b.pt", expected_source="previous",
            copy_source_path="/ck/c.pt", header_error="bad header")]),
        gpu=[pb.GpuMemory(device_index=0, device_uuid="GPU-1")],
        job=pb.JobInfo(source="explicit", env={"NCCL_DEBUG": "INFO"}, packages=["torch"],
                       scheduler_job=pb.SchedulerJob(scheduler="slurm", job_id="7",
                                                     job_name="train", user="ana",
                                                     source="env")),
        flight_recorder=pb.FlightRecorderSummary(version="2.4", groups=[pb.ProcessGroupProgress(
            pg_id="0", pg_name="default_pg", ranks=[0, 1], pending_op="all_reduce",
            pg_desc="default", last_op="all_reduce")]))
    r = pb.NodeReport(node="node-a", agent_id="agent-a", seq=1, agent_monotonic_seconds=10.0,
                      interval_seconds=1.0, full_round=True, samples=[s], stacks=[stack],
                      exited=[pb.RankIdentity(job_id="job-0", rank=0, world_size=1, pid=99,
                                              rank_source="RANK", rank_conflict="a:1 b:2",
                                              container=ident.container)],
                      changes=[pb.RankChange(slot=1, stack_id=stack.id,
                                             native_frame="c10d::Work::wait")],
                      health=pb.AgentHealth(version="1.0"))
    return pb.ReportRequest(protocol_version=2, report=r)


def _set_everywhere(msg, field: str, text: str) -> int:
    """Set every occurrence of ``field`` under ``msg`` to ``text``; how many were set."""
    n = 0
    for fd in msg.DESCRIPTOR.fields:
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            m = getattr(msg, fd.name)
            entry = fd.message_type.full_name.removeprefix(PACKAGE)
            if field == f"{entry}.key":
                items = dict(m)
                m.clear()
                m.update({text: v for v in items.values()})
                n += len(items)
            elif field == f"{entry}.value":
                for k in list(m):
                    m[k] = text
                    n += 1
        elif fd.message_type is not None:
            if fd.is_repeated:
                n += sum(_set_everywhere(x, field, text) for x in getattr(msg, fd.name))
            elif msg.HasField(fd.name):
                n += _set_everywhere(getattr(msg, fd.name), field, text)
        elif _name(fd) == field and fd.is_repeated:
            items = getattr(msg, fd.name)
            n += len(items)
            items[:] = [text] * len(items)
        elif _name(fd) == field:
            setattr(msg, fd.name, text)
            n += 1
    return n


def _with(field: str, length: int) -> pb.ReportRequest:
    req = _full_request()
    assert _set_everywhere(req.report, field, "x" * length), field
    if field.startswith("Frame."):        # the id is the frames' hash: keep it true
        for s in req.report.stacks:
            s.id = stack_id(Frame(f.name, f.filename, f.line) for f in s.frames)
    return req


def test_the_full_report_is_valid() -> None:
    assert admit(_full_request()) == Admission()


#: A derived field: a value of the gate's cap cannot be valid (it is a hash of the frames).
DERIVED = {"Stack.id"}


@pytest.mark.parametrize("field", sorted(WIRE_FIELDS))
def test_the_daemon_drops_the_part_one_character_past_each_bound(field) -> None:
    """A rank's string costs its part (a node's own field, the report)."""
    bound = string_bound(field, Bounds())
    node_field = field in ("NodeReport.node", "NodeReport.agent_id", "AgentHealth.version")
    req = _with(field, bound + 1)
    if node_field:
        with pytest.raises(ReportError):
            admit(req)
    else:
        adm = admit(req)
        assert adm.dropped and all(p.reason in ("string_too_long", "path_too_long",
                                                "env_too_long", "too_many_items",
                                                "stack_id_mismatch", "stack_too_big",
                                                "bad_container", "bad_job_id")
                                   for p in adm.dropped), (field, adm.dropped)
    if field not in DERIVED:     # and takes whatever the agent's gate lets through
        assert admit(_with(field, FIELDS[field].cap)) == Admission()


# -- hostile bytes through a whole round ------------------------------------------------

#: Tokens planted in the rank's text: none may leave the node (the part after
#: the prefix is what is looked for).
TOKENS = ["ghp_Zq8Rk2Lm9Xv4Bn7Tc1Yw5Hd3Fg6Js0Pa", "AKIAQX7ZK4M2N8P5R3T6",
          "tok_9f8e7d6c5b4a39281706f5e4", "hf_Zq8Rk2Lm9Xv4Bn7Tc1Yw5Hd3Fg"]
#: Shown as themselves where a field keeps the rank's text (VALUE and LABEL).
_SECRET_PARTS = [t[4:16] for t in TOKENS]

_HOSTILE = st.one_of(
    st.binary(max_size=120).map(lambda b: b.decode("utf-8", "surrogateescape")),
    st.text(max_size=80),
    st.sampled_from(["a" * 9000, "/ck/\udcff" * 3000, "\x00\x1b\n" * 50, "\x1b[2J\u202e" * 300,
                     "\ud800", "\x85\u2028"])).map(lambda x: x or "\x1b")   # every field set


@st.composite
def hostile(draw) -> str:
    """Hostile bytes, with a token planted at the start (before any cap) or not."""
    text = draw(_HOSTILE)
    token = draw(st.one_of(st.just(""), st.sampled_from(TOKENS)))
    sep = draw(st.sampled_from(["", "/", " ", "\n", "_"]))
    return token + sep + text if token else text


@st.composite
def round_inputs(draw):
    h = lambda: draw(hostile())   # noqa: E731 - one draw per field
    # fields the agent or the kernel fills (OWN: escaped and capped, not
    # redacted): hostile bytes, no planted token
    o = lambda: draw(_HOSTILE)    # noqa: E731
    env = {"NCCL_DEBUG_FILE": h(), "NCCL_" + h(): h(), "TORCH_NCCL_X": h()}
    ident = RankIdentity(job_id=h(), job_source=o(), rank=0, local_rank=0, world_size=2,
                         rank_source=o(), rank_conflict=o())
    container = ContainerInfo(container_pid=7, hostname=h(), container_id=h(), runtime=o(),
                              pod_uid=h(), namespace=h(), pod=h(), declared_namespace=h(),
                              declared_pod=h())
    proc = RankProcess(pid=4242, create_time=1.0, identity=ident,
                       env=sanitize.filter_env(env), container=container,
                       timeout=90.0, timeout_source=o())
    t = RankTracker(proc, 0.0)
    t.packages = frozenset({h(), h()})     # package names from paths the rank chose
    files = (OpenFile(h(), 10, previous_path=h(), expected_source=o(), copy_source_path=h(),
                      header_error=h()),)
    t.observe_process(ProcessSample(pid=4242, cpu_seconds=1.0, rss_bytes=1, io_read_bytes=0,
                                    io_write_bytes=0, num_threads=2, files_writing=files,
                                    memory_limits=(MemoryLimit("host", 1, 2),),
                                    blocked_in=o()), 1.0)
    t.scheduler_job = SchedulerJob(o(), h(), h(), h(), o())
    t.native = NativeWait(RankState.COLLECTIVE, CollectiveOp.WAIT, h())
    t.still_since = t.native_for = 0.5      # a native dump of this still period...
    t.native_dump_id = o()                  # ...and its stack's id
    pg = h()
    dump = FrDump(rank=0, version=h(), path="/x", pgs={pg: PgInfo(pg, h(), h(), (0, 1))},
                  entries=(FrEntry(pg, h(), 1, False, h(), "nccl", "scheduled", False, (), (),
                                   None, None, ()),),
                  status={pg: (1, 0, 0)})
    t.flight_recorder = summary_pb(dump, 100.0, 101.0)
    stack = Stack(tuple(Frame(h(), h(), 3) for _ in range(2)), thread_name=h())
    gpu = [GpuProcessMemory(4242, 0, 1 << 20)]
    devices = {0: GpuDevice(0, o(), o(), 1 << 30, 1 << 20)}
    return t, stack, gpu, devices, o()


def _strings_by_field(msg) -> list[tuple[str, str]]:
    out = []
    for fd, value in msg.ListFields():
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            entry = fd.message_type.full_name.removeprefix(PACKAGE)
            out += [x for k, v in value.items() for x in ((f"{entry}.key", k),
                                                          (f"{entry}.value", v))]
        elif fd.type == FieldDescriptor.TYPE_STRING:
            out += [(_name(fd), v) for v in (value if fd.is_repeated else [value])]
        elif fd.message_type is not None:
            for v in (value if fd.is_repeated else [value]):
                out += _strings_by_field(v)
    return out


def _json_strings(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in [k, *_json_strings(v)]]
    if isinstance(value, list):
        return [s for v in value for s in _json_strings(v)]
    return []


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(round_inputs())
def test_hostile_bytes_in_every_field_of_a_round(inputs) -> None:
    t, stack, gpu, devices, node = inputs
    spb = stack_pb(stack)
    t.stack_id = spb.id
    s = sample_pb(t, 2.0, gpu, devices, with_job=True)
    report = build_report(node=node or "n", agent_id="agent-h", seq=1, now=2.0, wall=2.0,
                          interval=1.0, samples=[s], exited=[t.proc],
                          health=AgentHealthCounts(version=node), ranks_watched=1)
    report.stacks.append(spb)
    wire = pb.NodeReport.FromString(report.SerializeToString())
    # every field made it, nothing was dropped
    assert s.HasField("process") and s.HasField("job") and s.HasField("flight_recorder")
    assert s.native_frame and s.native_stack_id and s.identity.HasField("container")
    # what leaves the agent: clean, within the gate's cap, no planted token
    fields = _strings_by_field(wire)
    assert {f for f, _ in fields} >= WIRE_FIELDS - {
        "RankChange.stack_id", "RankChange.native_frame", "RankChange.native_stack_id"}
    for field, text in fields:
        assert is_clean(text) and len(text) <= FIELDS[field].cap, (field, text[:80])
        if FIELDS[field].redact != sanitize.OWN:
            assert not any(p in text for p in _SECRET_PARTS), (field, text[:200])
    # the daemon takes it whole (protocol 2 with a change carrying the native frame too)
    req = pb.ReportRequest(protocol_version=2, report=wire)
    req.report.changes.add(slot=1, stack_id=spb.id, native_frame=s.native_frame,
                           native_stack_id=s.native_stack_id)
    assert admit(req) == Admission()
    d = Daemon()
    d.ingest(pb.ReportRequest(protocol_version=1, report=wire), now=2.0)
    view = jobs_view(d, now=2.0)
    stored = _json_strings(view)
    assert wire.samples[0].identity.job_id in stored
    for text in stored:
        assert is_clean(text), text[:80]
        assert not any(p in text for p in _SECRET_PARTS), text[:200]
    shown = render(json.loads(json.dumps(view)))
    assert not any(c in shown for c in "\x1b\x07\r\x00\x85\u2028\u202e"), repr(shown[:400])
