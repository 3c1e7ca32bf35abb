"""Pickles from processes we do not trust, read without running them.

Two readers share one opcode table here:

* ``load_plain``: a Flight Recorder dump (plain dicts, lists, strings,
  numbers). ``prescan`` walks the opcodes first and refuses every one that
  imports, calls or builds an object, and tuples nested so deeply that
  hashing one would never end; then an unpickler that resolves no global and
  no persistent id builds the value, and ``check_plain`` checks its types.
* ``persistent_ids``: the ``data.pkl`` of a torch.save archive, which is
  full of globals (``torch._utils._rebuild_tensor_v2``, ``torch
  FloatStorage``) and calls. It is never unpickled: a symbolic walk over the
  opcodes keeps a stack of inert values (strings, numbers, tuples;
  ``Global`` for a name it would import, ``OPAQUE`` for anything built by a
  call) and returns the persistent ids it would have asked for. Nothing is
  imported, called or hashed; the work and memory are linear in the bytes.
"""

from __future__ import annotations

import io
import pickle
import reprlib
import struct
from dataclasses import dataclass
from typing import Any

__all__ = ["Global", "OPAQUE", "PickleRefused", "PickleTruncated", "brief", "check_plain",
           "load_plain", "persistent_ids", "prescan"]


class PickleRefused(ValueError):
    """Bytes that are not a pickle this module reads (callers pass a subclass)."""


class PickleTruncated(PickleRefused):
    """The pickle ends before its STOP: more bytes may come (a file being written)."""


class _SafeUnpickler(pickle.Unpickler):
    """Resolves nothing: a global (os.system, builtins.eval, ...) is an error."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"forbidden global {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("forbidden persistent id")


_ALLOWED_TYPES = (dict, list, tuple, str, int, float, bool, type(None))

# What prescan lets through: the opcodes of plain data (torch writes protocol 2
# with dicts, lists, 2-tuples, strings, ints, floats, bools, None and the memo).
# Bytes and sets are let through to be refused by check_plain with a clearer
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


def prescan(data: bytes, where: str, *, error: type[Exception] = PickleRefused,
            what: str = "Flight Recorder") -> None:
    """Walk the opcodes before anything is built: refuse imports and calls, and
    tuples so deeply shared that hashing one (as a dict key) would never end.

    CPython does not cache tuple hashes: a tuple holding the same tuple twice,
    two hundred levels deep, is a few hundred bytes and 2**200 steps to hash.
    Each value on the simulated stack is the node count of its expansion
    (-1 a mark); lists and dicts count 1 (they cannot be hashed).
    """
    def bad(why: str) -> Exception:
        return error(f"{where}: truncated or corrupt pickle ({why})")

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
                raise error(f"{where}: not a {what} pickle: forbidden global "
                            f"{brief(mod_name)[1:-1]}")
            if name:
                op = "global (STACK_GLOBAL)" if name == "STACK_GLOBAL" else f"opcode {name}"
                raise error(f"{where}: not a {what} pickle: forbidden {op}")
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
                    raise error(f"{where}: a tuple of over {_MAX_TUPLE_NODES} nested "
                                f"parts (not a {what} dump)")
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
                raise error(f"{where}: a tuple of over {_MAX_TUPLE_NODES} nested "
                            f"parts (not a {what} dump)")
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


def brief(v: Any) -> str:
    """A bounded repr of an untrusted value for an error message."""
    return _REPR.repr(v)


def check_plain(obj: Any, where: str, *, error: type[Exception] = PickleRefused) -> None:
    """Only plain builtins, walked once per container: a pickle can share one
    list many times (memo) or hold itself (cycles); neither costs more than
    its size in bytes here."""
    stack = [obj]
    seen: set[int] = set()
    while stack:
        o = stack.pop()
        t = type(o)
        if t not in _ALLOWED_TYPES:
            raise error(f"{where}: unexpected {t.__name__} in the dump "
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


def load_plain(data: bytes, where: str, *, error: type[Exception] = PickleRefused,
               what: str = "Flight Recorder") -> Any:
    """Plain data out of an untrusted pickle: prescan, restricted load, type check."""
    prescan(data, where, error=error, what=what)
    try:
        raw = _SafeUnpickler(io.BytesIO(data)).load()
    except pickle.UnpicklingError as e:
        raise error(f"{where}: not a {what} pickle: {e}") from None
    except (EOFError, ValueError, TypeError, KeyError, IndexError, AttributeError,
            MemoryError, OverflowError, RecursionError, UnicodeDecodeError) as e:
        raise error(f"{where}: truncated or corrupt pickle ({type(e).__name__}: {e})") from None
    check_plain(raw, where, error=error)
    return raw


# ----------------------------------------------------------- symbolic walk


@dataclass(frozen=True, slots=True)
class Global:
    """A name the pickle would import (never imported here)."""

    module: str
    name: str


class _Opaque:
    """Whatever a call, a container or a buffer would have built."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "OPAQUE"


OPAQUE = _Opaque()

#: Opcodes the symbolic walk adds to the plain ones: (action, argument) as in
#: _OPS; actions: G global from two text lines, SG stack global (pop 2), R
#: call (pop 2, push OPAQUE), N2 NEWOBJ (pop 2, push), N3 NEWOBJ_EX (pop 3,
#: push), OB OBJ (pop to mark, push), IN INST (two lines, pop to mark, push),
#: B BUILD (pop 1), Q persistent id (pop 1, record, push), QL persistent id
#: from a text line, E extension code (push), NB next buffer (push).
_SYMBOLIC: dict[int, tuple[str, Any]] = {
    ord("c"): ("G", "2lines"), 0x93: ("SG", 0), ord("R"): ("R", 0), 0x81: ("N2", 0),
    0x92: ("N3", 0), ord("o"): ("OB", 0), ord("i"): ("IN", "2lines"), ord("b"): ("B", 0),
    ord("Q"): ("Q", 0), ord("P"): ("QL", "line"),
    0x82: ("E", 1), 0x83: ("E", 2), 0x84: ("E", 4), 0x97: ("NB", 0), 0x98: ("n", 0),
}
_WALK = {**_OPS, **_SYMBOLIC}
#: Values the walk keeps (the rest is OPAQUE): strings and integers.
_STR_OPS = frozenset({ord("X"), 0x8C, 0x8D})
_INT_FIXED = {ord("J"): ("<i", 4), ord("K"): ("<B", 1), ord("M"): ("<H", 2)}
_CONSTS = {ord("N"): None, 0x88: True, 0x89: False, ord(")"): ()}
#: Integers past this many bytes (LONG1/LONG4) are kept OPAQUE.
_MAX_INT_BYTES = 16


def persistent_ids(data: bytes | memoryview, where: str, *, start: int = 0,
                   error: type[PickleRefused] = PickleRefused,
                   truncated: type[PickleRefused] = PickleTruncated) -> tuple[list[Any], int]:
    """The persistent ids a pickle names, in order, and the offset after its STOP.

    Raises ``truncated`` when the bytes end before STOP (read more later) and
    ``error`` for anything that is not a well-formed pickle. Linear in the
    bytes: every opcode consumes at least one byte and moves O(1) values
    (a tuple or mark pop moves values pushed once).
    """
    buf = bytes(data)
    end = len(buf)
    stack: list[Any] = []
    marks: list[int] = []
    memo: dict[int | bytes, Any] = {}
    pids: list[Any] = []
    pos = start

    def bad(why: str) -> PickleRefused:
        return error(f"{where}: corrupt pickle ({why} at byte {pos})")

    def pop(n: int = 1) -> list[Any]:
        floor = marks[-1] if marks else 0
        if len(stack) - n < floor:
            raise bad("stack underflow")
        out = stack[-n:]
        del stack[-n:]
        return out

    def pop_mark() -> list[Any]:
        if not marks:
            raise bad("no mark")
        m = marks.pop()
        out = stack[m:]
        del stack[m:]
        return out

    def line() -> bytes:
        nonlocal pos
        nl = buf.find(b"\n", pos)
        if nl < 0:
            raise truncated(f"{where}: pickle ends inside a text line")
        text = buf[pos:nl]
        pos = nl + 1
        return text

    while True:
        if pos >= end:
            raise truncated(f"{where}: pickle ends before its STOP (byte {end})")
        code = buf[pos]
        pos += 1
        spec = _WALK.get(code)
        if spec is None:
            raise bad(f"unknown opcode 0x{code:02x}")
        action, arg = spec
        raw: Any = None
        if arg == "line":
            raw = line()
        elif arg == "2lines":
            raw = (line(), line())
        elif isinstance(arg, tuple):
            n = arg[1]
            if pos + n > end:
                raise truncated(f"{where}: pickle ends inside an argument")
            length = int.from_bytes(buf[pos:pos + n], "little")
            pos += n
            if pos + length > end:
                raise truncated(f"{where}: pickle ends inside an argument")
            raw = buf[pos:pos + length]
            pos += length
        elif arg:
            if pos + arg > end:
                raise truncated(f"{where}: pickle ends inside an argument")
            raw = buf[pos:pos + arg]
            pos += arg
        if action == "p":
            stack.append(_value(code, raw, bad))
        elif action == "m":
            marks.append(len(stack))
        elif action == "t":
            stack.append(tuple(pop_mark()))
        elif action in ("t1", "t2", "t3"):
            stack.append(tuple(pop(int(action[1]))))
        elif action in ("c", "OB"):
            pop_mark()
            stack.append(OPAQUE)
        elif action == "x":
            pop_mark()
        elif action == "o1" and code == ord("0") and marks and len(stack) == marks[-1]:
            marks.pop()                        # POP of a mark, as pickle does
        elif action in ("o1", "o2"):
            pop(int(action[1]))
        elif action == "d":
            stack.append(pop()[0])
            stack.append(stack[-1])
        elif action == "u":
            if len(stack) <= (marks[-1] if marks else 0):
                raise bad("memo put of nothing")
            key: int | bytes = (len(memo) if raw is None else
                                raw if arg == "line" else int.from_bytes(raw, "little"))
            memo[key] = stack[-1]
        elif action == "g":
            key = raw if arg == "line" else int.from_bytes(raw, "little")
            if key not in memo:
                raise bad(f"memo {brief(key)} read before written")
            stack.append(memo[key])
        elif action == "s":
            return pids, pos
        elif action == "G":
            stack.append(Global(*(_text(r, bad) for r in raw)))
        elif action == "SG":
            module, name = pop(2)
            if not (isinstance(module, str) and isinstance(name, str)):
                raise bad("STACK_GLOBAL of non-strings")
            stack.append(Global(module, name))
        elif action in ("R", "N2"):
            pop(2)
            stack.append(OPAQUE)
        elif action == "N3":
            pop(3)
            stack.append(OPAQUE)
        elif action == "IN":
            pop_mark()
            stack.append(OPAQUE)
        elif action == "B":
            pop(1)
            if not stack:
                raise bad("BUILD of nothing")
        elif action == "Q":
            pids.append(pop()[0])
            stack.append(OPAQUE)
        elif action == "QL":
            pids.append(_text(raw, bad))
            stack.append(OPAQUE)
        elif action in ("E", "NB"):
            stack.append(OPAQUE)
        # "n": PROTO, FRAME, READONLY_BUFFER: nothing to do


def _text(raw: bytes, bad: Any) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise bad("a string that is not UTF-8") from None


def _value(code: int, raw: Any, bad: Any) -> Any:
    """The value a push opcode puts on the stack: strings and ints kept, the rest OPAQUE."""
    if code in _STR_OPS:
        return _text(raw, bad)
    if code in _CONSTS:
        return _CONSTS[code]
    fixed = _INT_FIXED.get(code)
    if fixed:
        return struct.unpack(fixed[0], raw)[0]
    if code == 0x8A or code == 0x8B:       # LONG1 / LONG4
        return int.from_bytes(raw, "little", signed=True) if len(raw) <= _MAX_INT_BYTES else OPAQUE
    if code in (ord("I"), ord("L")):       # text ints (protocol 0); I01/I00 are bools
        text = raw.rstrip(b"L")
        if text in (b"00", b"01"):
            return text == b"01"
        if len(text) > 40:
            return OPAQUE
        try:
            return int(text)
        except ValueError:
            raise bad("a malformed integer line") from None
    if code in (ord("S"), ord("V")):       # text strings (protocol 0), kept raw
        return _text(raw, bad) if code == ord("V") else OPAQUE
    return OPAQUE
