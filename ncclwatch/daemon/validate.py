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


def check_node(req: pb.ReportRequest, bounds: Bounds = DEFAULT_BOUNDS) -> None:
    """Raise ReportError for a fault of the node's own fields of ``req``."""
    if req.protocol_version not in PROTOCOL_VERSIONS:
        raise ReportError(grpc.StatusCode.FAILED_PRECONDITION,
                          f"unsupported protocol_version {req.protocol_version}; "
                          f"this daemon speaks {sorted(PROTOCOL_VERSIONS)}", "",
                          "unsupported_protocol")
    if not req.HasField("report"):
        raise _bad("request has no report", "no_report")
    r = req.report
    if not r.node or len(r.node) > MAX_NODE:
        raise _bad(f"report.node must be a host name of 1-{MAX_NODE} characters", "bad_node")
    if not r.agent_id or len(r.agent_id) > MAX_ID:
        raise _bad(f"report.agent_id must be 1-{MAX_ID} characters", "bad_agent_id")
    if len(r.health.version) > MAX_ID:
        raise _bad(f"report.health.version over {MAX_ID} characters", "bad_agent_id")
    for name in ("agent_monotonic_seconds", "agent_wall_seconds", "interval_seconds",
                 "timed_round_trip_seconds"):
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
    if len(r.samples) > MAX_SAMPLES:
        raise _too_big(f"{len(r.samples)} samples in one report (max {MAX_SAMPLES})")
    if len(r.stacks) > MAX_STACKS:
        raise _too_big(f"{len(r.stacks)} stacks in one report (max {MAX_STACKS})")
    if r.HasField("briefs") or r.slots_reset or r.changes:
        if req.protocol_version < 2:
            raise _bad("briefs, changes and slots need protocol_version 2", "bad_briefs")
        _check_briefs(r.briefs, len(r.samples) + len(r.changes))


def _check_briefs(b: pb.RankBriefs, samples: int) -> None:
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
