"""GPU memory per process, and each device's utilisation and power, behind a small interface.

NVML is the one part with no counterpart on a CPU-only machine: the real
reader (nvidia-ml-py) fails soft and says why once; tests feed the same
logic with recorded readings (``RecordedGpuReader``). Utilisation and power
are each read on their own: a device that does not answer one (MIG, some
vGPU and consumer boards) keeps its memory reading and the other values.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class GpuDevice:
    index: int
    uuid: str
    name: str
    total_bytes: int
    used_bytes: int
    # nvmlDeviceGetUtilizationRates().gpu: percent of the last sample period
    # with a kernel running; -1: no answer.
    util_percent: int = -1
    # nvmlDeviceGetPowerUsage in watts; -1.0: no answer.
    power_watts: float = -1.0
    # nvmlDeviceGetEnforcedPowerLimit in watts; 0.0: no answer.
    power_limit_watts: float = 0.0


@dataclass(frozen=True, slots=True)
class GpuProcessMemory:
    pid: int
    device_index: int
    used_bytes: int


@dataclass(frozen=True, slots=True)
class GpuReading:
    devices: tuple[GpuDevice, ...]
    processes: tuple[GpuProcessMemory, ...]

    def by_pid(self) -> dict[int, list[GpuProcessMemory]]:
        out: dict[int, list[GpuProcessMemory]] = {}
        for p in self.processes:
            out.setdefault(p.pid, []).append(p)
        return out


EMPTY = GpuReading((), ())


class GpuReader(Protocol):
    @property
    def up(self) -> bool: ...

    def read(self) -> GpuReading: ...


class NvmlGpuReader:
    """nvidia-ml-py; ``up`` is False (and stays quiet) without driver or GPU."""

    def __init__(self) -> None:
        self.up = False
        self.reason = ""
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self.up = True
        except Exception as e:  # ImportError, NVMLError_LibraryNotFound, DriverNotLoaded...
            self.reason = f"{type(e).__name__}: {e}"
            log.warning("NVML unavailable, GPU memory not sampled (%s)", self.reason)

    def read(self) -> GpuReading:
        if not self.up:
            return EMPTY
        nv = self._nvml
        devices, procs = [], []
        try:
            for i in range(nv.nvmlDeviceGetCount()):
                h = nv.nvmlDeviceGetHandleByIndex(i)
                mem = nv.nvmlDeviceGetMemoryInfo(h)
                devices.append(GpuDevice(i, _str(nv.nvmlDeviceGetUUID(h)),
                                         _str(nv.nvmlDeviceGetName(h)), mem.total, mem.used,
                                         *activity(nv, h)))
                for p in nv.nvmlDeviceGetComputeRunningProcesses(h):
                    procs.append(GpuProcessMemory(p.pid, i, p.usedGpuMemory or 0))
        except Exception as e:
            log.warning("NVML read failed: %s", e)
            return EMPTY
        return GpuReading(tuple(devices), tuple(procs))


def _answer(call, default):
    """One NVML query, or ``default`` where the device does not answer it."""
    try:
        return call()
    except Exception:  # NVMLError_NotSupported, NoPermission, GpuIsLost...
        return default


def activity(nv, h) -> tuple[int, float, float]:
    """(utilisation %, power W, enforced power limit W) of one device, each -1/-1/0 when unanswered."""
    util = _answer(lambda: int(nv.nvmlDeviceGetUtilizationRates(h).gpu), -1)
    power = _answer(lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000.0, -1.0)
    limit = _answer(lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0, 0.0)
    return util, power, limit


class RecordedGpuReader:
    """Replays readings recorded as JSON (tests, and offline demos)."""

    def __init__(self, readings: list[GpuReading]) -> None:
        self.up = True
        self._readings = readings
        self._i = 0

    @classmethod
    def from_file(cls, path: Path) -> "RecordedGpuReader":
        data = json.loads(Path(path).read_text())
        readings = [
            GpuReading(
                tuple(_recorded_device(d, r.get("utilization", ())) for d in r["devices"]),
                tuple(GpuProcessMemory(**p) for p in r["processes"]),
            )
            for r in data["readings"]
        ]
        return cls(readings)

    def read(self) -> GpuReading:
        if not self._readings:
            return EMPTY
        r = self._readings[min(self._i, len(self._readings) - 1)]
        self._i += 1
        return r


def _recorded_device(d: dict, utilization) -> GpuDevice:
    """A recorded device; recordings from before utilisation and power load with them unknown.

    The first H200 recording kept device utilisation apart (``utilization``,
    by index): it is used where the device itself has none.
    """
    d = dict(d)
    if "util_percent" not in d:
        for u in utilization:
            if u.get("index") == d.get("index") and isinstance(u.get("gpu"), int):
                d["util_percent"] = u["gpu"]
    return GpuDevice(**d)


def expected_gpus(dev: Path = Path("/dev")) -> int:
    """GPU device nodes present: where NVML is down but these exist, it is broken."""
    try:
        return sum(1 for p in dev.glob("nvidia[0-9]*") if p.name[6:].isdigit())
    except OSError:
        return 0


def _str(v: str | bytes) -> str:
    return v.decode() if isinstance(v, bytes) else v
