"""Each job's rank table: the latest sample per rank, and since-when.

Durations use the agent's monotonic clock (ages in the report) anchored at
the daemon's receive time, so clocks of different nodes never meet. Per-job
indexes (ranks by state, ranks in a collective) are updated on each change,
so detection reads a few sets instead of rescanning the table.
"""

from __future__ import annotations

import collections
import logging
import math
import time
from collections.abc import Callable, Collection
from typing import Any

from ncclwatch.daemon.agents import AgentRecord
from ncclwatch.daemon.jobfacts import PastTimeouts, take_facts
from ncclwatch.daemon.jobinfo import JobInfos
from ncclwatch.daemon.learn import CPU_RECENT_TAU, smooth_cpu, take_progress
from ncclwatch.daemon.nodebudget import Held, rank_cost
from ncclwatch.daemon.records import Job, RankRecord
from ncclwatch.daemon.settings import GONE_JOB_TTL
from ncclwatch.daemon.statecounts import StateCounts
from ncclwatch.daemon.stackstore import StackStore
from ncclwatch.daemon.translate import container_of, take_process
from ncclwatch.daemon.validate import Briefs, Shape, read_briefs
from ncclwatch.model import CHECKPOINT_STATES, CollectiveOp, RankState, WaitEvidence
from ncclwatch.v1 import collector_pb2 as pb

log = logging.getLogger(__name__)

#: A state's start moving later by more than this on the agent's clock: a new
#: episode of it (the agent re-anchors a wait it saw the rank progress out of).
NEW_EPISODE = 0.5
#: The agent's clock offset falling by more than this re-dates its ranks'
#: states (``JobTable._reanchor``): less is the jitter every report has.
REANCHOR_STEP = 0.25
#: Wire values -> enums, looked up per sample (from_proto goes through names).
_STATE_OF = {v: RankState.from_proto(v) for v in pb.RankState.values()}
_OP_OF = {v: CollectiveOp.from_proto(v) for v in pb.CollectiveOp.values()}
_EVIDENCE_OF = {v: WaitEvidence.from_proto(v) for v in pb.WaitEvidence.values()}


class JobTable:
    """All jobs and agents this daemon knows. Mutated only on the event loop."""

    def __init__(self, staleness: float = 10.0) -> None:
        self.jobs: dict[str, Job] = {}
        self.agents: dict[str, AgentRecord] = {}
        self.stacks = StackStore()
        #: JobInfo values by wire bytes, read once (jobinfo.py).
        self.infos = JobInfos()
        self.staleness = staleness
        #: The timeout each job id showed, for its next incarnation (jobfacts).
        self.past_timeouts = PastTimeouts()
        #: Seconds a job whose ranks are all gone (or silent) is kept (expire).
        self.job_ttl = GONE_JOB_TTL
        self.dirty: set[str] = set()
        #: Each job's ranks counted by what the tick asks first (statecounts.py):
        #: kept here, at every change of a record, so the tick need not walk them.
        self.counts: dict[str, StateCounts] = {}
        #: Jobs where a rank at checkpoint work showed a newer stack while others
        #: wait: the stack that may complete a stall's evidence (core.Daemon.wake).
        self.fresh_work: set[str] = set()
        self.samples_total = 0
        self.reports_total = 0
        self.duplicates_total = 0
        #: Times an agent's better clock offset re-dated its ranks (_reanchor).
        self.reanchored_total = 0
        self._fresh_agents: tuple[float, set[str], frozenset[str]] | None = None
        #: Bumped when an agent is added or forgotten (detect.fresh_waiting's key).
        self.agents_version = 0
        #: Rank samples applied by the form they came in (protocol 2), and the
        #: resyncs asked for (briefs or changes naming slots not held).
        self.forms_total = {"full": 0, "change": 0, "brief": 0}
        self.resyncs_total = 0
        #: Parts of reports refused because the node does not own them, by what.
        self.identity_refusals_total: collections.Counter[str] = collections.Counter()
        #: Bytes held per node identity (nodebudget.py), and its agent ids.
        self.held = Held()
        self.node_agents: dict[str, set[str]] = {}

    def apply(self, report: pb.NodeReport, recv: float, recv_wall: float | None = None,
              left_out: Collection[str] = (), left_out_slots: Collection[int] = (),
              identity: str | None = None, shape: Shape | None = None,
              held: Collection[str] = ()) -> list[str]:
        """Apply a validated report; return stack ids the daemon lacks.

        ``left_out``: jobs whose samples were taken out of the report (rejected):
        a full round without them says nothing about their ranks, and
        ``left_out_slots`` (their samples' slots) are skipped by later briefs.
        ``identity``: the node identity a new agent counts against
        (nodebudget.identity_of); the report's node if not given.
        ``shape``: the report's parts as admission read them (validate.Shape;
        read from the report if not given); ``held``: ids of stacks admission
        took out of it because they are kept as sent (touched here, as a
        resent one is)."""
        self._fresh_agents = None
        agent = self.agents.get(report.agent_id)
        if agent is None:
            agent = self.agents[report.agent_id] = AgentRecord(report.agent_id, report.node)
            self.agents_version += 1
            agent.identity = identity or report.node
            self.node_agents.setdefault(agent.identity, set()).add(agent.agent_id)
        elif report.seq <= agent.last_seq:
            # Resent after a lost acknowledgement: already applied (or older).
            self.duplicates_total += 1
            return []
        elif report.seq > agent.last_seq + 1:
            agent.gaps_total += report.seq - agent.last_seq - 1
        agent.last_seq = report.seq
        agent.last_recv = recv
        agent.last_recv_wall = recv_wall if recv_wall is not None else time.time()
        agent.interval = report.interval_seconds or agent.interval
        health = agent.health = report.health
        agent_left_out = sum(health.parts_left_out[:])
        if agent_left_out > agent.left_out_total:
            agent.left_out_at = recv   # a part left out since: a fault of the node's
        agent.left_out_total = agent_left_out
        if shape is None:
            shape = Shape(read_briefs(report.briefs), report.samples, report.changes,
                          report.stacks, report.exited)
        briefs, samples, changes = shape.briefs, shape.samples, shape.changes
        if report.slots_reset:
            agent.slots = {}
        # A full round of full samples names every live rank of the stream:
        # its slots replace the table (slots of ranks gone are dropped).
        full_round = report.full_round
        slots = agent.slots if briefs.slot or changes or not full_round else {}
        for slot in left_out_slots:
            slots[slot] = None
        agent.reports_total += 1
        self.reports_total += 1

        for sid in held:
            self.stacks.touch(sid)
        if shape.stacks:
            for st in shape.stacks:
                self.stacks.add(st)
        missing: list[str] = []
        reported: set[tuple[str, int]] = set()
        # The hot loop (bench/daemon_ingest.py): each protobuf field is read
        # once, and strings every rank shares (node, agent, job id) are kept
        # as one object each, not one per rank.
        node = report.node
        if node == agent.node:
            node = agent.node
        agent_id = agent.agent_id
        agent_clock = report.agent_monotonic_seconds
        offset = agent.clock_offset(recv, agent_clock, report.seq, report.timed_seq,
                                    report.timed_round_trip_seconds, report.queued_seconds)
        anchor = offset + agent_clock  # <= recv
        if agent_clock > 0:
            if offset < agent.anchored_offset - REANCHOR_STEP and agent.ranks:
                self._reanchor(agent, offset)
            agent.anchored_offset = offset
        if samples:
            self._apply_samples(agent, samples, slots, reported, recv, anchor, agent_clock,
                                missing, node, report.slots_reset)
        if changes:
            self._apply_changes(agent, changes, slots, reported, recv, anchor,
                                agent_clock, missing)
        if briefs.slot:
            self._apply_briefs(agent, briefs, slots, reported, recv, anchor)
        agent.slots = slots

        if shape.exited:
            self._exited(shape.exited, node, recv)
        if full_round:
            if reported != agent.ranks:
                kept = ({jr for jr in agent.ranks if jr[0] in left_out}
                        if left_out else set())
                for job_id, rank in agent.ranks - reported - kept:
                    self._gone(job_id, rank, None, recv, agent_id)
                agent.ranks = reported | kept
        else:
            agent.ranks |= reported
        return missing

    def _apply_samples(self, agent: AgentRecord, samples, slots: dict[int, Any],
                       reported: set[tuple[str, int]], recv: float, anchor: float,
                       agent_clock: float, missing: list[str], node: str,
                       stream_reset: bool = True) -> None:
        """Full RankSamples: identity, state, process readings, job facts.

        A job this daemon does not hold, first seen mid-stream in a snapshot
        that carries no job facts (the daemon forgot it under the live
        stream), asks the agent to resync: its facts come with the first
        report of a stream, never again unless asked."""
        jobs, all_counts = self.jobs, self.counts
        held, payer = self.held, agent.identity
        agent_id = agent.agent_id
        job: Job | None = None
        counts: StateCounts | None = None
        for s in samples:
            ident = s.identity
            job_id = ident.job_id
            if job is None or job_id != job.job_id:
                job = jobs.get(job_id)
                if job is None:
                    job = jobs[job_id] = Job(job_id, ident.world_size, recv)
                    self.counts[job_id] = StateCounts(job)
                    self.past_timeouts.carry(job, recv)   # a restart: its last run's
                    if s.slot and not stream_reset and not s.HasField("job"):
                        agent.resync = True
                self.dirty.add(job.job_id)
                agent.jobs.add(job.job_id)
                counts = all_counts[job.job_id]
            rank, pid = ident.rank, ident.pid
            if rank < 0:
                rank = job.key_of(rank, node, pid)
            if not job.world_size and ident.world_size:
                job.world_size = ident.world_size  # PMIx ranks do not say it
            rec = job.ranks.get(rank)
            if rec is None:
                rec = job.ranks[rank] = RankRecord(rank)
                job.ranks_version += 1
            elif rec.gone_at is not None:
                rec.gone_at = None
                job.ranks_version += 1
            changed = self._take_state(job, rec, s, anchor, agent_clock, missing, rec.pid != pid)
            take_process(rec, s, recv)
            rec.local_rank = ident.local_rank
            rec.rank_source = ident.rank_source
            rec.rank_conflict = ident.rank_conflict
            rec.container = container_of(ident)
            rec.node = node
            if rec.agent_id != agent_id:
                job.ranks_version += 1   # its freshness is another agent's now
            rec.agent_id = agent_id
            rec.pid = pid
            age = ident.process_age_seconds
            rec.start = anchor - age if age > 0 else None
            ticks = ident.start_ticks
            if ticks != rec.proc_id[0]:      # a new process (its uid with it)
                rec.proc_id = (ticks, ident.uid if ident.HasField("uid") else -1)
            if s.HasField("still_seconds"):
                rec.progress_known = True
                take_progress(job, rec, s.still_seconds, changed, anchor, agent.interval)
            elif rec.progress_known:
                rec.progress_known = False
                rec.still_since = rec.still_at = None
                job.still.discard(rec.rank)
            if s.HasField("flight_recorder") or s.HasField("job"):
                if not take_facts(job, s, rank, recv, node, self.infos):
                    self.identity_refusals_total["rankless_job_facts"] += 1
                elif s.HasField("job"):
                    held.facts(job, payer, s.job.ByteSize())
            fr = job.flight_recorder.get(rank) if job.flight_recorder else None
            held.rank(rec, payer, rank_cost(s, fr[1] if fr else None))
            counts.update(rec)
            job.last_update = recv
            key = (job.job_id, rank)
            reported.add(key)
            if s.slot:
                slots[s.slot] = (job, rec, key)
        self.samples_total += len(samples)
        self.forms_total["full"] += len(samples)

    def _exited(self, exited, node: str, recv: float) -> None:
        for ident in exited:
            rank = ident.rank
            job = self.jobs.get(ident.job_id)
            if rank < 0:
                rank = job.key_of(rank, node, ident.pid, create=False) if job else None
                if rank is None:
                    continue
            rec = job.ranks.get(rank) if job else None
            if rec is not None and rec.node and rec.node != node:
                # Only the node that reports a rank may say it exited.
                self.identity_refusals_total["exited"] += 1
                continue
            self._gone(ident.job_id, rank, ident.pid, recv)

    def _reanchor(self, agent: AgentRecord, offset: float) -> None:
        """The agent's clock offset came out smaller than the one its ranks'
        states were anchored with: date them by the better one.

        A report that waited in the agent's queue (a daemon restarting, a
        stream reconnecting after backoff) arrives with its queueing inside
        ``recv - agent clock``; when it is the first the daemon sees, every
        state it carries starts that much late, and the briefs after it carry
        no state to correct it. A wait dated late is a watchdog budget that
        errs large. ``since_agent`` is on the agent's clock, so the better
        offset dates it again; earlier only, as ``_take_state`` keeps it.
        """
        jobs = self.jobs
        agent_id = agent.agent_id
        for job_id, rank in agent.ranks:
            job = jobs.get(job_id)
            rec = job.ranks.get(rank) if job else None
            if rec is None or rec.agent_id != agent_id or rec.gone_at is not None \
                    or rec.since_agent <= 0:
                continue
            since = rec.since_agent + offset
            if since < rec.since:
                rec.since = since
                self.dirty.add(job_id)
        self.reanchored_total += 1

    def _take_state(self, job: Job, rec: RankRecord, m: Any, anchor: float, agent_clock: float,
                    missing: list[str], moved: bool = False) -> bool:
        """State, op, since and stack of a RankSample or a RankChange (the same
        fields); True when the rank entered a new state (or ``moved``: a new pid).

        ``anchor``: the daemon time the report's ages count back from, the
        moment the agent built it as best known (AgentRecord.clock_offset),
        never later than its receipt."""
        state = _STATE_OF.get(m.state) or RankState.from_proto(m.state)
        op = _OP_OF.get(m.op) or CollectiveOp.from_proto(m.op)
        since = anchor - m.state_seconds
        since_agent = agent_clock - m.state_seconds
        changed = moved or state is not rec.state or op is not rec.op
        if changed or since_agent > rec.since_agent + NEW_EPISODE:
            changed = True
            job.set_state(rec, state, op)
            rec.since = since
            rec.seen_in_state = anchor
        elif since < rec.since:
            # Same state: keep the earliest anchor, immune to network jitter.
            rec.since = since
        rec.since_agent = since_agent
        ev = m.evidence
        rec.evidence = _EVIDENCE_OF[ev] if ev in _EVIDENCE_OF else WaitEvidence.from_proto(ev)
        rec.native_frame = m.native_frame
        rec.native_no_wait = m.native_no_wait
        nid = m.native_stack_id
        if nid != rec.native_stack_id:
            if nid and not self.stacks.touch(nid):
                missing.append(nid)
            rec.native_stack_id = nid
        sid = m.stack_id
        if sid != rec.stack_id:
            if sid and not self.stacks.touch(sid):
                missing.append(sid)
            rec.stack_id = sid
        # The state is what the stack of stack_age_seconds ago showed.
        stack_at = anchor - m.stack_age_seconds if state is not RankState.UNKNOWN else None
        if stack_at is not None and state in CHECKPOINT_STATES and \
                (rec.stack_at is None or stack_at > rec.stack_at):
            # A culprit's shape (detect/checkpoint.py): at checkpoint work, not
            # itself in a collective (a rank gathering inside all_gather waits too),
            # while others wait.
            waiting = job.waiting
            if waiting and rec.rank not in waiting:
                self.fresh_work.add(job.job_id)
        rec.stack_at = stack_at
        return changed

    def _resolve(self, agent: AgentRecord, slots: dict[int, Any], slot: int) -> Any:
        """The (job, record, key) a slot names; None: skip it; False: not held."""
        ent = slots.get(slot, False)
        if ent:
            job, rec, key = ent
            if rec.gone_at is not None or rec.agent_id != agent.agent_id \
                    or self.jobs.get(key[0]) is not job:
                return False
        return ent

    def _apply_changes(self, agent: AgentRecord, changes, slots: dict[int, Any],
                       reported: set[tuple[str, int]], recv: float, anchor: float,
                       agent_clock: float, missing: list[str]) -> None:
        """Ranks whose state, op, stack or state start moved: the state part of a
        full sample (``apply``), without the process stats it would repeat."""
        unresolved = 0
        for c in changes:
            ent = self._resolve(agent, slots, c.slot)
            if not ent:
                unresolved += ent is False
                continue
            job, rec, key = ent
            changed = self._take_state(job, rec, c, anchor, agent_clock, missing)
            cpu = c.cpu_utilization
            rec.cpu_recent = smooth_cpu(rec.cpu_recent, cpu, recv - rec.seen)
            rec.seen = recv
            rec.cpu_util = cpu
            rec.cpu_seconds = c.cpu_seconds
            take_progress(job, rec, c.still_seconds, changed, anchor, agent.interval)
            self.counts[key[0]].update(rec)
            self.dirty.add(key[0])
            job.last_update = recv
            reported.add(key)
        agent.changes_total += len(changes)
        self._counted(agent, "change", len(changes), unresolved)

    def _apply_briefs(self, agent: AgentRecord, b: Briefs, slots: dict[int, Any],
                      reported: set[tuple[str, int]], recv: float, anchor: float) -> None:
        """Steady ranks: a proof of life, CPU and progress; nothing else moved.

        The hot path of protocol 2 (bench/daemon_ingest.py): a few attribute
        writes per rank, the job's rounds of progress counted once per job
        of the report. A slot the daemon does not
        hold (it restarted, or forgot the job) asks the agent to resync with
        full samples.
        """
        interval, dirty, jobs, all_counts = agent.interval, self.dirty, self.jobs, self.counts
        agent_id = agent.agent_id
        unresolved = 0
        last_dt, a = -1.0, 1.0  # the smoothing weight, shared by ranks seen together
        none, device_wait, wait = CollectiveOp.NONE, RankState.DEVICE_WAIT, CollectiveOp.WAIT
        job: Job | None = None   # the job of the ranks just seen, known to the table
        stepped = 0              # ranks of ``job`` that made progress, not still
        for slot, still, cpu, cpu_s in zip(b.slot, b.still_seconds, b.cpu_utilization,
                                           b.cpu_seconds):
            ent = slots.get(slot, False)
            if not ent:
                unresolved += ent is False  # None: a rank of a job this daemon left out
                continue
            j, rec, key = ent
            if j is not job:
                if jobs.get(key[0]) is not j:   # the job left the table since
                    unresolved += 1
                    continue
                if stepped:
                    job.waits.stepped(anchor, stepped)
                    stepped = 0
                job = j
            if rec.gone_at is not None or rec.agent_id != agent_id:
                unresolved += 1
                continue
            dt = recv - rec.seen
            if dt != last_dt:
                last_dt = dt
                a = 1.0 - math.exp(-dt / CPU_RECENT_TAU) if 0 < dt <= 60 * CPU_RECENT_TAU \
                    else 1.0
            rec.cpu_recent += a * (cpu - rec.cpu_recent)
            rec.seen = recv
            rec.cpu_util = cpu
            rec.cpu_seconds = cpu_s
            if still > 0 or rec.still_since is not None or rec.still_at is not None:
                if stepped:
                    job.waits.stepped(anchor, stepped)
                    stepped = 0
                moved, unheld = rec.still_since is None, rec.still_at is None
                take_progress(job, rec, still, False, anchor, interval)
                if (rec.still_since is None) is not moved or (rec.still_at is None) is not unheld:
                    all_counts[key[0]].update(rec)  # it sat down or got up (statecounts.py)
                if still > 0:
                    dirty.add(key[0])  # a rank sitting still may be worth fresh stacks
            else:
                # _progress for a rank that made progress and was not still: the
                # common case, inlined (bench/daemon_ingest.py); the job's rounds
                # of progress are counted once per job of the report.
                stepped += 1
                op = rec.op
                if (op is not none or rec.state is device_wait) and rec.stack_at is not None \
                        and anchor - rec.stack_at >= interval:
                    job.waits.progressed(op if op is not none else wait, anchor)
            job.last_update = recv
            reported.add(key)
        if stepped:
            job.waits.stepped(anchor, stepped)
        agent.briefs_total += len(b.slot)
        self._counted(agent, "brief", len(b.slot), unresolved)

    def _counted(self, agent: AgentRecord, form: str, n: int, unresolved: int) -> None:
        """Count ``n`` samples of a protocol-2 form; slots not held ask for a resync."""
        self.samples_total += n
        self.forms_total[form] += n
        if unresolved:
            agent.briefs_unresolved_total += unresolved
            agent.resync = True

    def _gone(self, job_id: str, rank: int, pid: int | None, now: float,
              agent_id: str | None = None) -> None:
        """``agent_id``: only if that agent still owns the rank (another node may
        have taken it over: ownership.py)."""
        job = self.jobs.get(job_id)
        rec = job.ranks.get(rank) if job else None
        if rec is None or rec.gone_at is not None or (pid is not None and rec.pid != pid) \
                or (agent_id is not None and rec.agent_id != agent_id):
            return
        rec.gone_at = now
        job.ranks_version += 1
        rec.gone_waiting = rec.rank in job.waiting
        rec.still_at = None  # a wait cut short by exit is no normal wait
        job.set_state(rec, RankState.UNKNOWN, CollectiveOp.NONE)
        rec.since = now
        self.counts[job_id].update(rec)
        self.dirty.add(job_id)

    def resize(self, job_id: str, world: int, now: float) -> None:
        """The job runs at another world size now (ownership.resize): ranks
        beyond it are dropped (gone: their slots resync)."""
        job = self.jobs[job_id]
        job.world_size = world
        for key in [k for k in job.ranks if k >= world]:
            rec = job.ranks.pop(key)
            self.held.rank(rec, "", 0)
            job.remove_from_indexes(rec)
            self.counts[job_id].drop(key)
            rec.gone_at = now
            job.flight_recorder.pop(key, None)
        self.dirty.add(job_id)

    def state_counts(self, job: Job) -> StateCounts | None:
        """The counts kept of ``job`` (statecounts.py); None for a job the table
        did not build (a detector's caller may hand it one): walk it."""
        counts = self.counts.get(job.job_id)
        return counts if counts is not None and counts.job is job else None

    def world_size(self, job_id: str) -> int | None:
        job = self.jobs.get(job_id)
        return job.world_size if job else None

    def fresh_agents(self, now: float) -> set[str]:
        """Agents whose reports can be trusted now; for the detectors on the loop.

        One pass over the agents per tick instead of an agent lookup per rank
        (100k ranks are 12.5k agents); forgotten by the next report applied.
        """
        return self._freshness(now)[1]

    def stale_agents(self, now: float) -> frozenset[str]:
        """The agents ``fresh_agents`` leaves out (most ticks: none); with
        ``agents_version``, what a view of fresh ranks is kept by."""
        return self._freshness(now)[2]

    def _freshness(self, now: float) -> tuple[float, set[str], frozenset[str]]:
        cached = self._fresh_agents
        if cached is not None and cached[0] == now:
            return cached
        staleness = self.staleness
        agents = self.agents
        stale = frozenset([aid for aid, a in agents.items() if a.stale(now, staleness)])
        out = agents.keys() - stale
        self._fresh_agents = cached = (now, out, stale)
        return cached

    def fresh(self, rec: RankRecord, now: float) -> bool:
        """Whether a rank's latest sample can be trusted for a verdict now."""
        if rec.gone_at is not None:
            return False
        agent = self.agents.get(rec.agent_id)
        return agent is not None and not agent.stale(now, self.staleness)

    def expire(self, now: float,
               before: Callable[[str, Job], None] | None = None) -> list[str]:
        """Forget jobs whose ranks are all gone (or silent) for ``job_ttl``.

        ``before``: called with each such job while the table still holds it
        (its incidents end with what the table knows of it)."""
        dead = []
        for job_id, job in self.jobs.items():
            if now - job.last_update < self.job_ttl:
                continue
            if all(r.gone_at is not None or not self.fresh(r, now) for r in job.ranks.values()):
                dead.append(job_id)
        for job_id in dead:
            if before is not None:
                before(job_id, self.jobs[job_id])
            job = self.jobs.pop(job_id)
            self.counts.pop(job_id, None)
            self.held.release_job(job)
            for aid in {r.agent_id for r in job.ranks.values()}:
                if (agent := self.agents.get(aid)) is not None:
                    agent.jobs.discard(job_id)
        for agent_id in [a for a, rec in self.agents.items()
                         if not rec.connected and now - rec.last_recv > self.job_ttl]:
            gone = self.agents.pop(agent_id)
            self.agents_version += 1
            ids = self.node_agents.get(gone.identity)
            if ids is not None:
                ids.discard(agent_id)
                if not ids:
                    del self.node_agents[gone.identity]
        return dead
