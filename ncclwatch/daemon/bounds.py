"""What one report, one agent or one job may cost the daemon.

Every bound is a daemon setting (flag ``--max-...``, ``NCCLWATCH_MAX_...``,
TOML key ``max_...``) with a default well above what a real node sends, and
every hit is counted in ``ncclwatch_daemon_bound_hits_total{bound}``. A hit
refuses the smallest part that broke it: the whole report (a malformed
field, INVALID_ARGUMENT or RESOURCE_EXHAUSTED with the bound in the message),
one job of it (``rejected_jobs`` of the answer), or, for the stack store,
the least recently used stacks (evicted, not refused).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from ncclwatch.config import Option, positive_float, positive_int


@dataclass(frozen=True)
class Bounds:
    #: Jobs the daemon tracks at once; a report's samples of a new job past it
    #: are left out of it (rejected_jobs).
    max_jobs: int = 16384
    #: Jobs one agent reports at once (a node runs a handful).
    max_jobs_per_agent: int = 256
    #: Ranks (and rank-less members) of one job; also the largest world size.
    max_ranks_per_job: int = 262144
    #: Text (function and file names) of one stack, and of all stacks in a report.
    max_stack_bytes: int = 256 * 1024
    max_report_stack_bytes: int = 8 * 1024 * 1024
    #: Text of all stacks the daemon keeps (least recently used go first).
    max_stored_stack_bytes: int = 64 * 1024 * 1024
    #: One path (a file a rank writes, the previous checkpoint, a copy's source).
    max_path: int = 4096
    #: One environment value of a job (names: 256 characters).
    max_env_value: int = 4096
    #: Process groups in one Flight Recorder summary, and ranks they list in all.
    max_flight_recorder_groups: int = 256
    max_flight_recorder_ranks: int = 1 << 20
    #: An agent's round interval (a huge one kept a dead agent fresh).
    max_interval_seconds: float = 300.0
    #: A state's, stack's or dump's age (and a stillness or CPU time).
    max_age_seconds: float = 366 * 86400.0


#: Label of each bound in ncclwatch_daemon_bound_hits_total (all exported, 0 or not).
BOUND_LABELS = {
    "max_jobs": "jobs", "max_jobs_per_agent": "jobs_per_agent",
    "max_ranks_per_job": "ranks_per_job", "max_stack_bytes": "stack_bytes",
    "max_report_stack_bytes": "report_stack_bytes",
    "max_stored_stack_bytes": "stored_stack_bytes", "max_path": "path_length",
    "max_env_value": "env_length", "max_flight_recorder_groups": "flight_recorder_groups",
    "max_flight_recorder_ranks": "flight_recorder_ranks",
    "max_interval_seconds": "interval", "max_age_seconds": "age",
}

_HELP = {
    "max_jobs": "jobs tracked at once (new jobs past it are refused per report)",
    "max_jobs_per_agent": "jobs one agent may report at once",
    "max_ranks_per_job": "ranks and rank-less members of one job (and its largest world size)",
    "max_stack_bytes": "bytes of text in one stack",
    "max_report_stack_bytes": "bytes of stack text in one report",
    "max_stored_stack_bytes": "bytes of stack text kept (least recently used evicted)",
    "max_path": "characters of one reported path",
    "max_env_value": "characters of one job environment value",
    "max_flight_recorder_groups": "process groups in one Flight Recorder summary",
    "max_flight_recorder_ranks": "ranks listed in one Flight Recorder summary, all groups",
    "max_interval_seconds": "an agent's round interval",
    "max_age_seconds": "a reported age (state, stack, dump)",
}


def bound_options() -> tuple[Option, ...]:
    """One daemon option per bound: flag, environment variable and TOML key."""
    out = []
    for f in fields(Bounds):
        kind = positive_float if f.type in (float, "float") else positive_int
        out.append(Option(f.name, kind, f.default, _HELP[f.name],
                          "SECONDS" if kind is positive_float else "N"))
    return tuple(out)


def bounds_from(cfg: dict[str, Any]) -> Bounds:
    """The Bounds in a resolved config (defaults for what it lacks)."""
    return Bounds(**{f.name: cfg[f.name] for f in fields(Bounds) if cfg.get(f.name) is not None})
