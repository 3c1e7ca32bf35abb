"""PyTorch Flight Recorder dumps: load, normalise, summarise, analyse across ranks.

A Flight Recorder (FR) dump is what a rank's c10d backend writes when asked
(debug-info pipe, dump on timeout, ``torch._C._distributed_c10d._dump_fr_trace()``):
a pickle of a dict ``{version, pg_config, pg_status, entries, ...}``, one file
per global rank (``<prefix><rank>``). Its format moved over the torch releases;
the ``version`` key names it, and the header that defines it says "minor when
adding fields, major when changing existing fields". This module reads every
2.x layout (and the 1.x ``pg_config`` shapes) into one normalised model:

* ``FrDump``: one rank's dump; ``FrEntry``: one recorded collective / p2p op.
* ``summarize(dump)``: per process group, how far the rank got
  (``PgProgress``): that is what an agent ships, a few numbers per group.
* ``analyze(dumps)`` / ``analyze_progress(summaries)``: across ranks, the first
  collective of each group that did not complete everywhere, which members are
  blocked in it (waiting) and which never enqueued it (missing: the culprits),
  plus desyncs (same group and sequence number, different op or sizes).

What each version holds (from the torch sources; tests/data/flightrec/README.md
keeps the evidence, and which rows are read from a source file and which are
inferred):

=======  ==============================================================
version  change
=======  ==============================================================
1.x      ``pg_config`` a list (or dict) of rank lists indexed by pg id;
         no ``process_group`` / ``is_p2p`` keys (``seq_id`` in the first)
2.0      ``pg_config`` {name: {name, desc, ranks: "[0, 1]"}}, ``is_p2p``,
         ``process_group`` (name, desc); dtypes as ``"float"``
2.2      ``timeout_ms`` per entry (inferred)
2.3      ``pg_status`` {pg_id: last_enqueued/started/completed_collective},
         ``timeout_ms``; dtypes as ``"Float"``; no ``entries`` key when
         collectives are not included
2.7      ``nccl_version``
2.8      ``thread_id``, ``thread_name`` per entry (inferred)
2.9      ``comm_lib_version`` replaces ``nccl_version`` (inferred)
2.10     all of it (torch 2.13, checked live with gloo)
=======  ==============================================================

Every field past the core ones is optional here, and a 2.x minor this reader
has not seen is read the same way (minor bumps only add fields); another
major version is refused.

Completion, by the backend's semantics:

* NCCL (and the other event-tracking backends) set ``state`` from CUDA events:
  ``completed`` means done; ``retired`` without ``completed`` means the watchdog
  dropped it (timed out / aborted: "a retired but not completed event has timed
  out", FlightRecorder.hpp). ``pg_status.last_completed_collective`` can count
  such a timed-out work, so the status is lowered to the first entry that is
  not completed.
* gloo leaves every entry ``scheduled`` and ``last_started_collective`` at -1;
  finishing shows only as ``retired`` and in ``pg_status``. It retires a work
  that failed (timeout, peer gone) exactly like one that succeeded, so a gloo
  dump taken after the timeout fired no longer shows the hang: dump while the
  ranks are blocked (the debug-info pipe does).
* gloo's ``pg_config`` is not usable: it is recorded before the group has a
  name, under the key ``""``, and the last group constructed overwrites it
  (``{'': {'name': '', 'desc': '', 'ranks': '[]'}}`` after a ``new_group``).
  Group membership then comes from the dumps themselves (the ranks that report
  the group), and for the default group from ``world_size`` when given.

A dump is untrusted input (a file another user's process wrote): it is read
with an unpickler that resolves no globals and no persistent ids, so only
dict/list/tuple/str/int/float/bool/None can come out of it, and nothing in it
is executed.
"""

from __future__ import annotations

import io
import os
import pickle
import re
import reprlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "MAX_DUMP_BYTES",
    "FlightRecorderError",
    "FrAnalysis",
    "FrDump",
    "FrEntry",
    "Mismatch",
    "PgInfo",
    "PgProgress",
    "Stuck",
    "analyze",
    "analyze_progress",
    "load_dump",
    "loads_dump",
    "parse_version",
    "summarize",
]

MAX_DUMP_BYTES = 256 * 1024 * 1024
SUPPORTED_MAJORS = (1, 2)

# Backends whose FR entries carry a real state (from device events). gloo
# records no events: its entries stay "scheduled".
_STATELESS_BACKENDS = frozenset({"gloo"})

# Ops whose per-rank input / output sizes legitimately differ (uneven splits,
# root-only buffers), as torch's own analyzer treats them.
_INPUT_MAY_DIFFER = frozenset({
    "scatter", "all_to_all", "all_to_all_single", "all_to_all_v_single", "alltoall",
    "alltoall_base", "all_gather_v", "reduce_scatter_v", "coalesced",
})
_OUTPUT_MAY_DIFFER = frozenset({
    "gather", "all_to_all", "all_to_all_single", "all_to_all_v_single", "alltoall",
    "alltoall_base", "all_gather_v", "reduce_scatter_v", "coalesced",
})
_P2P_OPS = frozenset({"send", "recv", "isend", "irecv"})


class FlightRecorderError(ValueError):
    """A dump that cannot be read: names the file and what is wrong with it."""


# --------------------------------------------------------------------- model


@dataclass(frozen=True, slots=True)
class FrEntry:
    """One recorded op. ``seq`` is ``collective_seq_id`` (``p2p_seq_id`` for p2p)."""

    pg_id: str
    pg_name: str
    seq: int
    is_p2p: bool
    op: str                  # "all_reduce", "broadcast", "barrier", "send", ... (no backend prefix)
    backend: str             # "nccl", "gloo", ... ("" when the name has no prefix)
    state: str               # "scheduled" | "started" | "completed" as recorded
    completed: bool          # by the backend's semantics (module docstring)
    input_sizes: tuple[tuple[int, ...], ...]
    output_sizes: tuple[tuple[int, ...], ...]
    timeout_ms: int | None
    time_created_ns: int | None
    frames: tuple[tuple[str, str, int], ...]   # (name, filename, line), innermost first
    record_id: int | None = None
    retired: bool = False
    pg_desc: str = ""
    thread_name: str = ""


@dataclass(frozen=True, slots=True)
class PgInfo:
    pg_id: str
    name: str
    desc: str
    ranks: tuple[int, ...]   # global ranks of the group; () when the dump does not say


@dataclass(frozen=True, slots=True)
class FrDump:
    rank: int | None
    version: str
    path: str
    pgs: dict[str, PgInfo]                       # by pg_id
    entries: tuple[FrEntry, ...]
    status: dict[str, tuple[int, int, int]]      # pg_id -> (last_enqueued, last_started, last_completed)
    backend: str = ""
    comm_lib_version: str = ""
    configured: dict[str, tuple[int, ...]] = field(default_factory=dict)  # pg name -> ranks (pg_config)
    status_from_entries: bool = False            # no pg_status in this version: derived


# ------------------------------------------------------------------- loading


class _SafeUnpickler(pickle.Unpickler):
    """Resolves nothing: a global (os.system, builtins.eval, ...) is an error."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"forbidden global {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("forbidden persistent id")


_ALLOWED_TYPES = (dict, list, tuple, str, int, float, bool, type(None))

# What _prescan lets through: the opcodes of plain data (torch writes protocol 2
# with dicts, lists, 2-tuples, strings, ints, floats, bools, None and the memo).
# Bytes and sets are let through to be refused by _check_plain with a clearer
# message; every opcode that imports, calls or builds an object is refused.
# opcode -> (action, argument): action p push a value, m mark, t tuple from
# mark, t1..t3 tuple of n, c container from mark, x pop to mark, o pop n,
# u memo put, g memo get, d dup, n nothing, s stop; argument: number of bytes,
# ("len", n) an n-byte little-endian length then that many bytes, "line" a
# text line (protocol 0).
_OPS: dict[int, tuple[str, Any]] = {
    0x80: ("n", 1), 0x95: ("n", 8), ord("."): ("s", 0),
    ord("}"): ("p", 0), ord("]"): ("p", 0), ord(")"): ("p", 0), ord("N"): ("p", 0),
    0x88: ("p", 0), 0x89: ("p", 0), 0x8F: ("p", 0),
    ord("X"): ("p", ("len", 4)), 0x8C: ("p", ("len", 1)), 0x8D: ("p", ("len", 8)),
    ord("T"): ("p", ("len", 4)), ord("U"): ("p", ("len", 1)),
    ord("B"): ("p", ("len", 4)), ord("C"): ("p", ("len", 1)), 0x8E: ("p", ("len", 8)),
    0x96: ("p", ("len", 8)),
    ord("J"): ("p", 4), ord("K"): ("p", 1), ord("M"): ("p", 2), ord("G"): ("p", 8),
    0x8A: ("p", ("len", 1)), 0x8B: ("p", ("len", 4)),
    ord("S"): ("p", "line"), ord("V"): ("p", "line"), ord("I"): ("p", "line"),
    ord("L"): ("p", "line"), ord("F"): ("p", "line"),
    ord("("): ("m", 0), ord("t"): ("t", 0), 0x85: ("t1", 0), 0x86: ("t2", 0), 0x87: ("t3", 0),
    ord("l"): ("c", 0), ord("d"): ("c", 0), 0x91: ("c", 0),
    ord("e"): ("x", 0), ord("u"): ("x", 0), 0x90: ("x", 0), ord("1"): ("x", 0),
    ord("a"): ("o1", 0), ord("0"): ("o1", 0), ord("s"): ("o2", 0), ord("2"): ("d", 0),
    ord("q"): ("u", 1), ord("r"): ("u", 4), ord("p"): ("u", "line"), 0x94: ("u", 0),
    ord("h"): ("g", 1), ord("j"): ("g", 4), ord("g"): ("g", "line"),
}
_OPNAMES = {ord("c"): "GLOBAL", 0x93: "STACK_GLOBAL", ord("i"): "INST", ord("R"): "REDUCE",
            ord("b"): "BUILD", ord("o"): "OBJ", 0x81: "NEWOBJ", 0x92: "NEWOBJ_EX",
            0x82: "EXT1", 0x83: "EXT2", 0x84: "EXT4", ord("P"): "PERSID", ord("Q"): "BINPERSID",
            0x97: "NEXT_BUFFER", 0x98: "READONLY_BUFFER"}
_MAX_TUPLE_NODES = 100_000


def _prescan(data: bytes, where: str) -> None:
    """Walk the opcodes before anything is built: refuse imports and calls, and
    tuples so deeply shared that hashing one (as a dict key) would never end.

    CPython does not cache tuple hashes: a tuple holding the same tuple twice,
    two hundred levels deep, is a few hundred bytes and 2**200 steps to hash.
    Each value on the simulated stack is the node count of its expansion
    (-1 a mark); lists and dicts count 1 (they cannot be hashed).
    """
    def bad(why: str) -> FlightRecorderError:
        return FlightRecorderError(f"{where}: truncated or corrupt pickle ({why})")

    stack: list[int] = []
    memo: dict[Any, int] = {}
    pos, end = 0, len(data)
    ops = _OPS
    while pos < end:
        code = data[pos]
        pos += 1
        spec = ops.get(code)
        if spec is None:
            name = _OPNAMES.get(code)
            if name == "GLOBAL" or name == "INST":
                nl = data.find(b"\n", data.find(b"\n", pos) + 1)
                mod_name = data[pos:nl].decode("latin-1", "replace").replace("\n", ".")
                raise FlightRecorderError(f"{where}: not a Flight Recorder pickle: forbidden global "
                                          f"{_brief(mod_name)[1:-1]}")
            if name:
                what = "global (STACK_GLOBAL)" if name == "STACK_GLOBAL" else f"opcode {name}"
                raise FlightRecorderError(f"{where}: not a Flight Recorder pickle: forbidden {what}")
            raise bad(f"unknown opcode 0x{code:02x} at byte {pos - 1}")
        action, arg = spec
        # the argument
        key: Any = None
        if arg == "line":
            nl = data.find(b"\n", pos)
            if nl < 0:
                raise bad("unterminated line")
            key = data[pos:nl]
            pos = nl + 1
        elif isinstance(arg, tuple):
            n = arg[1]
            if pos + n > end:
                raise bad("truncated length")
            length = int.from_bytes(data[pos:pos + n], "little")
            pos += n + length
        elif arg:
            if arg in (1, 4) and action in ("u", "g"):
                key = int.from_bytes(data[pos:pos + arg], "little")
            pos += arg
        if pos > end:
            raise bad("truncated")
        # the effect
        if action == "p":
            stack.append(1)
        elif action == "m":
            stack.append(-1)
        elif action == "g":
            if key not in memo:
                raise bad(f"memo {key!r} read before written")
            stack.append(memo[key])
        elif action == "u":
            if not stack or stack[-1] < 0:
                raise bad("memo put of nothing")
            memo[key if key is not None else len(memo)] = stack[-1]
        elif action in ("t", "c", "x"):
            total = 1
            while True:
                if not stack:
                    raise bad("no mark")
                v = stack.pop()
                if v < 0:
                    break
                total += v
            if action == "t":
                if total > _MAX_TUPLE_NODES:
                    raise FlightRecorderError(f"{where}: a tuple of over {_MAX_TUPLE_NODES} nested "
                                              "parts (not a Flight Recorder dump)")
                stack.append(total)
            elif action == "c":
                stack.append(1)
        elif action in ("t1", "t2", "t3"):
            k = int(action[1])
            if len(stack) < k or min(stack[-k:]) < 0:
                raise bad("short stack")
            total = 1 + sum(stack[-k:])
            del stack[-k:]
            if total > _MAX_TUPLE_NODES:
                raise FlightRecorderError(f"{where}: a tuple of over {_MAX_TUPLE_NODES} nested "
                                          "parts (not a Flight Recorder dump)")
            stack.append(total)
        elif action in ("o1", "o2"):
            k = int(action[1])
            if len(stack) < k:
                raise bad("short stack")
            del stack[-k:]
        elif action == "d":
            if not stack:
                raise bad("short stack")
            stack.append(stack[-1])
        elif action == "s":
            return
    raise bad("no STOP opcode")


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxtuple, _REPR.maxdict = 2, 4, 4, 4
_REPR.maxstring, _REPR.maxother, _REPR.maxlong = 60, 60, 40


def _brief(v: Any) -> str:
    """A bounded repr of an untrusted value for an error message."""
    return _REPR.repr(v)


def _check_plain(obj: Any, where: str) -> None:
    """Only plain builtins, walked once per container: a pickle can share one
    list many times (memo) or hold itself (cycles); neither costs more than
    its size in bytes here."""
    stack = [obj]
    seen: set[int] = set()
    while stack:
        o = stack.pop()
        t = type(o)
        if t not in _ALLOWED_TYPES:
            raise FlightRecorderError(f"{where}: unexpected {t.__name__} in the dump "
                                      "(only dict/list/tuple/str/int/float/bool/None)")
        if t in (dict, list, tuple):
            if id(o) in seen:
                continue
            seen.add(id(o))
            if t is dict:
                stack.extend(o.keys())
                stack.extend(o.values())
            else:
                stack.extend(o)


def parse_version(version: Any, where: str = "<dump>") -> tuple[int, int]:
    """``"2.10"`` -> (2, 10); FlightRecorderError for what this reader does not know."""
    if not isinstance(version, str):
        raise FlightRecorderError(f"{where}: 'version' is {_brief(version)}, expected a string like '2.10'")
    m = re.fullmatch(r"\s*(\d+)\.(\d+)\s*", version)
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
    m = re.search(r"(\d+)$", os.path.basename(str(path)))
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
    _prescan(data, where)
    try:
        raw = _SafeUnpickler(io.BytesIO(data)).load()
    except pickle.UnpicklingError as e:
        raise FlightRecorderError(f"{where}: not a Flight Recorder pickle: {e}") from None
    except (EOFError, ValueError, TypeError, KeyError, IndexError, AttributeError,
            MemoryError, OverflowError, RecursionError, UnicodeDecodeError) as e:
        raise FlightRecorderError(
            f"{where}: truncated or corrupt pickle ({type(e).__name__}: {e})") from None
    _check_plain(raw, where)
    return normalize(raw, rank=rank, where=where)


# -------------------------------------------------------------- normalising


def _int(v: Any, what: str, where: str, *, allow_none: bool = False) -> int | None:
    if v is None and allow_none:
        return None
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v
    if isinstance(v, str) and re.fullmatch(r"\s*-?\d+\s*", v):   # the JSON dump's and old tools' strings
        return int(v)
    if isinstance(v, float) and v.is_integer():
        return int(v)
    raise FlightRecorderError(f"{where}: {what} is {_brief(v)}, expected an integer")


def _text(v: Any, what: str, where: str) -> str:
    if isinstance(v, str):
        return v
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
        return tuple(int(x) for x in re.findall(r"-?\d+", v))
    if isinstance(v, (list, tuple)):
        return tuple(int(x) for x in v if isinstance(x, int) and not isinstance(x, bool))
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
    for f in v:
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


# ----------------------------------------------------------------- summaries


@dataclass(frozen=True, slots=True)
class PgProgress:
    """How far one rank got in one process group: what the agent ships."""

    pg_id: str
    pg_name: str
    ranks: tuple[int, ...]          # members as the dump says (() when it does not: gloo)
    last_enqueued: int
    last_started: int
    last_completed: int
    pending_op: str                 # the first collective enqueued and not completed ("" if none)
    pending_seq: int                # its sequence number (0 if none)
    pending_timeout_ms: int | None
    pending_since_ns: int | None    # its time_created_ns (wall clock of the rank)
    pending_sizes: tuple            # its input sizes
    pending_output_sizes: tuple = ()
    pg_desc: str = ""
    backend: str = ""
    timeout_ms: int | None = None   # the group's timeout as last recorded

    def to_json(self) -> dict[str, Any]:
        return {
            "pg_id": self.pg_id, "pg_name": self.pg_name, "ranks": list(self.ranks),
            "last_enqueued": self.last_enqueued, "last_started": self.last_started,
            "last_completed": self.last_completed, "pending_op": self.pending_op,
            "pending_seq": self.pending_seq, "pending_timeout_ms": self.pending_timeout_ms,
            "pending_since_ns": self.pending_since_ns,
            "pending_sizes": [list(s) for s in self.pending_sizes],
            "pending_output_sizes": [list(s) for s in self.pending_output_sizes],
            "pg_desc": self.pg_desc, "backend": self.backend, "timeout_ms": self.timeout_ms,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> PgProgress:
        return cls(
            pg_id=str(d["pg_id"]), pg_name=str(d["pg_name"]), ranks=tuple(int(r) for r in d.get("ranks", ())),
            last_enqueued=int(d["last_enqueued"]), last_started=int(d.get("last_started", -1)),
            last_completed=int(d["last_completed"]), pending_op=str(d.get("pending_op", "")),
            pending_seq=int(d.get("pending_seq", 0)), pending_timeout_ms=d.get("pending_timeout_ms"),
            pending_since_ns=d.get("pending_since_ns"),
            pending_sizes=tuple(tuple(int(x) for x in s) for s in d.get("pending_sizes", ())),
            pending_output_sizes=tuple(tuple(int(x) for x in s) for s in d.get("pending_output_sizes", ())),
            pg_desc=str(d.get("pg_desc", "")), backend=str(d.get("backend", "")),
            timeout_ms=d.get("timeout_ms"))


def summarize(dump: FrDump) -> list[PgProgress]:
    """One PgProgress per process group of the dump, in pg_id order."""
    coll: dict[str, dict[int, FrEntry]] = {}
    last: dict[str, FrEntry] = {}
    for e in dump.entries:
        last[e.pg_id] = e
        if not e.is_p2p:
            coll.setdefault(e.pg_id, {}).setdefault(e.seq, e)   # first entry of a (coalesced) seq
    out = []
    for pg_id in sorted(dump.pgs, key=_id_key):
        info = dump.pgs[pg_id]
        le, ls, lc = dump.status.get(pg_id, (-1, -1, -1))
        pend = coll.get(pg_id, {}).get(lc + 1) if le > lc else None
        ranks = info.ranks or dump.configured.get(info.name, ())
        lastent = last.get(pg_id)
        out.append(PgProgress(
            pg_id=pg_id, pg_name=info.name, ranks=tuple(ranks),
            last_enqueued=le, last_started=ls, last_completed=lc,
            pending_op=pend.op if pend else "",
            pending_seq=(lc + 1) if le > lc else 0,
            pending_timeout_ms=pend.timeout_ms if pend else None,
            pending_since_ns=pend.time_created_ns if pend else None,
            pending_sizes=pend.input_sizes if pend else (),
            pending_output_sizes=pend.output_sizes if pend else (),
            pg_desc=info.desc, backend=(pend or lastent).backend if (pend or lastent) else dump.backend,
            timeout_ms=lastent.timeout_ms if lastent else None))
    return out


def _id_key(pg_id: str) -> tuple[int, int | str]:
    return (0, int(pg_id)) if pg_id.isdigit() else (1, pg_id)


# ------------------------------------------------------------------ analysis


@dataclass(frozen=True, slots=True)
class Stuck:
    """The first collective of a group that did not complete on every member."""

    pg_id: str
    pg_name: str
    seq: int
    op: str
    waiting_ranks: tuple[int, ...]     # enqueued it, not completed: blocked in it (collateral)
    missing_ranks: tuple[int, ...]     # members that never enqueued it: the culprits
    timeout_ms: int | None
    unreported_ranks: tuple[int, ...] = ()   # members with no dump: not known, never guessed
    since_ns: int | None = None        # earliest time_created_ns among the waiting ranks
    pg_desc: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"pg_id": self.pg_id, "pg_name": self.pg_name, "pg_desc": self.pg_desc, "seq": self.seq,
                "op": self.op, "waiting_ranks": list(self.waiting_ranks),
                "missing_ranks": list(self.missing_ranks), "unreported_ranks": list(self.unreported_ranks),
                "timeout_ms": self.timeout_ms, "since_ns": self.since_ns}


@dataclass(frozen=True, slots=True)
class Mismatch:
    """Same group and sequence number, different op or sizes across ranks (desync)."""

    pg_id: str
    seq: int
    ops: dict[int, tuple[str, tuple, tuple]]   # rank -> (op, input_sizes, output_sizes)
    pg_name: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"pg_id": self.pg_id, "pg_name": self.pg_name, "seq": self.seq,
                "ops": {str(r): {"op": o, "input_sizes": [list(s) for s in i],
                                 "output_sizes": [list(s) for s in out]}
                        for r, (o, i, out) in sorted(self.ops.items())}}


@dataclass
class FrAnalysis:
    progress: dict[int, list[PgProgress]]
    stuck: list[Stuck]
    mismatches: list[Mismatch]
    timeout_ms: int | None        # the stuck collective's watchdog timeout (else the default group's)
    unreported: tuple[int, ...] = ()   # members of some group that sent no dump

    def missing_ranks(self) -> list[int]:
        return sorted({r for s in self.stuck for r in s.missing_ranks})

    def waiting_ranks(self) -> list[int]:
        return sorted({r for s in self.stuck for r in s.waiting_ranks})

    def to_json(self) -> dict[str, Any]:
        return {
            "progress": {str(r): [p.to_json() for p in ps] for r, ps in sorted(self.progress.items())},
            "stuck": [s.to_json() for s in self.stuck],
            "mismatches": [m.to_json() for m in self.mismatches],
            "timeout_ms": self.timeout_ms,
            "missing_ranks": self.missing_ranks(),
            "waiting_ranks": self.waiting_ranks(),
            "unreported": list(self.unreported),
        }


def is_default_group(name: str, desc: str) -> bool:
    return desc == "default_pg" or name == "0"


def _sizes_differ(op: str, a: tuple, b: tuple) -> bool:
    """(input, output) size pairs that disagree for this op."""
    if op not in _INPUT_MAY_DIFFER and a[0] != b[0]:
        return True
    return op not in _OUTPUT_MAY_DIFFER and a[1] != b[1]


def _signatures_disagree(sigs: Mapping[int, tuple[str, tuple, tuple]]) -> bool:
    vals = list(sigs.values())
    first = vals[0]
    for other in vals[1:]:
        if other[0] != first[0]:
            return True
        if _sizes_differ(first[0], first[1:], other[1:]):
            return True
    return False


def analyze_progress(progress: Mapping[int, Sequence[PgProgress]], *,
                     world_size: int | None = None) -> FrAnalysis:
    """Cross-rank analysis from summaries alone (what the daemon has).

    Per process group (matched by name across ranks: pg ids are per-process):
    members come from the dumps' pg_config (NCCL), else for the default group
    from ``world_size`` (plus every reporting rank: all ranks are in it), else
    from the ranks that report the group. The pending sequence number is the
    lowest ``last_completed + 1`` of the ranks that have enqueued beyond what
    they completed; members with ``last_enqueued`` below it never joined it
    (missing), members that enqueued it and did not complete it are waiting.
    A member with no dump at all is unreported, never missing.
    """
    reporting = set(progress)
    groups: dict[str, dict[int, PgProgress]] = {}
    for rank, pps in progress.items():
        for p in pps:
            groups.setdefault(p.pg_name, {}).setdefault(rank, p)

    stuck: list[Stuck] = []
    mismatches: list[Mismatch] = []
    unreported_all: set[int] = set()
    default_timeout: int | None = None
    for name in sorted(groups, key=_id_key):
        per_rank = groups[name]
        any_p = next(iter(per_rank.values()))
        desc = next((p.pg_desc for p in per_rank.values() if p.pg_desc), "")
        members: set[int] = set()
        for p in per_rank.values():
            members.update(p.ranks)
        known = bool(members)
        if is_default_group(name, desc):
            if world_size:
                members.update(range(world_size))
                known = True
            members.update(reporting)
        if not members:
            members = set(per_rank)
        unreported = sorted(members - reporting) if known else []
        unreported_all.update(unreported)
        if is_default_group(name, desc):
            ts = [p.timeout_ms for p in per_rank.values() if p.timeout_ms is not None]
            if ts:
                default_timeout = min(ts)

        le = {r: max(per_rank[r].last_enqueued, 0) if r in per_rank else 0
              for r in members if r in reporting}
        lc = {r: max(per_rank[r].last_completed, 0) if r in per_rank else 0
              for r in members if r in reporting}
        behind = [lc[r] + 1 for r in le if le[r] > lc[r]]
        if not behind:
            continue
        seq = min(behind)
        waiting = sorted(r for r in le if le[r] >= seq and lc[r] < seq)
        missing = sorted(r for r in le if le[r] < seq)
        at_seq = {r: per_rank[r] for r in waiting if per_rank[r].pending_seq == seq}
        ops = Counter(p.pending_op for p in at_seq.values() if p.pending_op)
        op = ops.most_common(1)[0][0] if ops else ""
        timeouts = [p.pending_timeout_ms for p in at_seq.values() if p.pending_timeout_ms is not None]
        since = [p.pending_since_ns for p in at_seq.values() if p.pending_since_ns is not None]
        pg_id = per_rank[min(waiting)].pg_id if waiting else any_p.pg_id
        stuck.append(Stuck(pg_id=pg_id, pg_name=name, seq=seq, op=op, waiting_ranks=tuple(waiting),
                           missing_ranks=tuple(missing), timeout_ms=min(timeouts) if timeouts else None,
                           unreported_ranks=tuple(unreported), since_ns=min(since) if since else None,
                           pg_desc=desc))
        sigs = {r: (p.pending_op, p.pending_sizes, p.pending_output_sizes)
                for r, p in sorted(at_seq.items()) if p.pending_op}
        if len(sigs) > 1 and _signatures_disagree(sigs):
            mismatches.append(Mismatch(pg_id=pg_id, seq=seq, ops=sigs, pg_name=name))

    stuck_timeouts = [s.timeout_ms for s in stuck if s.timeout_ms is not None]
    return FrAnalysis(progress={r: list(ps) for r, ps in progress.items()}, stuck=stuck,
                      mismatches=mismatches,
                      timeout_ms=min(stuck_timeouts) if stuck_timeouts else default_timeout,
                      unreported=tuple(sorted(unreported_all)))


def analyze(dumps: Iterable[FrDump], *, world_size: int | None = None) -> FrAnalysis:
    """Cross-rank analysis of full dumps: analyze_progress on their summaries,
    and desyncs over every sequence number the ranks' buffers share."""
    by_rank: dict[int, FrDump] = {}
    for d in dumps:
        if d.rank is None:
            raise FlightRecorderError(f"{d.path}: rank unknown (pass rank= to load_dump)")
        if d.rank in by_rank:
            raise FlightRecorderError(f"{d.path}: a second dump for rank {d.rank} "
                                      f"(first: {by_rank[d.rank].path})")
        by_rank[d.rank] = d
    result = analyze_progress({r: summarize(d) for r, d in sorted(by_rank.items())},
                              world_size=world_size)

    # (pg name, seq) -> rank -> signature of all entries with that seq (coalesced: several)
    table: dict[tuple[str, int], dict[int, tuple[str, tuple, tuple]]] = {}
    pg_ids: dict[tuple[str, int], str] = {}
    for r, d in sorted(by_rank.items()):
        grouped: dict[tuple[str, int], list[FrEntry]] = {}
        for e in d.entries:
            if not e.is_p2p:
                grouped.setdefault((e.pg_name, e.seq), []).append(e)
        for key, es in grouped.items():
            op = "+".join(e.op for e in es)
            ins = tuple(s for e in es for s in e.input_sizes)
            outs = tuple(s for e in es for s in e.output_sizes)
            table.setdefault(key, {})[r] = (op, ins, outs)
            pg_ids.setdefault(key, es[0].pg_id)
    full = [Mismatch(pg_id=pg_ids[key], seq=key[1], ops=dict(sorted(sigs.items())), pg_name=key[0])
            for key, sigs in sorted(table.items(), key=lambda kv: (_id_key(kv[0][0]), kv[0][1]))
            if len(sigs) > 1 and _signatures_disagree(sigs)]
    seen = {(m.pg_name, m.seq) for m in full}
    result.mismatches = full + [m for m in result.mismatches if (m.pg_name, m.seq) not in seen]
    return result
