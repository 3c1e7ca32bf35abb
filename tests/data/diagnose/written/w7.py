# torch 2.4: rank 3's GPU fails (Xid 79); its all_reduce raises ncclUnhandledCudaError; others SIGTERMed.
import random, sys, datetime
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
from common import *
rng = random.Random(74)
L = ["W0828 06:00:12.331000 139966305412928 torch/distributed/run.py:779] ",
     "W0828 06:00:12.331000 139966305412928 torch/distributed/run.py:779] *****************************************",
     "W0828 06:00:12.331000 139966305412928 torch/distributed/run.py:779] Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to avoid your system being overloaded, please further tune the variable for optimal performance in your application as needed. ",
     "W0828 06:00:12.331000 139966305412928 torch/distributed/run.py:779] *****************************************"]
t = datetime.datetime(2024, 8, 28, 6, 0, 40)
for ep in range(3):
    for b in range(0, 1250, 50):
        t += datetime.timedelta(seconds=14.2 + rng.uniform(-0.4, 0.4))
        L.append(f"Epoch: [{ep}][{b:4d}/1251]  eta: {int((1251-b)*0.284)//60}:{int((1251-b)*0.284)%60:02d}  lr: {0.004*(1-ep/300):.6f}  loss: {rng.uniform(6.1,6.6):.4f} ({rng.uniform(6.2,6.5):.4f})  time: {rng.uniform(0.27,0.30):.4f}  data: 0.0009  max mem: 30871")
    L.append(f"Epoch: [{ep}] Total time: 0:05:56 (0.2847 s / it)")
    L.append(f"Averaged stats: lr: {0.004*(1-ep/300):.6f}  loss: {rng.uniform(6.2,6.4):.4f}")
    L.append(f"Test:  [ 0/25]  eta: 0:00:41  loss: {rng.uniform(5,6):.4f} (5.4415)  acc1: {rng.uniform(5,9):.4f}  acc5: {rng.uniform(15,22):.4f}  time: 1.6711  data: 1.4102  max mem: 30871")
    L.append(f"* Acc@1 {rng.uniform(5,9):.3f} Acc@5 {rng.uniform(15,22):.3f} loss {rng.uniform(5,6):.3f}")
for b in range(0, 650, 50):
    t += datetime.timedelta(seconds=14.2)
    L.append(f"Epoch: [3][{b:4d}/1251]  eta: {int((1251-b)*0.284)//60}:{int((1251-b)*0.284)%60:02d}  lr: 0.003960  loss: {rng.uniform(6.0,6.4):.4f} ({rng.uniform(6.1,6.3):.4f})  time: {rng.uniform(0.27,0.30):.4f}  data: 0.0009  max mem: 30871")
L += ["", "gpu-l40s-02:14422:14422 [3] enqueue.cc:1545 NCCL WARN Cuda failure 'unspecified launch failure'",
      "gpu-l40s-02:14422:14422 [3] NCCL INFO group.cc:231 -> 1", "gpu-l40s-02:14422:14422 [3] NCCL INFO group.cc:453 -> 1",
      "gpu-l40s-02:14422:14422 [3] NCCL INFO group.cc:546 -> 1", "gpu-l40s-02:14422:14422 [3] NCCL INFO enqueue.cc:2213 -> 1"]
tb = """Traceback (most recent call last):
  File "/srv/deit/main.py", line 488, in <module>
    main(args)
  File "/srv/deit/main.py", line 421, in main
    train_stats = train_one_epoch(
                  ^^^^^^^^^^^^^^^^
  File "/srv/deit/engine.py", line 61, in train_one_epoch
    metric_logger.update(loss=reduce_value(loss))
                              ^^^^^^^^^^^^^^^^^^
  File "/srv/deit/utils.py", line 233, in reduce_value
    dist.all_reduce(value)
  File "/opt/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", line 79, in wrapper
    return func(*args, **kwargs)
           ^^^^^^^^^^^^^^^^^^^^^
  File "/opt/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 2288, in all_reduce
    work = group.allreduce([tensor], opts)
           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.20.5
ncclUnhandledCudaError: Call to CUDA function failed.
Last error:
Cuda failure 'unspecified launch failure'"""
L += [f"[rank3]: {l}" for l in tb.splitlines()]
pids = {0: 14419, 1: 14420, 2: 14421, 3: 14422}
L += [f"W0828 06:56:03.{rng.randrange(0,1000):03d}000 139966305412928 torch/distributed/elastic/multiprocessing/api.py:858] Sending process {pids[r]} closing signal SIGTERM" for r in (0, 1, 2)]
L.append("E0828 06:56:04.117000 139966305412928 torch/distributed/elastic/multiprocessing/api.py:833] failed (exitcode: 1) local_rank: 3 (pid: 14422) of binary: /opt/venv/bin/python")
L += """Traceback (most recent call last):
  File "/opt/venv/bin/torchrun", line 8, in <module>
    sys.exit(main())
             ^^^^^^
  File "/opt/venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 348, in wrapper
    return f(*args, **kwargs)
           ^^^^^^^^^^^^^^^^^^
  File "/opt/venv/lib/python3.11/site-packages/torch/distributed/run.py", line 901, in main
    run(args)
  File "/opt/venv/lib/python3.11/site-packages/torch/distributed/run.py", line 892, in run
    elastic_launch(
  File "/opt/venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 133, in __call__
    return launch_agent(self._config, self._entrypoint, list(args))
           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/opt/venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 264, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: 
============================================================
main.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2024-08-28_06:56:03
  host      : gpu-l40s-02
  rank      : 3 (local_rank: 3)
  exitcode  : 1 (pid: 14422)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================""".splitlines()
text = "\n".join(L) + "\n"
dm = "[1209877.402211] NVRM: GPU at PCI:0000:c1:00: GPU-5f1e2a8c-93d4-4f2e-b0a7-1c9e6d3b2a41\n[1209877.402219] NVRM: Xid (PCI:0000:c1:00): 79, pid=14422, name=python, GPU has fallen off the bus.\n[1209877.402224] NVRM: GPU 0000:c1:00.0: GPU has fallen off the bus.\n[1209877.402260] NVRM: A GPU crash dump has been created. If possible, please run\n               NVRM: nvidia-bug-report.sh as root to collect this data before\n               NVRM: the NVIDIA kernel module is unloaded.\n"
a = lineno(text, "NCCL WARN Cuda failure"); b = lineno(text, "ncclUnhandledCudaError"); c = lineno(text, "Root Cause")
write("nccl_v2_4_unhandled_cuda_error", {"console.log": text, "dmesg.txt": dm}, {
    "class": "rank_crash", "initiating_ranks": [3], "collateral_ranks": [0, 1, 2],
    "origin": "written from torch v2.4 source torch/csrc/distributed/c10d/NCCLUtils.hpp:C10D_NCCL_CHECK (message as in https://github.com/NVIDIA/nccl/issues/1410) and NCCL 2.20 enqueue.cc CUDACHECK; NVIDIA driver Xid 79 dmesg lines; DeiT-style training log",
    "notes": f"Rank 3's GPU fails: NCCL WARN Cuda failure 'unspecified launch failure' (console.log:{a}), then rank 3's all_reduce raises DistBackendError ... unhandled cuda error / ncclUnhandledCudaError (console.log:{b}); dmesg.txt:2 has Xid 79 (GPU has fallen off the bus) for pid 14422 = rank 3. A device failure kills one rank (an NCCL error, but not a transport/network one); torchrun names rank 3 (console.log:{c}) and SIGTERMs the rest."})
print("ok", a, b, c)
