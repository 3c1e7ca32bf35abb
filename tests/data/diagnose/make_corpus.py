"""Regenerate the real-run cases of the `ncclwatch diagnose` corpus.

    .venv/bin/python tests/data/diagnose/make_corpus.py [CASE ...]

Each case runs jobs/train.py under the venv's real torchrun (gloo on CPU,
short process-group timeouts) with a fault injected, records what the job
wrote exactly as a user would have it (torchrun's stdout+stderr, and the
per-rank files where the case uses --log-dir, a Slurm-style labelled log, a
gzipped log, Flight Recorder dumps), and writes cases/<name>/expected.json.
The notes in expected.json cite file:line of the key lines, found by the
`evidence` patterns below; a pattern that no longer matches fails the run,
so a torch upgrade that changes the messages is noticed here.

Runs one job at a time (the machine may be small); about 15 minutes in all.
Cases written from torch sources (origin "written from ...") are made by
written/w*.py (templates with fixed seeds) and are not touched here.
"""

from __future__ import annotations

import fnmatch
import gzip
import json
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
CASES = HERE / "cases"
JOB = HERE / "jobs" / "train.py"
VENV_BIN = Path(sys.executable).parent
TORCHRUN = str(VENV_BIN / "torchrun")
OUT = "/tmp/ncclwatch-corpus/out"  # the jobs' checkpoint dir, stable in the logs
FR_DIR = "/tmp/ncclwatch-corpus/fr"  # where ranks write Flight Recorder dumps


@dataclass
class Case:
    name: str
    cls: str
    initiating: list[int]
    collateral: list[int] | None
    nproc: int
    job_args: list[str]
    notes: str
    evidence: list[tuple[str, str]]  # (file glob, regex): cited in notes
    layout: str = "console"  # console | logdir | redirects | fr | slurm | gz
    env: dict[str, str] = field(default_factory=dict)
    expect_rc: int | None = None  # None: any non-zero
    nnodes: int = 1


def torch_version():
    import torch
    return torch.__version__


def job(*args, timeout=10):
    return ["--timeout", str(timeout), "--out", OUT, *map(str, args)]


RUNS = [
    Case("healthy_finish", "none", [], [], 4, job(),
         "Trains 200 steps, saves two checkpoints and exits 0; no error lines.",
         [("console.log", r"Saving model checkpoint to"),
          ("console.log", r"Training completed")], expect_rc=0),
    Case("save_overrun_console", "checkpoint_gather_timeout", [0], [1, 2, 3], 4,
         job("--fault", "save_overrun", "--save-seconds", 40),
         "Rank 0 logs 'Saving model checkpoint to', consolidates the ZeRO shards "
         "and writes slowly; ranks 1-3 wait in dist.barrier() and hit the 10 s "
         "gloo timeout; rank 0 never reports an error and torchrun SIGTERMs it "
         "(exitcode -15), so its save is cut short.",
         [("console.log", r"Saving model checkpoint to"),
          ("console.log", r"Timed out waiting"),
          ("console.log", r"in barrier"),
          ("console.log", r"Root Cause")]),
    Case("save_overrun_logdir", "checkpoint_gather_timeout", [0], [1, 2, 3], 4,
         job("--fault", "save_overrun", "--save-seconds", 40),
         "Same failure as save_overrun_console, launched with --log-dir logs "
         "--tee 3: per-rank stdout.log/stderr.log under logs/<run>/attempt_0/<local_rank>/ "
         "plus the console copy.",
         [("logs/*/0/stdout.log", r"Saving model checkpoint to"),
          ("logs/*/1/stderr.log", r"Timed out waiting"),
          ("console.log", r"Root Cause")], layout="logdir"),
    Case("save_overrun_redirects", "checkpoint_gather_timeout", [0], [1], 2,
         job("--fault", "save_overrun", "--save-seconds", 40),
         "Two ranks, launched with --log-dir logs --redirects 3: the console has "
         "only torchrun's own lines; the workers' output is only in the per-rank "
         "files. Rank 0 saves, rank 1 times out in barrier.",
         [("logs/*/0/stdout.log", r"Saving model checkpoint to"),
          ("logs/*/1/stderr.log", r"Timed out waiting"),
          ("console.log", r"Root Cause")], layout="redirects"),
    Case("save_overrun_flight_recorder", "checkpoint_gather_timeout", [0], [1, 2, 3], 4,
         job("--fault", "save_overrun", "--save-seconds", 40, "--fr-dir", "FRDIR",
             "--steps", 60, "--save-steps", 30),
         "As save_overrun_console with TORCH_FR_BUFFER_SIZE=2000: each rank that "
         "catches the timeout writes nccl_trace_rank_<rank> beside the log, and "
         "rank 0 (still inside torch.save) dumps from a timer thread. In the dumps "
         "ranks 1-3's last entry is a gloo:barrier one collective_seq_id after "
         "rank 0's last entry (a gloo:broadcast of the ZeRO consolidation): rank 0 "
         "never reached the barrier. On gloo every entry stays state 'scheduled' "
         "and pg_status says last_completed_collective == last_enqueued even for "
         "the barrier that timed out, so only the sequence ids tell.",
         [("console.log", r"Saving model checkpoint to"),
          ("console.log", r"wrote Flight Recorder dump"),
          ("console.log", r"Timed out waiting")],
         layout="fr", env={"TORCH_FR_BUFFER_SIZE": "2000"}),
    Case("hang_compute", "collective_hang", [2], [0, 1, 3], 4,
         job("--fault", "hang_compute", "--fault-rank", 2, "--fault-step", 70),
         "Rank 2 runs an evaluation loop only it runs (pure compute) at step 70 "
         "and never joins the metric all_reduce; ranks 0, 1 and 3 time out in "
         "all_reduce; rank 2 prints no error and is SIGTERMed.",
         [("console.log", r"Timed out waiting"),
          ("console.log", r"in all_reduce"),
          ("console.log", r"Root Cause")]),
    Case("hang_sleep_gz", "collective_hang", [1], [0, 2], 3,
         job("--fault", "hang_sleep", "--fault-rank", 1, "--fault-step", 300,
             "--steps", 400, "--save-steps", 200),
         "Rank 1 sleeps (stuck input pipeline) at step 300 after a checkpoint at "
         "step 200 that went fine; ranks 0 and 2 time out in all_reduce. The log "
         "is gzipped (console.log.gz); the successful save at step 200 is a red "
         "herring.",
         [("console.log.gz", r"Saving model checkpoint to"),
          ("console.log.gz", r"Timed out waiting"),
          ("console.log.gz", r"Root Cause")], layout="gz"),
    Case("desync_op", "desync", [1], [0, 2, 3], 4,
         job("--fault", "desync_op", "--fault-rank", 1, "--fault-step", 50),
         "At step 50 rank 1 calls dist.broadcast while ranks 0, 2, 3 call "
         "dist.all_reduce (a code path only rank 1 takes).",
         [("console.log", r"\[rank1\]:\s+dist\.broadcast"),
          ("console.log", r"\[rank0\]:\s+dist\.all_reduce\(stat\)")]),
    Case("desync_detail", "desync", [1], [0, 2, 3], 4,
         job("--fault", "desync_op", "--fault-rank", 1, "--fault-step", 50, "--no-ddp"),
         "As desync_op with TORCH_DISTRIBUTED_DEBUG=DETAIL (gradients averaged "
         "with plain all_reduce: DDP segfaults under DETAIL on torch 2.13 CPU): "
         "torch's ProcessGroupWrapper reports the mismatch itself on every rank, "
         "each message naming rank 1's BROADCAST against an ALLREDUCE.",
         [("console.log", r"Detected mismatch between collectives")],
         env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}),
    Case("desync_shape", "desync", [3], [0, 1, 2], 4,
         job("--fault", "desync_shape", "--fault-rank", 3, "--fault-step", 50),
         "At step 50 rank 3 all_reduces a 3-element tensor (its traceback shows "
         "the different call) while the others all_reduce 2 "
         "elements. gloo lets ranks 0-2 through with the mismatched size; they "
         "move on to the next step's DDP gradient all_reduce inside "
         "loss.backward() while rank 3 is still in its own all_reduce: the ranks "
         "are in different collectives. Ranks that outlive their peers then get "
         "gloo's 'Connection closed by peer ... typically caused by a remote "
         "worker crashing', a red herring: nobody crashed first.",
         [("console.log", r"all_reduce\(torch\.tensor\(\[loss\.item\(\), 1\.0, 0\.0\]\)\)"),
          ("console.log", r"loss\.backward\(\)"),
          ("console.log", r"Connection closed by peer")]),
    Case("gather_oom", "gather_oom", [0], [1, 2, 3], 4,
         job("--fault", "gather_oom"),
         "While consolidating the ZeRO optimizer shards for the checkpoint at "
         "step 100, rank 0 runs out of host memory (an address-space cap set "
         "just before): MemoryError inside ZeroRedundancyOptimizer."
         "consolidate_state_dict/_broadcast_object. The other ranks, still "
         "sending their shards, then get gloo's 'Connection closed by peer ... "
         "typically caused by a remote worker crashing' (collateral).",
         [("console.log", r"Saving model checkpoint to"),
          ("console.log", r"consolidate_state_dict"),
          ("console.log", r"(can't allocate memory|MemoryError)"),
          ("console.log", r"Connection closed by peer")]),
    Case("gather_alloc_oom", "gather_oom", [0], [1, 2, 3], 4,
         job("--fault", "gather_alloc_oom"),
         "Saving the checkpoint at step 100, rank 0 materialises the full state "
         "in one buffer under an address-space cap: torch's CPU allocator refuses "
         "it ('DefaultCPUAllocator: can't allocate memory'); the other ranks wait "
         "in the ZeRO consolidation and fail after it (collateral).",
         [("console.log", r"Saving model checkpoint to"),
          ("console.log", r"can't allocate memory")]),
    Case("monitored_barrier_hang", "collective_hang", [2], [0, 1, 3], 4,
         job("--fault", "monitored_barrier", "--fault-rank", 2, "--fault-step", 40),
         "At step 40 rank 2 gets stuck before the trainer's sanity "
         "dist.monitored_barrier(); rank 0's monitored_barrier names it ('Rank 2 "
         "failed to pass monitoredBarrier in 10000 ms'), ranks 1 and 3 wait.",
         [("console.log", r"failed to pass monitoredBarrier"),
          ("console.log", r"Root Cause")]),
    Case("crash_exception", "rank_crash", [1], [0, 2, 3], 4,
         job("--fault", "raise", "--fault-rank", 1, "--fault-step", 45),
         "Rank 1 raises ValueError at step 45 (bad batch); torchrun tears the "
         "job down. Any connection errors on the others are collateral.",
         [("console.log", r"ValueError: Batch at step"),
          ("console.log", r"Root Cause")]),
    Case("crash_sigkill", "rank_crash", [3], [0, 1, 2], 4,
         job("--fault", "sigkill", "--fault-rank", 3, "--fault-step", 45),
         "Rank 3 is SIGKILLed at step 45 (no OOM, no dmesg); torchrun's summary "
         "shows exitcode -9 / Signal 9 (SIGKILL). The survivors' gloo 'Read error ... "
         "Connection reset by peer' is collateral.",
         [("console.log", r"exitcode\s*: -9"),
          ("console.log", r"SIGKILL")]),
    Case("crash_abort", "rank_crash", [3], [0, 1, 2], 4,
         job("--fault", "abort", "--fault-rank", 3, "--fault-step", 45),
         "Rank 3 calls os.abort() at step 45: exitcode -6 / Signal 6 (SIGABRT) "
         "for rank 3 only (not the watchdog pattern, where every rank aborts); the "
         "survivors' gloo 'Read error ... Connection reset by peer' is collateral.",
         [("console.log", r"exitcode\s*: -6"),
          ("console.log", r"SIGABRT")]),
    Case("crash_segfault", "rank_crash", [2], [0, 1, 3], 4,
         job("--fault", "segfault", "--fault-rank", 2, "--fault-step", 45),
         "Rank 2 dereferences NULL (ctypes.string_at(0)) at step 45: exitcode "
         "-11 / Signal 11 (SIGSEGV), no Python traceback from rank 2 (faulthandler "
         "off); the survivors' gloo 'Read error ... Connection reset by peer' is "
         "collateral.",
         [("console.log", r"exitcode\s*: -11"),
          ("console.log", r"SIGSEGV")]),
    Case("network_cut_links", "network_error", [0, 1, 2, 3], None, 4,
         job("--fault", "cut_links", "--fault-rank", 1, "--fault-step", 45),
         "At step 45 rank 1's peer-to-peer TCP connections are shut down while "
         "every process stays alive (a link failure). All four ranks report "
         "gloo's 'Connection closed by peer' first-hand, no rank died before "
         "(no other exception, no signal; the -15 exits are torchrun's "
         "teardown). The logs cannot tell which link broke, so every reporting "
         "rank counts as initiating and no collateral ranks are given. gloo's "
         "hint 'typically caused by a remote worker crashing' is wrong here.",
         [("console.log", r"\[rank0\]: RuntimeError: .*Connection closed by peer"),
          ("console.log", r"\[rank1\]: RuntimeError: .*Connection closed by peer"),
          ("console.log", r"Root Cause")]),
    Case("slurm_two_nodes_hang", "collective_hang", [3], [0, 1, 2], 2,
         job("--fault", "hang_sleep", "--fault-rank", 3, "--fault-step", 55),
         "Two 'nodes' (two torchrun agents, --nnodes 2 --node-rank 0/1, static "
         "rendezvous on 127.0.0.1) with their output merged and labelled as "
         "`srun --label` does (task id prefix '0: ' / '1: '). Global rank 3 "
         "(node 1, local rank 1) stops at step 55; ranks 0-2 time out in "
         "all_reduce.",
         [("slurm-4242.out", r"Timed out waiting"),
          ("slurm-4242.out", r"Root Cause")], layout="slurm", nnodes=2),
    Case("slurm_two_nodes_late_start", "none", [], [], 2,
         job("--steps", 80, "--save-steps", 40, timeout=20),
         "Two labelled 'nodes'; node 1's agent starts 4 s before node 0's and "
         "waits for the rendezvous store (torch 2.13 retries silently); then the "
         "job trains, saves twice and both agents exit 0.",
         [("slurm-4243.out", r"^1: .*joined the process group"),
          ("slurm-4243.out", r"Training completed")], layout="slurm", nnodes=2,
         expect_rc=0),
]


def run_job(case, tmp):
    """Run the case's job; returns the case's files (name -> bytes)."""
    fr_dir = Path(FR_DIR)
    shutil.rmtree(fr_dir, ignore_errors=True)
    args = [a.replace("FRDIR", FR_DIR) for a in case.job_args]
    env = {**__import__("os").environ, **case.env,
           "PYTHONUNBUFFERED": "1"}
    files = {}
    if case.layout == "slurm":
        return run_slurm(case, tmp, args, env)
    cmd = [TORCHRUN, "--standalone", "--nproc-per-node", str(case.nproc)]
    if case.layout == "logdir":
        cmd += ["--log-dir", str(tmp / "logs"), "--tee", "3"]
    elif case.layout == "redirects":
        cmd += ["--log-dir", str(tmp / "logs"), "--redirects", "3"]
    cmd += [str(JOB), *args]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       env=env, cwd=tmp, timeout=600)
    check_rc(case, p.returncode)
    if case.layout == "gz":
        files["console.log.gz"] = gzip.compress(p.stdout, mtime=0)
    else:
        files["console.log"] = p.stdout
    if case.layout in ("logdir", "redirects"):
        for f in sorted((tmp / "logs").rglob("*")):
            if f.is_file():
                files[str(f.relative_to(tmp))] = f.read_bytes()
    if case.layout == "fr":
        for f in sorted(fr_dir.glob("nccl_trace_rank_*")):
            files[f.name] = f.read_bytes()
        missing = [r for r in range(case.nproc) if f"nccl_trace_rank_{r}" not in files]
        if missing:
            raise SystemExit(f"{case.name}: no Flight Recorder dump from ranks {missing}")
    return files


def run_slurm(case, tmp, args, env):
    """Two torchrun agents as two Slurm tasks; merge their output with
    srun --label's task-id prefix, in arrival order, into slurm-<jobid>.out."""
    port = free_port()
    lines, lock = [], threading.Lock()
    procs = []
    order = [1, 0] if case.expect_rc == 0 else [0, 1]  # late start: node 1 first

    def pump(task, stream):
        for raw in iter(stream.readline, b""):
            with lock:
                lines.append(f"{task}: ".encode() + raw)

    for i, node in enumerate(order):
        if i and case.expect_rc == 0:
            time.sleep(4)
        cmd = [TORCHRUN, "--nnodes", str(case.nnodes), "--nproc-per-node",
               str(case.nproc), "--node-rank", str(node), "--master-addr",
               "127.0.0.1", "--master-port", str(port), str(JOB), *args]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             env={**env, "SLURM_JOB_ID": case_jobid(case),
                                  "SLURM_PROCID": str(node)}, cwd=tmp)
        t = threading.Thread(target=pump, args=(node, p.stdout), daemon=True)
        t.start()
        procs.append((p, t))
    rcs = []
    for p, t in procs:
        rcs.append(p.wait(timeout=600))
        t.join()
    check_rc(case, max(rcs, key=abs))
    return {f"slurm-{case_jobid(case)}.out": b"".join(lines)}


def case_jobid(case):
    return {"slurm_two_nodes_hang": "4242", "slurm_two_nodes_late_start": "4243"}[case.name]


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_rc(case, rc):
    if case.expect_rc is None and rc == 0:
        raise SystemExit(f"{case.name}: job exited 0, expected a failure")
    if case.expect_rc is not None and rc != case.expect_rc:
        raise SystemExit(f"{case.name}: job exited {rc}, expected {case.expect_rc}")


def text_of(name, data):
    if name.endswith(".gz"):
        data = gzip.decompress(data)
    return data.decode("utf-8", "replace")


def cite(case, files):
    """file:line of the first match of each evidence pattern."""
    out = []
    for pattern_file, regex in case.evidence:
        rx = re.compile(regex)
        names = [n for n in sorted(files) if fnmatch.fnmatch(n, pattern_file)]
        hit = None
        for n in names:
            for i, line in enumerate(text_of(n, files[n]).splitlines(), 1):
                if rx.search(line):
                    hit = f"{n}:{i}"
                    break
            if hit:
                break
        if not hit:
            raise SystemExit(f"{case.name}: evidence /{regex}/ not found in {pattern_file}")
        out.append(f"{hit} /{regex}/")
    return out


def write_case(case, files):
    d = CASES / case.name
    if d.exists():
        shutil.rmtree(d)
    for name, data in files.items():
        p = d / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    launcher = {"slurm": f"2 x torchrun --nnodes 2 --nproc-per-node {case.nproc}, output labelled like srun --label",
                "logdir": f"torchrun --standalone --nproc-per-node {case.nproc} --log-dir logs --tee 3",
                "redirects": f"torchrun --standalone --nproc-per-node {case.nproc} --log-dir logs --redirects 3",
                }.get(case.layout, f"torchrun --standalone --nproc-per-node {case.nproc}")
    env = "".join(f" {k}={v}" for k, v in case.env.items())
    expected = {
        "class": case.cls,
        "initiating_ranks": case.initiating,
        **({"collateral_ranks": case.collateral} if case.collateral is not None else {}),
        "origin": f"real run here: torch {torch_version()}, gloo, {launcher}{env} "
                  f"(make_corpus.py {case.name})",
        "notes": case.notes + " Evidence: " + "; ".join(cite(case, files)) + ".",
    }
    (d / "expected.json").write_text(dump_json(expected))


def dump_json(obj):
    """indent=2, but lists of ranks on one line."""
    text = json.dumps(obj, indent=2)
    return re.sub(r"\[\s*([0-9,\s]*?)\s*\]",
                  lambda m: "[" + ", ".join(re.findall(r"\d+", m.group(1))) + "]", text) + "\n"


README_HEAD = """# `ncclwatch diagnose` corpus

Logs of distributed PyTorch jobs that died (and a few that did not), each with
the verdict a careful human reaches from them. One directory per case under
`cases/<name>/`: the files exactly as the job, launcher or kernel wrote them
(a combined torchrun console log, torchrun `--log-dir` per-rank files, a
Slurm `srun --label` log, a gzipped log, Flight Recorder dumps
`nccl_trace_rank_<rank>`, a `dmesg.txt`), and `expected.json`:

- `class`: `checkpoint_gather_timeout`, `collective_hang`, `desync`,
  `gather_oom`, `network_error`, `rank_crash`, `unknown` (a failure the lines
  show but do not place: a paste cut off before the cause, an operator's "exit
  code 1"; the verdict quotes the lines) or `none` (no line shaped like a failure);
- `initiating_ranks`: the rank(s) the failure started from (the saving or
  gathering rank, the rank that never joined, the odd rank out in a desync,
  the rank that died; for `network_error` the ranks whose own log shows the
  transport error first-hand); `collateral_ranks`: ranks that only timed out,
  were aborted or were SIGTERMed because of it (absent where the logs cannot
  tell). Both are `[]` for `none`;
- `initiator_among` (where the logs name no initiator): the ranks it must be
  among, usually those that never reported (`[]`: nothing narrows it);
- `origin`: `real run here: ...` (regenerated by make_corpus.py) or
  `written from torch vX.Y source ...` (hand-written excerpts in the format of
  that version, for what only NCCL/GPU jobs print);
- `notes`: what happened and the file:line of the key evidence.

`public/<name>/` holds real logs that users pasted into public GitHub issues
and pull requests (pytorch, accelerate, transformers, Lightning, DeepSpeed,
torchtune, Megatron, NCCL and projects using them; issue 28 added 46 failing and
23 healthy logs, 48 of the 69 from projects not held before (Ray-based RL
trainers, Kubeflow and Kubernetes, Slurm jobs, t5x, torch_xla, Stable Diffusion
trainers and more; the rest from verl, OpenRLHF, NeMo, torchtune, axolotl,
LlamaFactory and others already held), 10 of them OOM kills or segfaults during
a save and 28 failing ones cut off mid-trace), kept exactly as pasted:
partial pastes cut mid-line, glued progress bars, interleaved stdout/stderr,
terminal hard wraps, user elisions, markdown quoting, log-viewer line numbers,
Ray/host/timestamp prefixes, GitHub-flattened one-line pastes. Each is a small
excerpt; its `expected.json` has `origin` "public: ..." and `source` (repo,
issue or PR number, URL, which comment), and the verdict the thread supports,
no more: where only waiting ranks speak, `initiating_ranks` is `[]` and
`initiator_among` lists the ranks that did not report waiting. They are cited
in the table at the end of this file, and tests/unit/test_diagnose.py counts them
apart from the cases made here. Two optional keys: `log_format` names the
torch release whose wording the log has (`torch 1.x` for the watchdog and
error lines of torch 1.6-1.13: `[E ProcessGroupNCCL.cpp:NNN]` without a time
stamp, WorkNCCL without NumelIn, sometimes without SeqNum), and
`"needs": "i21-diagnose"` marks a case whose verdict waits on recognisers
another branch adds (torch 1.x wording, gloo transport, c10d store, launcher
prefixes): the test reports it as pending rather than failing, and the key is
dropped once the case is right. Some public logs expect `none`: healthy NCCL
and torchrun output, harmless warnings, nccl-tests runs, pasted into threads
about something else.

`twins/<twin>/<name>/` holds a mangled twin of every public log, one per
transformation a log meets on its way into a paste: `wrap80` and `wrap120`
(a terminal cutting every line at that many columns), `bar` (a progress bar
redrawn with carriage returns, lines glued after its last redraw), `colour`
(rich-style colours, a window title, OSC 8 links) and `markdown` (indent
lost, HTML entities, `> ` quotes). They are written by `make_twins.py` from
the one table of transformations in `tests/harness/mangle.py` (seeded by
the case's and twin's names, so rerunning rewrites the same bytes), each with
an expected.json holding its original's verdict and what made it;
tests/unit/test_logstream_mangled.py checks every twin gets that verdict, ranks
included. Regenerate them after changing a public case or the table:

    .venv/bin/python tests/data/diagnose/make_twins.py

Real runs use gloo on CPU (torch 2.13), so they show gloo's messages
(`Timed out waiting 10000ms for recv operation to complete`), never NCCL's
watchdog; the written cases cover the NCCL watchdog, NCCL errors, CUDA/host
OOM and multi-node logs of torch 2.2 to 2.11. Timestamps, pids, hostnames and
paths are kept as the run printed them.

## Regenerate the real cases

    .venv/bin/python tests/data/diagnose/make_corpus.py            # all, ~15 min
    .venv/bin/python tests/data/diagnose/make_corpus.py hang_compute desync_op

Each run uses the venv's torchrun and jobs/train.py (a small DDP + ZeRO-1
trainer with `--fault ...`), one job at a time, 2-4 ranks, process-group
timeouts of 10-20 s. The script fails loudly if a job exits differently or an
evidence pattern no longer matches (so a torch upgrade that changes the
messages shows up), and rewrites this README's table from every case's
expected.json. The written cases come from `written/w*.py`: templates of
each version's lines (wording, prefixes and line numbers taken from the torch
source and from users' logs in the GitHub issues cited in `origin`) with fixed
seeds; `python3 tests/data/diagnose/written/wN.py` rewrites one of them.

Cases `written here: ...` (origin) were written by hand for failure patterns
of issue 14 that no public paste in reach showed whole; their files are the
source.

## Cases made here

| case | class | initiating | origin |
| --- | --- | --- | --- |
"""

PUBLIC_HEAD = """
## Public logs (real pastes, cited)

| case | class | initiating / among | source |
| --- | --- | --- | --- |
"""


def write_readme():
    rows = []
    for d in sorted(p for p in CASES.iterdir() if (p / "expected.json").is_file()):
        e = json.loads((d / "expected.json").read_text())
        origin = e["origin"]
        short = origin.split(" (make_corpus.py")[0] if origin.startswith("real run") else origin.split(" source ")[0]
        ranks = ", ".join(map(str, e["initiating_ranks"])) or "-"
        rows.append(f"| {d.name} | {e['class']} | {ranks} | {short} |")
    public = []
    for d in sorted(p for p in (HERE / "public").iterdir() if (p / "expected.json").is_file()):
        e = json.loads((d / "expected.json").read_text())
        src = e["source"]
        ranks = ", ".join(map(str, e["initiating_ranks"]))
        if not ranks:
            among = e.get("initiator_among")
            ranks = "among " + (", ".join(map(str, among)) if among else "(nothing narrows it)") \
                if among is not None else "-"
            if among and len(among) > 12:
                ranks = f"among {len(among)} ranks"
        kind = "PR" if src["kind"] == "pull_request" else "issue"
        public.append(f"| {d.name} | {e['class']} | {ranks} | {src['repo']} {kind} "
                      f"[#{src['number']}]({src['url']}), {src['comment']} |")
    (HERE / "README.md").write_text(README_HEAD + "\n".join(rows) + "\n" + PUBLIC_HEAD
                                    + "\n".join(public) + "\n")


def main(argv):
    wanted = set(argv)
    unknown = wanted - {c.name for c in RUNS}
    if unknown:
        raise SystemExit(f"unknown cases: {sorted(unknown)}")
    failed = []
    for case in RUNS:
        if wanted and case.name not in wanted:
            continue
        t0 = time.monotonic()
        try:
            with tempfile.TemporaryDirectory(prefix="ncclwatch-corpus-") as tmp:
                files = run_job(case, Path(tmp))
            write_case(case, files)
        except SystemExit as e:  # one broken case should not stop the others
            print(f"FAILED {e}", flush=True)
            failed.append(case.name)
            continue
        print(f"{case.name}: {len(files)} file(s), {time.monotonic() - t0:.0f}s", flush=True)
    write_readme()
    if failed:
        raise SystemExit(f"failed: {' '.join(failed)}")


if __name__ == "__main__":
    main(sys.argv[1:])
