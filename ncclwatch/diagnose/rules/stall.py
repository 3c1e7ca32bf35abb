"""Rule: the others timed out waiting for a rank: a checkpoint that outlasted the
watchdog, or a rank that never joined (named, or the ranks it must be among)."""

from __future__ import annotations

from ncclwatch.diagnose.facts import Facts, RankFacts
from ncclwatch.diagnose.finding import LogFinding, who
from ncclwatch.diagnose.signtypes import Event
from ncclwatch.diagnose.waiting import (
    first_where,
    op_of,
    timeout_seconds,
    waited_for,
    waited_op,
)
from ncclwatch.model import RankState


def rule_stall(facts: Facts) -> LogFinding | None:
    finding = _rule_stall(facts)
    if finding is not None and finding.cls == "collective_hang":
        finding.notes += _barrier_counts(facts)
    return finding


def _barrier_counts(facts: Facts) -> list[str]:
    """The store-based barrier counts who arrived: say how many never did."""
    out = []
    for e in facts.all_evidence(Event.TIMEOUT):
        f = e.fields
        if e.sign == "store_barrier_timeout" and f.get("world") and f.get("joined"):
            world, joined = int(f["world"]), int(f["joined"])
            out.append(f"the store-based barrier ({f.get('key', '?')}) counted {joined} of "
                       f"{world} ranks: {world - joined} never arrived")
    return sorted(set(out))


def _rule_stall(facts: Facts) -> LogFinding | None:
    waiting = facts.waiting
    if not waiting:
        return _stall_unranked(facts)
    missing, ev, how, candidates = waited_for(facts)
    missing = [r for r in missing if r not in waiting] or missing
    ev = list(ev)
    for r in waiting[:3]:
        ev += first_where(facts.ranks[r]) if r in facts.ranks else []
    op = waited_op(facts, waiting)
    timeout = timeout_seconds(facts)
    tmo = f"{timeout:g} s" if timeout else "process-group"
    heartbeat_only = all(not (rf.timeouts or rf.progress or rf.signalled or rf.dump_signals
                              or rf.tracebacks) for rf in facts.ranks.values() if rf.heartbeat) \
        and any(rf.heartbeat for rf in facts.ranks.values())
    if not missing:
        return _stall_unnamed(facts, waiting, candidates, op, tmo, ev, heartbeat_only)
    ckpt: list[tuple[int, str, str]] = []
    for r in missing:
        rf = facts.ranks.get(r) or RankFacts(r)
        state, _op = rf.activity()
        line = rf.checkpointing()
        if state in (RankState.SAVING, RankState.GATHERING_STATE_DICT):
            tb = rf.tracebacks[-1]
            ckpt.append((r, tb.where, f"rank {r}'s last traceback is in {state.value}"))
        elif line is not None:
            ckpt.append((r, line.where, f"rank {r} was checkpointing: {line.text[:160]}"))
        elif r == 0 and (line := facts.unattributed_checkpointing()) is not None:
            ckpt.append((r, line.where, "the main process (rank 0: trainers log from it "
                         f"alone) was checkpointing: {line.text[:160]}"))
    how_text = _HOW.get(how, how.replace("_", " "))
    if ckpt:
        shown = {w for _r, w, _y in ckpt}
        ev = [(w, why) for _r, w, why in ckpt] + [(w, y) for w, y in ev if w not in shown]
        culprits = sorted({r for r, _w, _y in ckpt})
        return LogFinding(
            "checkpoint_gather_timeout", culprits, waiting, "save_overruns_watchdog",
            f"{who(culprits, 'was', 'were')} gathering/saving the checkpoint while "
            f"{len(waiting)} rank(s) waited in {op} until the {tmo} timeout "
            f"({how_text}).", ev)
    notes = []
    for r in missing:
        rf = facts.ranks.get(r)
        if rf is not None and rf.activity()[0] is not RankState.UNKNOWN:
            notes.append(f"rank {r}'s last traceback: {rf.activity()[0].value}")
    busy = " (it was busy, not dead: see the evidence)" if how == "busy" else ""
    return LogFinding("collective_hang", missing, waiting, "rank_never_joined",
                      f"{who(missing)} never joined {op}{busy}; {len(waiting)} rank(s) "
                      f"waited in it until the {tmo} timeout ({how_text}).", ev, notes)


#: How the initiating rank was found, as the summary says it.
_HOW = {
    "did_not_time_out": "every other rank timed out waiting; these did not",
    "only_rank_not_waiting": "the only rank of the job that did not report waiting",
    "busy": "the others timed out waiting while it was still busy",
    "watchdog_progress": "the watchdog's last enqueued work numbers",
    "missing_ranks_message": "c10d named the ranks that did not arrive",
    "flight_recorder": "the Flight Recorder",
}


def _stall_everyone_waited(facts: Facts, waiting: list[int], op: str, tmo: str,
                           ev: list[tuple[str, str]]) -> LogFinding:
    """Every rank of the job is known and every one timed out in the collective:
    none is missing, so the collective itself never finished (a kernel before it
    on some rank's GPU, or the transport). A world of one is the plain case: its
    only rank waited for its own device (recorded on a real H200: tests/data/gpu)."""
    what = (f"{who(waiting, 'waited', 'waited')} in {op} until the {tmo} timeout, and that "
            f"is every rank of the job ({len(facts.world)}): none was missing, so the "
            "collective itself never finished")
    if len(facts.world) == 1:
        what += " (a single rank waits only for its own GPU: work queued before the collective)"
    return LogFinding("collective_hang", list(waiting), [], "collective_never_finished",
                      what + ".", ev,
                      ["no rank was late: what hung is device work or the transport, not a rank"],
                      missing=["whether the collective started on each GPU"],
                      collect=["TORCH_NCCL_ENABLE_TIMING=1 with the Flight Recorder "
                            "(TORCH_FR_BUFFER_SIZE=2000, TORCH_NCCL_DUMP_ON_TIMEOUT=1): each "
                            "entry then says started or not", "nvidia-smi and dmesg (Xid) "
                            "of the nodes while it hangs"])


def _stall_unnamed(facts: Facts, waiting: list[int], candidates: list[int], op: str,
                   tmo: str, ev: list[tuple[str, str]], heartbeat_only: bool) -> LogFinding:
    """A hang whose initiator the logs do not name: only waiting ranks speak."""
    if heartbeat_only:
        what = (f"the watchdogs of {who(waiting)} were stuck inside NCCL/CUDA calls "
                "(heartbeat monitor): the job hung, and no collective timeout names the op")
    else:
        what = f"{who(waiting, 'waited', 'waited')} in {op} until the {tmo} timeout"
    if not candidates and facts.world_known and set(waiting) >= set(facts.world):
        return _stall_everyone_waited(facts, waiting, op, tmo, ev)
    if candidates:
        whom = (f"the initiator is among {who(candidates)}, which did not report waiting"
                + (" (and any rank above the highest seen)" if not facts.world_known else ""))
    else:
        whom = ("every rank in the logs waited, so the initiator is a rank whose log is "
                "not here")
    ckpt = facts.unattributed_checkpointing()
    notes = ([f"a checkpoint was in progress ({ckpt.where}: {ckpt.text[:100]}), but the "
              "rank that logged it waited too"] if ckpt is not None else [])
    ev = ev + [(e.where, e.text[:200]) for e in facts.all_evidence(Event.HEARTBEAT)[:2]
               if heartbeat_only]
    return LogFinding("collective_hang", [], waiting, "rank_never_joined", f"{what}; {whom}.",
                      ev, notes, candidates=candidates,
                      missing=["the log of any rank that did not time out"
                            + (f" ({who(candidates)})" if candidates else "")]
                      + (["the watchdog's timeout lines (which collective, which work number)"]
                      if heartbeat_only else []),
                      collect=["every rank's log (torchrun --log-dir DIR --tee 3, or srun --label)",
                            "Flight Recorder dumps: TORCH_NCCL_TRACE_BUFFER_SIZE=2000 and "
                            "TORCH_NCCL_DUMP_ON_TIMEOUT=1 (files under "
                            "TORCH_NCCL_DEBUG_INFO_TEMP_FILE), read with ncclwatch diagnose"])


def _stall_unranked(facts: Facts) -> LogFinding | None:
    """Timeouts whose lines name no rank (a pasted line without its prefix, gloo's
    "Timed out waiting 1800000ms for send operation"): a rank waited for another that
    never joined; neither is named. Earlier rules had their chance at a crash or a
    transport error, so a wait is all these logs say."""
    lines = [e for e in facts.unattributed if e.event is Event.TIMEOUT]
    if not lines:
        return None
    e = lines[0]
    op = op_of(e) or (f"a gloo {e.fields['what']}" if e.fields.get("what") else "a collective")
    tmo = (f"{int(e.fields['timeout_ms']) / 1000:g} s" if e.fields.get("timeout_ms")
           else "process-group")
    return LogFinding("collective_hang", [], [], "rank_never_joined",
                      f"a rank waited in {op} until the {tmo} timeout; no line names it or the "
                      "rank it waited for, which never joined (its log is not here).",
                      [(x.where, x.text[:240]) for x in lines[:4]],
                      missing=["the rank prefix of the waiting line", "the log of any rank "
                            "that did not time out"],
                      collect=["every rank's log with its rank prefix (torchrun --log-dir DIR "
                            "--tee 3, or srun --label)",
                            "Flight Recorder dumps: TORCH_NCCL_TRACE_BUFFER_SIZE=2000 and "
                            "TORCH_NCCL_DUMP_ON_TIMEOUT=1, read with ncclwatch diagnose",
                            "py-spy dump of every rank while it hangs (which rank is elsewhere)"])
