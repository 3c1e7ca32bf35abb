"""Job settings that defeat the watchdog or the evidence (data, not code).

A job whose environment turns off NCCL's async error handling without
blocking wait never aborts a stuck collective: it hangs until someone kills
it, and the watchdog budget ncclwatch counts down is fiction. A job without
the Flight Recorder loses the per-collective record that says which rank
was missing. Each rule reads only allowlisted variables (envpolicy.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

Env = Mapping[str, str]


def _off(env: Env, *names: str) -> bool:
    """The first of ``names`` that is set says 0/false/off."""
    for n in names:
        if n in env:
            return env[n].strip().lower() in ("0", "false", "off", "no")
    return False


def _on(env: Env, *names: str) -> bool:
    for n in names:
        if n in env:
            return env[n].strip().lower() in ("1", "true", "on", "yes")
    return False


def _size_on(env: Env) -> bool:
    """A non-zero Flight Recorder buffer (the default is 2000 only from torch 2.11)."""
    for n in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        if n in env:
            try:
                return int(env[n]) > 0
            except ValueError:
                return False
    return False


@dataclass(frozen=True)
class EnvRule:
    code: str
    severity: str  # warning | info
    applies: Callable[[Env], bool]
    message: str


RULES: tuple[EnvRule, ...] = (
    EnvRule(
        "watchdog_cannot_abort", "warning",
        lambda e: _off(e, "TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING")
        and not _on(e, "TORCH_NCCL_BLOCKING_WAIT", "NCCL_BLOCKING_WAIT"),
        "TORCH_NCCL_ASYNC_ERROR_HANDLING=0 without TORCH_NCCL_BLOCKING_WAIT=1: a timed-out "
        "collective is never aborted, the job hangs past the process-group timeout until "
        "it is killed by hand. Unset it (default 3) or set TORCH_NCCL_BLOCKING_WAIT=1."),
    EnvRule(
        "flight_recorder_disabled", "warning",
        lambda e: _off(e, "TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"),
        "The Flight Recorder is off (trace buffer size 0): after a timeout there is no "
        "record of which rank missed which collective. Set TORCH_FR_BUFFER_SIZE=2000."),
    EnvRule(
        "flight_recorder_no_pipe", "info",
        lambda e: _size_on(e) and not e.get("TORCH_NCCL_DEBUG_INFO_PIPE_FILE"),
        "The Flight Recorder is on but has no debug-info pipe: ncclwatch cannot ask the "
        "job for a live dump during a stall (exact missing ranks, exact timeout). Set "
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE=/tmp/nccl_pipe_ (each rank then reads "
        "/tmp/nccl_pipe_<rank>.pipe) and keep TORCH_NCCL_DUMP_ON_TIMEOUT=1 so it is polled "
        "every second."),
    EnvRule(
        "dump_on_timeout_disabled", "info",
        lambda e: _off(e, "TORCH_NCCL_DUMP_ON_TIMEOUT"),
        "TORCH_NCCL_DUMP_ON_TIMEOUT=0: the Flight Recorder is not written when the "
        "watchdog fires, and its debug pipe is polled only every heartbeat timeout."),
    EnvRule(
        "watchdog_monitoring_disabled", "info",
        lambda e: _off(e, "TORCH_NCCL_ENABLE_MONITORING"),
        "TORCH_NCCL_ENABLE_MONITORING=0: a stuck watchdog thread itself is never "
        "detected (the heartbeat monitor is off)."),
)


@dataclass(frozen=True)
class EnvWarning:
    code: str
    severity: str
    message: str


def lint(env: Env) -> tuple[EnvWarning, ...]:
    return tuple(EnvWarning(r.code, r.severity, r.message) for r in RULES if r.applies(env))
