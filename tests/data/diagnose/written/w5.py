# Slurm 2 nodes x 8 GPUs, srun --label; torch 2.6 format; IB completion error on rank 12 (node 1).
import random, sys, datetime
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
from common import *
rng = random.Random(26)
def ns(): return rng.randrange(0, 10**9)
def hdr(r, sev, fl, tt): return f"[rank{r}]:[{sev}{tt:%m%d %H:%M:%S}.{ns():09d} {fl}]"
L = []
def out(task, line): L.append(f"{task}: {line}")
t = datetime.datetime(2025, 3, 2, 22, 14, 0)
for task in (0, 1):
    out(task, f"W0302 22:14:0{task}.{rng.randrange(0,1000):03d}000 {3100+task*7} torch/distributed/run.py:793] ")
    out(task, f"W0302 22:14:0{task}.{rng.randrange(0,1000):03d}000 {3100+task*7} torch/distributed/run.py:793] *****************************************")
    out(task, f"W0302 22:14:0{task}.{rng.randrange(0,1000):03d}000 {3100+task*7} torch/distributed/run.py:793] Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to avoid your system being overloaded, please further tune the variable for optimal performance in your application as needed. ")
    out(task, f"W0302 22:14:0{task}.{rng.randrange(0,1000):03d}000 {3100+task*7} torch/distributed/run.py:793] *****************************************")
out(0, "NCCL version 2.21.5+cuda12.4")
t += datetime.timedelta(seconds=95)
it = 0
for i in range(260):
    t += datetime.timedelta(seconds=1.31 + rng.uniform(-0.02, 0.02))
    it += 1
    out(0, f" [{t:%Y-%m-%d %H:%M:%S}] iteration    {31600+it:5d}/  500000 | consumed samples:     {(31600+it)*512:9d} | elapsed time per iteration (ms): {rng.uniform(1290,1330):.1f} | learning rate: 2.904E-04 | global batch size:   512 | lm loss: {rng.uniform(2.05,2.2):.6E} | loss scale: 1.0 | grad norm: {rng.uniform(0.18,0.3):.3f} | number of skipped iterations:   0 | number of nan iterations:   0 |")
te = t + datetime.timedelta(seconds=1.9)
out(1, f"gpu-node-02:3121:3502 [4] transport/net_ib.cc:1696 NCCL WARN NET/IB : Got completion from peer 10.20.1.11<53712> with status=12 opcode=0 len=0 vendor err 129 (Recv) localGid ::ffff:10.20.1.12 remoteGids::ffff:10.20.1.11")
out(1, "gpu-node-02:3121:3502 [4] NCCL INFO transport/net.cc:1298 -> 6")
out(1, "gpu-node-02:3121:3502 [4] NCCL INFO proxy.cc:694 -> 6")
out(1, "gpu-node-02:3121:3502 [4] NCCL INFO proxy.cc:874 -> 6 [Progress Thread]")
out(1, "")
out(1, f"gpu-node-02:3121:3502 [4] transport/net_ib.cc:1696 NCCL WARN NET/IB : Got completion from peer 10.20.1.11<53712> with status=5 opcode=0 len=0 vendor err 249 (Recv) localGid ::ffff:10.20.1.12 remoteGids::ffff:10.20.1.11")
seq = 31877
pfx12 = "[PG ID 0 PG GUID 0(default_pg) Rank 12]"
errm = ("NCCL error: remote process exited or there was a network error, NCCL version 2.21.5\n"
        "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.\n"
        "Last error:\n"
        "NET/IB : Got completion from peer 10.20.1.11<53712> with status=12 opcode=0 len=0 vendor err 129 (Recv) localGid ::ffff:10.20.1.12 remoteGids::ffff:10.20.1.11")
out(1, hdr(12, "E", "ProcessGroupNCCL.cpp:1785", te) + f" {pfx12} Exception (either an error or timeout) detected by watchdog at work: {seq}, last enqueued NCCL work: {seq+1}, last completed NCCL work: {seq-1}.")
out(1, hdr(12, "E", "ProcessGroupNCCL.cpp:630", te) + " [Rank 12] Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.")
out(1, hdr(12, "E", "ProcessGroupNCCL.cpp:636", te) + " [Rank 12] To avoid data inconsistency, we are taking the entire process down.")
lib = "/usr/local/lib/python3.10/dist-packages/torch/lib/libtorch_cuda.so"
wtxt = f"{pfx12} Process group watchdog thread terminated with exception: " + errm
tb = ["Exception raised from checkForNCCLErrorsInternal at /opt/pytorch/pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:2027 (most recent call first):"]
tb += frames_cpp(rng, lib, [
    ("c10::Error::Error(c10::SourceLocation, std::string)", "0x96", "/usr/local/lib/python3.10/dist-packages/torch/lib/libc10.so"),
    ("c10d::ProcessGroupNCCL::checkForNCCLErrorsInternal(std::shared_ptr<c10d::NCCLComm>&)", "0x2f6", None),
    ("c10d::ProcessGroupNCCL::WorkNCCL::checkAndSetException()", "0x70", None),
    ("c10d::ProcessGroupNCCL::watchdogHandler()", "0x1e0", None),
    ("c10d::ProcessGroupNCCL::ncclCommWatchdog()", "0x14d", None),
    ("<unknown function>", "0xdc253", "/usr/lib/x86_64-linux-gnu/libstdc++.so.6"),
    ("<unknown function>", "0x94ac3", "/usr/lib/x86_64-linux-gnu/libc.so.6"),
    ("<unknown function>", "0x126850", "/usr/lib/x86_64-linux-gnu/libc.so.6")])
for i, l in enumerate((hdr(12, "E", "ProcessGroupNCCL.cpp:1601", te) + " " + wtxt).split("\n") + tb + [""]):
    out(1, l)
for l in ["terminate called after throwing an instance of 'c10::DistBackendError'", "  what():  " + wtxt.split("\n")[0]] + wtxt.split("\n")[1:] + tb + [""]:
    out(1, l)
tk = te + datetime.timedelta(seconds=2)
pids1 = {r: 3117 + (r - 8) for r in range(8, 16)}
for r in range(8, 16):
    if r != 12:
        out(1, f"W{tk:%m%d %H:%M:%S}.{rng.randrange(0,1000):03d}000 3107 torch/distributed/elastic/multiprocessing/api.py:897] Sending process {pids1[r]} closing signal SIGTERM")
tk2 = tk + datetime.timedelta(seconds=1)
out(1, f"E{tk2:%m%d %H:%M:%S}.{rng.randrange(0,1000):03d}000 3107 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: -6) local_rank: 4 (pid: {pids1[12]}) of binary: /usr/bin/python")
tbrun = """Traceback (most recent call last):
  File "/usr/local/bin/torchrun", line 33, in <module>
    sys.exit(load_entry_point('torch==2.6.0a0+ecf3bae40a.nv25.1', 'console_scripts', 'torchrun')())
  File "/usr/local/lib/python3.10/dist-packages/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 355, in wrapper
    return f(*args, **kwargs)
  File "/usr/local/lib/python3.10/dist-packages/torch/distributed/run.py", line 918, in main
    run(args)
  File "/usr/local/lib/python3.10/dist-packages/torch/distributed/run.py", line 909, in run
    elastic_launch(
  File "/usr/local/lib/python3.10/dist-packages/torch/distributed/launcher/api.py", line 138, in __call__
    return launch_agent(self._config, self._entrypoint, list(args))
  File "/usr/local/lib/python3.10/dist-packages/torch/distributed/launcher/api.py", line 269, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: 
============================================================
pretrain_gpt.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:"""
for l in tbrun.split("\n"):
    out(1, l)
for l in [f"  time      : {tk2:%Y-%m-%d_%H:%M:%S}", "  host      : gpu-node-02", "  rank      : 12 (local_rank: 4)",
          f"  exitcode  : -6 (pid: {pids1[12]})", "  error_file: <N/A>", f"  traceback : Signal 6 (SIGABRT) received by PID {pids1[12]}",
          "============================================================"]:
    out(1, l)
out(1, "srun: error: gpu-node-02: task 1: Exited with exit code 1")
# node 0: ranks 0-7 time out 10 min after their last progress
tf = te + datetime.timedelta(seconds=598.3)
order = [3, 5, 0, 6, 1, 4, 2, 7]
for r in order:
    pfx = f"[PG ID 0 PG GUID 0(default_pg) Rank {r}]"
    w = f"[Rank {r}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType=_REDUCE_SCATTER_BASE, NumelIn=805306368, NumelOut=50331648, Timeout(ms)=600000) ran for {600000+rng.randrange(10,90)} milliseconds before timing out."
    out(0, hdr(r, "E", "ProcessGroupNCCL.cpp:616", tf) + " " + w)
    out(0, hdr(r, "E", "ProcessGroupNCCL.cpp:1785", tf) + f" {pfx} Exception (either an error or timeout) detected by watchdog at work: {seq}, last enqueued NCCL work: {seq+1}, last completed NCCL work: {seq-1}.")
    out(0, hdr(r, "E", "ProcessGroupNCCL.cpp:1834", tf) + f" {pfx} Timeout at NCCL work: {seq}, last enqueued NCCL work: {seq+1}, last completed NCCL work: {seq-1}.")
    out(0, hdr(r, "E", "ProcessGroupNCCL.cpp:630", tf) + f" [Rank {r}] Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.")
    out(0, hdr(r, "E", "ProcessGroupNCCL.cpp:636", tf) + f" [Rank {r}] To avoid data inconsistency, we are taking the entire process down.")
    out(0, "terminate called after throwing an instance of 'c10::DistBackendError'")
    out(0, f"  what():  {pfx} Process group watchdog thread terminated with exception: {w}")
    out(0, "Exception raised from checkTimeout at /opt/pytorch/pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:618 (most recent call first):")
    for l in frames_cpp(rng, lib, [("c10::Error::Error(c10::SourceLocation, std::string)", "0x96", "/usr/local/lib/python3.10/dist-packages/torch/lib/libc10.so"),
        ("c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(std::optional<std::chrono::duration<long, std::ratio<1l, 1000l> > >)", "0x2b4", None),
        ("c10d::ProcessGroupNCCL::watchdogHandler()", "0x1e0", None), ("c10d::ProcessGroupNCCL::ncclCommWatchdog()", "0x14d", None)]):
        out(0, l)
    out(0, "")
tk3 = tf + datetime.timedelta(seconds=3)
out(0, f"E{tk3:%m%d %H:%M:%S}.{rng.randrange(0,1000):03d}000 3100 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: -6) local_rank: 0 (pid: 3110) of binary: /usr/bin/python")
for l in tbrun.replace("  <NO_OTHER_FAILURES>\n", "").split("\n")[:-2]:
    out(0, l)
pids0 = {r: 3110 + r for r in range(8)}
blocks = {r: [f"[{i}]:", f"  time      : {tk3:%Y-%m-%d_%H:%M:%S}", "  host      : gpu-node-01", f"  rank      : {r} (local_rank: {r})",
              f"  exitcode  : -6 (pid: {pids0[r]})", "  error_file: <N/A>", f"  traceback : Signal 6 (SIGABRT) received by PID {pids0[r]}"] for i, r in enumerate(range(8))}
for r in range(1, 8):
    for l in blocks[r]: out(0, l)
out(0, "------------------------------------------------------------")
out(0, "Root Cause (first observed failure):")
for l in blocks[0] + ["============================================================"]:
    out(0, l)
out(0, "srun: error: gpu-node-01: task 0: Exited with exit code 1")
text = "\n".join(L) + "\n"
a = lineno(text, "NCCL WARN NET/IB"); b = lineno(text, "ncclRemoteError"); c = lineno(text, "[rank3]:[E"); d = lineno(text, "rank      : 0 (local_rank: 0)")
write("slurm_v2_6_ib_link_error", {"slurm-918273.out": text}, {
    "class": "network_error", "initiating_ranks": [12], "collateral_ranks": [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 14, 15],
    "origin": "written from torch v2.6 source torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:watchdogHandler/checkForNCCLErrorsInternal and NCCL 2.21 transport/net_ib.cc (NET/IB completion-error wording as in https://github.com/NVIDIA/nccl/issues/1405 and https://github.com/tatsu-lab/stanford_alpaca/issues/207); Megatron-LM iteration lines; srun --label output of two tasks (one torchrun agent per node)",
    "notes": f"Lines are labelled by Slurm task (0: node gpu-node-01 = ranks 0-7, 1: gpu-node-02 = ranks 8-15). On node 1, rank 12's NCCL proxy reports 'NCCL WARN NET/IB : Got completion from peer ... status=12 ... vendor err 129' (slurm-918273.out:{a}) and its watchdog raises ncclRemoteError with that Last error (slurm-918273.out:{b}); torchrun on node 1 names rank 12 correctly. Ten minutes later ranks 0-7 on node 0 only time out on the same SeqNum=31877 (first at slurm-918273.out:{c}); node 0's torchrun root cause is rank 0 (slurm-918273.out:{d}), collateral."})
print("ok", a, b, c, d)
