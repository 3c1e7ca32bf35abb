"""Which ranks failed on their own rather than by waiting, and how they ended.

A traceback of its own, a CUDA error, a crash signal in torchrun's table or a
launcher's exit line, the OOM killer's line: the evidence that a rank was the
first to die. Read by the crash, network, gather-OOM and fallback rules.
"""

from __future__ import annotations

import signal

from ncclwatch.diagnose.facts import Facts, RankFacts, exception_kind, time_order
from ncclwatch.diagnose.logwords import NETWORK_FAILURES, SIGNAL_MEANING, TASK_ENDS
from ncclwatch.diagnose.scanresult import Evidence
from ncclwatch.diagnose.signtypes import Event


def sig_of(rf: RankFacts) -> str:
    """The signal that ended a rank, by torchrun's table ("" when none did)."""
    fe = rf.failure
    if fe is None:
        return ""
    if fe.signame:
        return fe.signame
    if fe.exitcode is not None and fe.exitcode < 0:
        try:
            return signal.Signals(-fe.exitcode).name
        except ValueError:
            return ""
    return ""


def oom_killed(facts: Facts, rf: RankFacts) -> Evidence | None:
    fe = rf.failure
    if fe is None or fe.pid is None:
        return None
    for e in facts.unattributed + rf.oom:
        if e.sign == "oom_killer" and e.fields.get("pid") == str(fe.pid):
            return e
    return None


def job_failed(facts: Facts) -> bool:
    """Anything that says the job did not just finish (warnings alone do not)."""
    return bool(facts.scan.failures or any(
        e.event in (Event.EXIT, Event.TIMEOUT, Event.WATCHDOG_ABORT, Event.MISSING_RANKS,
                    Event.HEARTBEAT)
        or e.sign in ("nccl_error", "nccl_cuda_error", "store_get_failed", "store_connect_failed",
                      "ib_async_event", "nccl_error_frame")
        or (e.event is Event.NETWORK and any(t in e.text for t in NETWORK_FAILURES))
        for e in facts.scan.evidence)
        or any(exception_kind(t) not in ("teardown", "truncated") for t in facts.scan.tracebacks))


def own_crashes(facts: Facts) -> list[tuple[tuple, int, str, str]]:
    """(order, rank, where, why) of ranks that failed on their own (not by waiting)."""
    out = []
    watchdog = any(rf.aborted or rf.timeouts for rf in facts.ranks.values())
    for r, rf in facts.ranks.items():
        if rf.cuda_errors:
            e = rf.cuda_errors[0]
            out.append((time_order(e), r, e.where,
                        f"rank {r}'s GPU failed under NCCL: {e.text[:200]}"))
            continue
        for tb in rf.tracebacks:
            if exception_kind(tb) != "error":
                continue
            out.append((time_order(tb), r, tb.where, f"rank {r} raised {tb.exception[:200]}"))
            break
        else:
            sig = sig_of(rf)
            meaning = SIGNAL_MEANING.get(sig, "")
            if meaning in ("crashed", "killed") or (meaning == "aborted" and not watchdog
                                                   and not rf.waited):
                if sig == "SIGKILL" and oom_killed(facts, rf) is not None:
                    continue
                fe = rf.failure
                assert fe is not None
                out.append(((True, 0.0, fe.file, fe.line), r, fe.where,
                            f"rank {r} exited with {sig} (exitcode {fe.exitcode}, pid {fe.pid})"))
            elif _summary_exit(facts, rf, watchdog):
                fe = rf.failure
                assert fe is not None
                out.append(((True, 0.0, fe.file, fe.line), r, fe.where,
                            f"rank {r} exited with exitcode {fe.exitcode} (pid {fe.pid}), as "
                            "the launcher's failure summary says, and no rank waited for another"))
    if not facts.scan.failures:
        # torchrun's "failed (exitcode: -9) local_rank: 0 (pid: N)" without the summary;
        # the deepspeed launcher's line names its only worker when that is local rank 0;
        # Slurm's "task 3: Exited with exit code 1" where tasks are ranks.
        waited = anyone_waited(facts) or not _launcher_speaks_first(facts)
        for e in facts.all_evidence(Event.EXIT):
            code = exit_code(e)
            rank, named = exit_rank(facts, e)
            only = rank is None and e.fields.get("last_local_rank") == "0" and (
                SIGNAL_MEANING.get(exit_name(code)) in ("crashed", "killed")
                or not waited)  # else the exit of a rank that waited
            if only:
                rank, named = 0, "local rank 0"
            if rank is None or rank in {o[1] for o in out} or not _own_exit(e, code, only,
                                                                           waited):
                continue
            sig = exit_name(code)
            ended = e.fields.get("ended")
            out.append(((True, 0.0, e.file, e.line), rank, e.where,
                        (f"{named} ended: {ended} ({sig})" if ended else
                         f"{named} exited with {sig if code < 0 else 'exit code ' + sig}"
                         + (f" (exitcode {code})" if code < 0 else ""))
                        + (" (the deepspeed launcher's only worker on its node)"
                           if only else "")
                        + ("; no rank waited for another before it" if code > 0 and not only
                           else "")))
    out.sort()
    return out


def _own_exit(e: Evidence, code: int, only: bool, waited: bool) -> bool:
    """Whether a launcher's (or Slurm's) exit line says its rank failed on its own: a
    signal (a Slurm task that srun or the step's end terminated excepted), the deepspeed
    launcher's only worker, or a non-zero exit code where no rank waited for another
    (the launcher's line is then the first failure in the logs: a rank that timed out
    waiting exits non-zero too)."""
    if code < 0:
        return not (e.fields.get("task") is not None
                    and SIGNAL_MEANING.get(exit_name(code)) == "terminated")
    return only or (code > 0 and not waited)


#: Evidence that the job failed some other way than a rank exiting: where any of it is in
#: the logs, a launcher's exit line is not the first failure (a rank that waited, lost a
#: peer or met a transport error exits non-zero too), and other rules read the logs.
_NOT_AN_EXIT = frozenset({Event.TIMEOUT, Event.PROGRESS, Event.WATCHDOG_ABORT, Event.HEARTBEAT,
                          Event.MISSING_RANKS, Event.MISMATCH, Event.PEER_CLOSED, Event.STORE,
                          Event.DUMP_SIGNAL})


def _launcher_speaks_first(facts: Facts) -> bool:
    """Whether nothing but ranks' own errors precedes the launchers' exit lines: no wait,
    no lost peer or store, no transport error."""
    if any(e.event in _NOT_AN_EXIT or (e.event is Event.NETWORK
                                        and any(t in e.text for t in NETWORK_FAILURES))
           for e in facts.scan.evidence):
        return False
    return not any(exception_kind(tb) in ("network", "peer", "timeout")
                   for tb in facts.scan.tracebacks)


def exit_code(e: Evidence) -> int:
    """The exit code an exit line reports; a signal Slurm names in words as -N."""
    if "exitcode" in e.fields:
        return int(e.fields["exitcode"])
    return TASK_ENDS.get(e.fields.get("ended", ""), 1)


#: Launchers that start the ranks themselves: where one speaks in the logs, a Slurm task
#: is that launcher on a node (torchrun per node), not a rank.
AGENT_SIGNS = frozenset({"torchrun_failed", "torchrun_child_failed", "torchrun_teardown",
                         "child_failed", "deepspeed_exit", "deepspeed_teardown"})


def exit_rank(facts: Facts, e: Evidence) -> tuple[int | None, str]:
    """The rank an exit line names, and how it names it: torchrun's local rank (the
    global rank on one node, as the verdict notes), or a Slurm task where tasks are
    ranks."""
    lr = e.fields.get("local_rank")
    if lr is not None:
        return int(lr), f"local rank {lr}"
    if e.rank_from == "task" and e.rank is not None and not (
            facts.scan.failures or any(o.sign in AGENT_SIGNS for o in facts.scan.evidence)):
        return e.rank, f"Slurm task {e.rank}"
    return None, ""


def _summary_exit(facts: Facts, rf: RankFacts, watchdog: bool) -> bool:
    """A launcher's failure summary names a rank that exited non-zero (not by a signal)
    and nothing says it only waited or lost a peer: that rank failed on its own."""
    fe = rf.failure
    return bool(fe is not None and fe.exitcode is not None and fe.exitcode > 0
                and not fe.signame and not watchdog and not rf.waited
                and not rf.network and not rf.peer_closed and not anyone_waited(facts)
                and all(exception_kind(tb) in ("error", "truncated") for tb in rf.tracebacks))


def unranked_crash(facts: Facts) -> list[Evidence]:
    """Lines that say some process died of its own failure, with no rank anywhere:
    an allocator failing, the OOM killer, a worker killed by a signal."""
    out = [e for e in facts.unattributed if e.event in (Event.OOM, Event.CUDA_ERROR)]
    waited = anyone_waited(facts)
    out += [e for e in facts.all_evidence(Event.EXIT) if e.fields.get("local_rank") is None
            and exit_code(e) != 0
            # A launcher's exit line after ranks timed out is their exit (code 1, or -6
            # from the watchdog's abort), not a crash: only a crash signal still counts;
            # so is a Slurm task that the step's end terminated.
            and (not waited or SIGNAL_MEANING.get(exit_name(exit_code(e)))
                 in ("crashed", "killed"))
            and e.fields.get("ended") != "Terminated"]
    return sorted(out, key=time_order)


def exit_name(code: int) -> str:
    """SIGSEGV for -11 (a worker killed by a signal), else the code itself."""
    if code < 0 and -code in {s.value for s in signal.Signals}:
        return signal.Signals(-code).name
    return str(code)


def anyone_waited(facts: Facts) -> bool:
    """Some rank, named or not, timed out waiting for others."""
    return bool(facts.waiting) or any(
        e.event in (Event.TIMEOUT, Event.PROGRESS, Event.WATCHDOG_ABORT, Event.HEARTBEAT)
        for e in facts.unattributed)
