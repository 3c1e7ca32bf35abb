# torch 2.14 format: 8-rank job, rank 6 never joins the ALLREDUCE SeqNum=31207 (a
# rank-local evaluation); the other ranks' watchdogs time out after 10 min. Every
# message fragment below is a string of the torch 2.14.1 wheel's libtorch_cuda.so
# (`strings torch/lib/libtorch_cuda.so`: "Watchdog caught collective operation timeout: ",
# "WorkNCCL(", "SeqNum=", ", OpType=", ", NumelIn=", ", NumelOut=", ", Timeout(ms)=",
# " ran for ", " milliseconds before timing out.", " failure detected by watchdog at work
# sequence id: ", " PG status: last enqueued work: ", ", last completed work: ",
# "Received a dump signal due to a collective timeout from ", "Last enqueued NCCL work: ",
# "To avoid data inconsistency, we are taking the entire process down.").
import random, sys, datetime
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
from common import *
rng = random.Random(214)
def ns(): return rng.randrange(0, 10**9)
def hdr(r, sev, fl, tt): return f"[rank{r}]:[{sev}{tt:%m%d %H:%M:%S}.{ns():09d} {fl}]"
W, LAG, SEQ = 8, 6, 31207
t = datetime.datetime(2026, 10, 2, 9, 0, 0)
L = ["W1002 09:00:00.000000 5120 torch/distributed/run.py:874] *****************************************"]
for i in range(300):
    t += datetime.timedelta(seconds=1.9)
    L.append(f"[{t:%Y-%m-%d %H:%M:%S}] step {31000 + i // 2} | loss {2.1 + rng.random() / 10:.4f} | tok/s {rng.randrange(900000, 990000)}")
L.append(f"[{t:%Y-%m-%d %H:%M:%S}] step 31150 | running evaluation on rank {LAG} (shard-local metrics)")
tf = t + datetime.timedelta(seconds=600)
pfx = lambda r: f"[PG ID 0 PG GUID 0(default_pg) Rank {r}]"
for r in [r for r in range(W) if r != LAG]:
    L.append(hdr(r, "E", "ProcessGroupNCCL.cpp:688", tf) + f" {pfx(r)} Watchdog caught collective operation timeout: WorkNCCL(SeqNum={SEQ}, OpType=ALLREDUCE, NumelIn=2, NumelOut=2, Timeout(ms)=600000) ran for {600000 + rng.randrange(10, 90)} milliseconds before timing out.")
    L.append(hdr(r, "E", "ProcessGroupNCCL.cpp:2264", tf) + f" {pfx(r)}  failure detected by watchdog at work sequence id: {SEQ} PG status: last enqueued work: {SEQ}, last completed work: {SEQ - 1}")
for r in range(W):
    frm = "this local rank" if r == 0 else " rank 0"
    done = SEQ - 1
    enq = SEQ - 1 if r == LAG else SEQ
    L.append(hdr(r, "E", "ProcessGroupNCCL.cpp:2044", tf) + f" {pfx(r)} Received a dump signal due to a collective timeout from {frm} and we will try our best to dump the debug info. Last enqueued NCCL work: {enq}, last completed NCCL work: {done}.This is most likely caused by incorrect usages of collectives, e.g., wrong sizes used across ranks, the order of collectives is not same for all ranks or the scheduled collective, for some reason, didn't run. Additionally, this can be caused by GIL deadlock or other reasons such as network errors or bugs in the communications library (e.g. NCCL), etc. ")
for r in [r for r in range(W) if r != LAG]:
    L.append(hdr(r, "E", "ProcessGroupNCCL.cpp:702", tf) + f" {pfx(r)} To avoid data inconsistency, we are taking the entire process down.")
pids = {r: 5121 + r for r in range(W)}
tt = tf + datetime.timedelta(seconds=3)
L.append(f"E{tt:%m%d %H:%M:%S}.000000 5120 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -6) local_rank: 0 (pid: {pids[0]}) of binary: /usr/bin/python3")
L += ["torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
      "============================================================", "train.py FAILED",
      "------------------------------------------------------------", "Failures:"]
stamp = f"{tt:%Y-%m-%d_%H:%M:%S}"
others = [r for r in range(1, W)]
for i, r in enumerate(others, 1):
    code, sig = (-15, "SIGTERM") if r == LAG else (-6, "SIGABRT")
    L += [f"[{i}]:", f"  time      : {stamp}", "  host      : gpu-h100-12", f"  rank      : {r} (local_rank: {r})",
          f"  exitcode  : {code} (pid: {pids[r]})  ({sig})", "  error_file: <N/A>", f"  traceback : Signal {-code} ({sig}) received by PID {pids[r]}"]
L += ["------------------------------------------------------------", "Root Cause (first observed failure):",
      "[0]:", f"  time      : {stamp}", "  host      : gpu-h100-12", "  rank      : 0 (local_rank: 0)",
      f"  exitcode  : -6 (pid: {pids[0]})  (SIGABRT)", "  error_file: <N/A>", f"  traceback : Signal 6 (SIGABRT) received by PID {pids[0]}",
      "============================================================"]
text = "\n".join(L) + "\n"
a = lineno(text, "Watchdog caught"); b = lineno(text, f"Rank {LAG}] Received a dump signal")
write("nccl_v2_14_hang_dump_signal", {"console.log": text}, {
    "class": "collective_hang", "initiating_ranks": [LAG], "collateral_ranks": [r for r in range(W) if r != LAG],
    "origin": "written from the torch 2.14.1 wheel (message strings of torch/lib/libtorch_cuda.so, listed in written/w14.py) and torch/distributed/elastic/multiprocessing/errors/__init__.py (2.14 summary with the (SIGxxx) suffix)",
    "notes": f"Seven ranks time out on SeqNum={SEQ} OpType=ALLREDUCE after 600 s (first at console.log:{a}); rank {LAG} never enqueued it: its own dump-signal line says 'Last enqueued NCCL work: {SEQ - 1}' (console.log:{b}) while every other rank enqueued {SEQ}. torchrun names rank 0 (collateral)."})
print("ok", a, b)
