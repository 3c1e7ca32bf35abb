# torch 2.4 format: FSDP, rank 2 skips a layer's forward -> at SeqNum 9141 rank 2 is in
# _REDUCE_SCATTER_BASE while ranks 0,1,3 are in _ALLGATHER_BASE; all four time out.
import random, sys, datetime
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
from common import *
rng = random.Random(24)
L = []
L += ["W0917 11:02:31.540000 139872114845504 torch/distributed/run.py:779] ",
      "W0917 11:02:31.540000 139872114845504 torch/distributed/run.py:779] *****************************************",
      "W0917 11:02:31.540000 139872114845504 torch/distributed/run.py:779] Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to avoid your system being overloaded, please further tune the variable for optimal performance in your application as needed. ",
      "W0917 11:02:31.540000 139872114845504 torch/distributed/run.py:779] *****************************************"]
t = datetime.datetime(2024, 9, 17, 11, 3, 2)
L.append(f"2024-09-17 11:03:02 | INFO | moe_train | world size 4, FSDP FULL_SHARD, experts per rank 4, capacity factor 1.25")
loss = 3.1
for it in range(1, 281):
    t += datetime.timedelta(seconds=1.9 + rng.uniform(-0.1, 0.1))
    loss = max(1.2, loss * 0.997 + rng.uniform(-0.03, 0.03))
    if it % 2 == 0:
        L.append(f"{t:%Y-%m-%d %H:%M:%S} | INFO | moe_train | iter {it:6d} | loss {loss:.4f} | aux_loss {rng.uniform(0.009, 0.013):.5f} | lr 1.20e-04 | tokens/s {rng.randrange(41000, 43500)} | dropped_tokens {rng.randrange(0, 30)}")
t_fail = t + datetime.timedelta(seconds=600.2)
ops = {0: ("_ALLGATHER_BASE", 19008, 76032), 1: ("_ALLGATHER_BASE", 19008, 76032),
       3: ("_ALLGATHER_BASE", 19008, 76032), 2: ("_REDUCE_SCATTER_BASE", 76032, 19008)}
seq = 9141
enq = {0: 9141, 1: 9141, 3: 9141, 2: 9146}
pid = {0: 51230, 1: 51231, 2: 51232, 3: 51233}
def ns(): return rng.randrange(0, 10**9)
def hdr(r, sev, fl, tt): return f"[rank{r}]:[{sev}{tt:%m%d %H:%M:%S}.{ns():09d} {fl}]"
def work(r):
    op, i, o = ops[r]
    return f"WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn={i}, NumelOut={o}, Timeout(ms)=600000) ran for {600000 + rng.randrange(20, 120)} milliseconds before timing out."
wmsg = {}
for r in [1, 3, 0, 2]:
    wmsg[r] = f"[Rank {r}] Watchdog caught collective operation timeout: {work(r)}"
    L.append(hdr(r, "E", "ProcessGroupNCCL.cpp:607", t_fail) + " " + wmsg[r])
for r in [1, 3, 0, 2]:
    pfx = f"[PG 0 (default_pg) Rank {r}]"
    L.append(hdr(r, "E", "ProcessGroupNCCL.cpp:1664", t_fail) + f" {pfx} Exception (either an error or timeout) detected by watchdog at work: {seq}, last enqueued NCCL work: {enq[r]}, last completed NCCL work: {seq-1}.")
for r in [1, 3, 0, 2]:
    pfx = f"[PG 0 (default_pg) Rank {r}]"
    L.append(hdr(r, "E", "ProcessGroupNCCL.cpp:1709", t_fail) + f" {pfx} Timeout at NCCL work: {seq}, last enqueued NCCL work: {enq[r]}, last completed NCCL work: {seq-1}.")
    L.append(hdr(r, "E", "ProcessGroupNCCL.cpp:621", t_fail) + f" [Rank {r}] Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.")
    L.append(hdr(r, "E", "ProcessGroupNCCL.cpp:627", t_fail) + f" [Rank {r}] To avoid data inconsistency, we are taking the entire process down.")
for r in [1, 3, 0, 2]:
    pfx = f"[PG 0 (default_pg) Rank {r}]"
    msg = f"{pfx} Process group watchdog thread terminated with exception: {wmsg[r]}"
    lib = "/home/user/.venv/lib/python3.11/site-packages/torch/lib/libtorch_cuda.so"
    tb = ["Exception raised from checkTimeout at ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:609 (most recent call first):"]
    tb += frames_cpp(rng, lib, [
        ("c10::Error::Error(c10::SourceLocation, std::string)", "0x96", "/home/user/.venv/lib/python3.11/site-packages/torch/lib/libc10.so"),
        ("c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(std::optional<std::chrono::duration<long, std::ratio<1l, 1000l> > >)", "0x1d2", None),
        ("c10d::ProcessGroupNCCL::watchdogHandler()", "0x233", None),
        ("c10d::ProcessGroupNCCL::ncclCommWatchdog()", "0x14d", None),
        ("<unknown function>", "0xdbbf4", "/home/user/.venv/lib/python3.11/site-packages/torch/lib/../../../../libstdc++.so.6"),
        ("<unknown function>", "0x94ac3", "/lib/x86_64-linux-gnu/libc.so.6"),
        ("<unknown function>", "0x126850", "/lib/x86_64-linux-gnu/libc.so.6")])
    L.append(hdr(r, "E", "ProcessGroupNCCL.cpp:1515", t_fail) + " " + msg)
    L += tb + [""]
    L += ["terminate called after throwing an instance of 'c10::DistBackendError'", f"  what():  {msg}"] + tb + [""]
tt = t_fail + datetime.timedelta(seconds=1)
L.append(f"E{tt:%m%d %H:%M:%S}.{rng.randrange(0,1000):03d}000 139872114845504 torch/distributed/elastic/multiprocessing/api.py:833] failed (exitcode: -6) local_rank: 0 (pid: {pid[0]}) of binary: /home/user/.venv/bin/python")
L += """Traceback (most recent call last):
  File "/home/user/.venv/bin/torchrun", line 8, in <module>
    sys.exit(main())
             ^^^^^^
  File "/home/user/.venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 348, in wrapper
    return f(*args, **kwargs)
           ^^^^^^^^^^^^^^^^^^
  File "/home/user/.venv/lib/python3.11/site-packages/torch/distributed/run.py", line 901, in main
    run(args)
  File "/home/user/.venv/lib/python3.11/site-packages/torch/distributed/run.py", line 892, in run
    elastic_launch(
  File "/home/user/.venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 133, in __call__
    return launch_agent(self._config, self._entrypoint, list(args))
           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/home/user/.venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 264, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: 
============================================================
moe_train.py FAILED
------------------------------------------------------------
Failures:""".splitlines()
stamp = f"{tt:%Y-%m-%d_%H:%M:%S}"
blocks = {r: [f"[{i}]:", f"  time      : {stamp}", "  host      : h100-dev-3", f"  rank      : {r} (local_rank: {r})",
              f"  exitcode  : -6 (pid: {pid[r]})", "  error_file: <N/A>", f"  traceback : Signal 6 (SIGABRT) received by PID {pid[r]}"] for i, r in enumerate([1, 2, 3, 0])}
for r in [1, 2, 3]:
    L += blocks[r]
L += ["------------------------------------------------------------", "Root Cause (first observed failure):"] + blocks[0] + ["============================================================"]
text = "\n".join(L) + "\n"
a = lineno(text, "OpType=_REDUCE_SCATTER_BASE")
b = lineno(text, "[rank1]:[E")
c = lineno(text, "[PG 0 (default_pg) Rank 2] Exception")
write("nccl_v2_4_desync_optype", {"console.log": text}, {
    "class": "desync", "initiating_ranks": [2], "collateral_ranks": [0, 1, 3],
    "origin": "written from torch v2.4 source torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:WorkNCCL::checkTimeout/watchdogHandler (line layout and numbers as in https://github.com/sgl-project/sglang/issues/1693 and https://github.com/hiyouga/LlamaFactory/issues/6269)",
    "notes": f"All four ranks time out on the same SeqNum=9141, but rank 2's work is OpType=_REDUCE_SCATTER_BASE (console.log:{a}) while ranks 0, 1, 3 are in _ALLGATHER_BASE with other sizes (first at console.log:{b}); rank 2 also has enqueued 5 more works (last enqueued NCCL work: 9146 at console.log:{c}, versus 9141 on the others): rank 2 skipped a forward all_gather and ran ahead into backward. Every rank aborts with SIGABRT; torchrun's root cause (rank 0) is arbitrary."})
print("ok", a, b, c)
