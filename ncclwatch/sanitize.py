"""Text from a monitored process is data: made safe once, at the agent's edge.

Every string the agent takes from a training process (environment values,
file paths, command lines, stack and native frames, Slurm, container and pod
metadata, Flight Recorder names) is bytes the process chose. Before it goes
into a report it passes through ``gate``, which looks the report field up in
``FIELDS`` (one row per string field of the wire format: its cap and how it
is redacted, envpolicy's rules) and then ``clean``s it; log lines and the
terminal use the same escaper (``for_log``, ``escape``, ``deep``). ``clean``:

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

import functools
import hashlib
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable

from ncclwatch import envpolicy, envsplit

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
    """True when ``value`` needs no escaping (valid UTF-8, no controls).

    Printable ASCII, nearly all text, is told in C without the regex: the
    only ASCII it escapes are the C0 controls and DEL, which are exactly the
    ASCII characters ``isprintable`` refuses."""
    return (value.isascii() and value.isprintable()) or _UNSAFE.search(value) is None


def for_log(value: object, cap: int = MAX_LOG) -> str:
    """An untrusted value (job id, node name, path) made fit for one log line."""
    return clean(value if isinstance(value, (str, bytes, bytearray)) else str(value), cap,
                 count=False)


# -- the gate: every string field of a report -------------------------------------------
#
# How each kind of field is redacted before it is escaped and capped:
#   VALUE  the secret-by-shape rules too (envpolicy.redact_value): paths, frames,
#          env values, Slurm job names; a token in any of them goes;
#   LABEL  token formats and credential pairs only (envpolicy.redact_patterns):
#          identifiers that must stay distinct (job ids, pods, group names);
#   OWN    text the agent or the kernel made (hashes, enum names, NVML's uuid,
#          the agent's version): escaped and capped like the rest, not redacted.
VALUE, LABEL, OWN = "value", "label", "own"
_REDACT: dict[str, Callable[[str], str] | None] = {
    VALUE: envpolicy.redact_value, LABEL: envpolicy.redact_patterns, OWN: None}


@dataclass(frozen=True, slots=True)
class FieldRule:
    cap: int        # characters after escaping; the daemon's bound is at least this
    redact: str     # VALUE, LABEL or OWN


#: Every string field reachable from a NodeReport (proto name without the
#: package). tests/unit/test_sanitize_gate.py walks the proto's descriptors and
#: fails when a string field is missing here or the daemon
#: (contract/limits.STRING_BOUNDS) would refuse what this lets through.
FIELDS: dict[str, FieldRule] = {
    "NodeReport.node": FieldRule(255, OWN),
    "NodeReport.agent_id": FieldRule(64, OWN),
    "RankChange.stack_id": FieldRule(64, OWN),
    "RankChange.native_frame": FieldRule(MAX_FRAME, VALUE),
    "RankChange.native_stack_id": FieldRule(64, OWN),
    "RankIdentity.job_id": FieldRule(128, LABEL),
    "RankIdentity.rank_source": FieldRule(64, OWN),
    "RankIdentity.rank_conflict": FieldRule(128, OWN),
    "ContainerInfo.hostname": FieldRule(253, LABEL),
    "ContainerInfo.container_id": FieldRule(253, LABEL),
    "ContainerInfo.runtime": FieldRule(253, OWN),
    "ContainerInfo.pod_uid": FieldRule(253, LABEL),
    "ContainerInfo.namespace": FieldRule(253, LABEL),
    "ContainerInfo.pod": FieldRule(253, LABEL),
    "ContainerInfo.declared_namespace": FieldRule(253, LABEL),
    "ContainerInfo.declared_pod": FieldRule(253, LABEL),
    "RankSample.stack_id": FieldRule(64, OWN),
    "RankSample.native_frame": FieldRule(MAX_FRAME, VALUE),
    "RankSample.native_stack_id": FieldRule(64, OWN),
    # a system call's name and a kernel symbol (syscalls.reading): the kernel's
    "RankSample.blocked_in": FieldRule(600, OWN),
    "FlightRecorderSummary.version": FieldRule(32, LABEL),
    "ProcessGroupProgress.pg_id": FieldRule(MAX_LABEL, LABEL),
    "ProcessGroupProgress.pg_name": FieldRule(MAX_LABEL, LABEL),
    "ProcessGroupProgress.pending_op": FieldRule(MAX_LABEL, LABEL),
    "ProcessGroupProgress.pg_desc": FieldRule(MAX_LABEL, VALUE),
    "ProcessGroupProgress.last_op": FieldRule(MAX_LABEL, LABEL),
    "OpenFile.path": FieldRule(MAX_PATH, VALUE),
    "OpenFile.previous_path": FieldRule(MAX_PATH, VALUE),
    "OpenFile.expected_source": FieldRule(64, OWN),
    "OpenFile.copy_source_path": FieldRule(MAX_PATH, VALUE),
    "OpenFile.header_error": FieldRule(200, VALUE),
    "GpuMemory.device_uuid": FieldRule(MAX_NAME, OWN),
    "JobInfo.source": FieldRule(64, OWN),
    "JobInfo.watchdog_timeout_source": FieldRule(64, OWN),
    "JobInfo.packages": FieldRule(64, LABEL),
    "JobInfo.EnvEntry.key": FieldRule(MAX_NAME, LABEL),
    "JobInfo.EnvEntry.value": FieldRule(MAX_ENV_VALUE, VALUE),
    "SchedulerJob.scheduler": FieldRule(128, OWN),
    "SchedulerJob.job_id": FieldRule(128, LABEL),
    "SchedulerJob.job_name": FieldRule(128, VALUE),
    "SchedulerJob.user": FieldRule(128, VALUE),
    "SchedulerJob.source": FieldRule(128, OWN),
    "Stack.id": FieldRule(64, OWN),
    "Stack.thread_name": FieldRule(MAX_NAME, VALUE),
    "Frame.name": FieldRule(MAX_FRAME, VALUE),
    "Frame.filename": FieldRule(MAX_FRAME, VALUE),
    "AgentHealth.version": FieldRule(64, OWN),
}


def gate(field: str, value: str | bytes | None) -> str:
    """``value`` as it may leave the node in report field ``field`` (a FIELDS
    key): redacted by the field's rule, escaped, capped. A field not in
    FIELDS is a KeyError: a new field cannot leave ungated."""
    rule = FIELDS[field]
    if rule.redact == OWN:
        return clean(value, rule.cap)
    return _gated(to_text(value)[:4 * rule.cap], rule.cap, rule.redact)


#: Paths, frames, env and ids repeat every round: each distinct string is
#: redacted once (keys cut to 4x their cap: at most 64 MiB, ~1 in practice),
#: and counted in COUNTS once.
@functools.lru_cache(maxsize=4096)
def _gated(text: str, cap: int, redact: str) -> str:
    return clean(_REDACT[redact](text), cap)


def filter_env(env: Mapping[str, str]) -> dict[str, str]:
    """The allowlisted (envpolicy) subset of a process environment as it may
    leave the node: each value redacted alone, then keys split across two
    values redacted too (judged on the raw values), then names and values
    escaped and capped as the JobInfo.env fields."""
    names = sorted(k for k in env if envpolicy.is_allowed(k))[:envpolicy.MAX_VARIABLES]
    key, val = FIELDS["JobInfo.EnvEntry.key"], FIELDS["JobInfo.EnvEntry.value"]
    raw = {k: to_text(env[k])[:4 * val.cap] for k in names}
    redacted = envsplit.split_secrets(raw, {k: envpolicy.redact_value(v) for k, v in raw.items()})
    return {clean(envpolicy.redact_patterns(k), key.cap): clean(v, val.cap)
            for k, v in redacted.items()}


# -- the daemon: what a report may hold once stored --------------------------------------
#
# The agent's gate escapes every string it sends, but a certificate holder can
# send a report of its own making. The daemon makes every string field of a
# report it accepted safe the same way, once, before it stores any of it: the
# page, the API, /metrics and the logs then hold only escaped text.


#: Escaped forms of the strings that needed escaping, by (field, value): a
#: hostile value repeats every round, its escape is made once (bounded: the
#: oldest half is forgotten when full).
_ESCAPED: dict[tuple[str, str], str] = {}
_ESCAPED_MAX = 4096


def stored(field: str, value: str) -> str:
    """``value`` of report field ``field`` as the daemon stores it: escaped with
    the one escaper, and cut (TRUNCATED) only where escaping made it longer than
    both what it was and the field's gate cap, so it stays within the daemon's
    bound for that field."""
    if is_clean(value):
        return value
    key = (field, value)
    out = _ESCAPED.get(key)
    if out is None:
        out = clean(value, max(len(value), FIELDS[field].cap), count=False)
        if len(_ESCAPED) >= _ESCAPED_MAX:
            for old in list(_ESCAPED)[:_ESCAPED_MAX // 2]:
                del _ESCAPED[old]
        _ESCAPED[key] = out
    return out


@dataclass(frozen=True, slots=True)
class _Plan:
    """The string-bearing fields of one message type, by kind."""

    strings: tuple[tuple[str, str], ...]      # (attribute, FIELDS name), singular
    lists: tuple[tuple[str, str], ...]        # repeated strings
    maps: tuple[tuple[str, str, str], ...]    # string -> string: (attribute, key, value)
    messages: tuple[tuple[str, bool], ...]    # (attribute, repeated): those that reach a string
    names: tuple[str, ...]                    # the attributes of ``strings``
    #: ``messages`` with the plan of each one's type: (attribute, repeated, plan)
    subs: tuple[tuple[str, bool, Any], ...] = ()


_PLANS: dict[str, _Plan] = {}


def _plan(desc: Any) -> _Plan:
    plan = _PLANS.get(desc.full_name)
    if plan is not None:
        return plan
    prefix = len(desc.file.package) + 1
    strings, lists, maps, messages = [], [], [], []
    for fd in desc.fields:
        if fd.type == fd.TYPE_STRING:
            (lists if fd.is_repeated else strings).append((fd.name, fd.full_name[prefix:]))
        elif fd.type == fd.TYPE_MESSAGE and fd.message_type.GetOptions().map_entry:
            k, v = (fd.message_type.fields_by_name[n] for n in ("key", "value"))
            if k.type == v.type == fd.TYPE_STRING:
                maps.append((fd.name, k.full_name[prefix:], v.full_name[prefix:]))
            elif v.type == fd.TYPE_MESSAGE:          # none in the wire format
                raise TypeError(f"{fd.full_name}: a map of messages is not walked")
        elif fd.type == fd.TYPE_MESSAGE and _reaches_text(fd.message_type):
            messages.append((fd.name, fd.is_repeated))
    plan = _PLANS[desc.full_name] = _Plan(
        tuple(strings), tuple(lists), tuple(maps), tuple(messages),
        tuple(a for a, _ in strings))
    # The sub-messages' plans, once this one is known (a type may reach itself).
    object.__setattr__(plan, "subs", tuple(
        (name, rep, _plan(desc.fields_by_name[name].message_type)) for name, rep in messages))
    return plan


@functools.cache
def _reaches_text(desc: Any, seen: frozenset[str] = frozenset()) -> bool:
    if desc.full_name in seen:
        return False
    seen = seen | {desc.full_name}
    return any(fd.type == fd.TYPE_STRING
               or (fd.type == fd.TYPE_MESSAGE and _reaches_text(fd.message_type, seen))
               for fd in desc.fields)


#: Digests of messages with maps (a job's environment, the same in every rank's
#: sample and every round) whose text was clean: joining a map's strings costs
#: ten times hashing its serialization.
_CLEAN: dict[bytes, None] = {}
_CLEAN_MAX = 4096


def _maps_clean(msg: Any, plan: _Plan) -> bool:
    """True when every map of ``msg`` holds clean text only (remembered by the
    digest of the whole message's bytes, for the next rank and round)."""
    key = hashlib.blake2b(msg.SerializeToString(deterministic=True), digest_size=16,
                          person=msg.DESCRIPTOR.full_name.encode()[-16:]).digest()
    if key in _CLEAN:
        return True
    if not all(is_clean("".join(m) + "".join(m.values()))
               for m in (getattr(msg, a) for a, _, _ in plan.maps)):
        return False
    if len(_CLEAN) >= _CLEAN_MAX:
        _CLEAN.pop(next(iter(_CLEAN)))
    _CLEAN[key] = None
    return True


def _texts(msg: Any, plan: _Plan, out: list[str]) -> bool:
    """Append every string ``msg`` holds (nested messages and lists; maps are
    judged apart, ``_maps_clean``) to ``out``; False as soon as a map holds
    text that is not clean."""
    if plan.names:
        out += [getattr(msg, a) for a in plan.names]
    for attr, _ in plan.lists:
        out += getattr(msg, attr)
    if plan.maps and not _maps_clean(msg, plan):
        return False
    for attr, repeated, sub in plan.subs:
        if repeated:
            subs = getattr(msg, attr)
            if subs:    # iterating an empty repeated field costs more than asking
                for m in subs:
                    if not _texts(m, sub, out):
                        return False
        elif msg.HasField(attr) and not _texts(getattr(msg, attr), sub, out):
            return False
    return True


def neutralise(msg: Any) -> int:
    """Every string of the proto message ``msg`` (nested messages, repeated
    fields and maps, keys too) made safe in place by ``stored``; the number of
    strings that had to be changed. Clean text, the rule, costs one walk that
    gathers the strings and one regex search over all of them; only a message
    that holds text to escape is walked again, field by field."""
    plan = _plan(msg.DESCRIPTOR)
    texts: list[str] = []
    if _texts(msg, plan, texts) and is_clean("".join(texts)):
        return 0
    return _neutralise(msg, plan)


def _neutralise(msg: Any, plan: _Plan) -> int:
    """``neutralise`` field by field (``msg`` holds text to escape somewhere)."""
    changed = 0
    for attr, name in plan.strings:
        v = getattr(msg, attr)
        if not is_clean(v):
            setattr(msg, attr, stored(name, v))
            changed += 1
    for attr, name in plan.lists:
        items = getattr(msg, attr)
        for i, v in enumerate(items):
            if not is_clean(v):
                items[i] = stored(name, v)
                changed += 1
    for attr, kname, vname in plan.maps:
        m = getattr(msg, attr)
        dirty = [(k, v) for k, v in m.items() if not (is_clean(k) and is_clean(v))]
        for k, _ in dirty:
            del m[k]
        for k, v in dirty:
            m[stored(kname, k)] = stored(vname, v)
        changed += len(dirty)
    for attr, repeated, sub in plan.subs:
        if repeated:
            for m in getattr(msg, attr):
                texts: list[str] = []
                if not (_texts(m, sub, texts) and is_clean("".join(texts))):
                    changed += _neutralise(m, sub)
        elif msg.HasField(attr):
            changed += neutralise(getattr(msg, attr))
    return changed


# -- the terminal ----------------------------------------------------------------------


def escape(text: str, limit: int | None = None) -> str:
    """``text`` with every unsafe character escaped; capped at ``limit`` (the
    marker included) when given. For printing what a daemon sent."""
    if limit is not None:
        return clean(text, limit, count=False)
    return _UNSAFE.sub(_escape, text) if _UNSAFE.search(text) else text


def deep(value: Any) -> Any:
    """Every string (keys too) in a JSON-like value escaped."""
    if isinstance(value, str):
        return escape(value)
    if isinstance(value, dict):
        return {deep(k): deep(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [deep(v) for v in value]
    return value


# -- log lines -------------------------------------------------------------------------
#
# Log messages are format strings written here; their arguments are often a
# process's text (job ids, node names, paths, errors naming paths). Every
# argument is escaped: of a record from an ``ncclwatch`` logger as it is made
# (the record factory), of any other logger's record by the handlers' filter.
# So a newline in a job id cannot start a forged line in the journal, and an
# argument loses token formats and credential pairs (envpolicy.redact_patterns;
# run ids that only look random stay readable).


def _escape_arg(arg: object) -> object:
    if isinstance(arg, (str, bytes, bytearray, BaseException)):
        text = to_text(arg if not isinstance(arg, BaseException) else str(arg))
        return for_log(envpolicy.redact_patterns(text[:4 * MAX_LOG]))
    if arg is None or isinstance(arg, (int, float)):
        return arg
    if isinstance(arg, Mapping):         # log.info("%(job)s", {...}): its values
        return {k: _escape_arg(v) for k, v in arg.items()}
    text = str(arg)          # an object: its text, if that needs escaping
    return for_log(envpolicy.redact_patterns(text[:4 * MAX_LOG])) \
        if not is_clean(text) or len(text) > MAX_LOG else arg


def _escape_args(args: Any) -> Any:
    if isinstance(args, tuple):
        return tuple(_escape_arg(a) for a in args)
    if isinstance(args, Mapping):
        return {k: _escape_arg(v) for k, v in args.items()}
    return args


class EscapeArgs(logging.Filter):
    """A handler filter: the arguments of every record escaped, capped and
    redacted (records of ``ncclwatch.*`` loggers already were, when made)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.args and not getattr(record, "ncclwatch_escaped", False):
            record.args = _escape_args(record.args)
            record.ncclwatch_escaped = True
        return True


_installed = False


def install_log_escaping(logger: logging.Logger | None = None) -> None:
    """Escape the arguments of every ``ncclwatch.*`` log record as it is made,
    and of every record the handlers of ``logger`` (root) emit. Idempotent;
    call it again after adding handlers."""
    global _installed
    for h in (logger or logging.getLogger()).handlers:
        if not any(isinstance(f, EscapeArgs) for f in h.filters):
            h.addFilter(EscapeArgs())
    if _installed:
        return
    _installed = True
    make = logging.getLogRecordFactory()

    def factory(name, level, fn, lno, msg, args, exc_info, func=None, sinfo=None, **kw):
        ours = bool(args) and (name == "ncclwatch" or name.startswith("ncclwatch."))
        if ours:
            args = _escape_args(args)
        record = make(name, level, fn, lno, msg, args, exc_info, func, sinfo, **kw)
        if ours:
            record.ncclwatch_escaped = True
        return record

    logging.setLogRecordFactory(factory)
