"""The node's own fields of a report: the one fault that refuses it whole.

A report is refused (a gRPC status code and a message that says what is
wrong, nothing of it applied) only for what is the node's own: a protocol
version this daemon does not speak, no report, a bad node name or agent id,
its clocks and interval, more parts than the transport's limit, malformed
briefs (their slot arrays are the agent's encoding). A fault of one rank's
part costs that part alone (daemon/admission.py, contract/checks.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import grpc

from ncclwatch.contract.bounds import Bounds
from ncclwatch.contract.limits import (
    DEFAULT_BOUNDS, MAX_CLOCK, MAX_ID, MAX_NODE, MAX_SAMPLES, MAX_STACKS,
    PROTOCOL_VERSIONS)
from ncclwatch.v1 import collector_pb2 as pb

#: The gRPC codes a report, or a job in it, is refused with: the label values of
#: ncclwatch_daemon_rejected_*_total, exported at 0 before the first refusal.
REJECT_CODES: tuple[str, ...] = (
    "INVALID_ARGUMENT", "FAILED_PRECONDITION", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED")


class ReportError(Exception):
    """``bound``: the label (bounds.BOUND_LABELS) of the bound it hit, if any;
    ``reason``: the reason it is counted under (contract.checks.REASONS)."""

    def __init__(self, code: grpc.StatusCode, message: str, bound: str = "",
                 reason: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.bound = bound
        self.reason = reason


def _bad(msg: str, reason: str, bound: str = "") -> ReportError:
    return ReportError(grpc.StatusCode.INVALID_ARGUMENT, msg, bound, reason)


def _too_big(msg: str) -> ReportError:
    return ReportError(grpc.StatusCode.RESOURCE_EXHAUSTED, msg, "", "too_many_parts")


class Briefs(NamedTuple):
    """A report's protocol-2 briefs, read out of the message once (each read of a
    repeated field costs a wrapper): parallel sequences, one entry per steady rank."""

    slot: Sequence[int] = ()
    still_seconds: Sequence[float] = ()
    cpu_utilization: Sequence[float] = ()
    cpu_seconds: Sequence[float] = ()


NO_BRIEFS = Briefs()


def read_briefs(b: pb.RankBriefs) -> Briefs:
    """The briefs as lists (a slice of a repeated field is the cheapest copy)."""
    return Briefs(b.slot[:], b.still_seconds[:], b.cpu_utilization[:], b.cpu_seconds[:])


class Shape(NamedTuple):
    """A checked report's parts, each read out of the message once: what the
    steps of ingest after the check (admission, escaping, the table) look at
    instead of asking the message again (a repeated field's wrapper costs a
    fraction of a microsecond each time; a steady report is briefs alone).
    The repeated fields are the message's own: admission takes parts out of
    them in place."""

    briefs: Briefs
    samples: Any
    changes: Any
    stacks: Any
    exited: Any

    @property
    def parts(self) -> bool:
        """Whether the report holds anything but briefs."""
        return bool(self.samples or self.changes or self.stacks or self.exited)


_INF = math.inf


def check_node(req: pb.ReportRequest, bounds: Bounds = DEFAULT_BOUNDS) -> Shape:
    """Raise ReportError for a fault of the node's own fields of ``req``; return
    its parts (``Shape``)."""
    version = req.protocol_version
    if version not in PROTOCOL_VERSIONS:
        raise ReportError(grpc.StatusCode.FAILED_PRECONDITION,
                          f"unsupported protocol_version {version}; "
                          f"this daemon speaks {sorted(PROTOCOL_VERSIONS)}", "",
                          "unsupported_protocol")
    if not req.HasField("report"):
        raise _bad("request has no report", "no_report")
    r = req.report
    node, agent_id = r.node, r.agent_id
    if not node or len(node) > MAX_NODE:
        raise _bad(f"report.node must be a host name of 1-{MAX_NODE} characters", "bad_node")
    if not agent_id or len(agent_id) > MAX_ID:
        raise _bad(f"report.agent_id must be 1-{MAX_ID} characters", "bad_agent_id")
    if len(r.health.version) > MAX_ID:
        raise _bad(f"report.health.version over {MAX_ID} characters", "bad_agent_id")
    # The four clocks in one test (NaN and infinities fail it); a fault is then
    # said by the checks one by one.
    if not (0 <= r.agent_monotonic_seconds <= MAX_CLOCK and 0 <= r.agent_wall_seconds < _INF
            and 0 <= r.interval_seconds <= bounds.max_interval_seconds < _INF
            and 0 <= r.timed_round_trip_seconds < _INF and 0 <= r.queued_seconds < _INF):
        _check_clocks(r, bounds)
    samples, changes, stacks = r.samples, r.changes, r.stacks
    n = len(samples)
    if n > MAX_SAMPLES:
        raise _too_big(f"{n} samples in one report (max {MAX_SAMPLES})")
    if len(stacks) > MAX_STACKS:
        raise _too_big(f"{len(stacks)} stacks in one report (max {MAX_STACKS})")
    briefs = NO_BRIEFS
    if r.HasField("briefs") or r.slots_reset or changes:
        if version < 2:
            raise _bad("briefs, changes and slots need protocol_version 2", "bad_briefs")
        briefs = read_briefs(r.briefs)
        _check_briefs(briefs, n + len(changes))
    return Shape(briefs, samples, changes, stacks, r.exited)


def read_shape(req: pb.ReportRequest) -> Shape:
    """``check_node``'s answer for a report that passed it already (precheck.py,
    in an ingest worker): its parts, nothing checked again."""
    r = req.report
    changes = r.changes
    briefs = read_briefs(r.briefs) if r.HasField("briefs") or r.slots_reset or changes \
        else NO_BRIEFS
    return Shape(briefs, r.samples, changes, r.stacks, r.exited)


def _check_clocks(r: pb.NodeReport, bounds: Bounds) -> None:
    for name in ("agent_monotonic_seconds", "agent_wall_seconds", "interval_seconds",
                 "timed_round_trip_seconds", "queued_seconds"):
        v = getattr(r, name)
        if not math.isfinite(v) or v < 0:
            raise _bad(f"report.{name} must be finite and >= 0, got {v}", "bad_clock")
    if r.agent_monotonic_seconds > MAX_CLOCK:
        raise _bad(f"report.agent_monotonic_seconds {r.agent_monotonic_seconds:g} is not a "
                   f"monotonic clock (over {MAX_CLOCK:g})", "bad_clock", "age")
    if r.interval_seconds > bounds.max_interval_seconds:
        raise _bad(f"report.interval_seconds {r.interval_seconds:g} over "
                   f"{bounds.max_interval_seconds:g} (max_interval_seconds)", "bad_clock",
                   "interval")


def _check_briefs(b: Briefs, samples: int) -> None:
    """Parallel arrays of one length, slots > 0 (a brief's readings are its
rank's: admission drops a brief with a bad one alone)."""
    n = len(b.slot)
    if n + samples > MAX_SAMPLES:
        raise _too_big(f"{n} briefs and {samples} samples in one report (max {MAX_SAMPLES})")
    if not len(b.still_seconds) == len(b.cpu_utilization) == len(b.cpu_seconds) == n:
        raise _bad(f"briefs: {n} slots but {len(b.still_seconds)} still_seconds, "
                   f"{len(b.cpu_utilization)} cpu_utilization, {len(b.cpu_seconds)} "
                   f"cpu_seconds", "bad_briefs")
    if n and min(b.slot) == 0:
        raise _bad("briefs: slot 0 names no rank", "bad_briefs")
