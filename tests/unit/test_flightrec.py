"""Flight Recorder dumps: real gloo dumps from this machine (tests/data/flightrec/real),
older dump versions written from the torch sources (legacy), hostile input."""

from __future__ import annotations

import copy
import copyreg
import importlib.util
import json
import os
import pickle
import pickletools

import pytest

from ncclwatch.flightrec import (
    FlightRecorderError,
    FrDump,
    Mismatch,
    PgProgress,
    analyze,
    analyze_progress,
    load_dump,
    summarize,
)
from tests.harness import paths

DATA = paths.DATA / "flightrec"
REAL = DATA / "real"
LEGACY = DATA / "legacy"


def _capture_module():
    spec = importlib.util.spec_from_file_location("fr_capture", DATA / "capture.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


CAPTURE = _capture_module()
LEGACY_VERSIONS = CAPTURE.LEGACY_VERSIONS


def real(scenario: str) -> list[FrDump]:
    files = sorted((REAL / scenario).glob("comm_lib_trace_rank_*"))
    assert files, f"no dumps in {REAL / scenario}: run tests/data/flightrec/capture.py"
    return [load_dump(f) for f in files]


def raw(scenario: str, rank: int) -> dict:
    # our own committed test files: plain pickle is fine here (the code under test never does this)
    return pickle.loads((REAL / scenario / f"comm_lib_trace_rank_{rank}").read_bytes())


def dumps_bytes(obj) -> bytes:
    return pickle.dumps(obj, protocol=2)


# ---------------------------------------------------------------- real dumps


def test_real_dumps_are_small_pickles_without_globals():
    files = list(REAL.rglob("comm_lib_trace_rank_*")) + list(LEGACY.rglob("nccl_trace_rank_*"))
    assert len(files) == 16 + 3 * len(LEGACY_VERSIONS)
    for f in files:
        data = f.read_bytes()
        assert len(data) < 200_000, f
        ops = {op.name for op, _, _ in pickletools.genops(data)}
        assert not ops & {"GLOBAL", "STACK_GLOBAL", "REDUCE", "BUILD", "INST", "OBJ", "NEWOBJ"}, f


def test_healthy_gloo_job():
    dumps = real("healthy")
    assert [d.rank for d in dumps] == [0, 1, 2]
    for d in dumps:
        assert d.version == "2.10" and d.backend == "gloo"
        assert [(e.seq, e.op) for e in d.entries] == [
            (1, "all_reduce"), (2, "broadcast"), (3, "all_gather"), (4, "barrier")]
        assert all(e.completed and e.retired and e.state == "scheduled" for e in d.entries)
        assert d.status == {"0": (4, -1, 4)}          # gloo: last_started stays -1
        assert d.entries[0].input_sizes == ((4,),) and d.entries[3].input_sizes == ()
        assert d.entries[0].timeout_ms == 5000
        assert d.entries[0].thread_name == "python"
        assert d.entries[0].frames[0][0] == "all_reduce"
        assert any(f[0] == "_worker" and f[1].endswith("capture.py") for f in d.entries[0].frames)
        # gloo's pg_config: recorded under "" before the group had a name: not used
        assert raw("healthy", d.rank)["pg_config"] == {"": {"name": "", "desc": "", "ranks": "[0, 1, 2]"}}
        assert d.configured == {} and d.pgs["0"].ranks == ()
        assert d.pgs["0"].desc == "default_pg"
    a = analyze(dumps)
    assert a.stuck == [] and a.mismatches == [] and a.missing_ranks() == []
    assert a.timeout_ms == 5000
    assert all(p.pending_seq == 0 and p.pending_op == "" for ps in a.progress.values() for p in ps)


def test_hang_names_the_rank_that_never_joined():
    dumps = real("hang")
    r0 = dumps[0]
    assert r0.status["0"] == (4, -1, 3)
    last = r0.entries[-1]
    assert (last.seq, last.op, last.completed, last.retired) == (4, "all_reduce", False, False)
    assert dumps[2].status["0"] == (3, -1, 3)

    a = analyze(dumps)
    assert len(a.stuck) == 1
    s = a.stuck[0]
    assert (s.pg_name, s.pg_desc, s.seq, s.op) == ("0", "default_pg", 4, "all_reduce")
    assert s.waiting_ranks == (0, 1)
    assert s.missing_ranks == (2,)
    assert s.timeout_ms == 5000 and a.timeout_ms == 5000
    assert s.since_ns == min(d.entries[-1].time_created_ns for d in dumps[:2])
    assert a.missing_ranks() == [2] and a.waiting_ranks() == [0, 1]
    assert a.mismatches == []
    j = a.to_json()
    json.dumps(j)
    assert j["missing_ranks"] == [2] and j["stuck"][0]["op"] == "all_reduce"


def test_an_older_collective_no_dump_has_completed_does_not_hide_the_missing_rank():
    # ncclwatch.demo.job train, DDP, the step's all_reduce waited in work.wait(): rank 1
    # stops before step 52's. Every rank enqueued the last backward's bucket all_reduce
    # (#211), which gloo has not yet recorded as completed; ranks 0 and 2 enqueued the
    # step's all_reduce #212, rank 1 never did. Taken through the debug-info pipe.
    dumps = real("ddp-async-hang")
    assert [d.status["0"][::2] for d in dumps] == [(212, 210), (211, 210), (212, 210)]
    [s] = analyze(dumps).stuck
    assert (s.seq, s.op, s.waiting_ranks, s.missing_ranks) == (212, "all_reduce", (0, 2), (1,))
    assert s.timeout_ms == 90_000
    # From the summaries alone (what the daemon gets), the same.
    [p] = analyze_progress({d.rank: summarize(d) for d in dumps}, world_size=3).stuck
    assert (p.seq, p.op, p.waiting_ranks, p.missing_ranks) == (212, "all_reduce", (0, 2), (1,))


def test_a_rank_without_a_dump_is_unreported_never_missing():
    dumps = real("hang")[:2]                        # the culprit sent nothing
    a = analyze(dumps, world_size=3)
    assert a.stuck[0].waiting_ranks == (0, 1)
    assert a.stuck[0].missing_ranks == ()
    assert a.stuck[0].unreported_ranks == (2,) and a.unreported == (2,)
    assert a.missing_ranks() == []
    # without the world size nothing says a third rank exists
    b = analyze(dumps)
    assert b.unreported == () and b.missing_ranks() == []


def test_desync_ops_and_sizes():
    dumps = real("desync")
    a = analyze(dumps)
    by_seq = {m.seq: m for m in a.mismatches}
    assert sorted(by_seq) == [2, 3]
    assert by_seq[2].ops[2] == ("broadcast", ((8,),), ((8,),))      # rank 2 broadcast 8 elements
    assert by_seq[2].ops[0] == ("broadcast", ((4,),), ((4,),))
    assert by_seq[3].ops[2][0] == "broadcast" and by_seq[3].ops[0][0] == "all_reduce"
    assert by_seq[3].pg_name == "0"
    s = a.stuck[0]
    assert (s.seq, s.waiting_ranks, s.missing_ranks) == (3, (0, 1, 2), ())
    # from summaries alone the pending op at seq 3 already disagrees
    b = analyze_progress({d.rank: summarize(d) for d in dumps})
    assert [(m.seq, m.ops[2][0]) for m in b.mismatches] == [(3, "broadcast")]


def test_several_groups_match_by_name_not_by_pg_id():
    dumps = real("multipg")
    assert [d.rank for d in dumps] == [0, 1, 2, 3]
    # pg ids are per process: rank 0's "1" is pair01, rank 2's "1" is pair23
    assert (dumps[0].pgs["1"].name, dumps[0].pgs["1"].desc) == ("1", "pair01")
    assert (dumps[2].pgs["1"].name, dumps[2].pgs["1"].desc) == ("2", "pair23")
    a = analyze(dumps)
    assert len(a.stuck) == 1
    s = a.stuck[0]
    assert (s.pg_name, s.pg_desc, s.pg_id, s.seq, s.op) == ("2", "pair23", "1", 2, "all_reduce")
    assert s.waiting_ranks == (2,) and s.missing_ranks == (3,)
    assert a.missing_ranks() == [3]
    assert a.mismatches == []


def test_summaries_travel_as_json():
    dumps = real("hang")
    progress = {d.rank: summarize(d) for d in dumps}
    wire = json.loads(json.dumps({str(r): [p.to_json() for p in ps] for r, ps in progress.items()}))
    back = {int(r): [PgProgress.from_json(p) for p in ps] for r, ps in wire.items()}
    assert back == progress
    p0 = back[0][0]
    assert (p0.pending_seq, p0.pending_op, p0.pending_sizes, p0.pending_timeout_ms) == (
        4, "all_reduce", ((4,),), 5000)
    a = analyze_progress(back)
    assert a.stuck == analyze(dumps).stuck


# ------------------------------------------------------------ older versions


@pytest.mark.parametrize("version", LEGACY_VERSIONS)
def test_legacy_version_loads_and_analyzes(version):
    v = tuple(int(x) for x in version.split("."))
    files = sorted((LEGACY / f"v{version}").glob("nccl_trace_rank_*"))
    dumps = [load_dump(f) for f in files]
    assert [d.rank for d in dumps] == [0, 1, 2]
    d0 = dumps[0]
    assert d0.version == version and d0.backend == "nccl"
    assert d0.pgs["0"].ranks == (0, 1, 2)                  # NCCL's pg_config names the group
    assert d0.status_from_entries == (v < (2, 3))          # pg_status since 2.3
    assert d0.status["0"] == (4, 4, 3)
    last = d0.entries[-1]
    assert (last.state, last.completed) == ("started", False)
    assert d0.entries[0].completed and d0.entries[0].state == "completed"
    assert (last.timeout_ms is None) == (v < (2, 2))
    assert (last.thread_name != "") == (v >= (2, 8))
    assert d0.comm_lib_version == ("" if v < (2, 7) else CAPTURE.LEGACY_NCCL_VERSION)
    summary = summarize(d0)
    assert [(p.pg_name, p.pending_seq, p.pending_op) for p in summary] == [("0", 4, "all_reduce")]
    a = analyze(dumps)
    assert [(s.seq, s.op, s.waiting_ranks, s.missing_ranks) for s in a.stuck] == [
        (4, "all_reduce", (0, 1), (2,))]
    assert a.timeout_ms == (None if v < (2, 2) else 5000)
    # NCCL's pg_config lists the members: a rank with no dump is known to exist
    b = analyze(dumps[:2])
    assert b.unreported == (2,) and b.missing_ranks() == []


def test_legacy_files_are_what_the_generator_writes():
    for version in LEGACY_VERSIONS:
        for rank in range(3):
            committed = (LEGACY / f"v{version}" / f"nccl_trace_rank_{rank}").read_bytes()
            assert CAPTURE.legacy_bytes(version, rank) == committed, (version, rank)


def test_nccl_timed_out_work_is_not_completed():
    """pg_status counts a retired (timed-out) work as completed; its state says otherwise."""
    d = pickle.loads((LEGACY / "v2.9" / "nccl_trace_rank_0").read_bytes())
    d["entries"][-1]["retired"] = True
    d["pg_status"]["0"]["last_completed_collective"] = 4
    dump = load_dump(dumps_bytes(d), rank=0)
    assert dump.entries[-1].completed is False
    assert dump.status["0"] == (4, 4, 3)
    others = [load_dump(LEGACY / "v2.9" / f"nccl_trace_rank_{r}") for r in (1, 2)]
    s = analyze([dump, *others]).stuck[0]
    assert (s.seq, s.waiting_ranks, s.missing_ranks) == (4, (0, 1), (2,))


def test_first_layouts_pg_config_lists_and_seq_id():
    base = raw("hang", 2)
    entries = []
    for e in base["entries"]:
        e = {k: v for k, v in e.items() if k not in ("process_group", "is_p2p", "collective_seq_id")}
        e["seq_id"] = base["entries"].index(next(x for x in base["entries"]
                                                 if x["record_id"] == e["record_id"])) + 1
        e["profiling_name"] = e["profiling_name"].replace("gloo:", "nccl:")
        e["state"] = "completed"
        entries.append(e)
    for cfg in ([[0, 1, 2]], {0: [0, 1, 2]}, {"0": [0, 1, 2]}):
        d = load_dump(dumps_bytes({"version": "1.2", "entries": entries, "pg_config": cfg}), rank=2)
        assert d.pgs["0"].ranks == (0, 1, 2) and d.pgs["0"].name == "0"
        assert [e.seq for e in d.entries] == [1, 2, 3]
        assert d.status["0"] == (3, 3, 3) and d.status_from_entries


def test_p2p_entries_are_counted_apart():
    d = pickle.loads((LEGACY / "v2.9" / "nccl_trace_rank_0").read_bytes())
    send = copy.deepcopy(d["entries"][0])
    send.update(profiling_name="nccl:send 0->1", is_p2p=True, p2p_seq_id=1, collective_seq_id=3,
                state="started", time_discovered_completed_ns=None, retired=False)
    d["entries"].insert(3, send)
    dump = load_dump(dumps_bytes(d), rank=0)
    e = dump.entries[3]
    assert (e.op, e.is_p2p, e.seq, e.backend) == ("send", True, 1, "nccl")
    assert dump.status["0"] == (4, 4, 3)          # the pending send does not move the collectives
    assert summarize(dump)[0].pending_op == "all_reduce"


def test_sizes_that_may_differ_per_rank_are_not_a_desync():
    base = [pickle.loads((LEGACY / "v2.9" / f"nccl_trace_rank_{r}").read_bytes()) for r in range(2)]
    for d in base:
        del d["entries"][3:]                       # seqs 1..3, all completed
    gather = copy.deepcopy(base)
    for r, d in enumerate(gather):
        d["entries"][0].update(profiling_name="nccl:gather",
                               output_sizes=[[4], [4]] if r == 0 else [])
    assert analyze([load_dump(dumps_bytes(d), rank=r) for r, d in enumerate(gather)]).mismatches == []
    reduce_ = copy.deepcopy(base)
    reduce_[1]["entries"][0]["output_sizes"] = [[5]]
    ms = analyze([load_dump(dumps_bytes(d), rank=r) for r, d in enumerate(reduce_)]).mismatches
    assert ms == [Mismatch(pg_id="0", seq=1, pg_name="0",
                           ops={0: ("all_reduce", ((4,),), ((4,),)), 1: ("all_reduce", ((4,),), ((5,),))})]


# ------------------------------------------------------------- bad input


@pytest.mark.parametrize("version", ["3.0", "0.9", "abc", "", 2.1, None])
def test_unknown_version_is_a_clear_error(tmp_path, version):
    d = raw("hang", 0)
    d["version"] = version
    f = tmp_path / "nccl_trace_rank_0"
    f.write_bytes(dumps_bytes(d))
    with pytest.raises(FlightRecorderError) as ei:
        load_dump(f)
    msg = str(ei.value)
    assert str(f) in msg and "version" in msg
    assert repr(version) in msg


def test_missing_version_key(tmp_path):
    f = tmp_path / "dump_1"
    d = raw("hang", 0)
    del d["version"]
    f.write_bytes(dumps_bytes(d))
    with pytest.raises(FlightRecorderError, match="no 'version' key"):
        load_dump(f)


def test_garbage_truncated_and_empty_files(tmp_path):
    whole = (REAL / "hang" / "comm_lib_trace_rank_0").read_bytes()
    cases = {
        "truncated_0": whole[: len(whole) // 2],
        "garbage_1": os.urandom(512),
        "text_2": b"this is not a pickle\n",
        "empty_3": b"",
        "list_4": dumps_bytes([1, 2, 3]),
        "entries_5": dumps_bytes({"version": "2.10", "entries": {"a": 1}}),
        "entry_6": dumps_bytes({"version": "2.10", "entries": [{"profiling_name": 7}]}),
        "seq_7": dumps_bytes({"version": "2.10", "entries": [
            {"profiling_name": "nccl:all_reduce", "collective_seq_id": "x"}]}),
    }
    for name, data in cases.items():
        f = tmp_path / name
        f.write_bytes(data)
        with pytest.raises(FlightRecorderError) as ei:
            load_dump(f)
        assert str(f) in str(ei.value), name
    with pytest.raises(FlightRecorderError, match="cannot read"):
        load_dump(tmp_path / "absent_9")
    with pytest.raises(FlightRecorderError, match="limit"):
        load_dump(REAL / "hang" / "comm_lib_trace_rank_0", max_bytes=100)
    with pytest.raises(FlightRecorderError, match="limit"):
        load_dump(whole, max_bytes=100)


class Sneaky:
    def __reduce__(self):
        return (os.system, ("true",))


def test_a_pickle_with_a_global_is_refused_not_executed(tmp_path):
    marker = tmp_path / "pwned"
    payloads = [
        f"cos\nsystem\n(S'touch {marker}'\ntR.".encode(),                 # protocol 0 GLOBAL
        pickle.dumps({"version": "2.10", "x": Sneaky()}, protocol=4),     # STACK_GLOBAL
        f"cbuiltins\neval\n(S'open(\"{marker}\", \"w\")'\ntR.".encode(),
        (b"\x80\x02}q\x00X\x07\x00\x00\x00versionq\x01X\x04\x00\x00\x002.10q\x02s"
         b"X\x01\x00\x00\x00pq\x03\x82\xf1."),                             # EXT1 (copyreg)
        b"\x80\x02X\x03\x00\x00\x00abcQ.",                                 # BINPERSID
    ]
    copyreg.add_extension("os", "system", 0xF1)       # an extension code naming os.system
    try:
        for i, p in enumerate(payloads):
            with pytest.raises(FlightRecorderError) as ei:
                load_dump(p, rank=0)
            assert "forbidden" in str(ei.value), (i, ei.value)
    finally:
        copyreg.remove_extension("os", "system", 0xF1)
    assert not marker.exists()
    with pytest.raises(FlightRecorderError, match="forbidden global os.system|posix.system"):
        load_dump(payloads[0])


def test_only_plain_builtins_come_out():
    d = raw("hang", 0)
    d["entries"][0]["frames"] = {1, 2}                      # a set (protocol 4 EMPTY_SET)
    with pytest.raises(FlightRecorderError, match="unexpected set"):
        load_dump(pickle.dumps(d, protocol=4))
    d["entries"][0]["frames"] = b"bytes"
    with pytest.raises(FlightRecorderError, match="unexpected bytes"):
        load_dump(pickle.dumps(d, protocol=4))


def test_rank_from_the_file_name_or_given():
    assert load_dump(REAL / "hang" / "comm_lib_trace_rank_2").rank == 2
    assert load_dump(REAL / "hang" / "comm_lib_trace_rank_2", rank=7).rank == 7
    data = (REAL / "hang" / "comm_lib_trace_rank_2").read_bytes()
    d = load_dump(data)
    assert d.rank is None and d.path == "<bytes>"
    with pytest.raises(FlightRecorderError, match="rank unknown"):
        analyze([d])
    with pytest.raises(FlightRecorderError, match="second dump for rank 2"):
        analyze([load_dump(data, rank=2), load_dump(data, rank=2)])


def _shared_pickle(depth: int, key: bytes, kind: bytes = b"l") -> bytes:
    """{'version': '2.10', 'entries': [{..., key: L}]} where L holds L' twice,
    L' holds L'' twice, ... (2**depth paths, a few bytes a level); kind l: lists, t: tuples."""
    b = bytearray(b"\x80\x02")
    b += (b"]" if kind == b"l" else b")") + b"q\x00"     # the innermost object, memo 0
    for i in range(1, depth + 1):                 # L_i = [L_{i-1}, L_{i-1}], memo i
        b += b"(h" + bytes([i - 1]) + b"h" + bytes([i - 1]) + kind + b"q" + bytes([i]) + b"0"
    b += (b"}(X\x07\x00\x00\x00versionX\x04\x00\x00\x002.10X\x07\x00\x00\x00entries"
          b"](}(X\x0e\x00\x00\x00profiling_nameX\x0f\x00\x00\x00nccl:all_reduce"
          b"X\x11\x00\x00\x00collective_seq_idK\x01X" + len(key).to_bytes(4, "little") + key +
          b"h" + bytes([depth]) + b"ueu.")
    return bytes(b)


def test_shared_and_cyclic_structures_cost_their_size_not_more():
    import time
    t = time.monotonic()
    # 2**200 paths through the sizes: refused (a shape of lists, not ints) without walking them
    with pytest.raises(FlightRecorderError, match="input_sizes"):
        load_dump(_shared_pickle(200, b"input_sizes"), rank=0)
    with pytest.raises(FlightRecorderError, match="process_group name"):
        load_dump(_shared_pickle(200, b"process_group"), rank=0)
    with pytest.raises(FlightRecorderError, match="thread_name"):
        load_dump(_shared_pickle(200, b"thread_name"), rank=0)
    # shared tuples are refused before anything is built: as a dict key, hashing
    # one (CPython does not cache tuple hashes) would take 2**200 steps
    tuples = _shared_pickle(200, b"thread_name", b"t")
    with pytest.raises(FlightRecorderError, match="nested parts"):
        load_dump(tuples, rank=0)
    as_key = tuples[: tuples.index(b"}(X")] + b"}h\xc8Ns."        # {T_200: None}
    with pytest.raises(FlightRecorderError, match="nested parts"):
        load_dump(as_key, rank=0)
    # a list that holds itself
    cyclic = b"\x80\x02}(X\x07\x00\x00\x00versionX\x04\x00\x00\x002.10X\x07\x00\x00\x00entries]q\x07h\x07au."
    with pytest.raises(FlightRecorderError, match=r"entries\[0\] is a list"):
        load_dump(cyclic, rank=0)
    assert time.monotonic() - t < 2.0


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_every_pickle_protocol_of_plain_data_loads(protocol):
    d = raw("multipg", 2)
    d["entries"][0]["duration_ms"] = 1.5                     # a float, as NCCL's timing adds
    got = load_dump(pickle.dumps(d, protocol=protocol), rank=2)
    want = load_dump(REAL / "multipg" / "comm_lib_trace_rank_2")
    assert got.entries == want.entries and got.status == want.status and got.pgs == want.pgs
