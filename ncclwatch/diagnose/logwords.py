"""The words logs use that are no sign of their own: trainers' save messages,
exception names by what they say of a rank, and signals by what a death means.

Data, read by the scanner and the rules beside the signs (logsigns.py).
"""

from __future__ import annotations

#: What trainers print when a checkpoint starts (trigger, who prints it). Most print from
#: the main process (rank 0) only, without a rank prefix; a line of these with no
#: "saved" line after it puts that rank in a checkpoint. Matched case-sensitively as
#: printed (the first letter left off where both cases occur).
SAVE_MESSAGES: tuple[tuple[str, str], ...] = (
    ("aving model checkpoint", "HF Trainer: 'Saving model checkpoint to <dir>'"),
    ("aving checkpoint", "torchtune 'Saving checkpoint. This may take some time.', hand loops"),
    ("aving the checkpoint", "hand-written loops"),
    ("aving latest checkpoint", "Lightning 'Saving latest checkpoint...'"),
    ("saving model to", "Lightning ModelCheckpoint '... saving model to <path> as top k'"),
    ("is about to be saved", "DeepSpeed '[Torch] Checkpoint global_step100 is about to be saved!'"),
    ("aving current state", "accelerate 'Saving current state to <dir>'"),
    ("Saving FSDP model", "accelerate 'INFO:accelerate.accelerator:Saving FSDP model'"),
    ("Saving FSDP Optimizer", "accelerate (FSDP optimizer state)"),
    ("Saving DeepSpeed Model and Optimizer", "accelerate (DeepSpeed engine)"),
    ("aving state dict", "hand-written loops"),
    ("athering full state dict", "hand-written loops"),
    ("athering state dict", "hand-written loops"),
    ("Retrieving full model state dict", "torchtune"),
    ("Retrieving optimizer state dict", "torchtune"),
    ("Saving the newly created merged model to", "LoRA merge-and-save scripts (PEFT merge_and_unload)"),
    ("Summoning checkpoint", "latent-diffusion / Stable Diffusion main.py (Lightning), saving on "
     "exit or at an epoch's end: 'Summoning checkpoint.', 'Summoning checkpoint as last.ckpt'"),
    ("full_optim_state_dict``is being", "torch FSDP, printed by every rank gathering "
     "the full optimizer state (FSDP.full_optim_state_dict``is being deprecated)"),
    ("full_optim_state_dict`` is being", "the same warning, later spacing"),
    ("set_state_dict_type() are being", 
     "torch FSDP 2.4+, 'FSDP.state_dict_type() and FSDP.set_state_dict_type() are being "
     "deprecated', printed when a rank enters a state_dict_type() context to save"),
    ("torch.save start", "the demo job of this project"),
)
#: What they print when it finished (the save is not what is stuck).
SAVE_DONE_MESSAGES: tuple[tuple[str, str], ...] = (
    ("heckpoint saved", "hand loops, Lightning"),
    ("aved checkpoint", "hand loops"),
    ("is ready now", "DeepSpeed '[Torch] Checkpoint global_step100 is ready now!'"),
    ("B saved to", "torchtune 'Model checkpoint of size 15.0 GB saved to <path>'"),
)
#: Work one rank does while the others wait at a barrier (the main process tokenizing
#: or mapping a dataset under `main_process_first`): the busy rank is the one that is
#: late, not a dead one.
BUSY_MESSAGES: tuple[tuple[str, str], ...] = (
    ("Tokenizing", "axolotl 'Tokenizing Prompts (num_proc=64)', TRL, llm-foundry"),
    ("Running tokenizer on dataset", "HF examples, LlamaFactory"),
    ("Running tokenizer on", "HF examples"),
    ("Map (num_proc=", "datasets.map progress bar"),
    ("Grouping texts in chunks", "HF run_clm"),
    ("Filter (num_proc=", "datasets.filter progress bar"),
    ("Converting format of dataset", "LlamaFactory"),
    ("Dropping Long Sequences", "axolotl"),
    ("Add position_id column", "axolotl (sample packing)"),
)


#: Exceptions that mean "this rank waited for others and gave up" (collateral),
#: by the text of the traceback's last line.
TIMEOUT_EXCEPTIONS: tuple[str, ...] = (
    "Timed out waiting", "timed out", "Timeout", "failed to pass monitoredBarrier",
    "successfully reached monitoredBarrier",
    "DistBackendError: [Rank",
    # c10d's TCPStore wait (torch 2.3+): "DistStoreError: wait timeout after 1800000ms, keys:".
    "wait timeout after",
)
#: Exceptions of NCCL failing on this rank (its transport, its setup).
NETWORK_EXCEPTIONS: tuple[str, ...] = (
    "ncclSystemError", "unhandled system error", "ncclInternalError", "internal error",
    "NCCL error in:",
)
#: NCCL WARN lines that are a transport failing, not a warning of a job that goes on.
NETWORK_FAILURES: tuple[str, ...] = (
    "Got completion from peer", "Call to recv", "Call to send", "Connection closed by remote peer",
    "Connection reset by peer", "Socket recv failed", "Failed to execute operation",
    "Connection refused", "Broken pipe", "Got async event", "ibv_get_async_event",
)
#: Exceptions that a peer's death causes (collateral unless nothing else failed).
PEER_EXCEPTIONS: tuple[str, ...] = (
    "Connection closed by peer", "Connection reset by peer", "Broken pipe",
    "remote process exiting prematurely", "ncclRemoteError",
    # The c10d store's host went away under a client (torch 2.x TCPStore): "failed to recv,
    # got 0 bytes. Connection was likely closed. Did the remote server shutdown or crash?"
    "Connection was likely closed", "Did the remote server shutdown",
)
#: Exceptions of the rank being killed by its launcher (the teardown after another
#: rank failed): never the initiating failure.
TEARDOWN_EXCEPTIONS: tuple[str, ...] = (
    "ChildFailedError",  # torchrun's own traceback, after a worker failed
    "SignalException", "KeyboardInterrupt", "Process 0 terminated with signal SIGTERM",
    "SIGTERM", "SIGINT",
)

#: Signals a rank dies of, and whether the death says "this rank failed" or
#: "the launcher / the watchdog took it down".
SIGNAL_MEANING: dict[str, str] = {
    "SIGSEGV": "crashed", "SIGBUS": "crashed", "SIGILL": "crashed", "SIGFPE": "crashed",
    "SIGKILL": "killed", "SIGABRT": "aborted", "SIGTERM": "terminated", "SIGINT": "terminated",
}

#: What a crash line says died of, by its words (first match): the signal's name, whose
#: SIGNAL_MEANING names the fallback's class. Ray's dead workers name no signal.
CRASH_WORDS: tuple[tuple[str, str], ...] = (
    ("Segmentation fault", "SIGSEGV"), ("SIGSEGV", "SIGSEGV"), ("Bus error", "SIGBUS"),
    ("SIGBUS", "SIGBUS"), ("SIGILL", "SIGILL"), ("SIGFPE", "SIGFPE"), ("Aborted", "SIGABRT"),
    ("SIGABRT", "SIGABRT"), ("died unexpectedly", "crashed"), ("WorkerCrashedError", "crashed"),
    ("ActorDiedError", "crashed"), ("orker crashed", "crashed"), ("orker died", "crashed"),
    ("Fatal Python error", "crashed"), ("core dumped", "crashed"), ("umping core", "crashed"),
    ("Killed", "SIGKILL"),
)
#: How Slurm says a task ended by a signal ("srun: error: node: task 4: Killed"): the
#: exit code a launcher would report for it (-N).
TASK_ENDS: dict[str, int] = {
    "Killed": -9, "Terminated": -15, "Segmentation fault": -11, "Aborted": -6,
    "Bus error": -7, "Out Of Memory": -9,
}
#: Exit codes a shell, a container runtime or a scheduler reports for a fatal signal
#: (128 + N), as launchers report them (-N): the signal.
SIGNAL_EXIT_BASE = 128
