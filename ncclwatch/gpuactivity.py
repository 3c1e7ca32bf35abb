"""What a rank's GPUs are doing, from NVML's utilisation and power (a heuristic).

When every rank of a job sits in the same collective, no rank is the culprit
on the stacks; the devices are the evidence. NVML's utilisation
(``nvmlDeviceGetUtilizationRates().gpu``) is the percent of the sample period
in which one or more kernels ran, not how much of the chip they used
(nvidia-smi documentation, "Utilization"). An NCCL kernel waiting for a peer
that never arrives polls memory flags on a few SMs: the device reads ~100%
busy while it draws little more than idle power. Public reports of exactly
this shape: cupy/cupy#3557 (ranks blocked in NCCL allGather show 100%
utilisation at low temperature; "busy-looping" is NCCL's, per the
maintainers), nebius/soperator#796 (stuck NCCL operations detected as constant
100% GPU utilisation with very low power), vllm-project/vllm#41725 (a rank
"spinning at ~96% GPU / ~20 W" with its peer blocked in ncclAllReduce).
DCGM exposes the same two numbers (DCGM_FI_DEV_GPU_UTIL, DCGM_FI_DEV_POWER_USAGE).

Thresholds (``RULES``, first match wins): >= 90% busy at <= 40% of the
enforced power limit is ``spinning`` (a compute- or memory-bound training step
draws well over half its limit; an idle H100 SXM draws ~10%, polling kernels
~15-30%); < 10% busy is ``idle``; busy with a power reading otherwise is
``working``. It is a heuristic: a kernel spinning on anything (a livelock
outside NCCL, NVIDIA/nccl#2213's flashinfer case) reads the same, a small
latency-bound kernel can be busy at low power, and a power cap or a low clock
moves the ratio; findings say "spinning", never "hung", from this alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Protocol

#: NVML's "no answer": utilisation or power -1, power limit 0.
UNKNOWN_UTIL = -1
UNKNOWN_POWER = -1.0
UNKNOWN_LIMIT = 0.0


@dataclass(frozen=True, slots=True)
class Rule:
    word: str
    # Utilisation percent, inclusive bounds.
    util_min: int
    util_max: int
    # Power as a fraction of the enforced limit, inclusive; None: needs no power reading.
    power_min: float | None
    power_max: float | None


#: First match wins; nothing matches: "unknown".
RULES: tuple[Rule, ...] = (
    Rule("idle", 0, 9, None, None),
    Rule("spinning", 90, 100, 0.0, 0.40),
    Rule("working", 10, 100, 0.0, float("inf")),
)

#: The clause each word gives in a finding, after the device count.
PHRASES: dict[str, str] = {
    "spinning": "spinning in NCCL kernels, not computing",
    "working": "computing",
    "idle": "idle",
}

#: Order of the clauses in a summary: the evidence a hang finding wants first.
ORDER = ("spinning", "working", "idle")


def judge(util: int, power: float, limit: float) -> str:
    """``spinning``, ``working``, ``idle`` or ``unknown`` for one device's reading."""
    if util < 0 or util > 100:
        return "unknown"
    frac = power / limit if power >= 0 and limit > 0 else None
    for r in RULES:
        if not r.util_min <= util <= r.util_max:
            continue
        if r.power_min is None:
            return r.word
        if frac is not None and r.power_min <= frac <= r.power_max:
            return r.word
    return "unknown"


class _HasActivity(Protocol):
    node: str
    gpu_activity: tuple[tuple[int, int, float, float], ...]


def _span(lo: float, hi: float) -> str:
    return f"{lo:.0f}%" if round(lo) == round(hi) else f"{lo:.0f}-{hi:.0f}%"


def summary(records: Iterable[_HasActivity]) -> str:
    """The clause a finding appends about its ranks' GPUs; "" without a judged reading.

    A device two ranks share counts once (by node and index).
    """
    seen: dict[tuple[str, int], tuple[int, float, float]] = {}
    for rec in records:
        for index, util, power, limit in getattr(rec, "gpu_activity", ()) or ():
            seen.setdefault((getattr(rec, "node", ""), index), (util, power, limit))
    groups: dict[str, list[tuple[int, float, float]]] = {}
    for util, power, limit in seen.values():
        groups.setdefault(judge(util, power, limit), []).append((util, power, limit))
    parts = []
    for word in ORDER:
        g = groups.get(word)
        if not g:
            continue
        utils = [u for u, _, _ in g]
        text = f"{len(g)} at {_span(min(utils), max(utils))} utilisation"
        fracs = [100.0 * p / lim for _, p, lim in g if p >= 0 and lim > 0]
        if fracs and word != "idle":
            text += f", {_span(min(fracs), max(fracs))} of their power limit"
        parts.append(f"{text}: {PHRASES[word]}")
    return "GPUs: " + "; ".join(parts) if parts else ""
