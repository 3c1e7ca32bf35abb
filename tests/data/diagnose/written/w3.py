# torch 2.10-2.12 format: rank 5 never enqueues SeqNum 4412 (stuck in a python-side loop);
# the others time out; rank 5's own line shows last enqueued 4411 after it observes the dump signal.
import random, sys, datetime
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
from common import *
rng = random.Random(210)
L = []
def ns(): return rng.randrange(0, 10**9)
def hdr(r, sev, fl, tt): return f"[rank{r}]:[{sev}{tt:%m%d %H:%M:%S}.{ns():09d} {fl}]"
t = datetime.datetime(2026, 5, 21, 3, 10, 4)
L += [f"W0521 03:10:04.118000 88123 torch/distributed/run.py:852] ",
      f"W0521 03:10:04.118000 88123 torch/distributed/run.py:852] *****************************************",
      f"W0521 03:10:04.118000 88123 torch/distributed/run.py:852] Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to avoid your system being overloaded, please further tune the variable for optimal performance in your application as needed. ",
      f"W0521 03:10:04.118000 88123 torch/distributed/run.py:852] *****************************************"]
t += datetime.timedelta(seconds=50)
step = 0
loss = 2.7
for i in range(230):
    t += datetime.timedelta(seconds=2.4)
    step += 1
    loss = max(1.4, loss*0.998 + rng.uniform(-0.02, 0.02))
    L.append(f"[titan] {t:%Y-%m-%d %H:%M:%S},{rng.randrange(0,1000):03d} - root - INFO - step: {1980+step:5d}  loss: {loss:7.4f}  grad_norm: {rng.uniform(0.2,0.5):6.4f}  memory: 61.02GiB(77.12%)  tps: {rng.randrange(3300,3420):,}  tflops: {rng.uniform(190,198):.2f}  mfu: {rng.uniform(19.2,20.0):.2f}%")
    if (1980+step) % 100 == 0:
        L.append(f"[titan] {t:%Y-%m-%d %H:%M:%S},{rng.randrange(0,1000):03d} - root - INFO - [GC] Peforming periodical GC collection 0.07 seconds")
tf = t + datetime.timedelta(seconds=600.1)
seq = 4412
others = [0, 1, 2, 3, 4, 6, 7]
order = [2, 6, 0, 3, 7, 1, 4]
wm = {}
for r in order:
    wm[r] = f"[Rank {r}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for {600000+rng.randrange(30,99)} milliseconds before timing out."
    pfx = f"[PG ID 0 PG GUID 0(default_pg) Rank {r}]"
    L.append(hdr(r, "E", "ProcessGroupNCCL.cpp:757", tf) + " " + wm[r])
    L.append(hdr(r, "E", "ProcessGroupNCCL.cpp:2395", tf) + f" {pfx}  failure detected by watchdog at work sequence id: {seq} PG status: last enqueued work: {seq}, last completed work: {seq-1}")
    L.append(hdr(r, "E", "ProcessGroupNCCL.cpp:801", tf) + " Stack trace of the failed collective: ")
    L += ["#0 all_reduce from /usr/local/lib/python3.12/dist-packages/torch/distributed/distributed_c10d.py:3174",
          "#1 wrapper from /usr/local/lib/python3.12/dist-packages/torch/distributed/c10d_logger.py:83",
          "#2 _dist_reduce from /workspace/torchtitan/torchtitan/distributed/utils.py:41",
          "#3 dist_max from /workspace/torchtitan/torchtitan/distributed/utils.py:55",
          "#4 train_step from /workspace/torchtitan/torchtitan/train.py:512",
          "#5 train from /workspace/torchtitan/torchtitan/train.py:590",
          "#6 wrapper from /usr/local/lib/python3.12/dist-packages/torch/distributed/elastic/multiprocessing/errors/__init__.py:362",
          "#7 <module> from /workspace/torchtitan/torchtitan/train.py:701",
          ""]
    L.append(hdr(r, "E", "ProcessGroupNCCL.cpp:2732", tf) + f" {pfx} First PG on this rank to signal dumping.")
tf2 = tf + datetime.timedelta(milliseconds=180)
for r in order[:3]:
    pfx = f"[PG ID 0 PG GUID 0(default_pg) Rank {r}]"
    L.append(hdr(r, "E", "ProcessGroupNCCL.cpp:1987", tf2) + f" {pfx} Received a dump signal due to a collective timeout from this local rank and we will try our best to dump the debug info. Last enqueued NCCL work: {seq}, last completed NCCL work: {seq-1}.This is most likely caused by incorrect usages of collectives, e.g., wrong sizes used across ranks, the order of collectives is not same for all ranks or the scheduled collective, for some reason, didn't run. Additionally, this can be caused by GIL deadlock or other reasons such as network errors or bugs in the communications library (e.g. NCCL), etc. ")
L.append(hdr(5, "E", "ProcessGroupNCCL.cpp:1922", tf2) + " [PG ID 0 PG GUID 0(default_pg) Rank 5] Observed flight recorder dump signal from another rank via TCPStore.")
for r in order[3:]:
    pfx = f"[PG ID 0 PG GUID 0(default_pg) Rank {r}]"
    L.append(hdr(r, "E", "ProcessGroupNCCL.cpp:1987", tf2) + f" {pfx} Received a dump signal due to a collective timeout from this local rank and we will try our best to dump the debug info. Last enqueued NCCL work: {seq}, last completed NCCL work: {seq-1}.This is most likely caused by incorrect usages of collectives, e.g., wrong sizes used across ranks, the order of collectives is not same for all ranks or the scheduled collective, for some reason, didn't run. Additionally, this can be caused by GIL deadlock or other reasons such as network errors or bugs in the communications library (e.g. NCCL), etc. ")
L.append(hdr(5, "E", "ProcessGroupNCCL.cpp:1987", tf2) + f" [PG ID 0 PG GUID 0(default_pg) Rank 5] Received a dump signal due to a collective timeout from  rank 2 and we will try our best to dump the debug info. Last enqueued NCCL work: {seq-1}, last completed NCCL work: {seq-1}.This is most likely caused by incorrect usages of collectives, e.g., wrong sizes used across ranks, the order of collectives is not same for all ranks or the scheduled collective, for some reason, didn't run. Additionally, this can be caused by GIL deadlock or other reasons such as network errors or bugs in the communications library (e.g. NCCL), etc. ")
for r in order + [5]:
    L.append(hdr(r, "E", "ProcessGroupNCCL.cpp:1700", tf2) + f" [PG ID 0 PG GUID 0(default_pg) Rank {r}] ProcessGroupNCCL preparing to dump debug info. Include stack trace: 1, only active collectives: 0")
tf3 = tf2 + datetime.timedelta(seconds=480)
for r in order + [5]:
    pfx = f"[PG ID 0 PG GUID 0(default_pg) Rank {r}]"
    L.append(hdr(r, "F", "ProcessGroupNCCL.cpp:1725", tf3) + f" {pfx} {pfx} Terminating the process after attempting to dump debug info, due to collective timeout or exception.")
pid = {r: 88140 + r for r in range(8)}
tt = tf3 + datetime.timedelta(seconds=1)
L.append(f"E{tt:%m%d %H:%M:%S}.{rng.randrange(0,1000):03d}000 88123 torch/distributed/elastic/multiprocessing/api.py:914] failed (exitcode: -6) local_rank: 2 (pid: {pid[2]}) of binary: /usr/bin/python")
L += """Traceback (most recent call last):
  File "/usr/local/bin/torchrun", line 7, in <module>
    sys.exit(main())
             ^^^^^^
  File "/usr/local/lib/python3.12/dist-packages/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 362, in wrapper
    return f(*args, **kwargs)
           ^^^^^^^^^^^^^^^^^^
  File "/usr/local/lib/python3.12/dist-packages/torch/distributed/run.py", line 991, in main
    run(args)
  File "/usr/local/lib/python3.12/dist-packages/torch/distributed/run.py", line 982, in run
    elastic_launch(
  File "/usr/local/lib/python3.12/dist-packages/torch/distributed/launcher/api.py", line 170, in __call__
    return launch_agent(self._config, self._entrypoint, list(args))
           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/usr/local/lib/python3.12/dist-packages/torch/distributed/launcher/api.py", line 317, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: 
============================================================
torchtitan/train.py FAILED
------------------------------------------------------------
Failures:""".splitlines()
stamp = f"{tt:%Y-%m-%d_%H:%M:%S}"
fl = [2, 0, 1, 3, 4, 5, 6, 7]
blocks = {r: [f"[{i}]:", f"  time      : {stamp}", "  host      : gpu-h100-s14", f"  rank      : {r} (local_rank: {r})",
              f"  exitcode  : -6 (pid: {pid[r]})", "  error_file: <N/A>", f"  traceback : Signal 6 (SIGABRT) received by PID {pid[r]}"] for i, r in enumerate(sorted(fl))}
for r in sorted(fl):
    if r != 2:
        L += blocks[r]
L += ["------------------------------------------------------------", "Root Cause (first observed failure):"] + blocks[2] + ["============================================================"]
text = "\n".join(L) + "\n"
a = lineno(text, "[rank2]:[E"); b = lineno(text, "from  rank 2"); c = lineno(text, "Root Cause")
write("nccl_v2_10_hang_lagging_rank", {"console.log": text}, {
    "class": "collective_hang", "initiating_ranks": [5], "collateral_ranks": [0, 1, 2, 3, 4, 6, 7],
    "origin": "written from torch v2.10 source torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:Watchdog::runLoop/HeartbeatMonitor::runLoop (pytorch/pytorch main; line numbers and wording as printed by a 2026 NGC build in a public benchmark log); torchtitan log lines",
    "notes": f"Seven ranks report the timeout of SeqNum=4412 (ALLREDUCE NumelIn=1, first at console.log:{a}) with 'last enqueued work: 4412'. Rank 5 never reports a timeout: it only observes the dump signal and its own line (console.log:{b}) says 'Last enqueued NCCL work: 4411, last completed NCCL work: 4411': it never enqueued 4412, so it is the rank the others wait for. All eight ranks, rank 5 included, are then terminated by the heartbeat monitor 480 s later (F lines) and exit -6; torchrun's root cause (console.log:{c}) is rank 2, a collateral rank."})
print("ok", a, b, c)
