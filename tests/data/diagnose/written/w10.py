# torch 2.6: rank 0 consolidates a DeepSpeed ZeRO-3 16-bit model on the host; kernel OOM killer kills it.
import random, sys, datetime
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
from common import *
rng = random.Random(106)
L = ["W0611 20:12:40.118000 402211 site-packages/torch/distributed/run.py:793] ",
     "W0611 20:12:40.118000 402211 site-packages/torch/distributed/run.py:793] *****************************************",
     "W0611 20:12:40.118000 402211 site-packages/torch/distributed/run.py:793] Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to avoid your system being overloaded, please further tune the variable for optimal performance in your application as needed. ",
     "W0611 20:12:40.118000 402211 site-packages/torch/distributed/run.py:793] *****************************************",
     "[2025-06-11 20:13:22,904] [INFO] [config.py:1003:print_user_config]   json = {",
     '    "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}, "stage3_gather_16bit_weights_on_model_save": true},',
     '    "bf16": {"enabled": true}, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 16',
     "}"]
t = datetime.datetime(2025, 6, 11, 20, 15, 0)
for step in range(1, 181):
    t += datetime.timedelta(seconds=9.7 + rng.uniform(-0.3, 0.3))
    L.append(f"{{'loss': {rng.uniform(0.9,1.2):.4f}, 'grad_norm': {rng.uniform(0.3,0.9):.16f}, 'learning_rate': {2e-5*(1-step/900):.16g}, 'epoch': {step/450:.2f}}}")
    if step % 30 == 0:
        L.append(f"{step/900*100:3.0f}%|{'█'*int(step/900*20):<20}| {step}/900 [{int(step*9.7)//3600}:{int(step*9.7)%3600//60:02d}:{int(step*9.7)%60:02d}<{int((900-step)*9.7)//3600}:{int((900-step)*9.7)%3600//60:02d}:{int((900-step)*9.7)%60:02d},  9.71s/it]")
L += ["[INFO|trainer.py:3984] 2025-06-11 20:44:11,356 >> Saving model checkpoint to /home/ml/out/llama-70b-lora/checkpoint-180",
      "[2025-06-11 20:44:11,402] [INFO] [engine.py:3804:save_16bit_model] Saving model weights to /home/ml/out/llama-70b-lora/checkpoint-180/pytorch_model.bin, tag: global_step180",
      "W0611 20:46:58.513000 402211 site-packages/torch/distributed/elastic/multiprocessing/api.py:897] Sending process 402288 closing signal SIGTERM",
      "W0611 20:46:58.514000 402211 site-packages/torch/distributed/elastic/multiprocessing/api.py:897] Sending process 402289 closing signal SIGTERM",
      "W0611 20:46:58.514000 402211 site-packages/torch/distributed/elastic/multiprocessing/api.py:897] Sending process 402290 closing signal SIGTERM",
      "E0611 20:47:01.276000 402211 site-packages/torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: -9) local_rank: 0 (pid: 402287) of binary: /home/ml/miniconda3/envs/sft/bin/python3.11"]
L += """Traceback (most recent call last):
  File "/home/ml/miniconda3/envs/sft/bin/torchrun", line 8, in <module>
    sys.exit(main())
             ^^^^^^
  File "/home/ml/miniconda3/envs/sft/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 355, in wrapper
    return f(*args, **kwargs)
           ^^^^^^^^^^^^^^^^^^
  File "/home/ml/miniconda3/envs/sft/lib/python3.11/site-packages/torch/distributed/run.py", line 918, in main
    run(args)
  File "/home/ml/miniconda3/envs/sft/lib/python3.11/site-packages/torch/distributed/run.py", line 909, in run
    elastic_launch(
  File "/home/ml/miniconda3/envs/sft/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 138, in __call__
    return launch_agent(self._config, self._entrypoint, list(args))
           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/home/ml/miniconda3/envs/sft/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 269, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: 
=======================================================
train.py FAILED
-------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
-------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2025-06-11_20:46:58
  host      : ws-4xa6000
  rank      : 0 (local_rank: 0)
  exitcode  : -9 (pid: 402287)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 402287
=======================================================""".splitlines()
text = "\n".join(L) + "\n"
up = 1482016.0  # seconds since boot at 20:46:58
D = []
def k(dt, msg):
    D.append(f"[{up + dt:13.6f}] {msg}")
k(-0.004211, "python3.11 invoked oom-killer: gfp_mask=0x140dca(GFP_HIGHUSER_MOVABLE|__GFP_COMP|__GFP_ZERO), order=0, oom_score_adj=0")
k(-0.004190, "CPU: 17 PID: 402287 Comm: python3.11 Tainted: P           OE      6.5.0-41-generic #41~22.04.2-Ubuntu")
k(-0.004188, "Hardware name: ASUS System Product Name/Pro WS WRX80E-SAGE SE WIFI, BIOS 1201 03/14/2022")
k(-0.004187, "Call Trace:")
for fn in ["<TASK>", "dump_stack_lvl+0x48/0x70", "dump_stack+0x10/0x20", "dump_header+0x50/0x290", "oom_kill_process+0x10d/0x1c0",
           "out_of_memory+0x101/0x580", "__alloc_pages_may_oom+0x112/0x1e0", "__alloc_pages_slowpath.constprop.0+0x46f/0x9a0",
           "__alloc_pages+0x31f/0x350", "alloc_pages_mpol+0x91/0x1f0", "vma_alloc_folio+0x64/0xe0", "do_anonymous_page+0x6c/0x3f0",
           "__handle_mm_fault+0xb68/0xc00", "handle_mm_fault+0x164/0x360", "do_user_addr_fault+0x15f/0x660", "exc_page_fault+0x77/0x170",
           "asm_exc_page_fault+0x27/0x30"]:
    k(-0.004180, f" {fn}")
k(-0.004120, "Mem-Info:")
k(-0.004118, "active_anon:52119827 inactive_anon:11201533 isolated_anon:0")
k(-0.002460, "Tasks state (memory values in pages):")
k(-0.002458, "[  pid  ]   uid  tgid total_vm      rss pgtables_bytes swapents oom_score_adj name")
for p, rss in ((402287, 61402771), (402288, 1911202), (402289, 1908831), (402290, 1910244)):
    k(-0.002300, f"[ {p}]  1000 {p} {rss + 9000000} {rss}  {rss//400*8}        0             0 python3.11")
k(-0.000512, "oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,task_memcg=/user.slice/user-1000.slice/session-4.scope,task=python3.11,pid=402287,uid=1000")
k(0.0, "Out of memory: Killed process 402287 (python3.11) total-vm:281443084kB, anon-rss:245611084kB, file-rss:70124kB, shmem-rss:0kB, UID:1000 pgtables:480180kB oom_score_adj:0")
k(1.882, "oom_reaper: reaped process 402287 (python3.11), now anon-rss:0kB, file-rss:0kB, shmem-rss:0kB")
dm = "\n".join(D) + "\n"
a = lineno(text, "Saving model weights to"); b = lineno(text, "exitcode  : -9"); c = lineno(dm, "Out of memory: Killed process 402287")
write("host_oom_killer_dmesg", {"console.log": text, "dmesg.txt": dm}, {
    "class": "gather_oom", "initiating_ranks": [0], "collateral_ranks": [1, 2, 3],
    "origin": "written from torch v2.6 source torch/distributed/elastic/multiprocessing/errors/__init__.py:ChildFailedError.format_msg and api.py; Linux 6.5 mm/oom_kill.c messages (dmesg line shape as in https://github.com/2U1/Qwen-VL-Series-Finetune/issues/135); DeepSpeed engine.save_16bit_model log line",
    "notes": f"Rank 0 starts DeepSpeed's 16-bit consolidation for the checkpoint (console.log:{a}, 'Saving model weights to ...pytorch_model.bin'), then goes silent; torchrun reports rank 0 exitcode -9, Signal 9 (SIGKILL) for PID 402287 (console.log:{b}) and SIGTERMs the other three. dmesg.txt:{c} shows the kernel OOM killer killed exactly PID 402287 (anon-rss 234 GiB): a host OOM while gathering the state dict, not a plain crash."})
print("ok", a, b, c)
