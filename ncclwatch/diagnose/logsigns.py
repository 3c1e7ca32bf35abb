"""Log signatures: which log lines are evidence of what (data, not code).

Each row is one message some part of the stack prints when a distributed job
fails: the NCCL watchdog (torch 1.x to 2.14 wordings), gloo, the c10d store and
elastic rendezvous, c10d's ``monitored_barrier`` and collective-mismatch
checks, NCCL itself and its InfiniBand transport, the CUDA and CPU allocators,
the kernel's OOM killer, and torchrun's failure summary. Each row carries an
example line, and says whether it alone means the job failed (a log holding
one is never "no failure found").
``triggers`` are plain substrings: the scanner finds them all in one pass
over the bytes (Aho-Corasick), and only lines holding one are decoded and
matched against ``pattern``. A row adds a message; the verdict rules
(verdict.py) say what the events mean together.

Wordings come from the torch sources (ProcessGroupNCCL.cpp, ProcessGroupGloo.cpp,
ProcessGroupWrapper.cpp, elastic/multiprocessing/errors), from real runs here and
from logs users pasted into public issues (tests/data/diagnose/cases and public);
tests/unit/test_diagnose.py checks every row against a line of the corpus.
"""

from __future__ import annotations

import re

from ncclwatch.diagnose import severity
from ncclwatch.diagnose.logwords import (
    BUSY_MESSAGES,
    SAVE_DONE_MESSAGES,
    SAVE_MESSAGES,
    TASK_ENDS,
)
from ncclwatch.diagnose.signtypes import Event, LogSign

_N = r"-?\d+"
#: The rank tag torch puts inside its own messages, in every form of 2.2-2.14:
#: `[Rank 3]`, `[PG 0 Rank 3]`, `[PG 0 (default_pg) Rank 3]`, `[PG ID 0 PG GUID 0(default_pg)
#: Rank 3]`, `[PG ID 2 PG GUID 9 Rank 3]`. The rank is the one *inside that process
#: group*; only the default group's equals the global rank (verdict.py decides).
PG_TAG = (r"\[(?:PG (?:ID )?(?P<pg>\d{1,9}) ?(?:PG GUID (?P<pg_guid>[^\s(\]]+))?"
          r"\s*(?:\((?P<pg_desc>[^)]*)\))? ?)?Rank (?P<rank>\d{1,9})\]")
_RANK_TAG = r"(?:" + PG_TAG + r"\s*)?"

#: NCCL's own line prefix "host:pid:tid [cudaDev] " (anywhere: Ray and timestamps go first).
_NCCL_PREFIX = (r"(?:(?P<host>[\w.-]+):(?P<pid>\d+):(?P<tid>\d+) (?:\[(?P<device>\d+)\] )?"
                r"(?:[\w/.]+:\d+ )?)?")

#: The longest trigger: a terminal of this width or more cuts a trigger at most once,
#: and the scanner rejoins any single cut (logscan.py); the tests hold every row to it.
MAX_TRIGGER = 40
#: The shortest piece of a cut trigger the scanner looks for; a trigger of at least
#: 2 * FRAGMENT - 1 characters leaves one piece that long wherever it is cut (3: the
#: fallback's short words, ``Killed`` and ``FATAL``, are triggers too).
FRAGMENT = 3
MIN_TRIGGER = 2 * FRAGMENT - 1

_WD = ("[rank2]:[E0521 03:30:06.553507662 ProcessGroupNCCL.cpp:757] [Rank 2] Watchdog caught "
       "collective operation timeout: WorkNCCL(SeqNum=4412, OpType=ALLREDUCE, NumelIn=1, "
       "NumelOut=1, Timeout(ms)=600000) ran for 600089 milliseconds before timing out.")

def _level_fields(text: str) -> dict[str, str] | None:
    """The level_line sign's reader: the level and format of a line the grammar fails."""
    got = severity.failing(text)
    return None if got is None else {"level": got[0].name.lower(), "format": got[1]}


SIGNS: tuple[LogSign, ...] = (
    # -- the NCCL watchdog (ProcessGroupNCCL.cpp) --------------------------------
    # 2.x: "WorkNCCL(SeqNum=4412, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000)";
    # 1.x: "WorkNCCL(SeqNum=316, OpType=ALLREDUCE, Timeout(ms)=1800000)" and, before
    # sequence numbers, no SeqNum (and a TensorShape); "Caught collective operation
    # timeout" where the message is the exception's ("NCCL communicator was aborted").
    LogSign("nccl_watchdog_timeout", Event.TIMEOUT, ("aught collective operation timeout",),
            _RANK_TAG + r"(?:Watchdog )?[Cc]?aught collective operation timeout: ?(?P<work>Work\w+)\("
            r"(?:SeqNum=(?P<seq>\d+), )?OpType=(?P<op>\w+)(?:, TensorShape=\[[^\]]*\])?"
            r"(?:, NumelIn=(?P<numel_in>\d+), NumelOut=(?P<numel_out>\d+))?"
            r"(?:, ?Timeout\(ms\)=(?P<timeout_ms>\d+))?(?:\) ran for (?P<ran_ms>\d+) milliseconds)?",
            example=_WD),
    # 2.4+: "[PG ID 0 PG GUID 0(default_pg) Rank 1] failure detected by watchdog at work
    # sequence id: 5 PG status: last enqueued work: 5, last completed work: 4"
    LogSign("nccl_watchdog_progress", Event.PROGRESS, ("detected by watchdog at work",),
            _RANK_TAG + r".*?detected by watchdog at work(?: sequence id)?: (?P<seq>\d+)"
            r"(?:.*?last enqueued (?:NCCL )?work: (?P<enqueued>" + _N + r"))?"
            r"(?:.*?last completed (?:NCCL )?work: (?P<completed>" + _N + r"))?",
            example="[rank1]:[E1108 14:22:31.043329959 ProcessGroupNCCL.cpp:1785] [PG ID 0 PG GUID "
            "0(default_pg) Rank 1] Exception (either an error or timeout) detected by watchdog at "
            "work: 9803, last enqueued NCCL work: 9803, last completed NCCL work: 9802."),
    # 2.2-2.3: "Timeout at NCCL work: 5, last enqueued NCCL work: 5, last completed NCCL work: 4."
    LogSign("nccl_timeout_at_work", Event.PROGRESS, ("Timeout at NCCL work",),
            _RANK_TAG + r".*?Timeout at NCCL work: (?P<seq>\d+), last enqueued NCCL work: "
            r"(?P<enqueued>" + _N + r"), last completed NCCL work: (?P<completed>" + _N + r")",
            example="[rank1]:[E0917 11:21:53.188609673 ProcessGroupNCCL.cpp:1709] [PG 0 "
            "(default_pg) Rank 1] Timeout at NCCL work: 9141, last enqueued NCCL work: 9141, "
            "last completed NCCL work: 9140."),
    # 2.8+: every rank dumps when one times out, and says how far it got itself:
    # "[PG ID 0 PG GUID 0(default_pg) Rank 5] Received a dump signal due to a collective
    # timeout from  rank 2 ... Last enqueued NCCL work: 4411, last completed NCCL work: 4411."
    LogSign("nccl_dump_signal", Event.DUMP_SIGNAL, ("Received a dump signal",),
            _RANK_TAG + r".*?Received a dump signal due to a collective timeout from\s+"
            r"(?:rank (?P<from_rank>\d+)|this local rank).*?Last enqueued NCCL work: "
            r"(?P<enqueued>" + _N + r"), last completed NCCL work: (?P<completed>" + _N + r")",
            example="[rank5]:[E0521 03:30:06.924265579 ProcessGroupNCCL.cpp:1887] [PG ID 0 PG GUID "
            "0(default_pg) Rank 5] Received a dump signal due to a collective timeout from  rank 2 "
            "and we will try our best to dump the debug info. Last enqueued NCCL work: 4411, last "
            "completed NCCL work: 4411."),
    # "[PG ID 0 PG GUID 0(default_pg) Rank 0] Observed flight recorder dump signal from
    # another rank via TCPStore.": this rank's own watchdog had nothing overdue.
    LogSign("nccl_dump_observed", Event.DUMP_SIGNAL, ("Observed flight recorder dump signal",),
            _RANK_TAG + r".*?Observed flight recorder dump signal from (?P<observed>another rank)",
            example="[rank5]:[E0521 03:30:06.924265579 ProcessGroupNCCL.cpp:1922] [PG ID 0 PG GUID "
            "0(default_pg) Rank 5] Observed flight recorder dump signal from another rank via "
            "TCPStore."),
    LogSign("nccl_watchdog_abort", Event.WATCHDOG_ABORT,
            ("we are taking the entire process down",),
            _RANK_TAG + r".*we are taking the entire process down",
            example="[rank1]:[E1108 14:22:31.151230734 ProcessGroupNCCL.cpp:636] [Rank 1] To avoid "
            "data inconsistency, we are taking the entire process down."),
    # 1.x-2.x, just before the line above: "[E ProcessGroupNCCL.cpp:456] Some NCCL operations
    # have failed or timed out. Due to the asynchronous nature of CUDA kernels, ..."
    LogSign("nccl_ops_failed", Event.WATCHDOG_ABORT, ("Some NCCL operations have failed",),
            _RANK_TAG + r".*?Some NCCL operations have failed or timed out",
            example="[E ProcessGroupNCCL.cpp:456] Some NCCL operations have failed or timed out. "
            "Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run "
            "on corrupted/incomplete data."),
    # The watchdog's exception as Python sees it (1.x-2.x): "RuntimeError: NCCL communicator
    # was aborted on rank 2.  Original reason for failure was: [Rank 2] Watchdog caught ..."
    LogSign("nccl_comm_aborted", Event.WATCHDOG_ABORT, ("NCCL communicator was aborted",),
            r"NCCL communicator was aborted on rank (?P<rank>\d+)",
            example="RuntimeError: NCCL communicator was aborted on rank 2.  Original reason for "
            "failure was: [Rank 2] Watchdog caught collective operation timeout: "
            "WorkNCCL(SeqNum=10, OpType=BROADCAST, Timeout(ms)=1800000) ran for 1805457 "
            "milliseconds before timing out."),
    LogSign("nccl_heartbeat", Event.HEARTBEAT,
            ("watchdog got stuck for", "Heartbeat monitor timed out", "heartbeat monitor timed out",
             "detected no heartbeat"),
            _RANK_TAG + r".*?(?:watchdog got stuck for (?P<stuck_s>\d+) seconds|"
            r"[Hh]eartbeat monitor timed out|detected no heartbeat)",
            example="[rank1]:[E ProcessGroupNCCL.cpp:1316] [PG 0 Rank 1] Heartbeat monitor timed "
            "out! Process will be terminated after dumping debug info. workMetaList_.size()=103"),
    # The watchdog's own C++ frames, often pasted without the lines above them:
    # "frame #4: c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(...)", "c10d::
    # ProcessGroupNCCL::watchdogHandler()", "Exception raised from ncclCommWatchdog at
    # ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1418": the exception the watchdog
    # throws when it takes the process down (a collective timed out or NCCL failed).
    LogSign("nccl_watchdog_frame", Event.WATCHDOG_ABORT,
            ("WorkNCCL::checkTimeout", "watchdogHandler", "ncclCommWatchdog", "workCleanupLoop"),
            r"(?P<frame>WorkNCCL::checkTimeout|watchdogHandler|ncclCommWatchdog|workCleanupLoop)",
            example="frame #4: c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(std::optional<std::"
            "chrono::duration<long, std::ratio<1l, 1000l> > >) + 0x1d2 (0x7f3c1a6d0a22 in /usr/"
            "local/lib/python3.10/dist-packages/torch/lib/libtorch_cuda.so)"),
    # The watchdog's exception when it found an NCCL error rather than a timeout:
    # "Exception raised from checkForNCCLErrorsInternal at .../ProcessGroupNCCL.cpp:1736" and
    # its frame "c10d::ProcessGroupNCCL::checkForNCCLErrorsInternal(...)": a peer process
    # exited (a node killed, often for memory) or the network failed. The rank whose
    # frames these are lost its peer (rules/network.py).
    LogSign("nccl_error_frame", Event.PEER_CLOSED, ("checkForNCCLErrors",),
            r"(?P<frame>checkForNCCLErrors\w*)",
            example="Exception raised from checkForNCCLErrorsInternal at /opt/pytorch/pytorch/"
            "torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1736 (most recent call first):"),
    # The heartbeat monitor's frames (2.2+): "c10d::ProcessGroupNCCL::HeartbeatMonitor::
    # runLoop()" (2.6+), "c10d::ProcessGroupNCCL::heartbeatMonitor()" (2.2-2.5).
    LogSign("nccl_heartbeat_frame", Event.HEARTBEAT, ("HeartbeatMonitor::", "heartbeatMonitor("),
            r"(?P<frame>(?:HeartbeatMonitor::\w+|heartbeatMonitor)\()",
            example="frame #2: c10d::ProcessGroupNCCL::HeartbeatMonitor::runLoop() + 0x6c1 "
            "(0x7f6e3a3e1d41 in /opt/venv/lib/python3.12/site-packages/torch/lib/libtorch_cuda.so)"),
    LogSign("fr_dump", Event.FR_DUMP,
            ("flight recorder", "Flight Recorder", "FlightRecorder", "dump debug info",
             "dump_debug_info", "Dumping nccl trace", "nccl trace dump"),
            _RANK_TAG + r".*?(?P<what>(?:[Ff]light ?[Rr]ecorder|dump.debug.info|[Dd]umping nccl "
            r"trace|nccl trace dump).*)",
            example="[rank3]:[E0521 03:30:07.101265579 ProcessGroupNCCL.cpp:1595] [PG ID 0 PG GUID "
            "0(default_pg) Rank 3] ProcessGroupNCCL preparing to dump debug info. Include stack "
            "trace: 1",
            failure=False),
    # -- c10d / gloo ---------------------------------------------------------------
    # "[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting
    # 10000ms for recv operation to complete"
    LogSign("gloo_timeout", Event.TIMEOUT, ("Timed out waiting",),
            _RANK_TAG + r".*?Timed out waiting (?P<timeout_ms>\d+)ms for (?P<what>[\w/]+) operation",
            example="RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/"
            "unbound_buffer.cc:78] Timed out waiting 60000ms for recv operation to complete"),
    # c10d's TCPStore wait (the startup barrier, a rank 0 that never came back):
    # "[c10d] waitForInput: socket SocketImpl(...) timed out after 1800000ms"
    LogSign("store_timeout", Event.TIMEOUT, ("timed out after",),
            r"(?:waitForInput|[Ss]ocket|TCPStore|[Ss]tore).*?timed out after (?P<timeout_ms>\d+) ?ms"
            r"(?! while trying to connect)",
            example="[rank1]:[W516 14:34:56.854597329 socket.cpp:489] [c10d] waitForInput: socket "
            "SocketImpl(fd=79, addr=[localhost]:41170, remote=[localhost]:29500) timed out after "
            "1800000ms"),
    # A c10d store (or the rendezvous's) that a client never reached, after c10d's retries:
    # "[E socket.cpp:610] [c10d] The client socket has failed to connect to any network
    # address of (05, 40323).", 2.x "The client socket has timed out after 600000ms while
    # trying to connect to (172.18.21.4, 37907).", "TCP client failed to connect/validate
    # to host 172.18.21.4:37907 - timed out". The address is the store's (MASTER_ADDR or
    # the rendezvous endpoint). The per-address retries ("[W ...] ... has failed to
    # connect to [host]:port (errno: 110 ...)") are severity.BENIGN's.
    LogSign("store_connect_failed", Event.STORE,
            ("connect to any network address", "failed to connect/validate to",
             "while trying to connect to"),
            r"(?:connect to any network address of (?P<address>\([^)]*\))|failed to connect/"
            r"validate to host (?P<address2>\S+?)(?: -|$)|timed out after \d+ ?ms while trying "
            r"to connect to (?P<address3>\([^)]*\)))",
            example="[E socket.cpp:610] [c10d] The client socket has failed to connect to any "
            "network address of (05, 40323)."),
    # The TCPStore client's own timeout, as Python raises it: "RuntimeError: Socket Timeout".
    LogSign("store_socket_timeout", Event.STORE, ("Socket Timeout",),
            r"(?P<what>Socket Timeout)",
            example="RuntimeError: Socket Timeout"),
    # torchelastic's rendezvous: "RendezvousConnectionError: The connection to the C10d store
    # has failed. See inner exception for details.", "The node 'cn136_961_0' has failed to send
    # a keep-alive heartbeat to the rendezvous '159009' due to an error of type
    # RendezvousTimeoutError."
    LogSign("rendezvous_error", Event.STORE,
            ("RendezvousTimeoutError", "RendezvousConnectionError", "RendezvousClosedError",
             "connection to the C10d store has failed"),
            r"(?P<what>Rendezvous(?:Timeout|Connection|Closed)Error|connection to the C10d store "
            r"has failed)",
            example="WARNING:torch.distributed.elastic.rendezvous.dynamic_rendezvous:The node "
            "'cn136_961_0' has failed to send a keep-alive heartbeat to the rendezvous '159009' due "
            "to an error of type RendezvousTimeoutError."),
    # The store-based barrier that ends init_process_group and new_group (torch 1.8-2.x):
    # "RuntimeError: Timed out initializing process group in store based barrier on rank: 7,
    # for key: store_based_barrier_key:32 (world_size=8, worker_count=4, timeout=0:00:30)";
    # 2.x: "... on rank 7, for key: ... (world_size=8, num_workers_joined=4, timeout=...".
    # The rank is global and waited; world_size - worker_count ranks never arrived.
    LogSign("store_barrier_timeout", Event.TIMEOUT, ("in store based barrier",),
            r"in store based barrier on rank:? (?P<rank>\d+)(?:, for key: (?P<key>[^\s(]+))?"
            r"(?: \(world_size=(?P<world>\d+), (?:worker_count|num_workers_joined)="
            r"(?P<joined>\d+))?(?:, timeout=(?P<timeout>[\d:.]+))?",
            example="RuntimeError: Timed out initializing process group in store based barrier on "
            "rank: 7, for key: store_based_barrier_key:32 (world_size=8, worker_count=4, "
            "timeout=0:00:30)"),
    # A rank setting up an NCCL communicator gets the ncclUniqueId from the c10d store
    # (rank 0 put it there): "[15] is setting up NCCL communicator and retrieving
    # ncclUniqueId from [0] via c10d key-value store by key '0', but store->get('0') got
    # error: Connection reset by peer" (2.x; 1.x "retreiving", "got exception: Socket
    # Timeout"). The rank in brackets is the one that asked, not the cause.
    LogSign("store_get_failed", Event.STORE, ("via c10d key-value store",),
            r"via c10d key-value store(?: by key '(?P<key>[^']*)')?.*?got (?:error|exception): ?"
            r"(?P<error>.*)",
            example="[rank15]: torch.distributed.DistBackendError: [15] is setting up NCCL "
            "communicator and retrieving ncclUniqueId from [0] via c10d key-value store by key "
            "'0', but store->get('0') got error: Connection reset by peer"),
    LogSign("monitored_barrier", Event.MISSING_RANKS, ("failed to pass monitoredBarrier",),
            r"(?:\[Rank (?P<rank>\d+)\]:? )?Ranks? (?P<missing>\d+(?:, ?\d+)*) failed to pass "
            r"monitoredBarrier in (?P<timeout_ms>\d+) ms",
            example="[rank0]:[E1203 12:56:48.633118563 ProcessGroupGloo.cpp:67] [Rank 0]: Rank 2 "
            "failed to pass monitoredBarrier in 10000 ms"),
    # ProcessGroupWrapper (TORCH_DISTRIBUTED_DEBUG=DETAIL), 1.10 to 2.14: "Rank 0 is running
    # inconsistent collective: CollectiveFingerPrint(OpType=BARRIER)", "Rank 1 is running
    # collective: CollectiveFingerPrint(SequenceNumber=3104, OpType=ALLREDUCE, TensorShape=[..]
    # ...), but Rank 0 is running collective: CollectiveFingerPrint(...)" (the second half
    # often cut off in a paste), "... but Rank 1 is running collective: REDUCE." (1.12).
    LogSign("collective_mismatch", Event.MISMATCH, ("mismatch between collectives",),
            r"Detected mismatch between collectives on ranks\. Rank (?P<rank>\d+) is running "
            r"(?:inconsistent )?collective: (?P<mine>CollectiveFingerPrint\(.*?)"
            r"(?:,? but Rank (?P<other>\d+) is running collective: (?P<theirs>.*))?$",
            example="  RuntimeError: Detected mismatch between collectives on ranks. Rank 1 is "
            "running collective: CollectiveFingerPrint(SequenceNumber=1OpType=BARRIER), but Rank 2 "
            "is running collective: CollectiveFingerPrint(SequenceNumber=0OpType=BARRIER)."),
    # NCCL's own check (2.4-2.7): "NCCL WARN Mismatched collective detected, please check
    # your collective calls at and around rank 39."
    LogSign("nccl_mismatch", Event.MISMATCH, ("Mismatched collective detected",),
            r"Mismatched collective detected.*?around rank (?P<around>\d+)",
            example="init.cc:1247 NCCL WARN Mismatched collective detected, please check your "
            "collective calls at and around rank 39."),
    # gloo: "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer
    # [127.0.0.1]:10895", "pair.cc:589] Read error [192.168.70.92]:25266: Connection reset by
    # peer"; errno names where a library prints them.
    LogSign("gloo_peer_closed", Event.PEER_CLOSED,
            ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "ECONNRESET"),
            _RANK_TAG + r".*?(?P<what>Connection (?:closed|reset) by peer|Broken pipe|ECONNRESET)"
            r"(?: \[?(?P<peer>[\w.:-]+?)\]?:(?P<port>\d+))?",
            example="RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection "
            "closed by peer [127.0.0.1]:10895"),
    # -- NCCL ------------------------------------------------------------------------
    LogSign("nccl_warn", Event.NETWORK, ("NCCL WARN",),
            _NCCL_PREFIX + r"NCCL WARN (?!Cuda failure|Failed to CUDA|Mismatched collective)"
            r"(?P<message>.*)",
            example="vlm-sft-worker-0:41:211 [1] misc/socket.cc:50 NCCL WARN socketProgress: "
            "Connection closed by remote peer vlm-sft-worker-1.vlm-sft.default.svc.cluster.local"
            "<39082>",
            failure=False),  # NCCL warns of jobs that go on; NETWORK_FAILURES says which fail
    # InfiniBand verbs and the mlx5 driver (NET/IB): "NET/IBP:Got completion from peer
    # 7.6.13.83<36315> with status=12 opcode=32698 len=32696 vendor err 129 (Send)",
    # NCCL's "Call to ibv_modify_qp failed", libmlx5's "got completion with error".
    LogSign("ib_error", Event.NETWORK,
            ("Got completion from peer", "got completion with error", "ibv_poll_cq",
             "ibv_post_send", "ibv_post_recv", "ibv_modify_qp", "ibv_create_qp", "ibv_reg_mr",
             "ibv_get_async_event", "IBV_WC_"),
            _NCCL_PREFIX + r".*?(?P<message>(?:NET/IB\w*\s*:\s*)?(?:Got completion from peer|got "
            r"completion with error|(?:Call to )?ibv_\w+|IBV_WC_\w+).*)",
            example="worker-node1:2304:2340 [5] NCCL WARN NET/IBP:Got completion from peer "
            "7.6.13.83<36315> with status=12 opcode=32698 len=32696 vendor err 129 (Send)"),
    # InfiniBand async events NCCL's IB thread reports (net_ib.cc, 2.x and the 2.4-era
    # net_ib.cu): "NET/IB : Got async event : port error", "... : local catastrophic
    # error", "NET/IB : mlx5_0:1 Got async event : local access violation work queue
    # error": the link or the adapter failed under the job. Events that are no error (a
    # GID table change, a port coming back) are not this sign's.
    LogSign("ib_async_event", Event.NETWORK, ("Got async event",),
            _NCCL_PREFIX + r".*?Got async event\s*:\s*(?P<event>[^.]*?\b(?:error|err|failed|"
            r"catastrophic|fatal)\b[^.]*)",
            ignore_case=True,
            example="node-48:34050:34121 [0] transport/net_ib.cc:93 NCCL WARN NET/IB : Got async "
            "event : port error"),
    # NCCL's CUDA calls failing: out of memory (an OOM of that GPU), or any other CUDA
    # error (the GPU or driver failed): "host:pid:tid [3] include/alloc.h:178 NCCL WARN
    # Cuda failure 'out of memory'", "... Cuda failure 2 'out of memory'", "Cuda failure
    # 999 'unknown error'". [3] is the CUDA device, not a rank.
    LogSign("nccl_cuda_oom", Event.OOM, ("NCCL WARN Cuda failure", "Failed to CUDA calloc"),
            _NCCL_PREFIX + r"NCCL WARN (?:Cuda failure (?:\d+ )?'(?P<where>out of memory)'|"
            r"(?P<where2>Failed to CUDA calloc) (?P<bytes>\d+))",
            example="gpu-node-7:48211:48290 [1] include/alloc.h:103 NCCL WARN Cuda failure 2 "
            "'out of memory'"),
    LogSign("nccl_cuda_failure", Event.CUDA_ERROR, ("NCCL WARN Cuda failure",),
            _NCCL_PREFIX + r"NCCL WARN Cuda failure (?:(?P<code>\d+) )?'(?!out of memory)"
            r"(?P<message>[^']*)'",
            example="gpu-l40s-02:14422:14422 [3] enqueue.cc:1545 NCCL WARN Cuda failure "
            "'unspecified launch failure'"),
    LogSign("nccl_error", Event.NETWORK,
            ("ncclSystemError", "ncclRemoteError", "ncclInternalError", "ncclUnhandledCudaError",
             "ncclInvalidUsage", "NCCL error in:", "unhandled system error",
             "remote process exiting prematurely"),
            _RANK_TAG + r".*?(?P<code>ncclSystemError|ncclRemoteError|ncclInternalError|"
            r"ncclUnhandledCudaError|ncclInvalidUsage|NCCL error in:|unhandled system error|"
            r"remote process exiting prematurely)(?P<message>.*)",
            example="ncclRemoteError: A call failed possibly due to a network error or a remote "
            "process exiting prematurely."),
    LogSign("nccl_cuda_error", Event.NETWORK, ("unhandled cuda error",),
            _RANK_TAG + r".*?(?P<code>unhandled cuda error)(?P<message>.*)", ignore_case=True,
            example="[rank3]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/"
            "distributed/c10d/NCCLUtils.hpp:275, unhandled cuda error (run with NCCL_DEBUG=INFO "
            "for details), NCCL version 2.20.5"),
    # -- memory ------------------------------------------------------------------------
    # "CUDA out of memory. Tried to allocate 982.00 MiB (GPU 2; 79.35 GiB total capacity" (<2.1)
    # and "... Tried to allocate 4.35 GiB. GPU 3 has a total capacity" (2.1+).
    LogSign("cuda_oom", Event.OOM, ("CUDA out of memory",),
            r"(?P<where>CUDA) out of memory\.(?: Tried to allocate (?P<size>[\d.]+ ?\w+))?"
            r"(?:\.? \(?GPU (?P<device>\d+))?",
            example="[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.35 "
            "GiB. GPU 1 has a total capacity of 79.14 GiB of which 1.02 GiB is free."),
    # FSDP FULL_STATE_DICT: "UserWarning: Failed to clone() tensor with name X on rank 1. This
    # may mean that this state_dict entry could point to invalid memory ... Error: CUDA out of
    # memory" (the gathering rank; older torch names no rank, only the GPU).
    LogSign("fsdp_clone_failed", Event.OOM,
            ("Failed to clone() tensor", "could point to invalid memory"),
            r"(?P<where>state_dict clone\(\))?(?:Failed to clone\(\) tensor with name \S+?)?"
            r"(?: on rank (?P<rank>\d+))?\. This may mean that this state_dict entry"
            r"(?:.*?CUDA out of memory.*?GPU (?P<device>\d+))?",
            example="UserWarning: Failed to clone() tensor with name _fsdp_wrapped_module.w on "
            "rank 1. This may mean that this state_dict entry could point to invalid memory "
            "regions after returning from state_dict() call if this parameter is managed by FSDP."),
    LogSign("cpu_alloc_failed", Event.OOM, ("can't allocate memory",),
            r"(?P<where>DefaultCPUAllocator|CPUAllocator|\w+Allocator): can't allocate memory"
            r"(?:: you tried to allocate (?P<bytes>\d+) bytes)?",
            example="[rank0]: RuntimeError: [enforce fail at alloc_cpu.cpp:127] err == 0. "
            "DefaultCPUAllocator: can't allocate memory: you tried to allocate 673185792 bytes. "
            "Error code 12 (Cannot allocate memory)"),
    # The C/Rust allocator of a tokenizer or a data worker: "memory allocation of 2097152
    # bytes failed" (two ranks' lines often interleaved into one).
    LogSign("host_alloc_failed", Event.OOM, ("memory allocation of",),
            r"(?P<where>memory allocation of) (?:memory allocation of )?(?P<bytes>\d+)",
            example="memory allocation of 2097152 bytes failed"),
    # A Python MemoryError as the exception line (anchored: "except MemoryError:" in a
    # traceback's source lines is not one), after a launcher's or a host's tag.
    LogSign("memory_error", Event.OOM, ("MemoryError",),
            r"^(?:\[[\w ,.=-]*\]:? ?|[\w.-]+: )*(?P<where>MemoryError)\b(?P<message>.*)",
            example="[rank0]: MemoryError"),
    # Kernel: "Out of memory: Killed process 12345 (python) total-vm:..." and the
    # cgroup variant "Memory cgroup out of memory: Killed process ..."
    LogSign("oom_killer", Event.OOM, ("of memory: Killed process", "oom-kill:"),
            r"(?P<where>(?:Memory cgroup )?[Oo]ut of memory|oom-kill):"
            r".*?(?:Killed process |pid=)(?P<pid>\d+)(?: \((?P<comm>[^)]*)\))?",
            example="[1482015.999488] oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,"
            "mems_allowed=0,global_oom,task_memcg=/user.slice,task=python3.11,pid=402287,uid=1000"),
    # Slurm's cgroup: "slurmstepd: error: Detected 1 oom_kill event in StepId=4411.0. Some of
    # the step tasks have been OOM Killed." (older: "Detected 1 oom-kill event(s) in step
    # 51.batch cgroup").
    LogSign("slurm_oom_kill", Event.OOM,
            ("oom_kill event", "oom-kill event", "have been OOM Killed"),
            r"(?P<where>Detected (?P<count>\d+) oom[_-]kill event|have been OOM Killed)",
            example="slurmstepd: error: Detected 1 oom_kill event in StepId=4411.0. Some of the "
            "step tasks have been OOM Killed."),
    # Slurm killing a job or step over its memory limit (the scheduler's own accounting,
    # not the kernel's cgroup): "slurmstepd: error: Job 7518 exceeded memory limit
    # (626359956 > 512000000), being killed", older without "error:". (A step that only
    # went over at some point, "Exceeded step memory limit at some point", goes on:
    # severity.BENIGN.)
    LogSign("slurm_memory_limit", Event.OOM, ("exceeded memory limit",),
            r"(?P<where>(?:Job|Step) (?P<step>[\w.]+) exceeded memory limit) ?\((?P<used>\d+)[ >]*"
            r"(?P<limit>\d+)\),? ?being killed",  # (a wrap before "> " reads as a quote)
            example="slurmstepd: error: Job 7518 exceeded memory limit (626359956 > 512000000), "
            "being killed"),
    # Kubernetes: a container's last state ("Reason: OOMKilled" in kubectl describe, the pod
    # status column, operators' events).
    LogSign("k8s_oom_killed", Event.OOM, ("OOMKilled",), r"(?P<where>OOMKilled)",
            example="      Reason:       OOMKilled"),
    # Ray's memory monitor: "(raylet) ... 1 Workers (tasks / actors) killed due to memory
    # pressure (OOM)", "ray.exceptions.OutOfMemoryError: Task was killed due to the node
    # running low on memory. Memory on the node ... which exceeds the memory usage threshold
    # of 0.95 ... Top 10 memory users:".
    LogSign("ray_memory_monitor", Event.OOM,
            ("killed due to memory pressure", "running low on memory", "memory usage threshold",
             "memory users:", "Memory on the node (IP:"),
            r"(?P<where>killed due to memory pressure|running low on memory|exceeds the memory "
            r"usage threshold|Top \d+ memory users|Memory on the node \(IP: (?P<ip>[\w.:-]+))"
            # The task it killed, where Ray names it: "... where the task (task ID: ..,
            # name=head, rank=0,, pid=4503, memory used=..." (a Ray Train worker's rank).
            r"(?:.*?where the task \(.*?\brank=(?P<rank>\d+))?",
            example="(raylet) [2024-11-08 14:22:31,043 E 612 612] (raylet) node_manager.cc:3069: "
            "1 Workers (tasks / actors) killed due to memory pressure (OOM), 0 Workers crashed "
            "due to other reasons at node (ID: 3f2e, IP: 10.0.0.7) over the last time period."),
    # Any other wording of memory running out or an OOM kill ("HIP out of memory", "the
    # oom-killer", "got OOM at step 900"); the lines the rows above read are left to them,
    # and so is Ray's list of what may have killed a worker ("Some common causes include:
    # (1) the process was killed by the OOM killer ...": a guess, not evidence).
    LogSign("oom_word", Event.OOM,
            ("out of memory", "Out of memory", "OUT OF MEMORY", "oom-killer", "oom_killer",
             "oom_reaper", " OOM ", "(OOM)", " OOM:", " OOM,", " OOM.", "OOM: ", "OOM kill",
             "OOM-kill", "OOM Kill", "oom-kill"),
            r"^(?!.*(?:common causes|potential root causes)).*?"
            r"(?P<where>(?<!CUDA )(?<!Cuda )(?<!')(?<!cgroup )\bout of memory\b(?!:? Killed process)"
            r"|\boom[-_ ]?kill(?:er|ed)?\b|\boom_reaper\b|"
            r"(?<![\w-])OOM(?![\w-]))",
            ignore_case=True,
            example="RuntimeError: HIP out of memory. Tried to allocate 2.00 GiB (GPU 3; 63.98 GiB "
            "total capacity; 60.12 GiB already allocated)"),
    # -- torchrun (torch/distributed/elastic) ---------------------------------------------
    LogSign("torchrun_failed", Event.EXIT, ("failed (exitcode:",),
            r"failed \(exitcode: ?(?P<exitcode>" + _N + r")\)(?: ?local_rank: ?(?P<local_rank>\d+)"
            r"(?: ?\(pid: ?(?P<pid>\d+)\))?)?",
            example="E1203 12:36:12.482000 21547 torch/distributed/elastic/multiprocessing/api.py:"
            "1002] failed (exitcode: -6) local_rank: 3 (pid: 21555) of binary: /venv/bin/python"),
    # torch 1.9's warning when a worker failed without an error file: "CHILD PROCESS FAILED
    # WITH NO ERROR_FILE" over "Child process 17057 (local_rank 0) FAILED (exitcode 1)", as
    # in https://github.com/facebookresearch/MetaICL/issues/8.
    LogSign("torchrun_child_failed", Event.EXIT, (") FAILED (exitcode",),
            r"Child process ?(?P<pid>\d+) ?\(local_rank ?(?P<local_rank>\d+)\) FAILED \(exitcode "
            r"?(?P<exitcode>" + _N + r")\)",
            example="Child process 17057 (local_rank 0) FAILED (exitcode 1)"),
    # Slurm's own line for a task that ended: "srun: error: nid008637: task 3: Exited with
    # exit code 1", then "srun: error: nid008637: tasks 0-2: Terminated" for the tasks the
    # step's end took down; "srun.slurm: error: borg01x154: task 4: Killed" (older
    # installs). A task is a rank where srun starts the ranks itself, a node's launcher
    # where srun starts torchrun per node (crashes.py decides). Seen in
    # https://github.com/CSCfi/pytorch-ddp-examples/issues/1 (a wrong path: "slurmstepd:
    # error: execve(): torchrun: No such file or directory", task 0 exit code 2) and
    # https://github.com/desihub/desispec/issues/2744 ("tasks 0-57,59-63: Terminated").
    LogSign("slurm_task_exit", Event.EXIT,
            (": Exited with exit code",) + tuple(f": {w}" for w in TASK_ENDS),
            r"\b(?:srun|slurmstepd)(?:\.slurm)?: error: (?:(?P<host>[\w.-]+): )?tasks? "
            r"(?:(?P<task>\d{1,9})|(?P<tasks>\d{1,9}(?:[-,]\d{1,9})+)): (?:Exited with exit code "
            r"(?P<exitcode>\d{1,3})|(?P<ended>" + "|".join(TASK_ENDS) + r"))",
            example="srun: error: nid008637: task 3: Exited with exit code 1"),
    LogSign("torchrun_teardown", Event.TEARDOWN, ("closing signal",),
            r"Sending process (?P<pid>\d+) closing signal (?P<signame>SIG\w+)",
            example="W1203 12:36:12.416000 21547 torch/distributed/elastic/multiprocessing/api.py:"
            "1028] Sending process 21552 closing signal SIGTERM"),
    # The deepspeed launcher's sigkill_handler stopping the workers by pid after one of them
    # exited non-zero (its own OOM kill, a crash): "[2023-02-03 03:17:53,592] [INFO]
    # [launch.py:318:sigkill_handler] Killing subprocess 143917". At INFO level, and a
    # failure all the same: a paste cut before the exit line still says a worker died.
    LogSign("deepspeed_teardown", Event.FAILED, ("Killing subprocess",),
            r"sigkill_handler\] Killing subprocess (?P<pid>\d+)",
            example="[2023-02-03 03:17:53,592] [INFO] [launch.py:318:sigkill_handler] Killing "
            "subprocess 143917"),
    # (A failure in itself: torchrun stops the workers only after one failed, and a paste
    # cut off before the failure's own line still says the job failed.)
    # The deepspeed launcher (launch.py sigkill_handler) when a worker exits non-zero:
    # "[2023-07-10 04:26:35,999] [ERROR] [launch.py:324:sigkill_handler] ['/venv/bin/python',
    # '-u', 'train.py', '--local_rank=1', ...] exits with return code = -11". The command
    # is the LAST worker it spawned on the node (a loop variable), whichever worker failed:
    # its local rank is the node's worker count - 1, not the failed one's. The exit code
    # is the failed worker's.
    LogSign("deepspeed_exit", Event.EXIT, ("exits with return code",),
            r"(?:'--local_rank=(?P<last_local_rank>\d+)'.*?)?exits with return code = "
            r"(?P<exitcode>" + _N + r")",
            example="[2023-07-10 04:26:35,999] [ERROR] [launch.py:324:sigkill_handler] ['/venv/"
            "bin/python3.10', '-u', 'trainCLM.py', '--local_rank=1', '--deepspeed', 'ds.json'] "
            "exits with return code = -11"),
    # torchrun's own traceback after a worker failed, over its failure table.
    LogSign("child_failed", Event.FAILED, ("ChildFailedError",),
            r"(?P<what>ChildFailedError)",
            example="torch.distributed.elastic.multiprocessing.errors.ChildFailedError: "),
    # The failure table ("host : ...", "rank : 3 (local_rank: 3)", "exitcode : -9 (pid: N)",
    # "traceback : Signal 9 (SIGKILL) received by PID N"): unanchored, since srun, pdsh and
    # Ray put their tags in front, and its indent may be lost (a Markdown paste). torch
    # 1.9's table has no padding and no host row ("  time: 2021-07-12_10:02:58", "  rank:
    # 0 (local_rank: 0)", "  exitcode: 1 (pid: 866229)", "  error_file: <N/A>", under
    # "Root Cause:" and "Other Failures:"), as in
    # https://github.com/xzz777/SCTNet/issues/47.
    LogSign("summary_host", Event.SUMMARY, ("host      : ",),
            r"(?:^|\s)host\s+: (?P<host>\S+)", example="  host      : localhost",
            failure=False),
    LogSign("summary_rank", Event.SUMMARY, ("(local_rank: ",),
            r"(?:^|\s)rank\s*: ?(?P<rank>\d+) ?\(local_rank: ?(?P<local_rank>\d+)\)",
            example="  rank      : 0 (local_rank: 0)", failure=False),
    LogSign("summary_exitcode", Event.SUMMARY, ("exitcode  : ", "exitcode: "),
            r"(?:^|\s)exitcode\s*: ?(?P<exitcode>" + _N + r") ?\(pid: ?(?P<pid>\d+)\)",
            example="  exitcode  : -9 (pid: 21552)", failure=False),
    LogSign("summary_signal", Event.SUMMARY, ("received by PID",),
            r"Signal (?P<signal>\d+) \((?P<signame>SIG\w+)\) received by PID (?P<pid>\d+)",
            example="  traceback : Signal 9 (SIGKILL) received by PID 21552", failure=False),
    LogSign("summary_time", Event.SUMMARY, ("time      : ", "time: 20"),
            r"(?:^|\s)time(?:\s+: (?P<time>\S+)|: (?P<time19>\d{4}-\d\d-\d\d_\d\d:\d\d:\d\d)\s*$)",
            example="  time      : 2026-12-03_12:36:12", failure=False),
    LogSign("summary_root", Event.SUMMARY_ROOT, ("Root Cause (first observed failure)",
                                                 "Root Cause:"),
            r"Root Cause(?: \(first observed failure\))?:",
            example="Root Cause (first observed failure):"),
    # -- trainers: built from the message tables below ------------------------------------
    LogSign("checkpoint_start", Event.CHECKPOINT, tuple(t for t, _w in SAVE_MESSAGES),
            r"(?P<what>" + "|".join(re.escape(t) for t, _w in SAVE_MESSAGES) + r")(?P<target>.*)",
            example="[INFO|trainer.py:3984] 2024-10-21 08:03:20,122 >> Saving model checkpoint to "
            "/ckpt/run-17/checkpoint-100", failure=False),
    LogSign("checkpoint_done", Event.CHECKPOINT_DONE, tuple(t for t, _w in SAVE_DONE_MESSAGES),
            r"(?P<what>" + "|".join(re.escape(t) for t, _w in SAVE_DONE_MESSAGES)
            + r")(?P<target>.*)",
            example="2024-10-21 08:03:27 | Saved checkpoint to /ckpt/run-17/step_000100.pt "
            "(4.1 GiB, 6.8 s)", failure=False),
    LogSign("busy", Event.BUSY, tuple(t for t, _w in BUSY_MESSAGES),
            r"(?P<what>" + "|".join(re.escape(t) for t, _w in BUSY_MESSAGES) + r")(?P<detail>.*)",
            example="Running tokenizer on dataset (num_proc=16): 12%", failure=False),
    LogSign("traceback", Event.TRACEBACK, ("Traceback (most recent call last)",),
            r"Traceback \(most recent call last\)",
            example="[rank2]: Traceback (most recent call last):"),
    # -- the fallback: lines shaped like a failure ---------------------------------------
    # A process dying of a signal or a fatal runtime error, as the shell, libc, Python's
    # faulthandler, UCX, Megatron and Ray print it: "Segmentation fault (core dumped)",
    # "Fatal Python error: Segmentation fault", "caught signal 11 (Segmentation fault)",
    # "*** SIGSEGV received at time=...", "Aborted (core dumped)", "The actor died
    # unexpectedly before finishing this task", "ray.exceptions.WorkerCrashedError".
    LogSign("crash_signal", Event.CRASH,
            ("Segmentation fault", "SIGSEGV", "SIGABRT", "SIGBUS", "SIGILL", "SIGFPE",
             "core dumped", "Fatal Python error", "aught signal", "Bus error", "Aborted",
             "died unexpectedly", "WorkerCrashedError", "ActorDiedError", "Worker crashed",
             "worker crashed", "Worker died", "worker died", "umping core"),
            r"(?P<what>Segmentation fault|SIG(?P<sig>SEGV|ABRT|BUS|ILL|FPE)\b|core dumped|"
            r"Fatal Python error(?:: (?P<fatal>\w[\w ]*))?|[Cc]aught signal (?P<signum>\d+)|"
            r"Bus error|Aborted|died unexpectedly|WorkerCrashedError|ActorDiedError|"
            r"[Ww]orker (?:crashed|died)|[Dd]umping core)",
            example="Fatal Python error: Segmentation fault"),
    # A non-zero exit code or a fatal signal, as a launcher, a scheduler or a runtime reports
    # it: "srun: error: node-12: task 3: Exited with exit code 1", "Exit Code: 137"
    # (Kubernetes), "returned non-zero exit status 1", "exitcode: -9", "killed by signal 9".
    LogSign("exit_status", Event.ERROR,
            ("exit code", "Exit code", "Exit Code", "exitcode", "exitCode", "exit_code", "ExitCode",
             "exited with",
             "exit status", "Exit status", "return code", "returncode", "non-zero exit",
             "by signal", "with signal", "died with", "forcefully exiting via"),
            r"(?:\bexit(?:ed|s)?[ _]?(?:with )?(?:exit |return )?(?:code|status)|\bexitcode|"
            r"\breturn[ _]?code|non-zero exit status)[\s:=(]{0,8}(?P<code>-?[1-9]\d{0,5})\b|"
            r"\b(?:killed|terminated|exited|died|ended) (?:by|with|due to) signal:? ?"
            r"(?P<signal>SIG(?:KILL|TERM|SEGV|ABRT|BUS|ILL|FPE|INT|HUP|PIPE|QUIT)|\d+)|(?P<teardown>forcefully exiting via (?:Signals\.)?SIG[A-Z]+)",
            ignore_case=True,
            example="srun: error: gpu-node-12: task 3: Exited with exit code 1"),
    # Kubernetes: a pod that keeps crashing or failed ("CrashLoopBackOff" in kubectl get
    # pods, "Reason: Error" in kubectl describe, an operator's event "reason": "Error").
    LogSign("k8s_failed", Event.ERROR,
            ("CrashLoopBackOff", "BackoffLimitExceeded", "DeadlineExceeded", "ContainerCannotRun",
             "Reason:", "\"reason\": \"Error\""),
            r"(?P<reason>CrashLoopBackOff|BackoffLimitExceeded|DeadlineExceeded|ContainerCannotRun|"
            r"Reason:\s+(?:Error|Evicted)\b|\"reason\": \"Error\")",
            example="pytorchjob-example-82cjcqdz-master-0         0/2     CrashLoopBackOff   8    "
            "      2m32s"),
    # A Python exception line, a C++ exception's frame ("Exception raised from
    # checkTimeout at ../torch/csrc/..."), std::terminate ("terminate called after throwing
    # an instance of 'c10::DistBackendError'", "  what():  ..."); not a warning's line.
    LogSign("exception_line", Event.ERROR,
            ("Error:", "Exception:", "Exception in", "Exception raised from", "terminate called",
             "what():  "),
            r"^(?:(?!\w*Warning: ).)*?(?P<what>(?:(?<![\w.])(?:[a-z_]\w*\.)*(?P<exc>[A-Z]?\w*"
            r"(?:Error|Exception))(?::|$)|Exception (?:in|raised from)\b|terminate called|"
            r"\bwhat\(\): ))",
            example="FileNotFoundError: [Errno 2] No such file or directory: '/ckpt/tmp-step900' "
            "-> '/ckpt/step900'"),
    # A Python traceback's frame, where the paste lost the "Traceback" line above it (a
    # middle or an end of one), or Python's faulthandler dump ('File "x.py", line 3 in f').
    LogSign("traceback_frame", Event.ERROR, ('", line ',),
            r'(?<![\w.])File "(?P<file>[^"]+)", line (?P<line>\d{1,9}),? in (?P<func>\S+)',
            example='  File "/opt/conda/lib/python3.10/site-packages/transformers/trainer.py", '
            'line 2395, in _save_checkpoint'),
    # A log line at error or fatal level, a tool's "prog: error: ...", the shell's "Killed",
    # a line that starts with "Error" (Hydra's "Error executing job with overrides: ...").
    LogSign("error_line", Event.ERROR,
            ("ERROR", "FATAL", "Fatal error", "fatal error", ": error:", "error: ", "Error ", "Killed"),
            r"(?P<what>(?<![\w-])(?:ERROR|FATAL)(?![\w-])|[Ff]atal error|(?:^|[\w\])]: )error:|"
            r"(?<![\w-])Killed(?![\w-])|(?<![A-Za-z.-])Error (?=[a-z]))",
            example="/bin/bash: line 1: 402287 Killed                  python train.py --config "
            "configs/llama3_8b.yaml"),
    # The severity grammar (severity.py): a line at error or fatal level in any logger's
    # format, or a warning in error words, that no row above read and no benign shape
    # explains (c10d's "[E socket.cpp:610]", XLA's "2023-09-01 10:20:11.257981: E
    # external/xla/...cc:2593]", "NCCL WARN ... port error", "slurmstepd: error: ...").
    LogSign("level_line", Event.ERROR, severity.LEVEL_TRIGGERS, "",
            reader=_level_fields, whole_only=True,
            example="2023-09-01 10:20:11.257981: E external/xla/xla/pjrt/"
            "pjrt_stream_executor_client.cc:2593] Execution of replica 3 failed: INTERNAL: "
            "Failed to execute XLA Runtime executable"),
    LogSign("world_size", Event.WORLD, ("WORLD_SIZE=", "world_size=", "world size: ", "world_size: "),
            r"(?:WORLD_SIZE|world[_ ]size)(?:=|: )(?P<world>\d+)",
            example="2024-11-08 14:02:51,892 INFO     [train_vlm.py:212] world_size=8 backend=nccl",
            failure=False),
    LogSign("finished", Event.FINISHED,
            ("Local worker group finished", "raining completed", "raining finished"),
            r"(?P<what>Local worker group finished|[Tt]raining (?:completed|finished))",
            example="12/03/2026 12:24:53 - INFO - trainer - Training completed. Do not forget to "
            "share your model on huggingface.co/models =)", failure=False),
)

def _check_table() -> None:
    ids = [s.id for s in SIGNS]
    if len(ids) != len(set(ids)):
        raise AssertionError("duplicate log sign ids")
    bad = [t for s in SIGNS for t in s.triggers if not MIN_TRIGGER <= len(t) <= MAX_TRIGGER
           and not (s.whole_only and 3 <= len(t) <= MAX_TRIGGER)]
    if bad:
        raise AssertionError(f"triggers not {MIN_TRIGGER}-{MAX_TRIGGER} characters long: {bad}")


_check_table()
