"""A late rank found by what its peers do, and a hang with no culprit rank.

Rounds of reports as the agent sends them (tests/harness/reports.py's Feed:
one agent, 1 s rounds, ``still_seconds`` per rank), through the real daemon:
its learner, its detectors, its diagnosis.
"""

from __future__ import annotations

import pytest

from ncclwatch.agent.gpu import GpuDevice, RecordedGpuReader
from ncclwatch.agent.report import _activity_pb
from ncclwatch.daemon import api
from ncclwatch.daemon.detect import hang
from ncclwatch.model import CollectiveOp, RankState, StallKind
from ncclwatch.signatures import classify
from ncclwatch.stacks import Frame
from ncclwatch.v1 import collector_pb2 as pb
from tests.harness.paths import DATA
from tests.harness.reports import FEED_JOB as JOB, FEED_WORLD as WORLD, Feed, report, sample

S, Op = RankState, CollectiveOp


def _round(f: Feed, spec, cpu: dict[int, float] | None = None,
           blocked: dict[int, str] | None = None,
           fr: dict[int, pb.FlightRecorderSummary] | None = None,
           gpu: dict[int, GpuDevice] | None = None) -> None:
    """spec: [(rank, state, op, state_seconds, still_seconds)]; ``cpu``: share of a
    core; ``blocked``: what the agent read the rank's thread is blocked in;
    ``fr``: a Flight Recorder summary the rank's agent read this round;
    ``gpu``: the rank's device as its agent's NVML reader read it."""
    f.seq += 1
    samples = []
    for r, state, op, secs, still in spec:
        s = sample(JOB, r, WORLD, state, op, seconds=secs,
                   stack=f"s{r}{state.value}{op.value}" if state is not S.UNKNOWN else "")
        s.stack_age_seconds = 0.5
        s.still_seconds = still
        s.process.cpu_utilization = (cpu or {}).get(r, 0.0)
        s.blocked_in = (blocked or {}).get(r, "")
        if fr and r in fr:
            s.flight_recorder.CopyFrom(fr[r])
        if gpu and r in gpu:
            d = gpu[r]
            _activity_pb(s.gpu.add(device_index=d.index, used_bytes=d.used_bytes,
                                   device_total_bytes=d.total_bytes,
                                   device_used_bytes=d.used_bytes), d)
        samples.append(s)
    f.d.ingest(report(samples, seq=f.seq), now=f.t)
    f.d.tick(now=f.t)
    f.t += 1.0


def _steps(f: Feed, seconds: int) -> None:
    """A few seconds of steps: every rank progresses each round, its last stack
    (taken before the progress) an all_reduce it has since left."""
    for _ in range(seconds):
        f.round([(r, S.COLLECTIVE, Op.ALL_REDUCE, 0.2, 0.0) for r in range(WORLD)],
                stack_age=5.0)


def _findings(f: Feed):
    return [inc.finding for (j, _k), inc in f.d.incidents.active.items() if j == JOB]


def _late(f: Feed, state: RankState, busy: bool, limit: int = 40,
          blocked: str = "") -> int | None:
    """Ranks 0, 1 sit still in all_reduce; rank 2 is in ``state``, busy or not
    (``blocked``: what its agent read its thread is blocked in)."""
    for k in range(1, limit):
        _round(f, [(0, S.COLLECTIVE, Op.ALL_REDUCE, k, k), (1, S.COLLECTIVE, Op.ALL_REDUCE, k, k),
                   (2, state, Op.NONE, k, 0.0 if busy else k)], cpu={2: 1.0 if busy else 0.0},
               blocked={0: "futex/futex_wait_queue", 1: "futex/futex_wait_queue", 2: blocked})
        if _findings(f):
            return k
    return None


@pytest.mark.parametrize("state, busy, doing", [
    (S.COMPUTE, True, "CPU busy (100% of a core), making progress"),
    (S.IDLE, False, "no CPU (asleep or blocked in a call), no progress"),
    (S.DATALOADER, True, "CPU busy"),
])
def test_a_late_rank_is_named_at_the_learned_threshold_after_a_few_steps(
        state, busy, doing) -> None:
    f = Feed()
    _steps(f, 8)  # a few steps, far short of the old 20 s warm-up
    k = _late(f, state, busy)
    assert k is not None and k <= 8, k
    (fd,) = _findings(f)
    assert fd.kind is StallKind.COLLECTIVE_HANG and [c.rank for c in fd.culprits] == [2]
    assert fd.threshold_basis == "learned" and fd.threshold_seconds <= 8
    assert "never joined" in fd.summary and f"rank 2: {doing}" in fd.summary
    assert "(learned)" in fd.summary


def test_before_the_first_step_the_ceiling_holds_and_the_finding_says_so() -> None:
    f = Feed()
    k = _late(f, S.IDLE, False)
    assert k is not None and k >= 30, k
    (fd,) = _findings(f)
    assert fd.threshold_basis == "ceiling" and fd.threshold_seconds == 30.0
    assert "before the job's first step: the fixed 30s ceiling" in fd.summary


def test_a_recurring_rank0_evaluation_stays_silent() -> None:
    """Rank 0 evaluates 20 s every few steps while the others wait in a barrier:
    the first one under the ceiling (a barrier never seen), later ones learned."""
    f = Feed()
    for _ in range(3):
        _steps(f, 8)
        for k in range(1, 21):
            _round(f, [(0, S.COMPUTE, Op.NONE, k, 0.0), (1, S.COLLECTIVE, Op.BARRIER, k, k),
                       (2, S.COLLECTIVE, Op.BARRIER, k, k)], cpu={0: 1.0})
            assert not _findings(f), k
    job = f.d.table.jobs[JOB]
    assert job.waits.basis(Op.BARRIER, f.d.detect_cfg.waits, f.t) == "learned"


def test_every_rank_stuck_in_one_collective_is_a_hang_with_no_culprit() -> None:
    f = Feed()
    _steps(f, 25)  # each rank warm (stillness.WARMUP): judged by its own normal
    k = None
    for k in range(1, 40):
        _round(f, [(r, S.COLLECTIVE, Op.ALL_REDUCE, k, k) for r in range(WORLD)])
        if _findings(f):
            break
    (fd,) = _findings(f)
    assert k <= 8, k
    assert fd.kind is StallKind.COLLECTIVE_HANG and fd.culprits == ()
    assert fd.waiting == (0, 1, 2)
    assert "every rank waits in all_reduce" in fd.summary
    assert "no culprit rank (a peer outside the job, the network, or a device)" in fd.summary
    inc = f.d.incidents.active[(JOB, StallKind.COLLECTIVE_HANG)]
    assert inc.diagnosis.root_cause.id == "all_ranks_in_collective"


def test_every_rank_stuck_says_its_gpus_utilisation_and_power() -> None:
    """Where NVML answers (a recorded reader stands in for it: an H100 node in a
    step, then with every rank stuck in one all_reduce), the no-culprit hang
    says the GPUs spin at full utilisation and low power: NCCL polling, not work."""
    nvml = RecordedGpuReader.from_file(DATA / "nvml" / "h100_allreduce_hang.json")
    stepping = {r: d for r, d in enumerate(nvml.read().devices[:WORLD])}
    stuck = {r: d for r, d in enumerate(nvml.read().devices[:WORLD])}
    f = Feed()
    for _ in range(25):
        _round(f, [(r, S.COLLECTIVE, Op.ALL_REDUCE, 0.2, 0.0) for r in range(WORLD)],
               gpu=stepping)
    assert not _findings(f)
    for k in range(1, 40):
        _round(f, [(r, S.COLLECTIVE, Op.ALL_REDUCE, k, k) for r in range(WORLD)], gpu=stuck)
        if _findings(f):
            break
    (fd,) = _findings(f)
    assert fd.kind is StallKind.COLLECTIVE_HANG and fd.culprits == ()
    assert ("GPUs: 3 at 100% utilisation, 22-25% of their power limit: spinning in NCCL "
            "kernels, not computing") in fd.summary, fd.summary
    # Without readings (no NVML), the finding says nothing of GPUs.
    f = Feed()
    _steps(f, 25)
    for k in range(1, 40):
        _round(f, [(r, S.COLLECTIVE, Op.ALL_REDUCE, k, k) for r in range(WORLD)])
        if _findings(f):
            break
    (fd,) = _findings(f)
    assert fd.culprits == () and "GPUs" not in fd.summary


def test_every_rank_briefly_in_one_barrier_is_normal() -> None:
    f = Feed()
    for _ in range(4):
        _steps(f, 8)
        for k in range(1, 4):  # a short barrier each "epoch", every rank in it
            _round(f, [(r, S.COLLECTIVE, Op.BARRIER, k, k) for r in range(WORLD)])
    assert not _findings(f)


def test_gpu_shaped_long_steps_with_every_rank_still_stay_silent() -> None:
    """Every rank still through each 8 s step (spinning in a device sync): the
    step's own length, learned, is no hang, whoever is where."""
    f = Feed()
    _steps(f, 8)
    for _ in range(8):
        for k in range(1, 9):
            _round(f, [(r, S.COLLECTIVE, Op.ALL_REDUCE, k, k) for r in range(WORLD)])
            assert not _findings(f), k
        _round(f, [(r, S.COMPUTE, Op.NONE, 0.2, 0.0) for r in range(WORLD)])


# -- what the late rank's thread is blocked in ----------------------------------------


@pytest.mark.parametrize("state, busy, blocked, words", [
    (S.IDLE, False, "clock_nanosleep/hrtimer_nanosleep",
     "no CPU, no progress for {k}s, blocked in clock_nanosleep (hrtimer_nanosleep): asleep"),
    (S.DATALOADER, False, "read/pipe_read",
     "no progress for {k}s, blocked in read (pipe_read): reading a pipe, socket or file"),
    (S.COMPUTE, False, "futex",
     "blocked in futex: waiting on a lock or condition"),
    # still but burning a core: it spins (a device sync, a busy loop)
    (S.COMPUTE, None, "running", "CPU busy (100% of a core), no progress for {k}s, running"),
])
def test_the_late_rank_clause_says_what_its_thread_is_blocked_in(
        state, busy, blocked, words) -> None:
    f = Feed()
    _steps(f, 8)
    for k in range(1, 40):
        _round(f, [(0, S.COLLECTIVE, Op.ALL_REDUCE, k, k), (1, S.COLLECTIVE, Op.ALL_REDUCE, k, k),
                   (2, state, Op.NONE, k, k)], cpu={2: 1.0 if busy is None else 0.0},
               blocked={0: "futex/futex_wait_queue", 1: "futex/futex_wait_queue", 2: blocked})
        if _findings(f):
            break
    (fd,) = _findings(f)
    assert [c.rank for c in fd.culprits] == [2]
    assert words.format(k=k) in fd.summary, fd.summary
    # the waiters' own readings are not the culprit's clause
    assert fd.summary.count("blocked in") == (1 if blocked != "running" else 0)
    # the API's culprit view says the same, with the call and kernel function apart
    inc = f.d.incidents.active[(JOB, StallKind.COLLECTIVE_HANG)]
    (c,) = api.incident_view(f.d, inc, now=f.t)["culprits"]
    call, _, wchan = blocked.partition("/")
    assert (c["syscall"], c["wchan"]) == (call, wchan or None)
    assert c["blocked_in"] and c["blocked_in"] in fd.summary


def test_a_moving_late_rank_has_no_blocked_clause() -> None:
    """A rank making progress: its last reading is a moment's (read on a slow
    round), not what it waits in, and is not said."""
    f = Feed()
    _steps(f, 8)
    assert _late(f, S.COMPUTE, True, blocked="read/pipe_read") is not None
    (fd,) = _findings(f)
    assert "making progress" in fd.summary and "blocked in" not in fd.summary
    inc = f.d.incidents.active[(JOB, StallKind.COLLECTIVE_HANG)]
    (c,) = api.incident_view(f.d, inc, now=f.t)["culprits"]
    assert c["blocked_in"] is None and c["syscall"] is None


# -- a late rank whose frames nobody has a signature for --------------------------------


def test_frames_that_match_no_signature_classify_as_compute() -> None:
    """The classifier's answer for frames no signature names: compute (a
    still rank whose thread burns no CPU is then shown idle by its agent);
    unknown is only a rank without a stack."""
    c = classify((Frame("mystery_kernel", "/opt/vendor/lib/thing.py", 3),
                  Frame("main", "/job/train.py", 10)))
    assert c.state is S.COMPUTE and c.op is Op.NONE


@pytest.mark.parametrize("busy", [True, False])
def test_a_late_rank_in_frames_nobody_knows_is_named_like_a_computing_one(busy) -> None:
    f = Feed()
    _steps(f, 8)
    state = classify((Frame("mystery_kernel", "/opt/vendor/lib/thing.py", 3),)).state
    k = _late(f, state, busy)
    assert k is not None and k <= 8, k
    (fd,) = _findings(f)
    assert fd.kind is StallKind.COLLECTIVE_HANG and [c.rank for c in fd.culprits] == [2]
    assert fd.threshold_basis == "learned"


def test_a_late_rank_without_a_stack_waits_for_one_then_is_named() -> None:
    """RankState.UNKNOWN is a rank with no stack (none taken yet, or its dumps
    fail), not one in unknown frames. Its peers' waits do not show where it
    is: it may wait in the same collective (then no rank is late). So it is
    no culprit by guess: the detector's finding waits for a stack of it taken
    after the wait began (core._confirmed) and the daemon asks the agent for
    one; once it shows the rank anywhere but the collective, it is named."""
    f = Feed()
    _steps(f, 8)
    k = _late(f, S.UNKNOWN, False, limit=20, blocked="clock_nanosleep/hrtimer_nanosleep")
    assert k is None and not _findings(f)
    job = f.d.table.jobs[JOB]
    (fd,) = hang.detect(job, f.d.table, f.t, f.d.detect_cfg)   # found, not confirmed
    assert [c.rank for c in fd.culprits] == [2] and not f.d._confirmed(job, fd)
    for k in range(20, 24):     # the dump asked for arrives: the rank sleeps in Python
        _round(f, [(0, S.COLLECTIVE, Op.ALL_REDUCE, k, k), (1, S.COLLECTIVE, Op.ALL_REDUCE, k, k),
                   (2, S.IDLE, Op.NONE, 0.5, k)],
               blocked={2: "clock_nanosleep/hrtimer_nanosleep"})
        if _findings(f):
            break
    (fd,) = _findings(f)
    assert [c.rank for c in fd.culprits] == [2] and "blocked in clock_nanosleep" in fd.summary


# -- the hang with no culprit, named by the Flight Recorder ----------------------------


def _pending(rank: int, seq: int, seconds: float) -> pb.FlightRecorderSummary:
    """A rank's Flight Recorder: all_reduce #seq of default_pg enqueued and
    started on every rank, completed on none."""
    return pb.FlightRecorderSummary(version="2.10", dump_age_seconds=0.5, groups=[
        pb.ProcessGroupProgress(pg_id="0", pg_name="0", pg_desc="default_pg",
                                ranks=list(range(WORLD)), last_enqueued=seq,
                                last_started=seq, last_completed=seq - 1,
                                pending_op="all_reduce", pending_seq=seq,
                                pending_timeout_ms=600_000, pending_seconds=seconds,
                                last_op="all_reduce")])


def test_every_rank_at_a_device_sync_is_named_by_the_flight_recorder() -> None:
    """Every rank sits still at a device sync (op: wait; no frame names the
    collective): the Flight Recorder's pending all_reduce #7 of default_pg,
    the same on every rank, names it; none is missing, so no culprit."""
    f = Feed()
    _steps(f, 25)
    spec = lambda k: [(r, S.DEVICE_WAIT, Op.WAIT, k, k) for r in range(WORLD)]  # noqa: E731
    for k in range(1, 4):
        _round(f, spec(k))
    assert not _findings(f)
    fr = {r: _pending(r, 7, 4.0) for r in range(WORLD)}
    for k in range(4, 40):
        _round(f, spec(k), fr=fr if k == 4 else None)
        if _findings(f):
            break
    (fd,) = _findings(f)
    assert fd.kind is StallKind.COLLECTIVE_HANG and fd.culprits == ()
    assert fd.waiting == (0, 1, 2) and fd.waiting_ops == (Op.ALL_REDUCE,)
    assert "every rank waits in all_reduce #7 of group default_pg" in fd.summary
    assert {ev.value for _r, ev in fd.evidence} == {"flight_recorder"}
    inc = f.d.incidents.active[(JOB, StallKind.COLLECTIVE_HANG)]
    assert inc.diagnosis.root_cause.id == "all_ranks_in_collective"


def test_every_rank_at_a_device_sync_without_a_flight_recorder_names_no_collective() -> None:
    """The same stillness with no dump: a device wait names no collective, so
    no rank-less hang is claimed from it."""
    f = Feed()
    _steps(f, 25)
    for k in range(1, 40):
        _round(f, [(r, S.DEVICE_WAIT, Op.WAIT, k, k) for r in range(WORLD)])
        fds = _findings(f)
        assert not any(fd.kind is StallKind.COLLECTIVE_HANG and "every rank waits" in fd.summary
                       for fd in fds), fds


def test_a_late_rank_whose_stack_never_comes_is_named_provisionally_after_a_while() -> None:
    """A rank py-spy cannot read (every dump fails) shows no stack after the wait
    began: the finding waits for one, but not for ever (core.CONFIRM_PATIENCE):
    then it is raised provisional, saying whose stack is missing, and never
    before the patience is spent."""
    from ncclwatch.daemon import core

    f = Feed()
    _steps(f, 8)
    k = _late(f, S.UNKNOWN, False, limit=80)
    assert k is not None and k >= core.CONFIRM_PATIENCE, k
    (fd,) = _findings(f)
    assert [c.rank for c in fd.culprits] == [2] and fd.provisional
    assert "no stack of rank(s) 2 since the wait began" in fd.summary


def test_a_rank_late_for_a_state_dict_gather_is_named_at_the_checkpoint_threshold() -> None:
    """No step seen (the job gathers its full state dict right after start-up):
    the waiters sit inside the state-dict gather, which every rank enters at the
    same point, so the late rank is named after the checkpoint stall threshold
    (5 s), not the 30 s hang ceiling, and the finding says on what basis."""
    f = Feed()
    found = None
    for k in range(1, 40):
        _round(f, [(0, S.GATHERING_STATE_DICT, Op.ALL_GATHER, k, k),
                   (1, S.GATHERING_STATE_DICT, Op.ALL_GATHER, k, k),
                   (2, S.IDLE, Op.NONE, k, k)],
               blocked={2: "clock_nanosleep/hrtimer_nanosleep"})
        if _findings(f):
            found = k
            break
    assert found is not None and found < 15, found
    (fd,) = _findings(f)
    assert fd.kind is StallKind.COLLECTIVE_HANG and [c.rank for c in fd.culprits] == [2]
    assert fd.threshold_basis == hang.GATHER and "inside a full state-dict gather" in fd.summary


def test_ranks_entering_a_state_dict_gather_a_second_apart_are_no_hang() -> None:
    f = Feed()
    for k in range(1, 4):       # rank 2 arrives a few seconds later, then all leave
        _round(f, [(0, S.GATHERING_STATE_DICT, Op.ALL_GATHER, k, k),
                   (1, S.GATHERING_STATE_DICT, Op.ALL_GATHER, k, k),
                   (2, S.COMPUTE, Op.NONE, k, 0.0)], cpu={2: 1.0})
    for _ in range(10):
        _round(f, [(r, S.COMPUTE, Op.NONE, 0.5, 0.0) for r in range(WORLD)],
               cpu={r: 1.0 for r in range(WORLD)})
    assert not _findings(f)
