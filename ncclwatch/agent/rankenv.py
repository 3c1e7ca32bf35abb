"""A rank's environment, read and filtered within its budget (caps.py).

``/proc/PID/environ`` is read at most ``caps.ENVIRON_BYTES`` (and
``ENVIRON_VARIABLES`` variables), and before the allowlist's and the
redaction's regexes run, names over ``ENV_NAME_CHARS`` are skipped and the
allowlisted values, in name order, are taken only while their text stays
within ``ENV_TEXT`` (each cut at ``ENV_VALUE_CHARS`` first, as the gate
would). What is left out is counted by reason; the rank's identity is read
from the variables as parsed, so a large environment costs its rank only
the variables past the budget, never the round.
"""

from __future__ import annotations

import os
from typing import Mapping

from ncclwatch import envpolicy
from ncclwatch.agent import caps

_ENCODING = "utf-8"


def parse_environ(data: bytes, limit: int = caps.ENVIRON_BYTES,
                  max_variables: int = caps.ENVIRON_VARIABLES) -> dict[str, str]:
    """``NAME=value\\0...`` as psutil decodes it (undecodable bytes kept as
    surrogates), within ``limit`` bytes and ``max_variables`` variables;
    what is past either is left out and counted."""
    if len(data) > limit:
        caps.COUNTS.hit("environ_bytes")
        data = data[:limit]
        data = data[:data.rfind(b"\0") + 1]   # no half variable
    items = data.split(b"\0", max_variables)
    if len(items) > max_variables and items[max_variables].strip(b"\0"):
        caps.COUNTS.hit("env_variables")
    env: dict[str, str] = {}
    for item in items[:max_variables]:
        name, sep, value = item.partition(b"=")
        if sep and name:
            env[name.decode(_ENCODING, "surrogateescape")] = value.decode(_ENCODING,
                                                                          "surrogateescape")
    return env


def read_environ(pid: int, proc: str = "/proc") -> dict[str, str]:
    """The rank's environment, at most ``caps.ENVIRON_BYTES`` of it read.
    OSError (PermissionError, FileNotFoundError) as psutil's callers expect."""
    fd = os.open(f"{proc}/{pid}/environ", os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks, n = [], 0
        while n <= caps.ENVIRON_BYTES:
            b = os.read(fd, min(1 << 20, caps.ENVIRON_BYTES + 1 - n))
            if not b:
                break
            chunks.append(b)
            n += len(b)
    finally:
        os.close(fd)
    return parse_environ(b"".join(chunks))


def within_budget(env: Mapping[str, str], text: int = caps.ENV_TEXT) -> dict[str, str]:
    """The allowlisted variables the redaction may look at: names within
    ``caps.ENV_NAME_CHARS``, at most envpolicy.MAX_VARIABLES of them, values
    cut at ``caps.ENV_VALUE_CHARS``, ``text`` characters of values in all (in
    name order: the rest are left out, counted)."""
    names = sorted(k for k in env if len(k) <= caps.ENV_NAME_CHARS and envpolicy.is_allowed(k))
    if len(names) > envpolicy.MAX_VARIABLES:
        caps.COUNTS.hit("env_variables")
        names = names[:envpolicy.MAX_VARIABLES]
    out: dict[str, str] = {}
    left = text
    for k in names:
        v = env[k][:caps.ENV_VALUE_CHARS]
        if len(v) > left:
            caps.COUNTS.hit("env_text")
            break
        out[k] = v
        left -= len(v)
    return out
