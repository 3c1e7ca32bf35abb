"""Untrusted text made safe to print: on a terminal and in a log line.

Job ids, node names, Slurm users, stack frames and paths come from the
monitored processes and the agents; printed raw, an escape sequence in a
function name clears the screen and prints "no stall", and a newline in a
job id forges a log line. ``escape`` shows such characters as ``\\xNN`` /
``\\uNNNN`` (C0 and C1 controls, DEL, lone surrogates, line and paragraph
separators, bidi overrides and isolates, the BOM), the same form as the
agent's sanitiser (ncclwatch/sanitize.py, issue 20) so the two can merge;
a literal backslash is kept. One way: for showing, not for getting bytes back.
"""

from __future__ import annotations

import logging
import re
from typing import Any

_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff\u2028\u2029\u202a-\u202e"
                     "\u2066-\u2069\ufeff]")
#: One untrusted value in a log line is cut to this many characters.
MAX_LOG_VALUE = 512
TRUNCATED = "...<truncated>"


def _escape_char(m: re.Match[str]) -> str:
    o = ord(m.group(0))
    if 0xDC80 <= o <= 0xDCFF:  # an undecodable byte, as surrogateescape holds it
        return f"\\x{o - 0xDC00:02x}"
    return f"\\x{o:02x}" if o <= 0xFF else f"\\u{o:04x}"


def escape(text: str, limit: int | None = None) -> str:
    """``text`` with every unsafe character escaped; cut to ``limit`` first."""
    if limit is not None and len(text) > limit:
        text = text[:limit] + TRUNCATED
    return _UNSAFE.sub(_escape_char, text)


def deep(value: Any) -> Any:
    """Every string (keys too) in a JSON-like value escaped."""
    if isinstance(value, str):
        return escape(value)
    if isinstance(value, dict):
        return {deep(k): deep(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [deep(v) for v in value]
    return value


class EscapeArgs(logging.Filter):
    """A handler filter: the arguments of every record escaped and capped.

    Log calls pass untrusted text as arguments (``log.info("agent %s on
    %s", ...)``, never f-strings), so this covers every line of the agent
    and the daemon; the format strings are ours.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple):
            record.args = tuple(_arg(a) for a in args)
        elif isinstance(args, dict):
            record.args = {k: _arg(v) for k, v in args.items()}
        return True


def _arg(a: Any) -> Any:
    if isinstance(a, str):
        return escape(a, MAX_LOG_VALUE)
    if isinstance(a, (int, float)) or a is None:
        return a
    return escape(str(a), MAX_LOG_VALUE)  # an exception, a path: its text, escaped


def install(logger: logging.Logger | None = None) -> None:
    """Escape the arguments of records on every handler of ``logger`` (root)."""
    for h in (logger or logging.getLogger()).handlers:
        if not any(isinstance(f, EscapeArgs) for f in h.filters):
            h.addFilter(EscapeArgs())
