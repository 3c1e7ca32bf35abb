# torch 2.5, node 0's console: ncclSystemError at the first collective; node 1 advertised its docker0 address.
import random, sys, datetime
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
from common import *
rng = random.Random(85)
L = ["W0203 17:30:02.004000 5511 torch/distributed/run.py:793] ",
     "W0203 17:30:02.004000 5511 torch/distributed/run.py:793] *****************************************",
     "W0203 17:30:02.004000 5511 torch/distributed/run.py:793] Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to avoid your system being overloaded, please further tune the variable for optimal performance in your application as needed. ",
     "W0203 17:30:02.004000 5511 torch/distributed/run.py:793] *****************************************",
     "[2025-02-03 17:30:09] rank 0/4 on ws-a (local 0), MASTER_ADDR=10.8.0.21 MASTER_PORT=29500",
     "[2025-02-03 17:30:09] rank 1/4 on ws-a (local 1), MASTER_ADDR=10.8.0.21 MASTER_PORT=29500",
     "NCCL version 2.21.5+cuda12.4"]
for r, tid in ((0, 5602), (1, 5611)):
    pid = 5520 + r
    L += [f"ws-a:{pid}:{tid} [{r}] misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to 172.17.0.1<4{rng.randrange(1000,9999)}> failed : Connection refused",
          f"ws-a:{pid}:{tid} [{r}] NCCL INFO misc/socket.cc:565 -> 2",
          f"ws-a:{pid}:{tid} [{r}] NCCL INFO misc/socket.cc:587 -> 2",
          f"ws-a:{pid}:{tid} [{r}] NCCL INFO transport/net_socket.cc:339 -> 2",
          f"ws-a:{pid}:{tid} [{r}] NCCL INFO transport/net.cc:683 -> 2",
          f"ws-a:{pid}:{tid} [{r}] NCCL INFO proxy.cc:1325 -> 2",
          f"ws-a:{pid}:{tid} [{r}] NCCL INFO proxy.cc:1396 -> 2", "",
          f"ws-a:{pid}:{tid} [{r}] proxy.cc:1538 NCCL WARN [Proxy Service {r}] Failed to execute operation Connect from rank {r}, retcode 2"]
for r in (0, 1):
    port = rng.randrange(40000, 50000)
    tb = f"""Traceback (most recent call last):
  File "/home/ana/proj/train.py", line 118, in <module>
    main()
  File "/home/ana/proj/train.py", line 52, in main
    dist.barrier()
  File "/home/ana/.venv/lib/python3.12/site-packages/torch/distributed/c10d_logger.py", line 83, in wrapper
    return func(*args, **kwargs)
           ^^^^^^^^^^^^^^^^^^^^^
  File "/home/ana/.venv/lib/python3.12/site-packages/torch/distributed/distributed_c10d.py", line 4164, in barrier
    work = default_pg.barrier(opts=opts)
           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:2070, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5
ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error. 
Last error:
socketStartConnect: Connect to 172.17.0.1<{port}> failed : Connection refused"""
    L += [f"[rank{r}]: {l}" for l in tb.splitlines()]
L += ["W0203 17:30:14.551000 5511 torch/distributed/elastic/multiprocessing/api.py:897] Sending process 5521 closing signal SIGTERM",
      "E0203 17:30:14.702000 5511 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) local_rank: 0 (pid: 5520) of binary: /home/ana/.venv/bin/python3"]
L += """Traceback (most recent call last):
  File "/home/ana/.venv/bin/torchrun", line 8, in <module>
    sys.exit(main())
             ^^^^^^
  File "/home/ana/.venv/lib/python3.12/site-packages/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 355, in wrapper
    return f(*args, **kwargs)
           ^^^^^^^^^^^^^^^^^^
  File "/home/ana/.venv/lib/python3.12/site-packages/torch/distributed/run.py", line 919, in main
    run(args)
  File "/home/ana/.venv/lib/python3.12/site-packages/torch/distributed/run.py", line 910, in run
    elastic_launch(
  File "/home/ana/.venv/lib/python3.12/site-packages/torch/distributed/launcher/api.py", line 138, in __call__
    return launch_agent(self._config, self._entrypoint, list(args))
           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/home/ana/.venv/lib/python3.12/site-packages/torch/distributed/launcher/api.py", line 269, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: 
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2025-02-03_17:30:14
  host      : ws-a
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 5520)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================""".splitlines()
text = "\n".join(L) + "\n"
a = lineno(text, "NCCL WARN socketStartConnect"); b = lineno(text, "ncclSystemError")
write("nccl_v2_5_init_socket_system_error", {"ws-a.log": text}, {
    "class": "network_error", "initiating_ranks": [0, 1],
    "origin": "written from torch v2.5 source torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:getNCCLComm (C10D_NCCL_CHECK) and NCCL 2.21 misc/socket.cc/proxy.cc (wording as in https://github.com/NVIDIA/nccl-tests/issues/166 and https://github.com/pytorch/pytorch/issues/149984); console of node 0 of a 2-node job only",
    "notes": f"Only node 0's console (ranks 0 and 1) is available. At the first collective both ranks fail to open NCCL connections: 'NCCL WARN socketStartConnect: Connect to 172.17.0.1<...> failed : Connection refused' (ws-a.log:{a}; 172.17.0.1 is a docker bridge address the other node advertised) and DistBackendError ... unhandled system error / ncclSystemError (ws-a.log:{b}). A transport setup failure reported by ranks 0 and 1; the other node's ranks are not in this log, so collateral ranks are not given."})
print("ok", a, b)
