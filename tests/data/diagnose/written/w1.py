# torch 2.2 format: HF Trainer + FSDP, rank 0 saving, ranks 1-7 time out in the barrier;
# torchrun names rank 3 as root cause.
import random, sys
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
from common import *
rng = random.Random(22)
L = []
L += ["[2024-03-14 00:02:11,904] torch.distributed.run: [WARNING] ",
      "[2024-03-14 00:02:11,904] torch.distributed.run: [WARNING] *****************************************",
      "[2024-03-14 00:02:11,904] torch.distributed.run: [WARNING] Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to avoid your system being overloaded, please further tune the variable for optimal performance in your application as needed. ",
      "[2024-03-14 00:02:11,904] torch.distributed.run: [WARNING] *****************************************"]
L += ["[INFO|trainer.py:1812] 2024-03-14 00:04:40,118 >> ***** Running training *****",
      "[INFO|trainer.py:1813] 2024-03-14 00:04:40,118 >>   Num examples = 96,000",
      "[INFO|trainer.py:1814] 2024-03-14 00:04:40,118 >>   Num Epochs = 1",
      "[INFO|trainer.py:1815] 2024-03-14 00:04:40,118 >>   Instantaneous batch size per device = 4",
      "[INFO|trainer.py:1818] 2024-03-14 00:04:40,118 >>   Total train batch size (w. parallel, distributed & accumulation) = 64",
      "[INFO|trainer.py:1819] 2024-03-14 00:04:40,118 >>   Gradient Accumulation steps = 2",
      "[INFO|trainer.py:1820] 2024-03-14 00:04:40,118 >>   Total optimization steps = 1,500",
      "[INFO|trainer.py:1821] 2024-03-14 00:04:40,121 >>   Number of trainable parameters = 842,153,984"]
loss = 1.92
for step in range(10, 1501, 10):
    loss = max(0.61, loss * 0.995 + rng.uniform(-0.02, 0.02))
    lr = 2e-5 * (1 - step / 1500)
    L.append(f"{{'loss': {loss:.4f}, 'grad_norm': {rng.uniform(0.3, 1.4):.16f}, 'learning_rate': {lr:.16g}, 'epoch': {step/1500:.2f}}}")
    if step % 250 == 0:
        L.append(f"{step/1500*100:4.0f}%|{'█'*int(step/1500*20):<20}| {step}/1500 [{step*6//60:02d}:{step*6%60:02d}<{(1500-step)*6//60:02d}:{(1500-step)*6%60:02d},  1.62s/it]")
L += ["100%|████████████████████| 1500/1500 [2:06:38<00:00,  4.93s/it]",
      "[INFO|trainer.py:3067] 2024-03-14 02:11:07,482 >> Saving model checkpoint to /data/ckpt/llama-7b-sft/checkpoint-1500",
      "[INFO|configuration_utils.py:473] 2024-03-14 02:11:07,490 >> Configuration saved in /data/ckpt/llama-7b-sft/checkpoint-1500/config.json",
      "[INFO|configuration_utils.py:614] 2024-03-14 02:11:07,492 >> Configuration saved in /data/ckpt/llama-7b-sft/checkpoint-1500/generation_config.json"]
seq = 60231
order = [3, 1, 6, 2, 7, 5, 4]
ranfor = {r: 1800000 + rng.randrange(300, 900) for r in order}
def work(r):
    return f"WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran for {ranfor[r]} milliseconds before timing out."
for r in order:
    L.append(f"[rank{r}]:[E ProcessGroupNCCL.cpp:523] [Rank {r}] Watchdog caught collective operation timeout: {work(r)}")
for r in order:
    L.append(f"[rank{r}]:[E ProcessGroupNCCL.cpp:537] Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.")
    L.append(f"[rank{r}]:[E ProcessGroupNCCL.cpp:543] To avoid data inconsistency, we are taking the entire process down.")
    msg = f"[Rank {r}] NCCL watchdog thread terminated with exception: [Rank {r}] Watchdog caught collective operation timeout: {work(r)}"
    tb = ["Exception raised from checkTimeout at ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:525 (most recent call first):"]
    tb += frames_cpp(rng, "/opt/conda/lib/python3.10/site-packages/torch/lib/libtorch_cuda.so", [
        ("c10::Error::Error(c10::SourceLocation, std::string)", "0x57", "/opt/conda/lib/python3.10/site-packages/torch/lib/libc10.so"),
        ("c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(std::optional<std::chrono::duration<long, std::ratio<1l, 1000l> > >)", "0x1e6", None),
        ("c10d::ProcessGroupNCCL::workCleanupLoop()", "0x19d", None),
        ("c10d::ProcessGroupNCCL::ncclCommWatchdog()", "0x119", None),
        ("<unknown function>", "0xdbbf4", "/opt/conda/lib/python3.10/site-packages/torch/lib/../../../.././libstdc++.so.6"),
        ("<unknown function>", "0x8609", "/lib/x86_64-linux-gnu/libpthread.so.0"),
        ("clone", "0x43", "/lib/x86_64-linux-gnu/libc.so.6")])
    L.append(f"[rank{r}]:[E ProcessGroupNCCL.cpp:1182] {msg}")
    L += tb + [""]
    L.append("terminate called after throwing an instance of 'c10::DistBackendError'")
    L.append(f"  what():  {msg}")
    L += tb + [""]
pids = {r: 20417 + r for r in range(8)}
L.append("[2024-03-14 02:41:09,318] torch.distributed.elastic.multiprocessing.api: [WARNING] Sending process 20417 closing signal SIGTERM")
L.append("[2024-03-14 02:41:10,447] torch.distributed.elastic.multiprocessing.api: [ERROR] failed (exitcode: -6) local_rank: 1 (pid: 20418) of binary: /opt/conda/bin/python")
L += """Traceback (most recent call last):
  File "/opt/conda/bin/torchrun", line 8, in <module>
    sys.exit(main())
  File "/opt/conda/lib/python3.10/site-packages/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 347, in wrapper
    return f(*args, **kwargs)
  File "/opt/conda/lib/python3.10/site-packages/torch/distributed/run.py", line 812, in main
    run(args)
  File "/opt/conda/lib/python3.10/site-packages/torch/distributed/run.py", line 803, in run
    elastic_launch(
  File "/opt/conda/lib/python3.10/site-packages/torch/distributed/launcher/api.py", line 135, in __call__
    return launch_agent(self._config, self._entrypoint, list(args))
  File "/opt/conda/lib/python3.10/site-packages/torch/distributed/launcher/api.py", line 268, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: 
============================================================
train.py FAILED
------------------------------------------------------------
Failures:""".splitlines()
fails = [1, 2, 3, 4, 5, 6, 7]
root = 3
idx = 0
blocks = {}
for r in fails:
    blocks[r] = [f"[{idx}]:",
        f"  time      : 2024-03-14_02:41:09",
        f"  host      : gpu-a100-07.cluster.internal",
        f"  rank      : {r} (local_rank: {r})",
        f"  exitcode  : -6 (pid: {pids[r]})",
        f"  error_file: <N/A>",
        f"  traceback : Signal 6 (SIGABRT) received by PID {pids[r]}"]
    idx += 1
for r in fails:
    if r != root:
        L += blocks[r]
L += ["------------------------------------------------------------", "Root Cause (first observed failure):"] + blocks[root] + ["============================================================"]
text = "\n".join(L) + "\n"
save = lineno(text, "Saving model checkpoint to")
wd = lineno(text, "[rank3]:[E ProcessGroupNCCL.cpp:523]")
rc = lineno(text, "Root Cause")
write("nccl_v2_2_checkpoint_misblamed", {"console.log": text}, {
    "class": "checkpoint_gather_timeout", "initiating_ranks": [0], "collateral_ranks": [1, 2, 3, 4, 5, 6, 7],
    "origin": "written from torch v2.2 source torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:WorkNCCL::checkTimeout/handleException/ncclCommWatchdog (message layout as in https://github.com/arrival-ltd/catalyst-rl-tutorial/issues/15) and torch/distributed/elastic/multiprocessing/errors/__init__.py:ChildFailedError.format_msg; HF Trainer lines in transformers 4.38 format",
    "notes": f"HF Trainer (main process = rank 0) logs 'Saving model checkpoint to .../checkpoint-1500' at console.log:{save} and nothing after; 30 min later ranks 1-7 (never rank 0) report the watchdog timeout of the same barrier-shaped collective SeqNum=60231 OpType=ALLREDUCE NumelIn=1 (first at console.log:{wd}) and abort with SIGABRT; rank 0 is only SIGTERMed. torchrun's 'Root Cause' (console.log:{rc}) names rank 3, a collateral rank: the classic mis-blame."})
print("ok", save, wd, rc)
