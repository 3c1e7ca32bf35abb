# Two k8s workers (one console log each), torch 2.5: rank 5 (worker-1, local 1) raises KeyError;
# node 0's ranks then report ncclRemoteError "Connection closed by remote peer" -> looks like network.
import random, sys, datetime
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
from common import *
rng = random.Random(25)
def ns(): return rng.randrange(0, 10**9)
def hdr(r, sev, fl, tt): return f"[rank{r}]:[{sev}{tt:%m%d %H:%M:%S}.{ns():09d} {fl}]"
n0, n1 = [], []
t = datetime.datetime(2024, 11, 8, 14, 2, 11)
for L, pid in ((n0, 1), (n1, 1)):
    L += [f"W1108 14:02:11.{rng.randrange(0,1000):03d}000 {pid} site-packages/torch/distributed/run.py:793] ",
          f"W1108 14:02:11.{rng.randrange(0,1000):03d}000 {pid} site-packages/torch/distributed/run.py:793] *****************************************",
          f"W1108 14:02:11.{rng.randrange(0,1000):03d}000 {pid} site-packages/torch/distributed/run.py:793] Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to avoid your system being overloaded, please further tune the variable for optimal performance in your application as needed. ",
          f"W1108 14:02:11.{rng.randrange(0,1000):03d}000 {pid} site-packages/torch/distributed/run.py:793] *****************************************"]
t += datetime.timedelta(seconds=40)
n0.append(f"{t:%Y-%m-%d %H:%M:%S},{rng.randrange(1000):03d} INFO     [train_vlm.py:212] world_size=8 backend=nccl NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=eth0")
for step in range(1, 241):
    t += datetime.timedelta(seconds=4.9 + rng.uniform(-0.2, 0.2))
    n0.append(f"{t:%Y-%m-%d %H:%M:%S},{rng.randrange(1000):03d} INFO     [train_vlm.py:301] epoch 0 step {2400+step} loss={rng.uniform(0.8,1.1):.4f} lr=9.81e-06 img/s={rng.uniform(88,93):.1f}")
tc = t + datetime.timedelta(seconds=3.1)
tb = f"""Traceback (most recent call last):
  File "/workspace/train_vlm.py", line 377, in <module>
    main()
  File "/workspace/train_vlm.py", line 288, in main
    batch = next(train_iter)
            ^^^^^^^^^^^^^^^^
  File "/opt/conda/lib/python3.11/site-packages/torch/utils/data/dataloader.py", line 701, in __next__
    data = self._next_data()
           ^^^^^^^^^^^^^^^^^
  File "/opt/conda/lib/python3.11/site-packages/torch/utils/data/dataloader.py", line 1465, in _next_data
    return self._process_data(data)
           ^^^^^^^^^^^^^^^^^^^^^^^^
  File "/opt/conda/lib/python3.11/site-packages/torch/utils/data/dataloader.py", line 1491, in _process_data
    data.reraise()
  File "/opt/conda/lib/python3.11/site-packages/torch/_utils.py", line 715, in reraise
    raise exception
KeyError: Caught KeyError in DataLoader worker process 3.
Original Traceback (most recent call last):
  File "/opt/conda/lib/python3.11/site-packages/torch/utils/data/_utils/worker.py", line 351, in _worker_loop
    data = fetcher.fetch(index)  # type: ignore[possibly-undefined]
           ^^^^^^^^^^^^^^^^^^^^
  File "/opt/conda/lib/python3.11/site-packages/torch/utils/data/_utils/fetch.py", line 55, in fetch
    return self.collate_fn(data)
           ^^^^^^^^^^^^^^^^^^^^^
  File "/workspace/data/collate.py", line 48, in __call__
    pixel_values = torch.stack([ex["pixel_values"] for ex in batch])
                                ~~^^^^^^^^^^^^^^^^
KeyError: 'pixel_values'
"""
for l in tb.splitlines():
    n1.append(f"[rank5]: {l}" if l else "[rank5]: ")
tk = tc + datetime.timedelta(seconds=1.2)
pids1 = {4: 57, 5: 58, 6: 59, 7: 60}
for r in (4, 6, 7):
    n1.append(f"W{tk:%m%d %H:%M:%S}.{rng.randrange(0,1000):03d}000 1 site-packages/torch/distributed/elastic/multiprocessing/api.py:897] Sending process {pids1[r]} closing signal SIGTERM")
tk2 = tk + datetime.timedelta(seconds=0.6)
n1.append(f"E{tk2:%m%d %H:%M:%S}.{rng.randrange(0,1000):03d}000 1 site-packages/torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) local_rank: 1 (pid: 58) of binary: /opt/conda/bin/python")
n1 += """Traceback (most recent call last):
  File "/opt/conda/bin/torchrun", line 8, in <module>
    sys.exit(main())
             ^^^^^^
  File "/opt/conda/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 355, in wrapper
    return f(*args, **kwargs)
           ^^^^^^^^^^^^^^^^^^
  File "/opt/conda/lib/python3.11/site-packages/torch/distributed/run.py", line 919, in main
    run(args)
  File "/opt/conda/lib/python3.11/site-packages/torch/distributed/run.py", line 910, in run
    elastic_launch(
  File "/opt/conda/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 138, in __call__
    return launch_agent(self._config, self._entrypoint, list(args))
           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/opt/conda/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 269, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: 
============================================================
train_vlm.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:""".splitlines()
n1 += [f"  time      : {tk2:%Y-%m-%d_%H:%M:%S}", "  host      : vlm-sft-worker-1", "  rank      : 5 (local_rank: 1)",
       "  exitcode  : 1 (pid: 58)", "  error_file: <N/A>", "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html",
       "============================================================"]
# node 0 sees the peer's sockets close
te = tc + datetime.timedelta(seconds=1.5)
seq = 9803
for r, tid in ((1, 211), (3, 233), (0, 190), (2, 222)):
    n0.append(f"vlm-sft-worker-0:{40+r}:{tid} [{r}] misc/socket.cc:50 NCCL WARN socketProgress: Connection closed by remote peer vlm-sft-worker-1.vlm-sft.default.svc.cluster.local<{rng.randrange(33000,60000)}>")
    n0.append(f"vlm-sft-worker-0:{40+r}:{tid} [{r}] NCCL INFO misc/socket.cc:752 -> 6")
    n0.append(f"vlm-sft-worker-0:{40+r}:{tid} [{r}] NCCL INFO transport/net_socket.cc:474 -> 6")
    n0.append(f"vlm-sft-worker-0:{40+r}:{tid} [{r}] NCCL INFO transport/net.cc:1302 -> 6")
    n0.append(f"vlm-sft-worker-0:{40+r}:{tid} [{r}] NCCL INFO proxy.cc:698 -> 6")
    n0.append(f"vlm-sft-worker-0:{40+r}:{tid} [{r}] NCCL INFO proxy.cc:878 -> 6 [Progress Thread]")
    n0.append("")
for r in (1, 3, 0, 2):
    pfx = f"[PG ID 0 PG GUID 0(default_pg) Rank {r}]"
    n0.append(hdr(r, "E", "ProcessGroupNCCL.cpp:1785", te) + f" {pfx} Exception (either an error or timeout) detected by watchdog at work: {seq}, last enqueued NCCL work: {seq}, last completed NCCL work: {seq-1}.")
    n0.append(hdr(r, "E", "ProcessGroupNCCL.cpp:630", te) + f" [Rank {r}] Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.")
    n0.append(hdr(r, "E", "ProcessGroupNCCL.cpp:636", te) + f" [Rank {r}] To avoid data inconsistency, we are taking the entire process down.")
    msg = (f"{pfx} Process group watchdog thread terminated with exception: NCCL error: remote process exited or there was a network error, NCCL version 2.21.5\n"
           "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.\n"
           "Last error:\n"
           f"socketProgress: Connection closed by remote peer vlm-sft-worker-1.vlm-sft.default.svc.cluster.local<{rng.randrange(33000,60000)}>")
    tbc = ["Exception raised from checkForNCCLErrorsInternal at ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:2027 (most recent call first):"]
    tbc += frames_cpp(rng, "/opt/conda/lib/python3.11/site-packages/torch/lib/libtorch_cuda.so", [
        ("c10::Error::Error(c10::SourceLocation, std::string)", "0x96", "/opt/conda/lib/python3.11/site-packages/torch/lib/libc10.so"),
        ("c10d::ProcessGroupNCCL::checkForNCCLErrorsInternal(std::shared_ptr<c10d::NCCLComm>&)", "0x220", None),
        ("c10d::ProcessGroupNCCL::WorkNCCL::checkAndSetException()", "0x7c", None),
        ("c10d::ProcessGroupNCCL::watchdogHandler()", "0x213", None),
        ("c10d::ProcessGroupNCCL::ncclCommWatchdog()", "0x14d", None),
        ("<unknown function>", "0x145c0", "/opt/conda/lib/python3.11/site-packages/torch/lib/libtorch.so"),
        ("<unknown function>", "0x94ac3", "/lib/x86_64-linux-gnu/libc.so.6"),
        ("clone", "0x44", "/lib/x86_64-linux-gnu/libc.so.6")])
    n0 += (hdr(r, "E", "ProcessGroupNCCL.cpp:1601", te) + " " + msg).split("\n") + tbc + [""]
    n0 += ["terminate called after throwing an instance of 'c10::DistBackendError'", "  what():  " + msg.split("\n")[0]] + msg.split("\n")[1:] + tbc + [""]
tk3 = te + datetime.timedelta(seconds=1)
n0.append(f"E{tk3:%m%d %H:%M:%S}.{rng.randrange(0,1000):03d}000 1 site-packages/torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: -6) local_rank: 0 (pid: 53) of binary: /opt/conda/bin/python")
n0 += n1[n1.index("Traceback (most recent call last):", 300 if len(n1) > 300 else 0) if False else len(n0):len(n0)]
hdr_tb = [l for l in n1 if not l.startswith("[rank5]")]
start = hdr_tb.index("Traceback (most recent call last):")
n0 += hdr_tb[start:hdr_tb.index("Failures:") + 1]
pids0 = {0: 53, 1: 54, 2: 55, 3: 56}
for i, r in enumerate((1, 2, 3)):
    n0 += [f"[{i+1}]:", f"  time      : {tk3:%Y-%m-%d_%H:%M:%S}", "  host      : vlm-sft-worker-0", f"  rank      : {r} (local_rank: {r})",
           f"  exitcode  : -6 (pid: {pids0[r]})", "  error_file: <N/A>", f"  traceback : Signal 6 (SIGABRT) received by PID {pids0[r]}"]
n0 += ["------------------------------------------------------------", "Root Cause (first observed failure):",
       "[0]:", f"  time      : {tk3:%Y-%m-%d_%H:%M:%S}", "  host      : vlm-sft-worker-0", "  rank      : 0 (local_rank: 0)",
       "  exitcode  : -6 (pid: 53)", "  error_file: <N/A>", "  traceback : Signal 6 (SIGABRT) received by PID 53",
       "============================================================"]
t0 = "\n".join(n0) + "\n"; t1 = "\n".join(n1) + "\n"
a = lineno(t1, "KeyError: 'pixel_values'"); b = lineno(t0, "ncclRemoteError"); c = lineno(t0, "NCCL WARN socketProgress")
write("k8s_v2_6_crash_then_remote_error", {"vlm-sft-worker-0.log": t0, "vlm-sft-worker-1.log": t1}, {
    "class": "rank_crash", "initiating_ranks": [5], "collateral_ranks": [0, 1, 2, 3, 4, 6, 7],
    "origin": "written from torch v2.6 source torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:checkForNCCLErrorsInternal/watchdogHandler and NCCL 2.21 misc/socket.cc (socketProgress wording as in https://github.com/NVIDIA/nccl-tests/issues/166, ncclRemoteError text as in https://github.com/tatsu-lab/stanford_alpaca/issues/207); one console log per Kubernetes PyTorchJob worker pod",
    "notes": f"Rank 5 (worker-1, local rank 1) dies of a Python exception in its DataLoader collate: vlm-sft-worker-1.log:{a} KeyError, exit code 1, torchrun on worker-1 names rank 5. About 1.5 s later every rank on worker-0 reports 'NCCL WARN socketProgress: Connection closed by remote peer vlm-sft-worker-1...' (vlm-sft-worker-0.log:{c}) and ncclRemoteError (vlm-sft-worker-0.log:{b}): this looks like a network error but is the consequence of rank 5's process exiting (the peer was dead, not the link). worker-0's torchrun root cause (rank 0, SIGABRT) is collateral."})
print("ok", a, b, c)
