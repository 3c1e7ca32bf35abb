# torch 2.11 format, per-rank files from torchrun --log-dir ... --redirects 3: rank 0 saves (HF Trainer + accelerate),
# ranks 1-3 time out in the barrier after it; FR (on by default) prints the stack of the failed collective.
import random, sys, datetime
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
from common import *
rng = random.Random(211)
def ns(): return rng.randrange(0, 10**9)
def hdr(r, sev, fl, tt): return f"[rank{r}]:[{sev}{tt:%m%d %H:%M:%S}.{ns():09d} {fl}]"
run = "logs/8f0c2d4e-5b1a-4c77-9e3d-0a6b1f2c9d84_k2j9x1qe/attempt_0"
files = {}
out0 = ["[INFO|trainer.py:2519] 2026-04-02 19:20:11,052 >> ***** Running training *****",
        "[INFO|trainer.py:2520] 2026-04-02 19:20:11,052 >>   Num examples = 48,000",
        "[INFO|trainer.py:2521] 2026-04-02 19:20:11,052 >>   Num Epochs = 1",
        "[INFO|trainer.py:2525] 2026-04-02 19:20:11,052 >>   Total train batch size (w. parallel, distributed & accumulation) = 64",
        "[INFO|trainer.py:2526] 2026-04-02 19:20:11,052 >>   Total optimization steps = 750",
        "[INFO|trainer.py:2527] 2026-04-02 19:20:11,059 >>   Number of trainable parameters = 7,615,616,512"]
for step in range(2, 501, 2):
    out0.append(f"{{'loss': '{rng.uniform(0.55,0.8):.4f}', 'grad_norm': '{rng.uniform(0.9,2.4):.4f}', 'learning_rate': '{1e-5*(1-step/750):.4e}', 'epoch': '{step/750:.4f}'}}")
out0 += ["[INFO|trainer.py:4309] 2026-04-02 20:31:47,903 >> Saving model checkpoint to /lustre/users/kim/qwen-7b-dpo/checkpoint-500",
         "[INFO|configuration_utils.py:491] 2026-04-02 20:31:47,911 >> Configuration saved in /lustre/users/kim/qwen-7b-dpo/checkpoint-500/config.json"]
files[f"{run}/0/stdout.log"] = "\n".join(out0) + "\n"
files[f"{run}/0/stderr.log"] = ""
tf = datetime.datetime(2026, 4, 2, 20, 41, 49)
seq = 9002
lib = "/opt/venv/lib/python3.12/site-packages"
for r in (1, 2, 3):
    pfx = f"[PG ID 0 PG GUID 0(default_pg) Rank {r}]"
    e = [hdr(r, "E", "ProcessGroupNCCL.cpp:757", tf) + f" [Rank {r}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for {600000+rng.randrange(20,90)} milliseconds before timing out.",
         hdr(r, "E", "ProcessGroupNCCL.cpp:2395", tf) + f" {pfx}  failure detected by watchdog at work sequence id: {seq} PG status: last enqueued work: {seq}, last completed work: {seq-1}",
         hdr(r, "E", "ProcessGroupNCCL.cpp:801", tf) + " Stack trace of the failed collective: ",
         f"#0 barrier from {lib}/torch/distributed/distributed_c10d.py:4984",
         f"#1 wrapper from {lib}/torch/distributed/c10d_logger.py:83",
         f"#2 wait_for_everyone from {lib}/accelerate/state.py:389",
         f"#3 wait_for_everyone from {lib}/accelerate/accelerator.py:2871",
         f"#4 _save_checkpoint from {lib}/transformers/trainer.py:3333",
         f"#5 _maybe_log_save_evaluate from {lib}/transformers/trainer.py:3209",
         f"#6 _inner_training_loop from {lib}/transformers/trainer.py:2748",
         f"#7 train from {lib}/transformers/trainer.py:2325",
         f"#8 main from /lustre/users/kim/dpo/train_dpo.py:188",
         f"#9 <module> from /lustre/users/kim/dpo/train_dpo.py:196",
         "",
         hdr(r, "E", "ProcessGroupNCCL.cpp:2732", tf) + f" {pfx} First PG on this rank to signal dumping.",
         hdr(r, "E", "ProcessGroupNCCL.cpp:1987", tf) + f" {pfx} Received a dump signal due to a collective timeout from this local rank and we will try our best to dump the debug info. Last enqueued NCCL work: {seq}, last completed NCCL work: {seq-1}.This is most likely caused by incorrect usages of collectives, e.g., wrong sizes used across ranks, the order of collectives is not same for all ranks or the scheduled collective, for some reason, didn't run. Additionally, this can be caused by GIL deadlock or other reasons such as network errors or bugs in the communications library (e.g. NCCL), etc. ",
         hdr(r, "E", "ProcessGroupNCCL.cpp:1700", tf) + f" {pfx} ProcessGroupNCCL preparing to dump debug info. Include stack trace: 1, only active collectives: 0",
         hdr(r, "F", "ProcessGroupNCCL.cpp:1725", tf + datetime.timedelta(seconds=60)) + f" {pfx} {pfx} Terminating the process after attempting to dump debug info, due to collective timeout or exception."]
    files[f"{run}/{r}/stderr.log"] = "\n".join(e) + "\n"
    files[f"{run}/{r}/stdout.log"] = ""
e0 = [hdr(0, "E", "ProcessGroupNCCL.cpp:1922", tf) + " [PG ID 0 PG GUID 0(default_pg) Rank 0] Observed flight recorder dump signal from another rank via TCPStore.",
      hdr(0, "E", "ProcessGroupNCCL.cpp:1987", tf) + f" [PG ID 0 PG GUID 0(default_pg) Rank 0] Received a dump signal due to a collective timeout from  rank 2 and we will try our best to dump the debug info. Last enqueued NCCL work: {seq-1}, last completed NCCL work: {seq-1}.This is most likely caused by incorrect usages of collectives, e.g., wrong sizes used across ranks, the order of collectives is not same for all ranks or the scheduled collective, for some reason, didn't run. Additionally, this can be caused by GIL deadlock or other reasons such as network errors or bugs in the communications library (e.g. NCCL), etc. ",
      hdr(0, "E", "ProcessGroupNCCL.cpp:1700", tf) + " [PG ID 0 PG GUID 0(default_pg) Rank 0] ProcessGroupNCCL preparing to dump debug info. Include stack trace: 1, only active collectives: 0",
      hdr(0, "F", "ProcessGroupNCCL.cpp:1725", tf + datetime.timedelta(seconds=60)) + " [PG ID 0 PG GUID 0(default_pg) Rank 0] [PG ID 0 PG GUID 0(default_pg) Rank 0] Terminating the process after attempting to dump debug info, due to collective timeout or exception."]
files[f"{run}/0/stderr.log"] = "\n".join(e0) + "\n"
tt = tf + datetime.timedelta(seconds=61)
con = ["W0402 19:18:55.402000 61207 torch/distributed/run.py:852] ",
       "W0402 19:18:55.402000 61207 torch/distributed/run.py:852] *****************************************",
       "W0402 19:18:55.402000 61207 torch/distributed/run.py:852] Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to avoid your system being overloaded, please further tune the variable for optimal performance in your application as needed. ",
       "W0402 19:18:55.402000 61207 torch/distributed/run.py:852] *****************************************",
       f"E{tt:%m%d %H:%M:%S}.{rng.randrange(0,1000):03d}000 61207 torch/distributed/elastic/multiprocessing/api.py:914] failed (exitcode: -6) local_rank: 0 (pid: 61215) of binary: /opt/venv/bin/python3"]
con += """Traceback (most recent call last):
  File "/opt/venv/bin/accelerate", line 10, in <module>
    sys.exit(main())
             ^^^^^^
  File "/opt/venv/lib/python3.12/site-packages/accelerate/commands/accelerate_cli.py", line 50, in main
    args.func(args)
  File "/opt/venv/lib/python3.12/site-packages/accelerate/commands/launch.py", line 1229, in launch_command
    multi_gpu_launcher(args)
  File "/opt/venv/lib/python3.12/site-packages/accelerate/commands/launch.py", line 833, in multi_gpu_launcher
    distrib_run.run(args)
  File "/opt/venv/lib/python3.12/site-packages/torch/distributed/run.py", line 982, in run
    elastic_launch(
  File "/opt/venv/lib/python3.12/site-packages/torch/distributed/launcher/api.py", line 170, in __call__
    return launch_agent(self._config, self._entrypoint, list(args))
           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/opt/venv/lib/python3.12/site-packages/torch/distributed/launcher/api.py", line 317, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: 
============================================================
/lustre/users/kim/dpo/train_dpo.py FAILED
------------------------------------------------------------
Failures:""".splitlines()
pids = {r: 61215 + r for r in range(4)}
stamp = f"{tt:%Y-%m-%d_%H:%M:%S}"
for i, r in enumerate((1, 2, 3), 1):
    con += [f"[{i}]:", f"  time      : {stamp}", "  host      : gpu-h200-n07", f"  rank      : {r} (local_rank: {r})",
            f"  exitcode  : -6 (pid: {pids[r]})", f"  error_file: <N/A>", f"  traceback : Signal 6 (SIGABRT) received by PID {pids[r]}"]
con += ["------------------------------------------------------------", "Root Cause (first observed failure):",
        "[0]:", f"  time      : {stamp}", "  host      : gpu-h200-n07", "  rank      : 0 (local_rank: 0)",
        f"  exitcode  : -6 (pid: {pids[0]})", "  error_file: <N/A>", f"  traceback : Signal 6 (SIGABRT) received by PID {pids[0]}",
        "============================================================"]
files["console.log"] = "\n".join(con) + "\n"
a = lineno(files[f"{run}/0/stdout.log"], "Saving model checkpoint to")
b = lineno(files[f"{run}/1/stderr.log"], "#4 _save_checkpoint")
c = lineno(files[f"{run}/0/stderr.log"], "from  rank 2")
write("nccl_v2_11_checkpoint_per_rank_files", files, {
    "class": "checkpoint_gather_timeout", "initiating_ranks": [0], "collateral_ranks": [1, 2, 3],
    "origin": "written from torch v2.11 source torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:Watchdog::runLoop/HeartbeatMonitor::runLoop and FlightRecorder stack printing (Flight Recorder on by default since 2.11); torchrun --log-dir logs --redirects 3 layout as produced by torch 2.13 here (logs/<run_id>_<suffix>/attempt_0/<local_rank>/{stdout,stderr}.log), launched through accelerate launch",
    "notes": f"Per-rank files only (console.log has just torchrun's summary). Rank 0's stdout.log:{a} 'Saving model checkpoint to .../checkpoint-500' is its last line. Ranks 1-3 time out 10 min later in SeqNum=9002 ALLREDUCE NumelIn=1 and the Flight Recorder stack shows it is the barrier in accelerate wait_for_everyone called from Trainer._save_checkpoint ({run}/1/stderr.log:{b}). Rank 0 reports no timeout; its line {run}/0/stderr.log:{c} says 'Last enqueued NCCL work: 9001': it never reached the barrier. Everyone is then aborted (all -6), and torchrun's root cause happens to be rank 0 but only with SIGABRT, which by itself says nothing about the save."})
print("ok", a, b, c)
