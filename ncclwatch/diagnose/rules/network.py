"""Rule: a transport (NCCL/gloo) error ended the job, not a crashed peer or a hang."""

from __future__ import annotations

from ncclwatch.diagnose.crashes import job_failed, own_crashes
from ncclwatch.diagnose.facts import Facts, exception_kind, time_order
from ncclwatch.diagnose.finding import LogFinding, who
from ncclwatch.diagnose.scanresult import Evidence
from ncclwatch.diagnose.signtypes import Event


def _context_rank(facts: Facts, e: Evidence, within: int = 40) -> int | None:
    """An NCCL line has no rank prefix (NCCL prints host:pid:tid): take the rank of
    the next rank-prefixed evidence of the same node (srun task) a few lines on,
    which is the same process's watchdog reporting what NCCL said."""
    for o in facts.by_line.between(e.file, e.line + 1, e.line + within):
        if o.rank is not None and o.task == e.task:
            return o.rank
    return None


def rule_network(facts: Facts) -> LogFinding | None:
    if not job_failed(facts) or own_crashes(facts) or any(rf.oom for rf in facts.ranks.values()):
        return None  # warnings of a job that went on; or a rank died and its peers' errors follow
    items: list[tuple[bool, tuple, int | None, str, str]] = []  # (remote, order, rank, where, text)
    for e in facts.scan.evidence:
        if e.event is not Event.NETWORK:
            continue
        rank = e.rank if e.rank is not None else _context_rank(facts, e)
        remote = "ncclRemoteError" in e.text or "remote process" in e.text
        items.append((remote, time_order(e), rank, e.where, e.text))
    for r, rf in facts.ranks.items():
        for tb in rf.tracebacks:
            if exception_kind(tb) == "network":
                items.append((False, time_order(tb), r, tb.where, tb.exception))
    peers = [(r, tb) for r, rf in facts.ranks.items() for tb in rf.tracebacks
             if exception_kind(tb) == "peer"]
    if not items and (store := _store_lost(facts) or _store_unreachable(facts)
                      or _watchdog_found_error(facts)):
        return store
    if not items:
        # gloo: every failing rank lost a peer, nobody timed out, nobody crashed: the
        # connections broke under live processes. gloo names only ip:port, not the rank.
        # (A process killed for memory somewhere, unranked, is what went away instead.)
        if peers and not any(rf.timeouts or rf.timeout_tracebacks()
                             for rf in facts.ranks.values()) \
                and not any(e.event is Event.OOM for e in facts.unattributed):
            ev = [(tb.where, f"rank {r}: {tb.exception[:200]}") for r, tb in peers[:4]]
            reporting = sorted({r for r, _tb in peers})
            return LogFinding("network_error", reporting, [], "nccl_network_error",
                              f"{who(reporting)} lost connections to peers that did not "
                              "crash; gloo's messages name only ip:port, so which link failed "
                              "is not in the logs: every reporting rank counts as initiating.",
                              ev)
        return None
    if all("Got async event" in it[4] for it in items) \
            and facts.all_evidence(Event.FINISHED):
        return None  # an InfiniBand event the job outlived: quoted as failure evidence, no cause
    items.sort(key=lambda x: (x[0],) + x[1])
    lead = items[0]
    first_timeout = min((time_order(e) for rf in facts.ranks.values() for e in rf.timeouts),
                        default=None)
    if first_timeout is not None and first_timeout[0] is False and lead[1][0] is False \
            and first_timeout[1] < lead[1][1]:
        return None  # the errors are the watchdog's teardown of a hang
    initiating = sorted({it[2] for it in items if it[2] is not None and it[0] == lead[0]
                         and (it[1][0] or lead[1][0] or it[1][1] - lead[1][1] < 5.0)})
    ev = [(it[3], it[4][:240]) for it in items[:4]]
    collateral = [r for r in facts.world if r not in initiating]
    if not initiating:
        return LogFinding("network_error", [], collateral, "nccl_network_error",
                          "a transport error ended the job, but no line of it names a rank "
                          f"(NCCL prints host:pid:tid): {lead[4][:160]}", ev,
                          missing=["which rank the failing process was"],
                          collect=["every rank's log with its rank prefix (torchrun --tee 3 or "
                                "--log-dir; srun --label)", "NCCL_DEBUG=INFO with "
                                "NCCL_DEBUG_SUBSYS=INIT,NET (maps host:pid and devices to ranks)"])
    return LogFinding("network_error", initiating, collateral, "nccl_network_error",
                      f"the first transport error came from "
                      f"{who(initiating)}: {lead[4][:160]}", ev)


#: What a c10d store client's error says when its connection broke (not a timeout).
_STORE_BROKE = ("Connection reset by peer", "Broken pipe", "Connection closed by peer",
                "ECONNRESET", "Connection refused")


def _store_lost(facts: Facts) -> LogFinding | None:
    """A rank lost its connection to the c10d store (store->get ... Connection reset by
    peer) and nothing timed out or crashed: the store's host (rank 0's process, or
    torchrun's agent) went away or the network between them dropped the connection.
    The rank that reports it is where the line is printed, not the cause."""
    lost = [e for e in facts.all_evidence(Event.STORE) if e.sign == "store_get_failed"
            and any(t in e.fields.get("error", "") for t in _STORE_BROKE)]
    if not lost or any(rf.timeouts or rf.progress or rf.timeout_tracebacks()
                       for rf in facts.ranks.values()):
        return None
    e = lost[0]
    reporting = sorted({x.rank for x in lost if x.rank is not None})
    return LogFinding("network_error", [], reporting, "nccl_network_error",
                      f"the connection to the c10d store broke ({e.fields.get('error', '')[:80]}) "
                      + (f"under {who(reporting)}" if reporting else "")
                      + " while setting up NCCL: the store's host (rank 0's process or "
                      "torchrun's agent) went away, or the network between them dropped it; "
                      "no line says which.", [(x.where, x.text[:240]) for x in lost[:4]],
                      ["rule out a crashed rank 0 (or agent) before blaming the network: its "
                    "log is not here"],
                      missing=["the log of rank 0 (the store's host) around that time"],
                      collect=["rank 0's log and torchrun's agent log (the store host)",
                            "TORCH_CPP_LOG_LEVEL=INFO TORCH_DISTRIBUTED_DEBUG=DETAIL (the "
                            "store's own connection messages)", "the network path between "
                            "the nodes and MASTER_ADDR:MASTER_PORT (firewall, interface)"])


def _store_unreachable(facts: Facts) -> LogFinding | None:
    """Clients that never reached the c10d store (or the rendezvous's) after c10d's
    retries, and nothing else failed: the store's host never listened there, or the
    network or a firewall kept the clients out. The address is the one they tried."""
    lines = [e for e in facts.all_evidence(Event.STORE) if e.sign == "store_connect_failed"]
    if not lines or any(rf.tracebacks and any(exception_kind(tb) == "error" for tb in rf.tracebacks)
                        for rf in facts.ranks.values()):
        return None
    e = lines[0]
    address = next((v for k, v in e.fields.items() if k.startswith("address")), "?")
    reporting = sorted({x.rank for x in lines if x.rank is not None})
    return LogFinding("network_error", [], reporting, "nccl_network_error",
                      f"the c10d store at {address} was never reached"
                      + (f" by {who(reporting)}" if reporting else "")
                      + " (c10d gave up after its retries): the store's host (rank 0's process, "
                      "torchrun's agent or the rendezvous endpoint) was not listening there, or "
                      "the network between them kept the clients out.",
                      [(x.where, x.text[:240]) for x in lines[:4]],
                      ["rule out a wrong MASTER_ADDR / MASTER_PORT or --rdzv-endpoint (the "
                       "address above) and a store host that crashed before listening"],
                      missing=["the log of the store's host (rank 0 or the rendezvous endpoint)"],
                      collect=["rank 0's log and torchrun's agent log (the store host)",
                               "the address every node resolves MASTER_ADDR to, and whether the "
                               "port is open between the nodes (firewall, interface)"])


def _watchdog_found_error(facts: Facts) -> LogFinding | None:
    """The watchdog's own exception came from checkForNCCLErrors (an NCCL error), and no
    rank timed out: the ranks whose frames these are lost a peer, a process that exited or
    was killed (a whole node, often for memory), or the link under it. Not a hang."""
    lines = [e for e in facts.scan.evidence if e.sign == "nccl_error_frame"]
    if not lines or any(e.event in (Event.TIMEOUT, Event.PROGRESS) for e in facts.scan.evidence):
        return None
    lost = sorted({e.rank for e in lines if e.rank is not None})
    return LogFinding("network_error", [], lost, "nccl_network_error",
                      "the NCCL watchdog found an NCCL error, not a timeout (its exception is "
                      "raised from checkForNCCLErrors)"
                      + (f" on {who(lost)}, which only lost a peer" if lost else "")
                      + ": a peer process exited or was killed (a whole node, often for "
                      "memory), or the network failed under it; no line says which.",
                      [(e.where, e.text[:240]) for e in lines[:4]],
                      ["rule out a peer node killed for memory or lost (its scheduler events, "
                       "its kernel log) before blaming the network"],
                      candidates=[r for r in facts.world if r not in lost] if lost else [],
                      missing=["the log of the peer that went away"],
                      collect=["every node's log and the scheduler's events (a node killed for "
                               "memory or lost)", "NCCL_DEBUG=WARN (the NCCL error's own line: "
                               "'remote process exited or there was a network error')"])
