"""What one report, one agent or one job may cost the daemon: the bounds of the contract.

The agent caps what it sends under the defaults (``ncclwatch.agent.caps``)
and the daemon enforces the settings it runs with; both import them from
here. Every bound is a daemon setting (flag ``--max-...``, ``NCCLWATCH_MAX_...``,
TOML key ``max_...``) with a default well above what a real node sends, and
every hit is counted in ``ncclwatch_daemon_bound_hits_total{bound}``. A hit
refuses the smallest part that broke it: one job of a report
(``rejected_jobs`` of the answer), one rank sample, change, stack or Flight
Recorder summary (``dropped_parts`` of the answer), the whole report only
for the node's own fields (its interval, its clock), or, for the stack store,
the least recently used stacks (evicted, not refused).
"""

from __future__ import annotations

from dataclasses import dataclass

from ncclwatch.config import option, positive_float, positive_int

_N = {"type": positive_int, "metavar": "N"}
_S = {"type": positive_float, "metavar": "SECONDS"}


@dataclass(frozen=True)
class Bounds:
    #: Jobs the daemon tracks at once; a report's samples of a new job past it
    #: are left out of it (rejected_jobs).
    max_jobs: int = option(16384, "jobs tracked at once (new jobs past it are refused per "
                           "report)", **_N)
    #: Jobs one agent reports at once (a node runs a handful).
    max_jobs_per_agent: int = option(256, "jobs one agent may report at once", **_N)
    #: Ranks (and rank-less members) of one job; also the largest world size.
    max_ranks_per_job: int = option(262144, "ranks and rank-less members of one job (and its "
                                    "largest world size)", **_N)
    #: Frames of one stack (py-spy gives up to 4096); a deeper one is left out
    #: of the report, the rest applied.
    max_stack_frames: int = option(1024, "frames of one stack", **_N)
    #: Text (function and file names) of one stack, and of all stacks in a report.
    max_stack_bytes: int = option(256 * 1024, "bytes of text in one stack", **_N)
    max_report_stack_bytes: int = option(8 * 1024 * 1024, "bytes of stack text in one report",
                                         **_N)
    #: Text of all stacks the daemon keeps (least recently used go first).
    max_stored_stack_bytes: int = option(64 * 1024 * 1024, "bytes of stack text kept (least "
                                         "recently used evicted)", **_N)
    #: One path (a file a rank writes, the previous checkpoint, a copy's source).
    max_path: int = option(4096, "characters of one reported path", **_N)
    #: One environment value of a job (names: 256 characters).
    max_env_value: int = option(4096, "characters of one job environment value", **_N)
    #: Process groups in one Flight Recorder summary, and ranks they list in all.
    max_flight_recorder_groups: int = option(256, "process groups in one Flight Recorder "
                                             "summary", **_N)
    max_flight_recorder_ranks: int = option(1 << 20, "ranks listed in one Flight Recorder "
                                            "summary, all groups", **_N)
    #: An agent's round interval (a huge one kept a dead agent fresh).
    max_interval_seconds: float = option(300.0, "an agent's round interval", **_S)
    #: A state's, stack's or dump's age (and a stillness or CPU time).
    max_age_seconds: float = option(366 * 86400.0, "a reported age (state, stack, dump)", **_S)
    #: Per node identity (the node a client certificate is bound to; without
    #: TLS, the report's node) and in total: what one certificate may make the
    #: daemon hold, however many agent ids it invents (nodebudget.py).
    max_jobs_per_node: int = option(1024, "jobs one node's agents may report at once", **_N)
    max_agents_per_node: int = option(64, "agent ids one node may hold (a new one past it "
                                      "is refused)", **_N)
    max_agents: int = option(131072, "agent ids held at once, all nodes", **_N)
    max_node_bytes: int = option(64 * 1024 * 1024, "bytes of rank and job data one node "
                                 "may hold (estimated; new data past it is refused per job)",
                                 **_N)
    max_held_bytes: int = option(2 * 1024 * 1024 * 1024, "bytes of rank and job data held, "
                                 "all nodes (estimated)", **_N)
    #: A DumpStacks call's reason, where it is accepted and where it is kept.
    max_dump_reason: int = option(256, "characters of a DumpStacks reason (longer: cut)", **_N)


#: Label of each bound in ncclwatch_daemon_bound_hits_total (all exported, 0 or not).
BOUND_LABELS = {
    "max_jobs": "jobs", "max_jobs_per_agent": "jobs_per_agent",
    "max_ranks_per_job": "ranks_per_job", "max_stack_frames": "stack_frames",
    "max_stack_bytes": "stack_bytes",
    "max_report_stack_bytes": "report_stack_bytes",
    "max_stored_stack_bytes": "stored_stack_bytes", "max_path": "path_length",
    "max_env_value": "env_length", "max_flight_recorder_groups": "flight_recorder_groups",
    "max_flight_recorder_ranks": "flight_recorder_ranks",
    "max_interval_seconds": "interval", "max_age_seconds": "age",
    "max_jobs_per_node": "jobs_per_node", "max_agents_per_node": "agents_per_node",
    "max_agents": "agents", "max_node_bytes": "node_bytes", "max_held_bytes": "held_bytes",
    "max_dump_reason": "dump_reason_length",
}
