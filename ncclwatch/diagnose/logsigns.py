"""Log signatures: which log lines are evidence of what (data, not code).

Each row is one message some part of the stack prints when a distributed job
fails: the NCCL watchdog (torch 2.2 to 2.14 wordings), gloo, c10d's
``monitored_barrier`` and collective-mismatch checks, NCCL itself, the CUDA
and CPU allocators, the kernel's OOM killer, and torchrun's failure summary.
``triggers`` are plain substrings: the scanner finds them all in one pass
over the bytes (Aho-Corasick), and only lines holding one are decoded and
matched against ``pattern``. A row adds a message; the verdict rules
(verdict.py) say what the events mean together.

Wordings come from the torch sources (ProcessGroupNCCL.cpp, ProcessGroupGloo.cpp,
ProcessGroupWrapper.cpp, elastic/multiprocessing/errors), from real runs here and
from logs users pasted into public issues (tests/data/diagnose/cases and public);
tests/test_diagnose.py checks every row against a line of the corpus.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass


class Event(str, enum.Enum):
    """What a matched line says happened (the verdict reads these)."""

    #: A rank's watchdog (NCCL) or a collective's wait (gloo) gave up waiting.
    TIMEOUT = "timeout"
    #: The watchdog's progress numbers: last enqueued/completed work of a rank.
    PROGRESS = "progress"
    #: A rank told to dump because another timed out, with its own progress (not a wait).
    DUMP_SIGNAL = "dump_signal"
    #: The watchdog took the process down (SIGABRT follows: collateral).
    WATCHDOG_ABORT = "watchdog_abort"
    #: The watchdog thread itself was stuck (heartbeat monitor).
    HEARTBEAT = "heartbeat"
    #: The Flight Recorder was (or was to be) dumped.
    FR_DUMP = "fr_dump"
    #: c10d's own check named the ranks that did not arrive.
    MISSING_RANKS = "missing_ranks"
    #: c10d found ranks running different collectives.
    MISMATCH = "mismatch"
    #: NCCL or transport error.
    NETWORK = "network"
    #: A peer closed the connection (a rank died, or the network did).
    PEER_CLOSED = "peer_closed"
    #: Out of memory (device, host allocator, or the kernel's OOM killer).
    OOM = "oom"
    #: Checkpoint activity a trainer logged (HF, Lightning, DeepSpeed, user).
    CHECKPOINT = "checkpoint"
    #: A checkpoint that finished (the save is not what is stuck).
    CHECKPOINT_DONE = "checkpoint_done"
    #: A rank busy with work only it does (the main process tokenizing a dataset).
    BUSY = "busy"
    #: A rank's GPU failed under NCCL (a CUDA call returned an error): a crash.
    CUDA_ERROR = "cuda_error"
    #: torchrun: a local rank failed (exit code, pid).
    EXIT = "exit"
    #: torchrun stops a surviving worker after another failed (counts the workers).
    TEARDOWN = "teardown"
    #: torchrun's failure summary lines (host / rank / exitcode / signal).
    SUMMARY = "summary"
    #: torchrun's "Root Cause (first observed failure)" marker.
    SUMMARY_ROOT = "summary_root"
    #: A Python traceback starts (the scanner then reads the frames).
    TRACEBACK = "traceback"
    #: The world size, as launchers and trainers print it.
    WORLD = "world"
    #: The job finished (torchrun and trainers say so).
    FINISHED = "finished"


@dataclass(frozen=True)
class LogSign:
    id: str
    event: Event
    triggers: tuple[str, ...]
    #: Searched (not anchored) in the line, rank prefixes removed; named
    #: groups become the event's fields.
    pattern: str
    #: Matched case-insensitively (messages whose case changed between versions).
    ignore_case: bool = False

    def compile(self) -> re.Pattern[str]:
        return re.compile(self.pattern, re.IGNORECASE if self.ignore_case else 0)


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
    ("full_optim_state_dict``is being deprecated", "torch FSDP, printed by every rank gathering "
     "the full optimizer state (FSDP.full_optim_state_dict)"),
    ("full_optim_state_dict`` is being deprecated", "the same warning, later spacing"),
    ("FSDP.state_dict_type() and FSDP.set_state_dict_type() are being deprecated",
     "torch FSDP 2.4+, printed when a rank enters a state_dict_type() context to save"),
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

_N = r"-?\d+"
#: The rank tag torch puts inside its own messages, in every form of 2.2-2.14:
#: `[Rank 3]`, `[PG 0 Rank 3]`, `[PG 0 (default_pg) Rank 3]`, `[PG ID 0 PG GUID 0(default_pg)
#: Rank 3]`, `[PG ID 2 PG GUID 9 Rank 3]`. The rank is the one *inside that process
#: group*; only the default group's equals the global rank (verdict.py decides).
PG_TAG = (r"\[(?:PG (?:ID )?(?P<pg>\d+) ?(?:PG GUID (?P<pg_guid>[^\s(\]]+))?"
          r"\s*(?:\((?P<pg_desc>[^)]*)\))? ?)?Rank (?P<rank>\d+)\]")
_RANK_TAG = r"(?:" + PG_TAG + r"\s*)?"

#: NCCL's own line prefix "host:pid:tid [cudaDev] " (anywhere: Ray and timestamps go first).
_NCCL_PREFIX = (r"(?:(?P<host>[\w.-]+):(?P<pid>\d+):(?P<tid>\d+) (?:\[(?P<device>\d+)\] )?"
                r"(?:[\w/.]+:\d+ )?)?")

SIGNS: tuple[LogSign, ...] = (
    # -- the NCCL watchdog (ProcessGroupNCCL.cpp) --------------------------------
    LogSign("nccl_watchdog_timeout", Event.TIMEOUT, ("Watchdog caught collective operation timeout",),
            _RANK_TAG + r"Watchdog caught collective operation timeout: ?(?P<work>Work\w+)\("
            r"SeqNum=(?P<seq>\d+), OpType=(?P<op>\w+)"
            r"(?:, NumelIn=(?P<numel_in>\d+), NumelOut=(?P<numel_out>\d+))?"
            r"(?:, ?Timeout\(ms\)=(?P<timeout_ms>\d+))?(?:\) ran for (?P<ran_ms>\d+) milliseconds)?"),
    # 2.4+: "[PG ID 0 PG GUID 0(default_pg) Rank 1] failure detected by watchdog at work
    # sequence id: 5 PG status: last enqueued work: 5, last completed work: 4"
    LogSign("nccl_watchdog_progress", Event.PROGRESS, ("detected by watchdog at work",),
            _RANK_TAG + r".*?detected by watchdog at work(?: sequence id)?: (?P<seq>\d+)"
            r"(?:.*?last enqueued (?:NCCL )?work: (?P<enqueued>" + _N + r"))?"
            r"(?:.*?last completed (?:NCCL )?work: (?P<completed>" + _N + r"))?"),
    # 2.2-2.3: "Timeout at NCCL work: 5, last enqueued NCCL work: 5, last completed NCCL work: 4."
    LogSign("nccl_timeout_at_work", Event.PROGRESS, ("Timeout at NCCL work",),
            _RANK_TAG + r".*?Timeout at NCCL work: (?P<seq>\d+), last enqueued NCCL work: "
            r"(?P<enqueued>" + _N + r"), last completed NCCL work: (?P<completed>" + _N + r")"),
    # 2.8+: every rank dumps when one times out, and says how far it got itself:
    # "[PG ID 0 PG GUID 0(default_pg) Rank 5] Received a dump signal due to a collective
    # timeout from  rank 2 ... Last enqueued NCCL work: 4411, last completed NCCL work: 4411."
    LogSign("nccl_dump_signal", Event.DUMP_SIGNAL, ("Received a dump signal",),
            _RANK_TAG + r".*?Received a dump signal due to a collective timeout from\s+"
            r"(?:rank (?P<from_rank>\d+)|this local rank).*?Last enqueued NCCL work: "
            r"(?P<enqueued>" + _N + r"), last completed NCCL work: (?P<completed>" + _N + r")"),
    # "[PG ID 0 PG GUID 0(default_pg) Rank 0] Observed flight recorder dump signal from
    # another rank via TCPStore.": this rank's own watchdog had nothing overdue.
    LogSign("nccl_dump_observed", Event.DUMP_SIGNAL, ("Observed flight recorder dump signal",),
            _RANK_TAG + r".*?Observed flight recorder dump signal from (?P<observed>another rank)"),
    LogSign("nccl_watchdog_abort", Event.WATCHDOG_ABORT,
            ("we are taking the entire process down",),
            _RANK_TAG + r".*we are taking the entire process down"),
    LogSign("nccl_heartbeat", Event.HEARTBEAT,
            ("watchdog got stuck for", "Heartbeat monitor timed out", "heartbeat monitor timed out",
             "detected no heartbeat"),
            _RANK_TAG + r".*?(?:watchdog got stuck for (?P<stuck_s>\d+) seconds|"
            r"[Hh]eartbeat monitor timed out|detected no heartbeat)"),
    LogSign("fr_dump", Event.FR_DUMP,
            ("flight recorder", "Flight Recorder", "FlightRecorder", "dump debug info",
             "dump_debug_info", "Dumping nccl trace", "nccl trace dump"),
            _RANK_TAG + r".*?(?P<what>(?:[Ff]light ?[Rr]ecorder|dump.debug.info|[Dd]umping nccl "
            r"trace|nccl trace dump).*)"),
    # -- c10d / gloo ---------------------------------------------------------------
    # "[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting
    # 10000ms for recv operation to complete"
    LogSign("gloo_timeout", Event.TIMEOUT, ("Timed out waiting",),
            _RANK_TAG + r".*?Timed out waiting (?P<timeout_ms>\d+)ms for (?P<what>\w+) operation"),
    # c10d's TCPStore wait (the startup barrier, a rank 0 that never came back):
    # "[c10d] waitForInput: socket SocketImpl(...) timed out after 1800000ms"
    LogSign("store_timeout", Event.TIMEOUT, ("timed out after",),
            r"(?:waitForInput|[Ss]ocket|TCPStore|[Ss]tore).*?timed out after (?P<timeout_ms>\d+) ?ms"),
    LogSign("monitored_barrier", Event.MISSING_RANKS, ("failed to pass monitoredBarrier",),
            r"(?:\[Rank (?P<rank>\d+)\]:? )?Ranks? (?P<missing>\d+(?:, ?\d+)*) failed to pass "
            r"monitoredBarrier in (?P<timeout_ms>\d+) ms"),
    # ProcessGroupWrapper (TORCH_DISTRIBUTED_DEBUG=DETAIL), 1.10 to 2.14: "Rank 0 is running
    # inconsistent collective: CollectiveFingerPrint(OpType=BARRIER)", "Rank 1 is running
    # collective: CollectiveFingerPrint(SequenceNumber=3104, OpType=ALLREDUCE, TensorShape=[..]
    # ...), but Rank 0 is running collective: CollectiveFingerPrint(...)" (the second half
    # often cut off in a paste), "... but Rank 1 is running collective: REDUCE." (1.12).
    LogSign("collective_mismatch", Event.MISMATCH, ("Detected mismatch between collectives",),
            r"Detected mismatch between collectives on ranks\. Rank (?P<rank>\d+) is running "
            r"(?:inconsistent )?collective: (?P<mine>CollectiveFingerPrint\(.*?)"
            r"(?:,? but Rank (?P<other>\d+) is running collective: (?P<theirs>.*))?$"),
    # NCCL's own check (2.4-2.7): "NCCL WARN Mismatched collective detected, please check
    # your collective calls at and around rank 39."
    LogSign("nccl_mismatch", Event.MISMATCH, ("Mismatched collective detected",),
            r"Mismatched collective detected.*?around rank (?P<around>\d+)"),
    LogSign("gloo_peer_closed", Event.PEER_CLOSED,
            ("Connection closed by peer", "Connection reset by peer", "Broken pipe"),
            _RANK_TAG + r".*?(?P<what>Connection (?:closed|reset) by peer|Broken pipe)"
            r"(?: \[?(?P<peer>[\w.:-]+?)\]?:(?P<port>\d+))?"),
    # -- NCCL ------------------------------------------------------------------------
    LogSign("nccl_warn", Event.NETWORK, ("NCCL WARN",),
            _NCCL_PREFIX + r"NCCL WARN (?!Cuda failure|Failed to CUDA|Mismatched collective)"
            r"(?P<message>.*)"),
    # NCCL's CUDA calls failing: out of memory (an OOM of that GPU), or any other CUDA
    # error (the GPU or driver failed): "host:pid:tid [3] include/alloc.h:178 NCCL WARN
    # Cuda failure 'out of memory'", "... Cuda failure 2 'out of memory'", "Cuda failure
    # 999 'unknown error'". [3] is the CUDA device, not a rank.
    LogSign("nccl_cuda_oom", Event.OOM, ("NCCL WARN Cuda failure", "Failed to CUDA calloc"),
            _NCCL_PREFIX + r"NCCL WARN (?:Cuda failure (?:\d+ )?'(?P<where>out of memory)'|"
            r"(?P<where2>Failed to CUDA calloc) (?P<bytes>\d+))"),
    LogSign("nccl_cuda_failure", Event.CUDA_ERROR, ("NCCL WARN Cuda failure",),
            _NCCL_PREFIX + r"NCCL WARN Cuda failure (?:(?P<code>\d+) )?'(?!out of memory)"
            r"(?P<message>[^']*)'"),
    LogSign("nccl_error", Event.NETWORK,
            ("ncclSystemError", "ncclRemoteError", "ncclInternalError", "ncclUnhandledCudaError",
             "ncclInvalidUsage", "NCCL error in:", "unhandled system error",
             "remote process exiting prematurely"),
            _RANK_TAG + r".*?(?P<code>ncclSystemError|ncclRemoteError|ncclInternalError|"
            r"ncclUnhandledCudaError|ncclInvalidUsage|NCCL error in:|unhandled system error|"
            r"remote process exiting prematurely)(?P<message>.*)"),
    LogSign("nccl_cuda_error", Event.NETWORK, ("unhandled cuda error",),
            _RANK_TAG + r".*?(?P<code>unhandled cuda error)(?P<message>.*)", ignore_case=True),
    # -- memory ------------------------------------------------------------------------
    # "CUDA out of memory. Tried to allocate 982.00 MiB (GPU 2; 79.35 GiB total capacity" (<2.1)
    # and "... Tried to allocate 4.35 GiB. GPU 3 has a total capacity" (2.1+).
    LogSign("cuda_oom", Event.OOM, ("CUDA out of memory",),
            r"(?P<where>CUDA) out of memory\.(?: Tried to allocate (?P<size>[\d.]+ ?\w+))?"
            r"(?:\.? \(?GPU (?P<device>\d+))?"),
    # FSDP FULL_STATE_DICT: "UserWarning: Failed to clone() tensor with name X on rank 1. This
    # may mean that this state_dict entry could point to invalid memory ... Error: CUDA out of
    # memory" (the gathering rank; older torch names no rank, only the GPU).
    LogSign("fsdp_clone_failed", Event.OOM,
            ("Failed to clone() tensor", "state_dict entry could point to invalid memory"),
            r"(?P<where>state_dict clone\(\))?(?:Failed to clone\(\) tensor with name \S+?)?"
            r"(?: on rank (?P<rank>\d+))?\. This may mean that this state_dict entry"
            r"(?:.*?CUDA out of memory.*?GPU (?P<device>\d+))?"),
    LogSign("cpu_alloc_failed", Event.OOM, ("can't allocate memory",),
            r"(?P<where>DefaultCPUAllocator|CPUAllocator|\w+Allocator): can't allocate memory"
            r"(?:: you tried to allocate (?P<bytes>\d+) bytes)?"),
    # The C/Rust allocator of a tokenizer or a data worker: "memory allocation of 2097152
    # bytes failed" (two ranks' lines often interleaved into one).
    LogSign("host_alloc_failed", Event.OOM, ("memory allocation of",),
            r"(?P<where>memory allocation of) (?:memory allocation of )?(?P<bytes>\d+)"),
    LogSign("memory_error", Event.OOM, ("MemoryError",),
            r"^(?P<where>MemoryError)\b(?P<message>.*)"),
    # Kernel: "Out of memory: Killed process 12345 (python) total-vm:..." and the
    # cgroup variant "Memory cgroup out of memory: Killed process ..."
    LogSign("oom_killer", Event.OOM, ("of memory: Killed process", "oom-kill:"),
            r"(?P<where>(?:Memory cgroup )?[Oo]ut of memory|oom-kill):"
            r".*?(?:Killed process |pid=)(?P<pid>\d+)(?: \((?P<comm>[^)]*)\))?"),
    # -- torchrun (torch/distributed/elastic) ---------------------------------------------
    LogSign("torchrun_failed", Event.EXIT, ("failed (exitcode:",),
            r"failed \(exitcode: (?P<exitcode>" + _N + r")\)(?: local_rank: (?P<local_rank>\d+)"
            r"(?: \(pid: (?P<pid>\d+)\))?)?"),
    LogSign("torchrun_teardown", Event.TEARDOWN, ("closing signal",),
            r"Sending process (?P<pid>\d+) closing signal (?P<signame>SIG\w+)"),
    LogSign("summary_host", Event.SUMMARY, ("  host      : ",), r"^\s*host\s+: (?P<host>\S+)"),
    LogSign("summary_rank", Event.SUMMARY, ("(local_rank: ",),
            r"^\s*rank\s+: (?P<rank>\d+) \(local_rank: (?P<local_rank>\d+)\)"),
    LogSign("summary_exitcode", Event.SUMMARY, ("  exitcode  : ",),
            r"^\s*exitcode\s+: (?P<exitcode>" + _N + r") \(pid: (?P<pid>\d+)\)"),
    LogSign("summary_signal", Event.SUMMARY, ("received by PID",),
            r"Signal (?P<signal>\d+) \((?P<signame>SIG\w+)\) received by PID (?P<pid>\d+)"),
    LogSign("summary_root", Event.SUMMARY_ROOT, ("Root Cause (first observed failure)",),
            r"Root Cause \(first observed failure\)"),
    # -- trainers: built from the message tables below ------------------------------------
    LogSign("checkpoint_start", Event.CHECKPOINT, tuple(t for t, _w in SAVE_MESSAGES),
            r"(?P<what>" + "|".join(re.escape(t) for t, _w in SAVE_MESSAGES) + r")(?P<target>.*)"),
    LogSign("checkpoint_done", Event.CHECKPOINT_DONE, tuple(t for t, _w in SAVE_DONE_MESSAGES),
            r"(?P<what>" + "|".join(re.escape(t) for t, _w in SAVE_DONE_MESSAGES)
            + r")(?P<target>.*)"),
    LogSign("busy", Event.BUSY, tuple(t for t, _w in BUSY_MESSAGES),
            r"(?P<what>" + "|".join(re.escape(t) for t, _w in BUSY_MESSAGES) + r")(?P<detail>.*)"),
    LogSign("traceback", Event.TRACEBACK, ("Traceback (most recent call last)",),
            r"Traceback \(most recent call last\)"),
    LogSign("world_size", Event.WORLD, ("WORLD_SIZE=", "world_size=", "world size: ", "world_size: "),
            r"(?:WORLD_SIZE|world[_ ]size)(?:=|: )(?P<world>\d+)"),
    LogSign("finished", Event.FINISHED,
            ("Local worker group finished", "raining completed", "raining finished"),
            r"(?P<what>Local worker group finished|[Tt]raining (?:completed|finished))"),
)

#: Exceptions that mean "this rank waited for others and gave up" (collateral),
#: by the text of the traceback's last line.
TIMEOUT_EXCEPTIONS: tuple[str, ...] = (
    "Timed out waiting", "timed out", "Timeout", "failed to pass monitoredBarrier",
    "successfully reached monitoredBarrier",
    "DistBackendError: [Rank",
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
    "Connection refused", "Broken pipe",
)
#: Exceptions that a peer's death causes (collateral unless nothing else failed).
PEER_EXCEPTIONS: tuple[str, ...] = (
    "Connection closed by peer", "Connection reset by peer", "Broken pipe",
    "remote process exiting prematurely", "ncclRemoteError",
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


def _check_unique() -> None:
    ids = [s.id for s in SIGNS]
    if len(ids) != len(set(ids)):
        raise AssertionError("duplicate log sign ids")


_check_unique()
