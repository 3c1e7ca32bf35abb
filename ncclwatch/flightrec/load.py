"""Read Flight Recorder dumps: every 2.x layout (and 1.x pg_config) into one model.

As torch's flight_recorder ``components/loader.py``: bytes in, ``FrDump``
out. A dump is untrusted input (a file another user's process wrote): it is
read with ``ncclwatch.safepickle.load_plain``, so only
dict/list/tuple/str/int/float/bool/None can come out of it, and nothing in
it is executed. What each version holds is in the package docstring.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from ncclwatch.flightrec.model import FlightRecorderError, FrDump, FrEntry, PgInfo
from ncclwatch.safepickle import brief as _safe_brief
from ncclwatch.safepickle import load_plain

MAX_DUMP_BYTES = 256 * 1024 * 1024
#: Entries one dump may hold. torch's ring buffer holds TORCH_FR_BUFFER_SIZE entries
#: (2,000 is the documented setting); a pickle can reuse one memoised entry millions of
#: times in a few MB, and expanding them cost minutes and GiBs (issue 20).
MAX_ENTRIES = 200_000
#: Stack frames kept per entry.
MAX_FRAMES = 256
#: Digits of an integer field (an int64 has 19).
MAX_DIGITS = 19
SUPPORTED_MAJORS = (1, 2)

# Backends whose FR entries carry a real state (from device events). gloo
# records no events: its entries stay "scheduled".
_STATELESS_BACKENDS = frozenset({"gloo"})
_P2P_OPS = frozenset({"send", "recv", "isend", "irecv"})


def _brief(v: Any) -> str:
    """A bounded repr for an error message (an int too long to print says so)."""
    try:
        return _safe_brief(v)
    except ValueError:
        return "<a number too long to print>"


def parse_version(version: Any, where: str = "<dump>") -> tuple[int, int]:
    """``"2.10"`` -> (2, 10); FlightRecorderError for what this reader does not know."""
    if not isinstance(version, str):
        raise FlightRecorderError(f"{where}: 'version' is {_brief(version)}, expected a string like '2.10'")
    m = re.fullmatch(r"\s*(\d{1,6})\.(\d{1,6})\s*", version)
    if not m:
        raise FlightRecorderError(f"{where}: unknown Flight Recorder version {_brief(version)}")
    major, minor = int(m.group(1)), int(m.group(2))
    if major not in SUPPORTED_MAJORS:
        raise FlightRecorderError(
            f"{where}: unsupported Flight Recorder version {_brief(version)} "
            f"(this reader knows {', '.join(f'{v}.x' for v in SUPPORTED_MAJORS)})")
    return major, minor


def rank_from_path(path: str) -> int | None:
    """``.../comm_lib_trace_rank_3`` -> 3; trailing digits of the file name."""
    m = re.search(r"(?<!\d)(\d{1,9})$", os.path.basename(str(path)))
    return int(m.group(1)) if m else None


def load_dump(source: str | os.PathLike[str] | bytes, *, rank: int | None = None,
              max_bytes: int = MAX_DUMP_BYTES) -> FrDump:
    """Read one rank's dump from a path or from its bytes.

    ``rank`` defaults to the trailing digits of the file name. Raises
    FlightRecorderError for anything that is not a readable dump: missing or
    oversized file, truncated or garbage bytes, a pickle that asks for a global,
    an unknown version, a malformed field.
    """
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
        where = "<bytes>"
        if len(data) > max_bytes:
            raise FlightRecorderError(f"{where}: {len(data)} bytes, over the {max_bytes}-byte limit")
    else:
        where = os.fspath(source)
        try:
            with open(where, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size > max_bytes:
                    raise FlightRecorderError(f"{where}: {size} bytes, over the {max_bytes}-byte limit")
                data = f.read(max_bytes + 1)
        except FlightRecorderError:
            raise
        except OSError as e:
            raise FlightRecorderError(f"{where}: cannot read: {e.strerror or e}") from None
        if len(data) > max_bytes:
            raise FlightRecorderError(f"{where}: over the {max_bytes}-byte limit")
        if rank is None:
            rank = rank_from_path(where)
    return loads_dump(data, rank=rank, where=where)


def loads_dump(data: bytes, *, rank: int | None = None, where: str = "<bytes>") -> FrDump:
    if not data:
        raise FlightRecorderError(f"{where}: empty file")
    raw = load_plain(data, where, error=FlightRecorderError)
    return normalize(raw, rank=rank, where=where)


# -------------------------------------------------------------- normalising

def _int(v: Any, what: str, where: str, *, allow_none: bool = False) -> int | None:
    if v is None and allow_none:
        return None
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        if abs(v) >= 10 ** MAX_DIGITS:
            raise FlightRecorderError(f"{where}: {what} has more than {MAX_DIGITS} digits")
        return v
    if isinstance(v, str) and re.fullmatch(r"\s*-?\d{1,%d}\s*" % MAX_DIGITS, v):  # JSON dumps, old tools
        return int(v)
    if isinstance(v, float) and v.is_integer() and abs(v) < 10.0 ** MAX_DIGITS:
        return int(v)
    raise FlightRecorderError(f"{where}: {what} is {_brief(v)}, expected an integer")


def _text(v: Any, what: str, where: str) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, int) and abs(v) >= 10 ** MAX_DIGITS:
        raise FlightRecorderError(f"{where}: {what} is a number of more than {MAX_DIGITS} digits")
    if v is None or isinstance(v, (int, float)):
        return str(v)
    raise FlightRecorderError(f"{where}: {what} is {_brief(v)}, expected a string")


def _sizes(v: Any, what: str, where: str) -> tuple[tuple[int, ...], ...]:
    if v is None:
        return ()
    if not isinstance(v, (list, tuple)):
        raise FlightRecorderError(f"{where}: {what} is {_brief(v)}, expected a list of shapes")
    out = []
    for shape in v:
        if not isinstance(shape, (list, tuple)):
            raise FlightRecorderError(f"{where}: {what} has {_brief(shape)}, expected a shape list")
        out.append(tuple(_int(d, what, where) for d in shape))
    return tuple(out)


def _ranks(v: Any) -> tuple[int, ...]:
    """pg_config ranks: a string "[0, 1]" (2.x; parsed, never eval'd) or a list."""
    if isinstance(v, str):
        nums = re.findall(r"-?\d+", v)
        if any(len(x) > MAX_DIGITS for x in nums):
            raise FlightRecorderError(f"pg_config ranks: a number of more than {MAX_DIGITS} digits")
        return tuple(int(x) for x in nums)
    if isinstance(v, (list, tuple)):
        return tuple(int(x) for x in v if isinstance(x, int) and not isinstance(x, bool)
                     and abs(x) < 10 ** MAX_DIGITS)
    return ()


def _split_profiling_name(name: str) -> tuple[str, str]:
    """``"nccl:send 1->2"`` -> ("nccl", "send"); ``"barrier"`` -> ("", "barrier")."""
    backend, sep, rest = name.partition(":")
    if not sep:
        backend, rest = "", name
    op = rest.strip().split(" ", 1)[0]
    return backend.strip().lower(), op


def _frames(v: Any, where: str) -> tuple[tuple[str, str, int], ...]:
    if not isinstance(v, (list, tuple)):
        return ()
    out = []
    for f in v[:MAX_FRAMES]:
        if isinstance(f, dict):
            line = f.get("line", 0)
            out.append((_text(f.get("name", ""), "frame name", where),
                        _text(f.get("filename", ""), "frame filename", where),
                        line if isinstance(line, int) and not isinstance(line, bool) else 0))
    return tuple(out)


def normalize(raw: Any, *, rank: int | None = None, where: str = "<dump>") -> FrDump:
    """The loaded dict of any supported version -> FrDump."""
    if not isinstance(raw, dict):
        raise FlightRecorderError(f"{where}: top level is a {type(raw).__name__}, "
                                  "expected a dict with a 'version' key")
    if "version" not in raw:
        raise FlightRecorderError(f"{where}: no 'version' key (keys: {[_brief(k) for k in list(raw)[:8]]})")
    version = raw["version"]
    parse_version(version, where)

    # pg_config -> configured (by group name) and ranks by pg id (1.x lists)
    configured: dict[str, tuple[int, ...]] = {}
    ranks_by_id: dict[str, tuple[int, ...]] = {}
    cfg = raw.get("pg_config")
    if isinstance(cfg, list):                          # 1.x: [ranks of pg 0, ranks of pg 1, ...]
        for i, r in enumerate(cfg):
            ranks_by_id[str(i)] = _ranks(r)
    elif isinstance(cfg, dict):
        for key, val in cfg.items():
            if isinstance(val, dict):                  # 2.x: {name: {name, desc, ranks}}
                name = _text(val.get("name", key), "pg_config name", where)
                if name == "":                         # gloo: recorded before the group had a name
                    continue
                configured[name] = _ranks(val.get("ranks"))
            else:                                      # 1.x: {pg_id: [ranks]}
                ranks_by_id[_text(key, "pg_config key", where)] = _ranks(val)
    elif cfg is not None:
        raise FlightRecorderError(f"{where}: pg_config is a {type(cfg).__name__}")

    raw_entries = raw.get("entries", [])
    if raw_entries is None:
        raw_entries = []
    if not isinstance(raw_entries, list):
        raise FlightRecorderError(f"{where}: 'entries' is a {type(raw_entries).__name__}, expected a list")
    if len(raw_entries) > MAX_ENTRIES:
        raise FlightRecorderError(f"{where}: {len(raw_entries):,} entries, over the limit of "
                                  f"{MAX_ENTRIES:,} (torch keeps TORCH_FR_BUFFER_SIZE of them)")

    raw_status = raw.get("pg_status")
    if raw_status is not None and not isinstance(raw_status, dict):
        raise FlightRecorderError(f"{where}: pg_status is a {type(raw_status).__name__}")
    status_in: dict[str, tuple[int, int, int]] = {}
    for pg_id, st in (raw_status or {}).items():
        if not isinstance(st, dict):
            raise FlightRecorderError(f"{where}: pg_status[{_brief(pg_id)}] is not a dict")
        w = f"{where}: pg_status[{_brief(pg_id)}]"
        status_in[_text(pg_id, "pg_status key", where)] = (
            _int(st.get("last_enqueued_collective", -1), "last_enqueued_collective", w),
            _int(st.get("last_started_collective", -1), "last_started_collective", w),
            _int(st.get("last_completed_collective", -1), "last_completed_collective", w),
        )

    # first pass: the fields, without completion (it needs the status). Shared
    # lists (the pickle memoizes repeated frames and shapes) convert once.
    size_memo: dict[int, tuple[tuple[int, ...], ...]] = {}
    frame_memo: dict[int, tuple[tuple[str, str, int], ...]] = {}

    def sizes(v: Any, what: str, w: str) -> tuple[tuple[int, ...], ...]:
        if id(v) not in size_memo:
            size_memo[id(v)] = _sizes(v, what, w)
        return size_memo[id(v)]

    def frames(v: Any, w: str) -> tuple[tuple[str, str, int], ...]:
        if id(v) not in frame_memo:
            frame_memo[id(v)] = _frames(v, w)
        return frame_memo[id(v)]

    parsed: list[dict[str, Any]] = []
    for i, e in enumerate(raw_entries):
        w = f"{where}: entries[{i}]"
        if not isinstance(e, dict):
            raise FlightRecorderError(f"{w} is a {type(e).__name__}, expected a dict")
        pname = e.get("profiling_name")
        if not isinstance(pname, str):
            raise FlightRecorderError(f"{w}: profiling_name is {_brief(pname)}, expected a string")
        backend, op = _split_profiling_name(pname)
        pg_id_raw = e.get("pg_id", 0)
        pg_id = str(_int(pg_id_raw, "pg_id", w))
        pg = e.get("process_group")
        if isinstance(pg, (list, tuple)) and len(pg) >= 1:
            pg_name = _text(pg[0], "process_group name", w)
            pg_desc = _text(pg[1], "process_group desc", w) if len(pg) > 1 else ""
        else:                                          # 1.x: no process_group key
            pg_name, pg_desc = pg_id, ""
        is_p2p_raw = e.get("is_p2p")
        is_p2p = bool(is_p2p_raw) if isinstance(is_p2p_raw, bool) else op in _P2P_OPS
        if "collective_seq_id" in e:
            cseq = _int(e["collective_seq_id"], "collective_seq_id", w)
        elif "seq_id" in e:                            # the first FR layout
            cseq = _int(e["seq_id"], "seq_id", w)
        else:
            raise FlightRecorderError(f"{w}: no collective_seq_id")
        pseq = _int(e.get("p2p_seq_id", 0), "p2p_seq_id", w)
        state = e.get("state", "scheduled")
        if not isinstance(state, str):
            raise FlightRecorderError(f"{w}: state is {_brief(state)}")
        parsed.append({
            "pg_id": pg_id, "pg_name": pg_name, "pg_desc": pg_desc,
            "seq": pseq if is_p2p else cseq, "is_p2p": is_p2p, "op": op, "backend": backend,
            "state": state,
            "input_sizes": sizes(e.get("input_sizes"), "input_sizes", w),
            "output_sizes": sizes(e.get("output_sizes"), "output_sizes", w),
            "timeout_ms": _int(e.get("timeout_ms"), "timeout_ms", w, allow_none=True),
            "time_created_ns": _int(e.get("time_created_ns"), "time_created_ns", w, allow_none=True),
            "frames": frames(e.get("frames"), w),
            "record_id": _int(e.get("record_id"), "record_id", w, allow_none=True),
            "retired": bool(e.get("retired", False)),
            "thread_name": _text(e.get("thread_name", "") or "", "thread_name", w),
        })

    backends = Counter(p["backend"] for p in parsed if p["backend"])
    backend = backends.most_common(1)[0][0] if backends else ""

    def completed(p: dict[str, Any]) -> bool:
        if p["state"] == "completed":
            return True
        if p["backend"] in _STATELESS_BACKENDS:
            if p["retired"]:
                return True
            st = status_in.get(p["pg_id"])
            return bool(st and not p["is_p2p"] and p["seq"] <= st[2])
        return False   # retired without "completed" = timed out / aborted

    entries = tuple(
        FrEntry(pg_id=p["pg_id"], pg_name=p["pg_name"], seq=p["seq"], is_p2p=p["is_p2p"],
                op=p["op"], backend=p["backend"], state=p["state"], completed=completed(p),
                input_sizes=p["input_sizes"], output_sizes=p["output_sizes"],
                timeout_ms=p["timeout_ms"], time_created_ns=p["time_created_ns"],
                frames=p["frames"], record_id=p["record_id"], retired=p["retired"],
                pg_desc=p["pg_desc"], thread_name=p["thread_name"])
        for p in parsed)

    # groups: named by their entries; a pg_status-only group is named by its id
    pgs: dict[str, PgInfo] = {}
    for e in entries:
        if e.pg_id not in pgs:
            pgs[e.pg_id] = PgInfo(e.pg_id, e.pg_name, e.pg_desc,
                                  configured.get(e.pg_name) or ranks_by_id.get(e.pg_id, ()))
    for pg_id in list(status_in) + list(ranks_by_id):
        if pg_id not in pgs:
            pgs[pg_id] = PgInfo(pg_id, pg_id, "", configured.get(pg_id) or ranks_by_id.get(pg_id, ()))

    status = _status(entries, status_in, pgs)
    comm = raw.get("comm_lib_version", raw.get("nccl_version", ""))
    return FrDump(rank=rank, version=version, path=where, pgs=pgs, entries=entries, status=status,
                  backend=backend, comm_lib_version=comm if isinstance(comm, str) else "",
                  configured=configured, status_from_entries=not status_in and bool(entries))


def _status(entries: Sequence[FrEntry], status_in: Mapping[str, tuple[int, int, int]],
            pgs: Mapping[str, PgInfo]) -> dict[str, tuple[int, int, int]]:
    by_pg: dict[str, list[FrEntry]] = {}
    for e in entries:
        if not e.is_p2p:
            by_pg.setdefault(e.pg_id, []).append(e)
    out: dict[str, tuple[int, int, int]] = {}
    for pg_id in pgs:
        coll = by_pg.get(pg_id, [])
        pending = [e.seq for e in coll if not e.completed]
        if pg_id in status_in:
            le, ls, lc = status_in[pg_id]
            # a timed-out work counts as "completed" in pg_status once retired
            below = [s for s in pending if s <= lc]
            if below:
                lc = min(below) - 1
            out[pg_id] = (le, ls, lc)
        elif coll:
            le = max(e.seq for e in coll)
            lc = (min(pending) - 1) if pending else le
            started = [e.seq for e in coll if e.state in ("started", "completed")]
            out[pg_id] = (le, max(started) if started else -1, lc)
        else:
            out[pg_id] = (-1, -1, -1)
    return out
