# torch 2.5 healthy run with scary-looking but harmless NCCL/c10d warnings; finishes, exit 0.
import random, sys, datetime
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
from common import *
rng = random.Random(115)
def ns(): return rng.randrange(0, 10**9)
L = ["W1021 08:01:55.662000 30112 torch/distributed/run.py:793] ",
     "W1021 08:01:55.662000 30112 torch/distributed/run.py:793] *****************************************",
     "W1021 08:01:55.662000 30112 torch/distributed/run.py:793] Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to avoid your system being overloaded, please further tune the variable for optimal performance in your application as needed. ",
     "W1021 08:01:55.662000 30112 torch/distributed/run.py:793] *****************************************"]
for r in (2, 0, 3, 1):
    L.append(f"[rank{r}]:[W1021 08:02:03.{ns():09d} ProcessGroupNCCL.cpp:4115] [PG ID 0 PG GUID 0 Rank {r}]  using GPU {r} to perform barrier as devices used by this process are currently unknown. This can potentially cause a hang if this rank to GPU mapping is incorrect.Specify device_ids in barrier() to force use of a particular device,or call init_process_group() with a device_id.")
L.append("NCCL version 2.21.5+cuda12.4")
t = datetime.datetime(2024, 10, 21, 8, 2, 20)
for step in range(1, 301):
    t += datetime.timedelta(seconds=0.61)
    if step % 2 == 0:
        L.append(f"{t:%Y-%m-%d %H:%M:%S} | step {step:5d}/300 | loss {rng.uniform(2.2,2.6)*(1-step/900):.4f} | lr {3e-4*(1-step/300):.2e} | {rng.randrange(51000,53000)} tok/s")
    if step == 161:
        L.append(f"sim-a100-04:30120:30190 [0] transport/net_ib.cc:98 NCCL WARN NET/IB : mlx5_0:1 Got async event : port error")
        L.append(f"sim-a100-04:30123:30188 [3] transport/net_ib.cc:98 NCCL WARN NET/IB : mlx5_0:1 Got async event : port error")
    if step == 163:
        L.append(f"sim-a100-04:30120:30190 [0] transport/net_ib.cc:98 NCCL WARN NET/IB : mlx5_0:1 Got async event : port active")
        L.append(f"sim-a100-04:30123:30188 [3] transport/net_ib.cc:98 NCCL WARN NET/IB : mlx5_0:1 Got async event : port active")
    if step in (100, 200, 300):
        L.append(f"{t:%Y-%m-%d %H:%M:%S} | Saving checkpoint to /ckpt/run-17/step_{step:06d}.pt")
        t += datetime.timedelta(seconds=6.8)
        L.append(f"{t:%Y-%m-%d %H:%M:%S} | Saved checkpoint to /ckpt/run-17/step_{step:06d}.pt (4.1 GiB, 6.8 s)")
L.append(f"{t:%Y-%m-%d %H:%M:%S} | training finished in 0:03:31")
for r in (1, 0, 3, 2):
    L.append(f"[rank{r}]:[W1021 08:05:52.{ns():09d} ProcessGroupNCCL.cpp:1250] Warning: WARNING: process group has NOT been destroyed before we destruct ProcessGroupNCCL. On normal program exit, the application should call destroy_process_group to ensure that any pending NCCL operations have finished in this process. In rare cases this process can exit before this point and block the progress of another member of the process group. This constraint has always been present,  but this warning has only recently been added. For more info, please see https://pytorch.org/docs/stable/distributed.html#shutdown (function operator())")
text = "\n".join(L) + "\n"
a = lineno(text, "NCCL WARN"); b = lineno(text, "training finished"); c = lineno(text, "process group has NOT been destroyed")
write("nccl_v2_5_healthy_with_warnings", {"console.log": text}, {
    "class": "none", "initiating_ranks": [], "collateral_ranks": [],
    "origin": "written from torch v2.5 source torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:barrier (device warning) and ~ProcessGroupNCCL (destroy warning), NCCL 2.21 transport/net_ib.cc:ncclIbAsyncThreadMain WARN('NET/IB : %s:%d Got async event : %s'); torchrun exits 0 and prints no failure summary",
    "notes": f"A job that finished: the IB link flapped ('NCCL WARN NET/IB : mlx5_0:1 Got async event : port error' at console.log:{a}, 'port active' two lines later) and recovered, step lines continue without a gap; the '[W... ProcessGroupNCCL.cpp:4115] using GPU N to perform barrier' and 'process group has NOT been destroyed' (console.log:{c}) warnings are noise; 'training finished' at console.log:{b}, no Watchdog/ChildFailedError lines."})
print("ok", a, b, c)
