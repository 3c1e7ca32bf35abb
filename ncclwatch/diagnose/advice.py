"""What to alert on next time, and which sibling failures to rule out (data).

A postmortem verdict is also a monitoring gap: each failure class names the
ncclwatch metric and the alert (dashboards/prometheus/alerts.yaml) that would
have caught the same failure live, before the watchdog killed the job, and the
failures that leave the same traces and must be ruled out before acting on
the verdict (a slow save vs a save entered on one rank, an OOM vs a slow
gather, a network error vs a crashed peer). tests/unit/diagnose/test_render.py
checks every alert named here exists in alerts.yaml.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Fingerprint:
    """The live signal of a failure class: metric (with its selector) and alert."""

    metric: str
    alert: str
    why: str


@dataclass(frozen=True)
class Sibling:
    """A failure that leaves the same traces, and how to tell it apart."""

    cls: str
    tell: str


FINGERPRINTS: dict[str, tuple[Fingerprint, ...]] = {
    "checkpoint_gather_timeout": (
        Fingerprint('ncclwatch_stall_culprit_info{kind="checkpoint_gather"}',
                    "NCCLWatchCheckpointGatherStall",
                    "names the saving rank while the others wait"),
        Fingerprint("ncclwatch_watchdog_forecast_overrun_seconds > 0",
                    "NCCLWatchWatchdogForecastOverrun",
                    "fires when the save is forecast to outlast the watchdog, before it does"),
    ),
    "gather_oom": (
        Fingerprint("ncclwatch_memory_exhaustion_eta_seconds < 600",
                    "NCCLWatchMemoryExhaustionForecast",
                    "the gathering rank's memory runs out within minutes"),
        Fingerprint('ncclwatch_stall_culprit_info{kind="checkpoint_gather"}',
                    "NCCLWatchCheckpointGatherStall", "the gather itself"),
    ),
    "collective_hang": (
        Fingerprint('ncclwatch_stall_culprit_info{kind="collective_hang"}',
                    "NCCLWatchCollectiveHang", "names the rank that never joined"),
        Fingerprint("ncclwatch_watchdog_remaining_seconds", "NCCLWatchWatchdogBudgetLow",
                    "the time left before the watchdog fires"),
    ),
    "desync": (
        Fingerprint('ncclwatch_stall_culprit_info{kind="desync"}', "NCCLWatchCollectiveDesync",
                    "ranks waiting in different collectives"),
    ),
    "rank_crash": (
        Fingerprint('ncclwatch_stall_active{kind="rank_lost"}', "NCCLWatchRankLost",
                    "a rank's process went away while the others wait for it"),
    ),
    "network_error": (
        Fingerprint('ncclwatch_stall_active{kind="rank_lost"}', "NCCLWatchRankLost",
                    "the ranks that lost their peers"),
        Fingerprint('ncclwatch_stall_culprit_info{kind="collective_hang"}',
                    "NCCLWatchCollectiveHang", "a transport that stalls rather than fails"),
    ),
    "unknown": (
        Fingerprint("ncclwatch_watchdog_remaining_seconds", "NCCLWatchWatchdogBudgetLow",
                    "any stall, whatever its cause, before the watchdog fires"),
    ),
}

SIBLINGS: dict[str, tuple[Sibling, ...]] = {
    "checkpoint_gather_timeout": (
        Sibling("collective_hang", "a save entered on one rank only (the others went on to the "
                "next step): the saving rank's collective is one the others never issue; a slow "
                "save finishes if given time"),
        Sibling("gather_oom", "an OOM during the gather: look for 'out of memory' or the OOM "
                "killer (dmesg) on the saving rank"),
    ),
    "gather_oom": (
        Sibling("checkpoint_gather_timeout", "a slow gather that only looked like an OOM: no "
                "allocator or OOM-killer line, the rank was alive when the watchdog fired"),
        Sibling("rank_crash", "an OOM outside the checkpoint (activations, a data worker)"),
    ),
    "collective_hang": (
        Sibling("rank_crash", "a rank that died rather than hung: torchrun's exit codes, a "
                "traceback or SIGKILL (-9: the OOM killer's usual signature) on that rank"),
        Sibling("checkpoint_gather_timeout", "the missing rank was saving or gathering"),
        Sibling("network_error", "a transport that stalls without an error: NCCL_DEBUG=INFO, "
                "IB counters"),
    ),
    "desync": (
        Sibling("collective_hang", "one rank late, not in a different collective: the same op "
                "and sequence number on every rank that reported"),
    ),
    "rank_crash": (
        Sibling("network_error", "peers that report 'Connection reset'/'closed by peer' are "
                "collateral of the crash, not a network failure"),
        Sibling("gather_oom", "a rank killed with SIGKILL (-9) during a save: the OOM killer"),
    ),
    "network_error": (
        Sibling("rank_crash", "a crashed peer: the remote side's log, exit code or OOM killer "
                "line; 'remote process exiting prematurely' is often a peer dying"),
    ),
    "unknown": (
        Sibling("rank_crash", "a rank whose log is missing died first: collect every rank's log"),
    ),
}


def fingerprints(cls: str) -> list[dict[str, str]]:
    return [{"metric": f.metric, "alert": f.alert, "why": f.why}
            for f in FINGERPRINTS.get(cls, ())]


def siblings(cls: str) -> list[dict[str, str]]:
    return [{"class": s.cls, "tell": s.tell} for s in SIBLINGS.get(cls, ())]
