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
ProcessGroupGloo.cpp, elastic/multiprocessing/errors) and from real runs here
(tests/data/diagnose); tests/test_diagnose.py checks every row against a line
of the corpus.
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


_N = r"-?\d+"
#: `[Rank 3]`, `[PG 0 Rank 3]`, `[PG ID 0 PG GUID 0(default_pg) Rank 3]`, `[PG ID 1 PG GUID 3(x) Rank 3]`
_RANK_TAG = (r"(?:\[(?:PG (?:ID )?(?P<pg>\d+) (?:PG GUID (?P<pg_guid>[^\s(\]]+)"
             r"(?:\((?P<pg_desc>[^)]*)\))? )?)?Rank (?P<rank>\d+)\]\s*)?")

SIGNS: tuple[LogSign, ...] = (
    # -- the NCCL watchdog (ProcessGroupNCCL.cpp) --------------------------------
    LogSign("nccl_watchdog_timeout", Event.TIMEOUT, ("Watchdog caught collective operation timeout",),
            _RANK_TAG + r"Watchdog caught collective operation timeout: (?P<work>Work\w+)\("
            r"SeqNum=(?P<seq>\d+), OpType=(?P<op>\w+)"
            r"(?:, NumelIn=(?P<numel_in>\d+), NumelOut=(?P<numel_out>\d+))?"
            r"(?:, Timeout\(ms\)=(?P<timeout_ms>\d+))?\) ran for (?P<ran_ms>\d+) milliseconds"),
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
    LogSign("nccl_watchdog_abort", Event.WATCHDOG_ABORT,
            ("we are taking the entire process down",),
            _RANK_TAG + r".*we are taking the entire process down"),
    LogSign("nccl_heartbeat", Event.HEARTBEAT,
            ("watchdog got stuck for", "Heartbeat monitor timed out", "heartbeat monitor timed out"),
            _RANK_TAG + r".*?(?:watchdog got stuck for (?P<stuck_s>\d+) seconds|"
            r"[Hh]eartbeat monitor timed out)"),
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
    LogSign("monitored_barrier", Event.MISSING_RANKS, ("failed to pass monitoredBarrier",),
            r"(?:\[Rank (?P<rank>\d+)\]:? )?Ranks? (?P<missing>\d+(?:, ?\d+)*) failed to pass "
            r"monitoredBarrier in (?P<timeout_ms>\d+) ms"),
    LogSign("collective_mismatch", Event.MISMATCH, ("Detected mismatch between collectives",),
            r"Detected mismatch between collectives on ranks\. Rank (?P<rank>\d+) is running "
            r"collective: (?P<mine>CollectiveFingerPrint\(.*?\)\)?)(?:\)|,)? but Rank "
            r"(?P<other>\d+) is running collective: (?P<theirs>CollectiveFingerPrint\(.*\))"),
    LogSign("gloo_peer_closed", Event.PEER_CLOSED,
            ("Connection closed by peer", "Connection reset by peer", "Broken pipe"),
            _RANK_TAG + r".*?(?P<what>Connection (?:closed|reset) by peer|Broken pipe)"
            r"(?: \[?(?P<peer>[\w.:-]+?)\]?:(?P<port>\d+))?"),
    # -- NCCL ------------------------------------------------------------------------
    LogSign("nccl_warn", Event.NETWORK, ("NCCL WARN",),
            r"(?:(?P<host>[\w.-]+):(?P<pid>\d+):(?P<tid>\d+) (?:\[(?P<device>\d+)\] )?)?"
            r"NCCL WARN (?P<message>.*)"),
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
    LogSign("cuda_oom", Event.OOM, ("CUDA out of memory",),
            r"(?P<where>CUDA) out of memory\.(?: Tried to allocate (?P<size>[\d.]+ ?\w+))?"
            r"(?:\. GPU (?P<device>\d+))?"),
    LogSign("cpu_alloc_failed", Event.OOM, ("can't allocate memory",),
            r"(?P<where>DefaultCPUAllocator|CPUAllocator|\w+Allocator): can't allocate memory"
            r"(?:: you tried to allocate (?P<bytes>\d+) bytes)?"),
    LogSign("memory_error", Event.OOM, ("MemoryError",),
            r"^(?P<where>MemoryError)\b(?P<message>.*)"),
    # Kernel: "Out of memory: Killed process 12345 (python) total-vm:..." and the
    # cgroup variant "Memory cgroup out of memory: Killed process ..."
    LogSign("oom_killer", Event.OOM, ("of memory: Killed process", "oom-kill:"),
            r"(?P<where>(?:Memory cgroup )?[Oo]ut of memory: Killed process|oom-kill:)"
            r".*?(?:(?:Killed process |pid=)(?P<pid>\d+))(?: \((?P<comm>[^)]*)\))?"),
    # -- torchrun (torch/distributed/elastic) ---------------------------------------------
    LogSign("torchrun_failed", Event.EXIT, ("failed (exitcode:",),
            r"failed \(exitcode: (?P<exitcode>" + _N + r")\) local_rank: (?P<local_rank>\d+) "
            r"\(pid: (?P<pid>\d+)\)"),
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
    # -- trainers ----------------------------------------------------------------------------
    # HF Trainer "Saving model checkpoint to <dir>", DeepSpeed "[Torch] Checkpoint
    # global_step100 is about to be saved!", Lightning and hand-written loops
    # ("saving checkpoint ...", "Saving state dict"), accelerate "Saving current state to".
    LogSign("checkpoint_start", Event.CHECKPOINT,
            ("aving model checkpoint", "aving checkpoint", "is about to be saved",
             "aving current state", "aving state dict", "aving the checkpoint",
             "athering full state dict", "athering state dict", "torch.save start"),
            r"(?P<what>[Ss]aving model checkpoint|[Ss]aving (?:the )?checkpoint|is about to be "
            r"saved|[Ss]aving current state|[Ss]aving state dict|[Gg]athering (?:full )?state "
            r"dict|torch\.save start)(?P<target>.*)"),
    LogSign("checkpoint_done", Event.CHECKPOINT_DONE,
            ("heckpoint saved", "aved checkpoint", "is ready now"),
            r"(?P<what>[Cc]heckpoint saved|[Ss]aved checkpoint|is ready now)"
            r"(?P<target>.*)"),
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
