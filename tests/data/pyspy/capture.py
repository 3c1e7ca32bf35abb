"""Capture real py-spy dumps of the demo job's ranks as test fixtures.

    .venv/bin/python tests/data/pyspy/capture.py [NAME ...]

For each capture below: start the job under real torchrun, wait for its
NCCLWATCH_DEMO marker lines to say the ranks are in the interesting state,
run `py-spy dump --json --nonblocking --pid PID` on each rank and store the
raw output as <name>__rank<N>.json, then let the job finish. manifest.json
records the expected classification of each dump's main thread; this script
checks the dumps against it (frames present, outermost c10d op) and fails
loudly when torch's stacks no longer look as expected.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
VENV_BIN = Path(sys.executable).parent
TORCHRUN = str(VENV_BIN / "torchrun")
PYSPY = str(VENV_BIN / "py-spy")

# Collective ops as py-spy names their frames in distributed_c10d.py.
C10D_OPS = {"barrier", "broadcast", "all_reduce", "all_gather", "gather",
            "scatter", "reduce_scatter", "send", "recv", "all_gather_object",
            "gather_object", "broadcast_object_list", "monitored_barrier",
            "all_gather_into_tensor", "reduce_scatter_tensor"}


def cap(name, scenario, nproc, args, wait, expect, ranks=None):
    """wait: markers (phase, rank) to see first; expect: rank -> (state, op,
    a frame name that must be on the main thread's stack)."""
    return dict(name=name, scenario=scenario, nproc=nproc, args=args,
                wait=wait, expect=expect, ranks=ranks or sorted(expect))


def park(op, with_rank0=False):
    exp = {1: ("collective", op, op)}
    if with_rank0:  # time.sleep in plain user code: from the stack alone
        exp[0] = ("compute", None, "_busy_elsewhere")  # that is compute
    return cap(f"park-{op}", "park", 2, ["--op", op, "--save-seconds", "5"],
               [("busy_start", 0), ("wait_start", 1)], exp)


CAPTURES = [
    cap("slow-save", "slow-save", 2, ["--model-mb", "16", "--save-seconds", "6"],
        [("save_start", 0), ("wait_start", 1)],
        {0: ("saving", None, "_save"), 1: ("collective", "barrier", "barrier")}),
    cap("fsdp-gather-slow", "fsdp-gather-slow", 2,
        ["--model-mb", "16", "--save-seconds", "6"],
        [("gather_start", 0), ("gather_start", 1)],
        {0: ("gathering_state_dict", None, "_gather_state_dict"),
         1: ("gathering_state_dict", "wait", "wait_tensor")}),
    cap("slow-load", "slow-load", 2, ["--model-mb", "16", "--save-seconds", "6"],
        [("load_start", 0), ("wait_start", 1)],
        {0: ("loading", None, "load"), 1: ("collective", "broadcast", "broadcast")}),
    cap("compute", "compute", 2, ["--save-seconds", "5"],
        [("compute_start", 0), ("compute_start", 1)],
        {0: ("compute", None, "scenario_compute")}),
    cap("dataloader", "dataloader", 2, ["--save-seconds", "5"],
        [("dataloader_start", 0), ("dataloader_start", 1)],
        {0: ("dataloader", None, "__next__")}),
    cap("dataloader-workers1", "dataloader", 2,
        ["--save-seconds", "6", "--num-workers", "1"],
        [("dataloader_start", 0), ("dataloader_start", 1)],
        {0: ("dataloader", None, "__next__")}),
    park("barrier", with_rank0=True),
    *[park(op) for op in [
        "broadcast", "all_reduce", "all_gather", "gather", "scatter",
        "reduce_scatter", "gather_object", "all_gather_object",
        "broadcast_object_list", "monitored_barrier", "recv", "send"]],
]

MARK = re.compile(r"NCCLWATCH_DEMO phase=(\S+) rank=(\d+) pid=(\d+)")


def run_capture(c) -> tuple[list[dict], list[str]]:
    cmd = [TORCHRUN, "--standalone", "--nproc-per-node", str(c["nproc"]),
           "-m", "ncclwatch.demo.job", "--scenario", c["scenario"],
           "--pg-timeout", "60", *c["args"]]
    print(f"\n=== {c['name']}: {' '.join(cmd[1:])}", flush=True)
    t0 = time.time()
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    seen, pids, lines = set(), {}, []

    def read():
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            m = MARK.search(line)
            if m:
                seen.add((m[1], int(m[2])))
                pids[int(m[2])] = int(m[3])

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    entries, errors = [], []
    try:
        deadline = time.time() + 120
        while not all(w in seen for w in c["wait"]):
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError("job ended or timed out before the markers:\n"
                                   + "\n".join(lines[-30:]))
            time.sleep(0.1)
        time.sleep(1.5)  # let the ranks get from the print into the op
        for rank in c["ranks"]:
            out = subprocess.run([PYSPY, "dump", "--json", "--nonblocking",
                                  "--pid", str(pids[rank])],
                                 capture_output=True, timeout=30)
            if out.returncode:
                raise RuntimeError(f"py-spy failed: {out.stderr.decode()}")
            fname = f"{c['name']}__rank{rank}.json"
            (HERE / fname).write_bytes(out.stdout)
            state, op, frame = c["expect"][rank]
            entries.append(dict(file=fname, scenario=c["name"], rank=rank,
                                state=state, op=op))
            errors += check(fname, out.stdout, pids[rank], op, frame)
        rc = proc.wait(timeout=120)
        reader.join(timeout=5)
        if rc != 0:
            raise RuntimeError(f"torchrun exit {rc}:\n" + "\n".join(lines[-30:]))
        print(f"--- ok in {time.time() - t0:.1f}s", flush=True)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return entries, errors


def main_thread(dump: list[dict], pid: int) -> dict:
    for t in dump:
        if t.get("os_thread_id") == pid or t.get("thread_name") == "MainThread":
            return t
    raise RuntimeError("no main thread in dump")


def fn(frame: dict) -> str:
    """Function name: py-spy on Python 3.11+ gives the qualified name
    (`_BaseDataLoaderIter.__next__`, `_exception_logger.<locals>.wrapper`)."""
    return frame["name"].rsplit(".", 1)[-1]


def outermost_op(frames: list[dict]) -> str | None:
    ops = [fn(f) for f in frames if fn(f) in C10D_OPS
           and f["filename"].endswith("distributed/distributed_c10d.py")]
    if ops:
        return ops[-1]  # frames are innermost first
    if any(fn(f) == "wait_tensor" for f in frames):
        return "wait"
    return None


def check(fname, raw: bytes, pid, op, frame) -> list[str]:
    frames = main_thread(json.loads(raw), pid)["frames"]
    kb = len(raw) / 1024
    print(f"{fname} ({kb:.0f} KB, {len(frames)} frames, main thread innermost first):")
    for f in frames:
        print(f"    {f['name']} ({f['short_filename']}:{f['line']})")
    errs = []
    if kb > 200:
        errs.append(f"{fname}: {kb:.0f} KB > 200 KB")
    if frame not in [fn(f) for f in frames]:
        errs.append(f"{fname}: frame {frame!r} not on the main thread")
    if outermost_op(frames) != op:
        errs.append(f"{fname}: outermost op {outermost_op(frames)!r} != {op!r}")
    return errs


def main(argv: list[str]) -> int:
    todo = [c for c in CAPTURES if not argv or c["name"] in argv]
    manifest_path = HERE / "manifest.json"
    old = {}
    if argv and manifest_path.exists():  # partial rerun: keep the others
        old = {e["file"]: e for e in json.loads(manifest_path.read_text())["fixtures"]}
    errors = []
    for c in todo:
        entries, errs = run_capture(c)
        errors += errs
        old.update({e["file"]: e for e in entries})
    import torch  # only for the versions in the manifest
    spy = subprocess.run([PYSPY, "--version"], capture_output=True, text=True)
    manifest = {
        "generated_by": "tests/data/pyspy/capture.py",
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "py_spy": spy.stdout.split()[-1],
        "fixtures": sorted(old.values(), key=lambda e: e["file"]),
    }
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
    for e in errors:
        print("MISMATCH:", e)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
