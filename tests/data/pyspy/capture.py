"""Capture real py-spy dumps of the demo job's and the frameworks' ranks as fixtures.

    .venv/bin/python tests/data/pyspy/capture.py [NAME ...]

For each capture below: start the job under real torchrun, wait for its
NCCLWATCH_DEMO marker lines to say the ranks are in the interesting state,
run `py-spy dump --json --nonblocking --pid PID` on each rank and store the
raw output as <name>__rank<N>.json, then let the job finish. manifest.json
records the expected classification of each dump's main thread; this script
checks the dumps against it (frames present, outermost c10d op) and fails
loudly when torch's stacks no longer look as expected.

FRAMEWORKS run tests/workloads/fw_*.py instead (Lightning, transformers,
accelerate, DeepSpeed, DCP, FSDP1) with their checkpoint dir on a throttlefs
mount (ncclwatch.demo.throttlefs) paced so the save lasts while py-spy looks;
the expected frame may sit on another thread than the main one (DCP's
async writer), and the manifest's state is the rank's (signatures.classify_rank).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
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
            "all_gather_into_tensor", "reduce_scatter_tensor", "all_gather_single",
            "reduce_scatter_single", "send_object_list", "recv_object_list"}
#: The op a frame's name stands for where the two differ.
OP_OF = {"all_gather_into_tensor": "all_gather", "all_gather_single": "all_gather",
         "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter_single": "reduce_scatter",
         "send_object_list": "send", "recv_object_list": "recv"}


def cap(name, scenario, nproc, args, wait, expect, ranks=None, script=None,
        write_rate=None, read_rate=None, env=None, settle=1.5):
    """wait: markers (phase, rank) to see first; expect: rank -> (state, op,
    a frame name that must be on the rank's stack). script: a workload under
    tests/workloads run instead of ncclwatch.demo.job, with --ckpt-dir on a
    throttlefs mount paced at write_rate/read_rate bytes/s."""
    return dict(name=name, scenario=scenario, nproc=nproc, args=args,
                wait=wait, expect=expect, ranks=ranks or sorted(expect), script=script,
                write_rate=write_rate, read_rate=read_rate, env=env or {}, settle=settle)


def fw(name, script, nproc, args, wait, expect, write_rate=None, read_rate=None, env=None,
       settle=1.5):
    """A framework workload (tests/workloads/SCRIPT) saving to a slow FUSE mount."""
    return cap(name, name, nproc, args, wait, expect, script=script, write_rate=write_rate,
               read_rate=read_rate, env=env, settle=settle)


def park(op, with_rank0=False):
    exp = {1: ("collective", OP_OF.get(op, op), op)}
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

FRAMEWORKS = [
    # Lightning: rank 0 in _atomic_save's fsspec commit (a move onto the slow mount),
    # rank 1 in the strategy barrier of Trainer.save_checkpoint.
    fw("lightning-ckpt", "fw_lightning.py", 2, ["--model-mb", "8"],
       [("save_start", 0), ("wait_start", 1)],
       {0: ("saving", None, "_atomic_save"), 1: ("collective", "barrier", "barrier")},
       write_rate=500_000, settle=3.0),
    fw("pl-ckpt", "fw_lightning.py", 2, ["--model-mb", "8", "--pkg", "pytorch_lightning"],
       [("save_start", 0), ("wait_start", 1)],
       {0: ("saving", None, "_atomic_save"), 1: ("collective", "barrier", "barrier")},
       write_rate=500_000, settle=3.0),
    # Lightning resuming: every rank restores the checkpoint (read paced).
    fw("lightning-restore", "fw_lightning.py", 2, ["--model-mb", "8", "--resume", "1"],
       [("load_start", 0), ("load_start", 1)],
       {0: ("loading", None, "_restore_modules_and_callbacks"),
        1: ("loading", None, "_restore_modules_and_callbacks")},
       read_rate=1_000_000, settle=2.0),
    # transformers Trainer: process 0 in save_pretrained (safetensors); rank 1 already
    # in the next step's token count gather.
    fw("hf-trainer-ckpt", "fw_hf_trainer.py", 2, ["--model-mb", "8"],
       [("save_start", 0), ("wait_start", 1)],
       {0: ("saving", None, "save_pretrained"),
        1: ("collective", "all_gather", "_get_num_items_in_batch")},
       write_rate=1_000_000, settle=2.5),
    fw("accelerate-save-state", "fw_accelerate.py", 2,
       ["--model-mb", "8", "--mode", "save_state"], [("save_start", 0), ("wait_start", 1)],
       {0: ("saving", None, "save_state"), 1: ("collective", "barrier", "wait_for_everyone")},
       write_rate=1_000_000, settle=2.0),
    fw("accelerate-save-model", "fw_accelerate.py", 2,
       ["--model-mb", "8", "--mode", "save_model"], [("save_start", 0), ("wait_start", 1)],
       {0: ("saving", None, "save_model"), 1: ("collective", "barrier", "wait_for_everyone")},
       write_rate=1_000_000, settle=2.0),
    fw("accelerate-load-state", "fw_accelerate.py", 2,
       ["--model-mb", "8", "--mode", "load_state"], [("load_start", 0), ("wait_start", 1)],
       {0: ("loading", None, "load_state"), 1: ("collective", "barrier", "wait_for_everyone")},
       read_rate=1_000_000, settle=2.0),
    fw("deepspeed-16bit", "fw_deepspeed.py", 2, ["--model-mb", "8", "--mode", "16bit"],
       [("save_start", 0), ("wait_start", 1)],
       {0: ("saving", None, "save_16bit_model"), 1: ("collective", "barrier", "barrier")},
       write_rate=1_000_000, settle=2.0),
    fw("deepspeed-ckpt", "fw_deepspeed.py", 2, ["--model-mb", "8", "--mode", "checkpoint"],
       [("save_start", 0), ("wait_start", 1)],
       {0: ("saving", None, "save_checkpoint"), 1: ("saving", None, "save_checkpoint")},
       write_rate=1_000_000, settle=2.0),
    # DCP async_save: the main thread waits in Future.result, DCP's thread writes.
    fw("dcp-async-save", "fw_torch.py", 2, ["--model-mb", "8", "--mode", "dcp-async"],
       [("save_start", 0), ("wait_start", 1)],
       {0: ("saving", None, "write_data"), 1: ("saving", "gather_object", "save_wrapper")},
       write_rate=1_000_000, settle=3.0),
    fw("fsdp1-full-load", "fw_torch.py", 2, ["--model-mb", "8", "--mode", "fsdp1-load"],
       [("load_start", 0), ("wait_start", 1)],
       {0: ("loading", None, "load"),
        1: ("loading", "all_gather", "_full_pre_load_state_dict_hook")},
       read_rate=1_000_000, settle=2.0),
]
CAPTURES += FRAMEWORKS
CAPTURES += [park(op) for op in ["all_gather_single", "all_gather_into_tensor",
                                 "reduce_scatter_single", "reduce_scatter_tensor",
                                 "send_object_list", "recv_object_list"]]

MARK = re.compile(r"NCCLWATCH_DEMO phase=(\S+) rank=(\d+) pid=(\d+)")


def mount_throttlefs(c, top: Path) -> tuple[subprocess.Popen, Path]:
    backing, mnt = top / "backing", top / "mnt"
    backing.mkdir()
    mnt.mkdir()
    argv = [sys.executable, "-m", "ncclwatch.demo.throttlefs", str(backing), str(mnt)]
    if c["write_rate"]:
        argv += ["--write-rate", str(c["write_rate"])]
    if c["read_rate"]:
        argv += ["--read-rate", str(c["read_rate"])]
    fs = subprocess.Popen(argv, cwd=REPO)
    deadline = time.time() + 20
    while not os.path.ismount(mnt):
        if fs.poll() is not None or time.time() > deadline:
            raise RuntimeError(f"throttlefs did not mount {mnt}")
        time.sleep(0.05)
    return fs, mnt


def run_capture(c) -> tuple[list[dict], list[str]]:
    if not c["script"]:
        return _run_capture(c, [TORCHRUN, "--standalone", "--nproc-per-node", str(c["nproc"]),
                                "-m", "ncclwatch.demo.job", "--scenario", c["scenario"],
                                "--pg-timeout", "60", *c["args"]])
    with tempfile.TemporaryDirectory(prefix="capture-") as top:
        fs, mnt = mount_throttlefs(c, Path(top))
        try:
            return _run_capture(c, [TORCHRUN, "--standalone", "--nproc-per-node",
                                    str(c["nproc"]), str(HERE.parents[1] / "workloads" /
                                                         c["script"]),
                                    "--ckpt-dir", str(mnt), "--pg-timeout", "60", *c["args"]])
        finally:
            subprocess.run(["fusermount", "-u", "-z", str(mnt)], check=False)
            fs.wait(10)


def _run_capture(c, cmd) -> tuple[list[dict], list[str]]:
    print(f"\n=== {c['name']}: {' '.join(cmd[1:])}", flush=True)
    t0 = time.time()
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1",
           "OMP_NUM_THREADS": "1", **c["env"]}
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env=env)
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
        time.sleep(c["settle"])  # let the ranks get from the print into the op
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
        return OP_OF.get(ops[-1], ops[-1])  # frames are innermost first
    if any(fn(f) == "wait_tensor" for f in frames):
        return "wait"
    return None


def check(fname, raw: bytes, pid, op, frame) -> list[str]:
    dump = json.loads(raw)
    main = main_thread(dump, pid)
    # the rank's state may come from another of its threads (DCP's async writer)
    owner = next((t for t in [main, *dump] if frame in [fn(f) for f in t["frames"]]), main)
    frames = owner["frames"] if owner is not main and op else main["frames"]
    kb = len(raw) / 1024
    for t in dump:
        print(f"{fname} ({kb:.0f} KB) thread {t.get('thread_name')} "
              f"{'(main) ' if t is main else ''}innermost first:")
        for f in t["frames"]:
            print(f"    {f['name']} ({f['short_filename']}:{f['line']})")
    errs = []
    if kb > 200:
        errs.append(f"{fname}: {kb:.0f} KB > 200 KB")
    # the frame may be on another thread: DCP async_save writes in its own thread
    if frame not in [fn(f) for t in dump for f in t["frames"]]:
        errs.append(f"{fname}: frame {frame!r} not on any thread")
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
