"""One-shot GPU probe for ncclwatch fixtures (issue 12 item 6). Runs on the device machine.

Parts (each fails soft, each writes what it saw under OUTDIR):
  env    versions: torch, CUDA, NCCL, driver, python; nvidia-smi
  fr     world_size=1 NCCL job; Flight Recorder dump asked through the debug-info pipe
         served by ProcessGroupNCCL itself, with ncclwatch's real trigger (frpipe.request_dump)
  wait   CUDA rank waiting in torch.cuda.synchronize() and in .item() behind a long
         torch.cuda._sleep kernel: py-spy dumps, /proc CPU use, NVML per-process memory/util
  wd     NCCL watchdog timeout of a world_size=1 job stuck behind such a kernel: the real
         log, py-spy of the main thread in .item(), the dump-on-timeout Flight Recorder file
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import traceback
from pathlib import Path

OUT = Path(sys.argv[1])
OUT.mkdir(parents=True, exist_ok=True)
REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))
PYSPY = shutil.which("py-spy") or "/tmp/site/bin/py-spy"
SUMMARY: dict = {}


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


def save(name: str, data) -> None:
    p = OUT / name
    p.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, (bytes, bytearray)):
        p.write_bytes(data)
    elif isinstance(data, str):
        p.write_text(data)
    else:
        p.write_text(json.dumps(data, indent=1, default=str))


def run(cmd, timeout=30, **kw):
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
        return {"rc": r.returncode, "out": r.stdout[-20000:], "err": r.stderr[-5000:]}
    except Exception as e:  # noqa: BLE001
        return {"error": repr(e)}


def pyspy(pid: int, name: str, extra=()) -> dict:
    t0 = time.monotonic()
    # --native needs a blocking read (py-spy refuses --native with --nonblocking); the
    # probe's own child may be paused for it, a monitored rank never is.
    mode = [] if "--native" in extra else ["--nonblocking"]
    r = run([PYSPY, "dump", "--json", *mode, *extra, "--pid", str(pid)], timeout=20)
    r["seconds"] = time.monotonic() - t0
    save(f"{name}.pyspy.json", r.get("out") or json.dumps(r))
    return {"rc": r.get("rc"), "seconds": r["seconds"], "err": (r.get("err") or "")[-500:]}


def cpu_ticks(pid: int) -> tuple[int, int]:
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(f[11]), int(f[12])  # utime, stime


def proc_facts(pid: int, seconds: float = 2.0) -> dict:
    """CPU use over a window, per thread too (NCCL/CUDA threads), and /proc status."""
    hz = os.sysconf("SC_CLK_TCK")
    tids = os.listdir(f"/proc/{pid}/task")
    before = {t: _task_ticks(pid, t) for t in tids}
    u0, s0 = cpu_ticks(pid)
    time.sleep(seconds)
    u1, s1 = cpu_ticks(pid)
    threads = []
    for t in tids:
        try:
            a, b = before[t], _task_ticks(pid, t)
            comm = Path(f"/proc/{pid}/task/{t}/comm").read_text().strip()
            state = Path(f"/proc/{pid}/task/{t}/stat").read_text().rsplit(")", 1)[1].split()[0]
            wchan = _read(f"/proc/{pid}/task/{t}/wchan")
            threads.append({"tid": int(t), "comm": comm, "state": state, "wchan": wchan,
                            "cpu": (b - a) / hz / seconds})
        except Exception:  # noqa: BLE001
            pass
    status = _read(f"/proc/{pid}/status")
    return {"cpu_utilization": ((u1 + s1) - (u0 + s0)) / hz / seconds,
            "user": (u1 - u0) / hz / seconds, "system": (s1 - s0) / hz / seconds,
            "threads": threads, "status": status, "wchan": _read(f"/proc/{pid}/wchan"),
            "io": _read(f"/proc/{pid}/io")}


def _task_ticks(pid, tid) -> int:
    f = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(f[11]) + int(f[12])


def _read(p: str) -> str:
    try:
        return Path(p).read_text()
    except Exception as e:  # noqa: BLE001
        return f"<{e!r}>"


def nvml_facts() -> dict:
    out: dict = {}
    try:
        import pynvml as nv
        nv.nvmlInit()
        out["driver"] = nv.nvmlSystemGetDriverVersion()
        out["nvml_version"] = nv.nvmlSystemGetNVMLVersion()
        devs = []
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            d: dict = {"index": i, "name": nv.nvmlDeviceGetName(h), "uuid": nv.nvmlDeviceGetUUID(h)}
            m = nv.nvmlDeviceGetMemoryInfo(h)
            d["total_bytes"], d["used_bytes"] = m.total, m.used
            try:
                u = nv.nvmlDeviceGetUtilizationRates(h)
                d["util_gpu"], d["util_mem"] = u.gpu, u.memory
            except Exception as e:  # noqa: BLE001
                d["util_error"] = repr(e)
            try:
                d["compute_procs"] = [{"pid": p.pid, "used_bytes": p.usedGpuMemory}
                                      for p in nv.nvmlDeviceGetComputeRunningProcesses(h)]
            except Exception as e:  # noqa: BLE001
                d["compute_procs_error"] = repr(e)
            try:
                d["process_util"] = [{"pid": s.pid, "sm": s.smUtil, "mem": s.memUtil,
                                      "ts": s.timeStamp}
                                     for s in nv.nvmlDeviceGetProcessUtilization(h, 0)]
            except Exception as e:  # noqa: BLE001
                d["process_util_error"] = repr(e)
            devs.append(d)
        out["devices"] = devs
    except Exception as e:  # noqa: BLE001
        out["error"] = repr(e)
    try:
        from ncclwatch.agent.gpu import NvmlGpuReader
        r = NvmlGpuReader()
        out["ncclwatch_reader_up"] = r.up
        rd = r.read()
        out["ncclwatch_reading"] = {
            "devices": [d.__dict__ if hasattr(d, "__dict__") else repr(d) for d in rd.devices],
            "processes": [repr(p) for p in rd.processes]}
    except Exception as e:  # noqa: BLE001
        out["ncclwatch_reader_error"] = repr(e)
    return out


def child(code: str, env: dict, name: str) -> tuple[subprocess.Popen, Path]:
    script = OUT / "jobs" / f"{name}.py"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(code)
    logf = OUT / f"{name}.log"
    fh = open(logf, "w")
    p = subprocess.Popen([sys.executable, "-u", str(script)], stdout=fh, stderr=subprocess.STDOUT,
                         env={**os.environ, **env}, start_new_session=True)
    return p, logf


def wait_for(logf: Path, marker: str, timeout: float, p: subprocess.Popen) -> bool:
    t = time.monotonic() + timeout
    while time.monotonic() < t:
        if marker in logf.read_text():
            return True
        if p.poll() is not None:
            return False
        time.sleep(0.1)
    return False


def kill(p: subprocess.Popen) -> None:
    if p.poll() is None:
        try:
            os.killpg(p.pid, 9)
        except Exception:  # noqa: BLE001
            pass
    try:
        p.wait(10)
    except Exception:  # noqa: BLE001
        pass


# ---------------------------------------------------------------------------------------
def part_env() -> None:
    import torch
    SUMMARY["env"] = {
        "python": sys.version, "torch": torch.__version__, "cuda": torch.version.cuda,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "pyspy": run([PYSPY, "--version"]).get("out", "").strip(),
    }
    save("nvidia-smi.txt", run(["nvidia-smi"]).get("out", ""))
    save("nvidia-smi-q.txt", run(["nvidia-smi", "-q"]).get("out", ""))


COMMON = """
import os, sys, time, datetime, torch, torch.distributed as dist
def mark(s): print("PROBE", s, "pid=%d" % os.getpid(), "t=%.3f" % time.time(), flush=True)
def cycles_for(seconds):
    torch.cuda._sleep(10_000_000); torch.cuda.synchronize()
    t0 = time.perf_counter(); torch.cuda._sleep(200_000_000); torch.cuda.synchronize()
    rate = 200_000_000 / (time.perf_counter() - t0)
    print("PROBE cycles_per_second=%.0f" % rate, flush=True)
    return int(rate * seconds)
"""


def part_fr() -> None:
    """ProcessGroupNCCL's own debug-info pipe, asked by ncclwatch's real trigger."""
    d = Path("/tmp/probe_fr"); shutil.rmtree(d, ignore_errors=True); d.mkdir()
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": "29611", "TORCH_FR_BUFFER_SIZE": "2000",
           "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
           "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": str(d / "pipe_"),
           "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": str(d / "nccl_trace_rank_"),
           "TORCH_FR_DUMP_TEMP_FILE": str(d / "nccl_trace_rank_"),
           "TORCH_NCCL_DUMP_ON_TIMEOUT": "1", "NCCL_DEBUG": "INFO"}
    code = COMMON + textwrap.dedent("""
    dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=120),
                            device_id=torch.device("cuda:0"))
    t = torch.ones(1 << 20, device="cuda")
    dist.all_reduce(t); dist.broadcast(t, 0); dist.barrier()
    out = [torch.empty_like(t)]; dist.all_gather(out, t)
    sub = dist.new_group([0], group_desc="probe_subgroup")
    dist.all_reduce(t, group=sub)
    torch.cuda.synchronize()
    mark("ready")
    for i in range(60):
        dist.all_reduce(t); torch.cuda.synchronize(); time.sleep(0.5)
    mark("done")
    dist.destroy_process_group()
    """)
    p, logf = child(code, env, "fr_job")
    res: dict = {}
    try:
        res["ready"] = wait_for(logf, "PROBE ready", 90, p)
        pipe = d / "pipe_0.pipe"
        t = time.monotonic() + 15
        while not pipe.exists() and time.monotonic() < t:
            time.sleep(0.2)
        res["pipe_exists"] = pipe.exists()
        res["pipe_is_fifo"] = pipe.exists() and __import__("stat").S_ISFIFO(pipe.stat().st_mode)
        res["files"] = sorted(os.listdir(d))
        from ncclwatch.agent import frpipe
        from ncclwatch import flightrec
        t0 = time.monotonic()
        dump = frpipe.request_dump({**env}, 0, timeout=15)
        res["request_dump_seconds"] = time.monotonic() - t0
        res["dump_found"] = dump is not None
        if dump is not None:
            res["dump_path"] = dump.path
            res["dump_version"] = getattr(dump, "version", None)
            res["dump_repr"] = repr(dump)[:4000]
        for f in sorted(os.listdir(d)):
            if f.startswith("nccl_trace_rank_"):
                save(f"fr/{f}", (d / f).read_bytes())
                try:
                    dd = flightrec.load_dump(str(d / f))
                    res.setdefault("parsed", {})[f] = repr(dd)[:3000]
                except Exception as e:  # noqa: BLE001
                    res.setdefault("parse_errors", {})[f] = repr(e)
        # A second dump: the pipe keeps serving.
        t0 = time.monotonic()
        dump2 = frpipe.request_dump({**env}, 0, timeout=15)
        res["second_dump"] = dump2 is not None
        res["second_dump_seconds"] = time.monotonic() - t0
    except Exception:  # noqa: BLE001
        res["error"] = traceback.format_exc()
    finally:
        kill(p)
    SUMMARY["fr"] = res


def part_wait() -> None:
    """A CUDA rank blocked at a device sync point behind a long kernel."""
    code = COMMON + textwrap.dedent("""
    x = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")   # 2 GiB held
    n = cycles_for(14)
    torch.cuda._sleep(n); mark("sync_wait")
    torch.cuda.synchronize(); mark("sync_done")
    y = torch.ones(4, device="cuda"); torch.cuda._sleep(n); z = (y * 2).sum()
    mark("item_wait")
    v = z.item(); mark("item_done")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(n)
    ev = torch.cuda.Event(); ev.record(s)
    mark("event_wait"); ev.synchronize(); mark("event_done")
    """)
    p, logf = child(code, {}, "wait_job")
    res: dict = {}
    try:
        for phase in ("sync_wait", "item_wait", "event_wait"):
            if not wait_for(logf, f"PROBE {phase}", 120, p):
                res[phase] = "never reached"
                continue
            time.sleep(2)
            r: dict = {"pyspy1": pyspy(p.pid, f"wait_{phase}_1")}
            r["proc"] = proc_facts(p.pid, 2.0)
            r["nvml"] = nvml_facts()
            r["pyspy2"] = pyspy(p.pid, f"wait_{phase}_2")
            r["pyspy_native"] = pyspy(p.pid, f"wait_{phase}_native", ("--native",))
            r["pid"] = p.pid
            res[phase] = r
            done = phase.replace("wait", "done")
            wait_for(logf, f"PROBE {done}", 60, p)
    except Exception:  # noqa: BLE001
        res["error"] = traceback.format_exc()
    finally:
        kill(p)
    SUMMARY["wait"] = res


def part_wd() -> None:
    """The real NCCL watchdog timeout: a collective queued behind a 60 s kernel, 12 s timeout."""
    d = Path("/tmp/probe_wd"); shutil.rmtree(d, ignore_errors=True); d.mkdir()
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": "29612", "TORCH_FR_BUFFER_SIZE": "2000",
           "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
           "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": str(d / "nccl_trace_rank_"),
           "TORCH_FR_DUMP_TEMP_FILE": str(d / "nccl_trace_rank_"),
           "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": str(d / "pipe_"),
           "TORCH_NCCL_DUMP_ON_TIMEOUT": "1", "NCCL_DEBUG": "WARN",
           "TORCHELASTIC_ERROR_FILE": str(d / "error.json")}
    code = COMMON + textwrap.dedent("""
    dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=12),
                            device_id=torch.device("cuda:0"))
    t = torch.ones(1 << 20, device="cuda")
    for _ in range(3):
        dist.all_reduce(t)
    torch.cuda.synchronize()
    n = cycles_for(75)
    torch.cuda._sleep(n)
    dist.all_reduce(t)
    mark("stuck")
    v = t.sum().item()
    mark("unexpected_done")
    """)
    p, logf = child(code, env, "watchdog_job")
    res: dict = {}
    try:
        if wait_for(logf, "PROBE stuck", 90, p):
            t_stuck = time.monotonic()
            time.sleep(3)
            res["pyspy_item"] = pyspy(p.pid, "wd_item_wait")
            res["proc"] = proc_facts(p.pid, 2.0)
            time.sleep(3)
            res["pyspy_item2"] = pyspy(p.pid, "wd_item_wait_2")
            # Wait for the watchdog to fire and the process to go down.
            try:
                p.wait(100)
            except subprocess.TimeoutExpired:
                res["still_alive_after_100s"] = True
                res["pyspy_late"] = pyspy(p.pid, "wd_late")
            res["exit_seconds_after_stuck"] = time.monotonic() - t_stuck
            res["returncode"] = p.returncode
        else:
            res["never_stuck"] = True
        res["files"] = sorted(os.listdir(d))
        for f in sorted(os.listdir(d)):
            if f.startswith("nccl_trace_rank_") or f == "error.json":
                save(f"wd/{f}", (d / f).read_bytes())
    except Exception:  # noqa: BLE001
        res["error"] = traceback.format_exc()
    finally:
        kill(p)
    SUMMARY["wd"] = res


if __name__ == "__main__":
    for part in (part_env, part_fr, part_wait, part_wd):
        log("start", part.__name__)
        try:
            part()
        except Exception:  # noqa: BLE001
            SUMMARY[part.__name__] = {"error": traceback.format_exc()}
        save("summary.json", SUMMARY)
        log("end", part.__name__)
    log("all done")
