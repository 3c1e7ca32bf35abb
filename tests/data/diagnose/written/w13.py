# torch 2.7 format: GRPO job, rank 1 never joins the BROADCAST SeqNum=4; ranks 0,2,3 time out after 30 min,
# their watchdogs then hang and the heartbeat monitor kills them 480 s later.
import random, sys, datetime
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
from common import *
rng = random.Random(27)
def ns(): return rng.randrange(0, 10**9)
def hdr(r, sev, fl, tt): return f"[rank{r}]:[{sev}{tt:%m%d %H:%M:%S}.{ns():09d} {fl}]"
L = ["W0424 00:44:02.910000 211804 site-packages/torch/distributed/run.py:766] ",
     "W0424 00:44:02.910000 211804 site-packages/torch/distributed/run.py:766] *****************************************",
     "W0424 00:44:02.910000 211804 site-packages/torch/distributed/run.py:766] Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to avoid your system being overloaded, please further tune the variable for optimal performance in your application as needed. ",
     "W0424 00:44:02.910000 211804 site-packages/torch/distributed/run.py:766] *****************************************"]
t = datetime.datetime(2025, 4, 24, 0, 44, 30)
for r in range(4):
    L.append(f"[2025-04-24 00:44:3{r},{rng.randrange(1000):03d}] [INFO] [real_accelerator.py:239:get_accelerator] Setting ds_accelerator to cuda (auto detect)")
for i in range(120):
    t += datetime.timedelta(seconds=0.35)
    L.append(f"Map (num_proc=16): {min(100, (i+1)*100//120):3d}%|{'█'*((i+1)*20//120):<20}| {min(7473, (i+1)*7473//120)}/7473 [00:{int(i*0.35):02d}<00:{int((120-i)*0.35):02d}, {rng.randrange(2600,2900)}.{rng.randrange(10,99)} examples/s]")
L += ["[INFO|trainer.py:2409] 2025-04-24 00:45:19,882 >> ***** Running training *****",
      "[INFO|trainer.py:2410] 2025-04-24 00:45:19,882 >>   Num examples = 7,473",
      "[INFO|trainer.py:2417] 2025-04-24 00:45:19,882 >>   Total optimization steps = 3,736",
      "  0%|          | 0/3736 [00:00<?, ?it/s]"]
tf = datetime.datetime(2025, 4, 24, 1, 15, 21)
wm = {}
order = [3, 2, 0]
for r in order:
    wm[r] = f"[Rank {r}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=4, OpType=BROADCAST, NumelIn=112, NumelOut=112, Timeout(ms)=1800000) ran for {1800000+rng.randrange(5,40)} milliseconds before timing out."
    pfx = f"[PG ID 0 PG GUID 0(default_pg) Rank {r}]"
    L.append(hdr(r, "E", "ProcessGroupNCCL.cpp:629", tf) + " " + wm[r])
    L.append(hdr(r, "E", "ProcessGroupNCCL.cpp:2168", tf) + f" {pfx}  failure detected by watchdog at work sequence id: 4 PG status: last enqueued work: 4, last completed work: 3")
    L.append(hdr(r, "E", "ProcessGroupNCCL.cpp:667", tf) + " Stack trace of the failed collective not found, potentially because FlightRecorder is disabled. You can enable it by setting TORCH_NCCL_TRACE_BUFFER_SIZE to a non-zero value.")
th = tf + datetime.timedelta(seconds=480)
for r in order:
    pfx = f"[PG ID 0 PG GUID 0(default_pg) Rank {r}]"
    L.append(hdr(r, "E", "ProcessGroupNCCL.cpp:1743", th) + f" {pfx} ProcessGroupNCCL's watchdog got stuck for 480 seconds without making progress in monitoring enqueued collectives. This typically indicates a NCCL/CUDA API (e.g., CudaEventDestroy) hang blocking the watchdog, and could be triggered by another thread holding the GIL inside a CUDA api (for example, CudaEventDestroy), or other deadlock-prone behaviors.If you suspect the watchdog is not actually stuck and a longer timeout would help, you can either increase the timeout (TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC) to a larger value or disable the heartbeat monitor (TORCH_NCCL_ENABLE_MONITORING=0).If either of aforementioned helps, feel free to file an issue to PyTorch about the short timeout or false positive abort; otherwise, please attempt to debug the hang. ")
    L.append(hdr(r, "E", "ProcessGroupNCCL.cpp:1533", th) + f" {pfx} ProcessGroupNCCL preparing to dump debug info. Include stack trace: 1")
tk = th + datetime.timedelta(seconds=480)
for r in order:
    pfx = f"[PG ID 0 PG GUID 0(default_pg) Rank {r}]"
    L.append(hdr(r, "F", "ProcessGroupNCCL.cpp:1554", tk) + f" {pfx} {pfx} Terminating the process after attempting to dump debug info, due to ProcessGroupNCCL watchdog hang.")
pids = {r: 211830 + r for r in range(4)}
tt = tk + datetime.timedelta(seconds=2)
L.append(f"W{tt:%m%d %H:%M:%S}.{rng.randrange(0,1000):03d}000 211804 site-packages/torch/distributed/elastic/multiprocessing/api.py:900] Sending process {pids[1]} closing signal SIGTERM")
L.append(f"E{tt:%m%d %H:%M:%S}.{rng.randrange(0,1000):03d}000 211804 site-packages/torch/distributed/elastic/multiprocessing/api.py:874] failed (exitcode: -6) local_rank: 0 (pid: {pids[0]}) of binary: /home/ai/miniconda3/envs/grpo/bin/python3.11")
L += """Traceback (most recent call last):
  File "/home/ai/miniconda3/envs/grpo/bin/accelerate", line 8, in <module>
    sys.exit(main())
             ^^^^^^
  File "/home/ai/miniconda3/envs/grpo/lib/python3.11/site-packages/accelerate/commands/accelerate_cli.py", line 50, in main
    args.func(args)
  File "/home/ai/miniconda3/envs/grpo/lib/python3.11/site-packages/accelerate/commands/launch.py", line 1196, in launch_command
    deepspeed_launcher(args)
  File "/home/ai/miniconda3/envs/grpo/lib/python3.11/site-packages/accelerate/commands/launch.py", line 878, in deepspeed_launcher
    distrib_run.run(args)
  File "/home/ai/miniconda3/envs/grpo/lib/python3.11/site-packages/torch/distributed/run.py", line 883, in run
    elastic_launch(
  File "/home/ai/miniconda3/envs/grpo/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 139, in __call__
    return launch_agent(self._config, self._entrypoint, list(args))
           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/home/ai/miniconda3/envs/grpo/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 270, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: 
============================================================
src/grpo.py FAILED
------------------------------------------------------------
Failures:""".splitlines()
stamp = f"{tt:%Y-%m-%d_%H:%M:%S}"
for i, r in enumerate((2, 3), 1):
    L += [f"[{i}]:", f"  time      : {stamp}", "  host      : a800-srv-3", f"  rank      : {r} (local_rank: {r})",
          f"  exitcode  : -6 (pid: {pids[r]})", "  error_file: <N/A>", f"  traceback : Signal 6 (SIGABRT) received by PID {pids[r]}"]
L += ["------------------------------------------------------------", "Root Cause (first observed failure):",
      "[0]:", f"  time      : {stamp}", "  host      : a800-srv-3", "  rank      : 0 (local_rank: 0)",
      f"  exitcode  : -6 (pid: {pids[0]})", "  error_file: <N/A>", f"  traceback : Signal 6 (SIGABRT) received by PID {pids[0]}",
      "============================================================"]
text = "\n".join(L) + "\n"
a = lineno(text, "[rank3]:[E"); b = lineno(text, "watchdog got stuck"); c = lineno(text, f"Sending process {pids[1]}")
write("nccl_v2_7_hang_heartbeat_monitor", {"console.log": text}, {
    "class": "collective_hang", "initiating_ranks": [1], "collateral_ranks": [0, 2, 3],
    "origin": "written from torch v2.7 source torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:watchdogHandler/HeartbeatMonitor::runLoop (wording and line numbers as in https://github.com/huggingface/open-r1/issues/620 and https://github.com/om-ai-lab/VLM-R1/issues/257); accelerate launch + DeepSpeed GRPO job",
    "notes": f"Ranks 3, 2 and 0 time out on SeqNum=4 OpType=BROADCAST after 30 min (first at console.log:{a}); rank 1 prints nothing at all, it never enqueued that broadcast. Their watchdogs then hang and the heartbeat monitor reports 'ProcessGroupNCCL's watchdog got stuck for 480 seconds' (console.log:{b}) and terminates them (F lines): a consequence, not the cause. torchrun SIGTERMs rank 1 (pid {pids[1]}, console.log:{c}) and names rank 0 as root cause."})
print("ok", a, b, c)
