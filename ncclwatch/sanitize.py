"""Text from a monitored process is data: made safe once, at the agent's edge.

Every string the agent takes from a training process (environment values,
file paths, command lines, stack frames, Slurm and container metadata) is
bytes the process chose. Before it goes into a report or a log line it
passes through ``clean``:

- bytes that are not UTF-8 are shown, never dropped or crashed on: psutil
  and ``os.fsdecode`` hand them over as surrogate escapes (U+DC80-U+DCFF),
  which become the four characters ``\\xNN`` (so ``nccl.\\xff.log`` still
  says which byte it was); any other lone surrogate becomes ``\\uDXXX``;
- control characters (C0, DEL, C1), line and paragraph separators and the
  bidirectional overrides become ``\\xNN`` / ``\\uNNNN``, so no value can
  move a terminal's cursor, forge a log line or reorder what is read;
- a string longer than its cap is cut at a character (never inside an
  escape) and ends with ``TRUNCATED``, so a reader knows it is not whole.

The escaping is one way (a literal backslash is kept as it is): it is for
showing and naming, not for getting the bytes back. The work is linear in
the input and bounded by the cap: the input is cut before it is escaped.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass

#: Said at the end of a value cut to its cap.
TRUNCATED = "...<truncated>"

#: Caps per kind of field (characters, after escaping, marker included).
MAX_PATH = 4096
MAX_ENV_VALUE = 4096
MAX_NAME = 256            # variable names, thread names
MAX_FRAME = 1024          # a function name or a frame's file name
MAX_LABEL = 256           # job ids, node names, scheduler job names and users
MAX_LOG = 512             # one untrusted value inside a log line

#: What is escaped: C0 controls, DEL, C1 controls, surrogates (undecodable
#: bytes and lone halves), line/paragraph separators, bidi embeddings,
#: overrides and isolates, the BOM / zero-width no-break space.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff\u2028\u2029\u202a-\u202e"
                     "\u2066-\u2069\ufeff]")


@dataclass
class SanitizeCounts:
    """What the sanitiser had to do, for the agent's health counters."""

    fields_dropped_total: int = 0   # a rank's field left out of a round (could not encode)
    escaped_total: int = 0      # strings that held undecodable bytes or controls
    truncated_total: int = 0    # strings cut to their cap


#: The agent's counts (one process, one agent); tests may read or reset them.
COUNTS = SanitizeCounts()


def _escape_char(c: str) -> str:
    o = ord(c)
    if 0xDC80 <= o <= 0xDCFF:          # an undecodable byte, as surrogateescape holds it
        return f"\\x{o - 0xDC00:02x}"
    if o <= 0xFF:
        return f"\\x{o:02x}"
    return f"\\u{o:04x}"


def _escape(m: re.Match[str]) -> str:
    return _escape_char(m.group(0))


def to_text(value: str | bytes | bytearray | memoryview | None) -> str:
    """Bytes as the OS gives them (undecodable ones as surrogate escapes)."""
    if value is None:
        return ""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "surrogateescape")
    return value if isinstance(value, str) else str(value)


def clean(value: str | bytes | bytearray | memoryview | None, cap: int = MAX_PATH, *,
          count: bool = True) -> str:
    """``value`` as safe, valid UTF-8 text of at most ``cap`` characters.
    ``count``: add to COUNTS (the agent's health) what had to be done."""
    text = to_text(value)
    head = text[:cap]
    unsafe = _UNSAFE.search(head) is not None
    out = _UNSAFE.sub(_escape, head) if unsafe else head
    if unsafe and count:
        COUNTS.escaped_total += 1
    if len(text) <= cap and len(out) <= cap:
        return out
    if count:
        COUNTS.truncated_total += 1
    return _cut(head, max(0, cap - len(TRUNCATED))) + TRUNCATED


def _cut(head: str, room: int) -> str:
    """The escaped form of ``head`` cut to ``room`` characters at a whole escape."""
    out: list[str] = []
    used = 0
    pos = 0
    for m in _UNSAFE.finditer(head):
        plain = head[pos:m.start()]
        if used + len(plain) >= room:
            out.append(plain[:room - used])
            return "".join(out)
        out.append(plain)
        used += len(plain)
        esc = _escape_char(m.group(0))
        if used + len(esc) > room:
            return "".join(out)
        out.append(esc)
        used += len(esc)
        pos = m.end()
    out.append(head[pos:pos + room - used])
    return "".join(out)


def is_clean(value: str) -> bool:
    """True when ``value`` needs no escaping (valid UTF-8, no controls)."""
    return _UNSAFE.search(value) is None


def for_log(value: object, cap: int = MAX_LOG) -> str:
    """An untrusted value (job id, node name, path) made fit for one log line."""
    return clean(value if isinstance(value, (str, bytes, bytearray)) else str(value), cap,
                 count=False)


# -- log lines -------------------------------------------------------------------------
#
# Log messages are format strings written here; their arguments are often a
# process's text (job ids, node names, paths, errors naming paths). Every
# argument of a record from an ``ncclwatch`` logger is escaped as it is made,
# so a newline in a job id cannot start a forged line in the journal, and
# loses token formats and credential pairs (envpolicy.redact_patterns).


def _escape_arg(arg: object) -> object:
    if isinstance(arg, (str, bytes, bytearray, BaseException)):
        from ncclwatch.envpolicy import redact_patterns   # envpolicy imports this module
        text = to_text(arg if not isinstance(arg, BaseException) else str(arg))
        # token formats and credential pairs go (a token in a path), run ids stay
        return for_log(redact_patterns(text[:4 * MAX_LOG]))
    return arg


_installed = False


def install_log_escaping() -> None:
    """Escape the arguments of every ``ncclwatch.*`` log record (idempotent)."""
    global _installed
    if _installed:
        return
    _installed = True
    make = logging.getLogRecordFactory()

    def factory(name, level, fn, lno, msg, args, exc_info, func=None, sinfo=None, **kw):
        if args and (name == "ncclwatch" or name.startswith("ncclwatch.")):
            if isinstance(args, tuple):
                args = tuple(_escape_arg(a) for a in args)
            elif isinstance(args, Mapping):
                args = {k: _escape_arg(v) for k, v in args.items()}
        return make(name, level, fn, lno, msg, args, exc_info, func, sinfo, **kw)

    logging.setLogRecordFactory(factory)
