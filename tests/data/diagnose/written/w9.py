# torch 2.5 + HF Trainer + FSDP FULL_STATE_DICT: rank 0 CUDA OOM while gathering the full state dict for the checkpoint.
import random, sys, datetime
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
from common import *
rng = random.Random(95)
L = ["W0116 09:40:02.517000 7710 site-packages/torch/distributed/run.py:793] ",
     "W0116 09:40:02.517000 7710 site-packages/torch/distributed/run.py:793] *****************************************",
     "W0116 09:40:02.517000 7710 site-packages/torch/distributed/run.py:793] Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to avoid your system being overloaded, please further tune the variable for optimal performance in your application as needed. ",
     "W0116 09:40:02.517000 7710 site-packages/torch/distributed/run.py:793] *****************************************"]
L += ["[INFO|trainer.py:2369] 2025-01-16 09:42:51,077 >> ***** Running training *****",
      "[INFO|trainer.py:2370] 2025-01-16 09:42:51,077 >>   Num examples = 212,480",
      "[INFO|trainer.py:2371] 2025-01-16 09:42:51,077 >>   Num Epochs = 2",
      "[INFO|trainer.py:2372] 2025-01-16 09:42:51,077 >>   Instantaneous batch size per device = 2",
      "[INFO|trainer.py:2375] 2025-01-16 09:42:51,077 >>   Total train batch size (w. parallel, distributed & accumulation) = 128",
      "[INFO|trainer.py:2376] 2025-01-16 09:42:51,077 >>   Gradient Accumulation steps = 8",
      "[INFO|trainer.py:2377] 2025-01-16 09:42:51,077 >>   Total optimization steps = 3,320",
      "[INFO|trainer.py:2378] 2025-01-16 09:42:51,085 >>   Number of trainable parameters = 4,015,263,744"]
for step in range(5, 1001, 5):
    L.append(f"{{'loss': {rng.uniform(1.05,1.3):.4f}, 'grad_norm': {rng.uniform(0.5,2.0):.16f}, 'learning_rate': {1e-5*(1-step/3320):.16g}, 'epoch': {step/1660:.2f}}}")
L += ["[INFO|trainer.py:3801] 2025-01-16 13:51:30,662 >> Saving model checkpoint to /mnt/ckpt/qwen2.5-32b-sft/checkpoint-1000",
      "/opt/conda/lib/python3.11/site-packages/torch/distributed/fsdp/fully_sharded_data_parallel.py:690: FutureWarning: FSDP.state_dict_type() and FSDP.set_state_dict_type() are being deprecated. Please use APIs, get_state_dict() and set_state_dict(), which can support different parallelisms, FSDP1, FSDP2, DDP. API doc: https://pytorch.org/docs/stable/distributed.checkpoint.html#torch.distributed.checkpoint.state_dict.get_state_dict .Tutorial: https://pytorch.org/tutorials/recipes/distributed_checkpoint_recipe.html .",
      "  warnings.warn("]
tb = """Traceback (most recent call last):
  File "/workspace/sft.py", line 214, in <module>
    main()
  File "/workspace/sft.py", line 207, in main
    trainer.train()
  File "/opt/conda/lib/python3.11/site-packages/transformers/trainer.py", line 2164, in train
    return inner_training_loop(
           ^^^^^^^^^^^^^^^^^^^^
  File "/opt/conda/lib/python3.11/site-packages/transformers/trainer.py", line 2589, in _inner_training_loop
    self._maybe_log_save_evaluate(tr_loss, grad_norm, model, trial, epoch, ignore_keys_for_eval)
  File "/opt/conda/lib/python3.11/site-packages/transformers/trainer.py", line 3050, in _maybe_log_save_evaluate
    self._save_checkpoint(model, trial, metrics=metrics)
  File "/opt/conda/lib/python3.11/site-packages/transformers/trainer.py", line 3124, in _save_checkpoint
    self.save_model(output_dir, _internal_call=True)
  File "/opt/conda/lib/python3.11/site-packages/transformers/trainer.py", line 3697, in save_model
    state_dict = self.accelerator.get_state_dict(self.model)
                 ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/opt/conda/lib/python3.11/site-packages/accelerate/accelerator.py", line 3365, in get_state_dict
    state_dict = model.state_dict()
                 ^^^^^^^^^^^^^^^^^^
  File "/opt/conda/lib/python3.11/site-packages/torch/nn/modules/module.py", line 2218, in state_dict
    module.state_dict(
  File "/opt/conda/lib/python3.11/site-packages/torch/nn/modules/module.py", line 2218, in state_dict
    module.state_dict(
  File "/opt/conda/lib/python3.11/site-packages/torch/nn/modules/module.py", line 2215, in state_dict
    hook(self, prefix, keep_vars)
  File "/opt/conda/lib/python3.11/site-packages/torch/utils/_contextlib.py", line 116, in decorate_context
    return func(*args, **kwargs)
           ^^^^^^^^^^^^^^^^^^^^^
  File "/opt/conda/lib/python3.11/site-packages/torch/distributed/fsdp/_state_dict_utils.py", line 782, in _pre_state_dict_hook
    _pre_state_dict_hook_fn[fsdp_state._state_dict_type](
  File "/opt/conda/lib/python3.11/site-packages/torch/distributed/fsdp/_state_dict_utils.py", line 303, in _full_pre_state_dict_hook
    _common_unshard_pre_state_dict_hook(
  File "/opt/conda/lib/python3.11/site-packages/torch/distributed/fsdp/_state_dict_utils.py", line 169, in _common_unshard_pre_state_dict_hook
    _enter_unshard_params_ctx(
  File "/opt/conda/lib/python3.11/site-packages/torch/distributed/fsdp/_state_dict_utils.py", line 133, in _enter_unshard_params_ctx
    fsdp_state._unshard_params_ctx[module].__enter__()
  File "/opt/conda/lib/python3.11/contextlib.py", line 137, in __enter__
    return next(self.gen)
           ^^^^^^^^^^^^^^
  File "/opt/conda/lib/python3.11/site-packages/torch/distributed/fsdp/_unshard_param_utils.py", line 199, in _unshard_fsdp_state_params
    _unshard(state, handle, computation_stream, computation_stream)
  File "/opt/conda/lib/python3.11/site-packages/torch/distributed/fsdp/_runtime_utils.py", line 290, in _unshard
    handle.unshard()
  File "/opt/conda/lib/python3.11/site-packages/torch/distributed/fsdp/_flat_param.py", line 1305, in unshard
    unsharded_flat_param = self._alloc_padded_unsharded_flat_param()
                           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/opt/conda/lib/python3.11/site-packages/torch/distributed/fsdp/_flat_param.py", line 1332, in _alloc_padded_unsharded_flat_param
    _alloc_storage(unsharded_flat_param, flat_param._padded_unsharded_size)  # type: ignore[attr-defined]
    ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/opt/conda/lib/python3.11/site-packages/torch/distributed/utils.py", line 186, in _alloc_storage
    tensor._typed_storage()._resize_(size.numel())
  File "/opt/conda/lib/python3.11/site-packages/torch/storage.py", line 1027, in _resize_
    self._untyped_storage.resize_(size * self._element_size())
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which 3.22 GiB is free. Including non-PyTorch memory, this process has 75.92 GiB memory in use. Of the allocated memory 71.40 GiB is allocated by PyTorch, and 2.96 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)
"""
for l in tb.splitlines():
    L.append(f"[rank0]: {l}")
L += ["W0116 13:51:38.204000 7710 site-packages/torch/distributed/elastic/multiprocessing/api.py:897] Sending process 7790 closing signal SIGTERM",
      "W0116 13:51:38.205000 7710 site-packages/torch/distributed/elastic/multiprocessing/api.py:897] Sending process 7791 closing signal SIGTERM",
      "W0116 13:51:38.206000 7710 site-packages/torch/distributed/elastic/multiprocessing/api.py:897] Sending process 7792 closing signal SIGTERM",
      "W0116 13:51:38.207000 7710 site-packages/torch/distributed/elastic/multiprocessing/api.py:897] Sending process 7793 closing signal SIGTERM",
      "W0116 13:51:38.208000 7710 site-packages/torch/distributed/elastic/multiprocessing/api.py:897] Sending process 7794 closing signal SIGTERM",
      "W0116 13:51:38.209000 7710 site-packages/torch/distributed/elastic/multiprocessing/api.py:897] Sending process 7795 closing signal SIGTERM",
      "W0116 13:51:38.210000 7710 site-packages/torch/distributed/elastic/multiprocessing/api.py:897] Sending process 7796 closing signal SIGTERM",
      "E0116 13:51:40.871000 7710 site-packages/torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) local_rank: 0 (pid: 7789) of binary: /opt/conda/bin/python"]
L += """Traceback (most recent call last):
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
/workspace/sft.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2025-01-16_13:51:38
  host      : a100-80g-node11
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 7789)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================""".splitlines()
text = "\n".join(L) + "\n"
a = lineno(text, "Saving model checkpoint to"); b = lineno(text, "_full_pre_state_dict_hook"); c = lineno(text, "torch.OutOfMemoryError")
write("fsdp_v2_5_full_state_dict_cuda_oom", {"console.log": text}, {
    "class": "gather_oom", "initiating_ranks": [0], "collateral_ranks": [1, 2, 3, 4, 5, 6, 7],
    "origin": "written from torch v2.5 source torch/distributed/fsdp/_state_dict_utils.py:_full_pre_state_dict_hook, fsdp/_flat_param.py:_alloc_padded_unsharded_flat_param and c10/cuda/CUDACachingAllocator.cpp (OOM message); traceback shape as in https://github.com/ByteDance-Seed/Bagel/issues/157; HF Trainer 4.47 frames",
    "notes": f"Rank 0 logs 'Saving model checkpoint to .../checkpoint-1000' (console.log:{a}); its traceback goes through Trainer._save_checkpoint -> accelerator.get_state_dict -> FSDP _full_pre_state_dict_hook (console.log:{b}) and ends in torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB (console.log:{c}). The other seven ranks are SIGTERMed by torchrun without errors of their own."})
print("ok", a, b, c)
