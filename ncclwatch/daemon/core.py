"""The daemon's state machine: ingest reports, tick the detectors.

Pure of I/O: gRPC (service.py) and HTTP (http.py) call into it on the event
loop; tests drive ``ingest`` and ``tick`` directly with a ``now`` they pick.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable
from dataclasses import replace

import grpc

from ncclwatch import sanitize
from ncclwatch.contract.limits import MAX_NODE
from ncclwatch.daemon.admission import admit, node_jobs, over_bounds, over_bytes
from ncclwatch.daemon.budget import Budget, BudgetConfig, budget
from ncclwatch.daemon.detect import DetectConfig, detect_job
from ncclwatch.daemon.detect.shape import halted, still_since
from ncclwatch.daemon.diagnosis import diagnose_stall
from ncclwatch.daemon.incidents import KEEP_ENDED, Incidents
from ncclwatch.daemon.nodebudget import identity_of
from ncclwatch.daemon.ownership import Ownership
from ncclwatch.daemon.settings import DaemonConfig
from ncclwatch.daemon.smooth import Smoother
from ncclwatch.daemon.table import JobTable
from ncclwatch.daemon.validate import ReportError
from ncclwatch.model import CHECKPOINT_STATES, QUIET_CPU, RankState
from ncclwatch.v1 import collector_pb2 as pb

log = logging.getLogger(__name__)

#: Ask a suspicious job's agents for fresh stacks at most this often.
ESCALATE_EVERY = 3.0
#: While an incident is open, refresh its stacks this often.
REFRESH_EVERY = 10.0
#: Ask a stalled job for Flight Recorder dumps at most this often (one dump per
#: rank is a file of up to a few MB written by torch; the wait does not change fast).
FLIGHT_RECORDER_EVERY = 30.0
#: Evidence bundles kept of lost jobs that left the table: how many, each at
#: most this many ranks and bytes (packed once, on the event loop).
KEEP_BUNDLES, KEEP_BUNDLE_RANKS, KEEP_BUNDLE_BYTES = 16, 1024, 8 << 20
#: Tell a job's agents its shape says a stall is under way (native dumps of
#: its still ranks allowed) at most this often.
NATIVE_ASK_EVERY = 2.0


#: Seconds past the confirmation point (``stall_threshold`` after the wait
#: began) after which a finding whose culprit shows no stack taken since is
#: raised anyway, provisional: a rank py-spy cannot read (a dump that fails
#: every time) must not hide its job's stall. A monitor that goes blind on one
#: job without a word is worse than a verdict that says what it lacks.
CONFIRM_PATIENCE = 30.0


def unconfirmed(job, f):
    """``f`` raised without its culprits' fresh stacks: provisional, and the
    summary says whose stack is missing and that their state is older."""
    stale = [c.rank for c in f.culprits
             if (rec := job.ranks.get(c.rank)) is None or rec.stack_at is None
             or rec.stack_at < f.started_at]
    note = (f"; no stack of rank(s) {', '.join(map(str, stale))} since the wait began "
            "(py-spy could not read them): their state is the last seen before it"
            if stale else "")
    return replace(f, provisional=True, summary=f.summary + note)


class Daemon:
    def __init__(self, config: DaemonConfig | None = None) -> None:
        self.config = config or DaemonConfig()
        self.table = JobTable(staleness=self.config.staleness)
        self.table.stacks.max_bytes = self.config.bounds.max_stored_stack_bytes
        self.table.job_ttl = self.config.gone_job_ttl
        #: Evidence bundles of lost jobs that left the table: job id -> (daemon
        #: time, file name, tar.gz), the newest KEEP_BUNDLES for KEEP_ENDED.
        self.kept_bundles: collections.OrderedDict[str, tuple[float, str, bytes]] = \
            collections.OrderedDict()
        #: Hits of each bound (bounds.BOUND_LABELS), counted where refused.
        self.bound_hits_total: collections.Counter[str] = collections.Counter()
        self.incidents = Incidents()
        self.detect_cfg = DetectConfig(stall_threshold=self.config.stall_threshold,
                                       hang_threshold=self.config.hang_threshold,
                                       hang_floor=self.config.hang_floor)
        self.budget_cfg = BudgetConfig(default_timeout=self.config.watchdog_timeout,
                                       job_timeouts=dict(self.config.job_timeouts))
        self.budgets: dict[str, Budget] = {}
        self.rejected_total: collections.Counter[str] = collections.Counter()
        #: Who owns a rank two nodes report (ownership.py).
        self.ownership = Ownership()
        #: Jobs left out of otherwise applied reports, by the status they had.
        self.rejected_jobs_total: collections.Counter[str] = collections.Counter()
        #: Reports applied that held text to escape (sanitize.neutralise).
        self.texts_escaped_total = 0
        self.detect_seconds_total = 0.0
        #: ingestpool.WorkerStats of each ingest worker (none without workers).
        self.ingest_workers: list = []
        self.ticks_total = 0
        self._escalated: dict[str, float] = {}
        self._fr_asked: dict[str, float] = {}
        self._native_asked: dict[str, float] = {}
        self.started_at = time.monotonic()
        #: What each node's reports cost it: node identity (``who``: its
        #: certificate's, else the report's node; for a report refused before
        #: that is known, its node cut at MAX_NODE, or "") -> reason
        #: (contract.checks.REASONS) -> parts dropped and reports refused; and
        #: the daemon's monotonic time of its last one. At most max_agents
        #: nodes, the least recent forgotten first (record_fault).
        self.node_faults: dict[str, collections.Counter[str]] = {}
        self.node_fault_at: dict[str, float] = {}
        #: Parts dropped (admission.py), by part and reason.
        self.dropped_parts_total: collections.Counter[tuple[str, str]] = collections.Counter()
        #: Forecasts as countdowns, not a new guess each tick (smooth.py).
        self.smooth = Smoother()
        #: Called (on the loop) when a report may have completed a stall's
        #: evidence: a rank at checkpoint work showed a newer stack while others
        #: wait and its job has no open incident. The server then ticks at once
        #: (after URGENT_GAP), not at the next regular tick: the decision no
        #: longer waits up to a tick for the loop. None: ticks keep their pace.
        self.wake: Callable[[], None] | None = None

    # -- ingest --------------------------------------------------------------

    def ingest(self, req: pb.ReportRequest, now: float | None = None, *,
               cert_names: frozenset[str] | None = None,
               prechecked: bool = False) -> pb.ReportResponse:
        """Validate and apply one report; raise ReportError to reject it whole.

        ``cert_names``: the names the sender's client certificate proves (mTLS),
        or None on a connection without TLS. ``prechecked``: an ingest worker
        ran every check that needs no table, escaping included, and found
        nothing (precheck.clean): they are not run again.
        """
        now = time.monotonic() if now is None else now
        report = req.report
        who = identity_of(report.node, cert_names)
        try:
            if cert_names is not None:
                self._check_identity(report, cert_names)
            self._check_agent(report.agent_id, who)
            adm = admit(req, self.table.world_size, self.config.bounds, self._holder,
                        self.table.stacks.held, self.table.infos.check, prechecked)
        except ReportError as e:
            self.rejected_total[e.code.name] += 1
            if e.bound:
                self.bound_hits_total[e.bound] += 1
            self.record_fault(who[:MAX_NODE], e.reason or "refused", now)
            raise
        parts, rejected = adm.dropped, adm.rejected
        for part in parts:
            if part.bound:
                self.bound_hits_total[part.bound] += 1
            self.dropped_parts_total[part.what, part.reason] += 1
            self.record_fault(who, part.reason, now)
        # Every string it holds is stored escaped (the one escaper): the page,
        # the API and /metrics never see a control or bidi character of a
        # report's own making. Checked above as sent (its stack ids are the
        # hashes of the frames as sent).
        shape = adm.shape
        if not prechecked and (shape.parts or not self._known_header(report)) \
                and sanitize.neutralise(report):
            self.texts_escaped_total += 1
            rejected = {sanitize.stored("RankIdentity.job_id", k): e for k, e in rejected.items()}
        dropped: list[int] = list(adm.slots)
        if shape.samples:    # a steady report (briefs alone) holds nothing to judge here
            self._resized(report, rejected, now)
            for bound in (*over_bounds(self.table, report, rejected, self.config.bounds, who),
                          *over_bytes(self.table, report, rejected, self.config.bounds, who)):
                self.bound_hits_total[bound] += 1
            aside = self.ownership.judge(self.table, report, now, rejected)
            if aside:
                dropped += self._set_aside(report, aside)
        if rejected:
            dropped += self._drop_jobs(report, rejected)
            for e in rejected.values():
                self.record_fault(who, e.reason or "job_over_bound", now)
        missing = self.table.apply(report, now, left_out=rejected.keys(),
                                   left_out_slots=dropped, identity=who, shape=shape,
                                   held=adm.held)
        if adm.wire:
            self.table.stacks.remember(adm.wire)
        if self.table.fresh_work:
            self._woken()
        agent = self.table.agents[report.agent_id]
        agent.connected = True
        if parts:   # a stack left out is not asked for again: the agent keeps it back
            gone = {p.stack_id for p in parts if p.stack_id}
            missing = [m for m in missing if m not in gone]
        resp = (pb.ReportResponse(ack_seq=report.seq, missing_stack_ids=missing) if missing
                else pb.ReportResponse(ack_seq=report.seq))
        for p in parts:
            resp.dropped_parts.add(what=p.what, stack_id=p.stack_id, job_id=p.job_id,
                                   rank=p.rank, bound=p.bound,
                                   reason=f"{p.reason}: {p.message}")
        if agent.resync:
            agent.resync = False
            resp.resync = True
            self.table.resyncs_total += 1
        for job_id, e in rejected.items():
            resp.rejected_jobs.add(job_id=job_id, code=e.code.name, reason=e.message)
        while agent.commands:
            resp.commands.append(agent.commands.popleft())
        return resp

    def _woken(self) -> None:
        """A stack that may complete a stall's evidence arrived (table.fresh_work):
        wake the ticks for a job with no open incident yet."""
        fresh, self.table.fresh_work = self.table.fresh_work, set()
        if self.wake is not None and any(not self.incidents.for_job(j) for j in fresh):
            self.wake()

    def _known_header(self, report: pb.NodeReport) -> bool:
        """Whether the report's own text (its node, agent id and version: all a
        report of briefs alone holds) is what the daemon stored for its agent
        last time, escaped already: then there is nothing to escape."""
        agent = self.table.agents.get(report.agent_id)   # keyed by the stored id
        return (agent is not None and report.node == agent.node
                and report.health.version == agent.health.version)

    def record_fault(self, who: str, reason: str, now: float) -> None:
        """Count one part dropped or report refused against node ``who``."""
        faults = self.node_faults.get(who)
        if faults is None:
            top = self.config.bounds.max_agents
            while len(self.node_faults) >= top:
                oldest = min(self.node_fault_at, key=self.node_fault_at.__getitem__)
                del self.node_faults[oldest], self.node_fault_at[oldest]
            faults = self.node_faults[who] = collections.Counter()
        faults[reason] += 1
        self.node_fault_at[who] = now

    def _holder(self, job_id: str, rank: int) -> int | None:
        """The pid the table holds for (job, rank), if any (admission's incumbent)."""
        job = self.table.jobs.get(job_id)
        rec = job.ranks.get(rank) if job is not None and rank >= 0 else None
        return rec.pid if rec is not None and rec.gone_at is None else None

    def _check_identity(self, report: pb.NodeReport, names: frozenset[str]) -> None:
        """Under mTLS a node is who its certificate says, and so is its agent."""
        shown = ", ".join(repr(n) for n in sorted(names)) or "no name"
        if report.node not in names:
            raise ReportError(grpc.StatusCode.PERMISSION_DENIED,
                              f"certificate for {shown} cannot report for node {report.node!r}",
                              reason="identity")
        agent = self.table.agents.get(report.agent_id)
        if agent is not None and agent.node != report.node:
            raise ReportError(grpc.StatusCode.PERMISSION_DENIED,
                              f"agent {report.agent_id[:8]} reports for node {agent.node!r}; "
                              f"certificate for {shown} cannot use it", reason="identity")

    def _check_agent(self, agent_id: str, who: str) -> None:
        """A new agent id counts against its node's and the daemon's bounds:
        a certificate cannot fill the daemon by inventing agent ids."""
        table, b = self.table, self.config.bounds
        if agent_id in table.agents:
            return
        mine = len(table.node_agents.get(who, ()))
        if mine >= b.max_agents_per_node:
            raise ReportError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                              f"node {who!r} holds {mine} agent ids (max_agents_per_node "
                              f"{b.max_agents_per_node})", "agents_per_node", "agents_over_limit")
        if len(table.agents) >= b.max_agents:
            raise ReportError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                              f"the daemon holds {len(table.agents)} agent ids (max_agents "
                              f"{b.max_agents})", "agents", "agents_over_limit")

    def node_jobs(self, who: str) -> set[str]:
        """The jobs the agents of node identity ``who`` reported that the table holds."""
        return node_jobs(self.table, who)

    def _resized(self, report: pb.NodeReport, rejected: dict[str, ReportError],
                 now: float) -> None:
        """A job left out for another world size is taken at that size when the
        evidence says it runs so now (ownership.resize): a first claim of a job
        id never blocks the job that really runs under it."""
        if not rejected:
            return
        for job_id, e in list(rejected.items()):
            known = self.table.world_size(job_id)
            if e.code is not grpc.StatusCode.FAILED_PRECONDITION or not known:
                continue
            worlds = {s.identity.world_size for s in report.samples
                      if s.identity.job_id == job_id}
            if len(worlds) != 1 or not (world := worlds.pop()) or world == known:
                continue
            if self.ownership.resize(self.table, report, job_id, world, now):
                self.table.resize(job_id, world, now)
                del rejected[job_id]

    @staticmethod
    def _set_aside(report: pb.NodeReport, aside: set[int]) -> list[int]:
        """Take the samples of ranks another node owns out of the report (never
        refused: the node's other ranks and jobs apply); return their slots."""
        dropped = [s.slot for i, s in enumerate(report.samples) if i in aside and s.slot]
        kept = [s for i, s in enumerate(report.samples) if i not in aside]
        del report.samples[:]
        report.samples.extend(kept)
        return dropped

    def _drop_jobs(self, report: pb.NodeReport, rejected: dict[str, ReportError]) -> list[int]:
        """Take the rejected jobs' samples and exits out of the report, counted;
        return the slots of the samples taken out."""
        for e in rejected.values():
            self.rejected_jobs_total[e.code.name] += 1
        dropped = [s.slot for s in report.samples
                   if s.slot and s.identity.job_id in rejected]
        kept = [s for s in report.samples if s.identity.job_id not in rejected]
        del report.samples[:]
        report.samples.extend(kept)
        exited = [e for e in report.exited if e.job_id not in rejected]
        del report.exited[:]
        report.exited.extend(exited)
        return dropped

    def disconnected(self, agent_id: str) -> None:
        agent = self.table.agents.get(agent_id)
        if agent is not None:
            agent.connected = False

    # -- commands --------------------------------------------------------------

    def operator_request_stacks(self, job_id: str, reason: str,
                                names: frozenset[str] | None) -> int:
        """A DumpStacks call: under mTLS (``names``: what the caller's
        certificate proves) only for a job with a live rank on the caller's
        node; raise ReportError (NOT_FOUND, PERMISSION_DENIED) otherwise."""
        job = self.table.jobs.get(job_id)
        if job is None:
            owner = self.config.shards.job_view(job_id) if self.config.shards else None
            where = (f": shard {owner['index']} owns it, ask a daemon of it "
                     f"({', '.join(p.partition('/#')[0] for p in owner['pages'])})"
                     if owner and owner["owned"] is False else "")
            raise ReportError(grpc.StatusCode.NOT_FOUND, f"unknown job {job_id!r}{where}")
        if names is not None and not any(r.node in names for r in job.ranks.values()
                                         if r.gone_at is None):
            self.table.identity_refusals_total["dump_stacks"] += 1
            shown = ", ".join(repr(n) for n in sorted(names)) or "no name"
            raise ReportError(grpc.StatusCode.PERMISSION_DENIED,
                              f"certificate for {shown} cannot ask for stacks of job "
                              f"{job_id!r}: none of its ranks runs on that node")
        return self.request_stacks(job_id, self._reason(reason))

    def _reason(self, reason: str) -> str:
        """A command's reason, cut at max_dump_reason (counted when a caller's is)."""
        top = self.config.bounds.max_dump_reason
        if len(reason) <= top:
            return reason
        self.bound_hits_total["dump_reason_length"] += 1
        return reason[:top]

    def request_stacks(self, job_id: str, reason: str) -> int:
        """Queue a DumpStacks command for every agent with ranks of the job."""
        return self._command(job_id, pb.Command(
            dump_stacks=pb.DumpStacksCommand(job_id=job_id, reason=reason)))

    def request_native(self, job_id: str, reason: str) -> int:
        """Tell the job's agents a stall is under way: their still ranks whose
        Python stacks say nothing may be paused for a native dump (within
        each agent's pause budget). It forces no Python dumps (those are
        asked for apart, at their own pace)."""
        return self._command(job_id, pb.Command(
            dump_stacks=pb.DumpStacksCommand(job_id=job_id, reason=reason, native=True)))

    def request_flight_recorder(self, job_id: str, reason: str) -> int:
        """Ask the job's agents for its ranks' Flight Recorder dumps (via their pipe)."""
        return self._command(job_id, pb.Command(
            dump_flight_recorder=pb.DumpFlightRecorderCommand(job_id=job_id, reason=reason)))

    def _command(self, job_id: str, cmd: pb.Command) -> int:
        """Queue ``cmd`` for the job's agents (their queues keep the newest 64;
        each reason kept at most max_dump_reason characters)."""
        for part in (cmd.dump_stacks, cmd.dump_flight_recorder):
            if len(part.reason) > self.config.bounds.max_dump_reason:
                part.reason = part.reason[:self.config.bounds.max_dump_reason]
        job = self.table.jobs.get(job_id)
        if job is None:
            raise KeyError(job_id)
        n = 0
        for aid in job.live_agents():
            agent = self.table.agents.get(aid)
            if agent is not None:
                agent.commands.append(cmd)
                n += 1
        return n

    # -- detection -------------------------------------------------------------

    def tick(self, now: float | None = None, wall: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        wall = time.time() if wall is None else wall
        t0 = time.perf_counter()
        table = self.table
        def leaving(job_id: str, job) -> None:
            self.incidents.end_job(job_id, now, wall)
            self.incidents.settle(now, table.jobs.get, table.fresh, job_id)
            self._keep_bundle(job_id, now)

        self.incidents.prune(now)
        for job_id in table.expire(now, leaving):
            self.budgets.pop(job_id, None)
            self._escalated.pop(job_id, None)
            self._fr_asked.pop(job_id, None)
            self._native_asked.pop(job_id, None)
            self.smooth.forget(job_id)
            self.ownership.forget(job_id)
        # A quiet job's waits are all younger than this: none can count yet.
        young = min(self.config.stall_threshold / 2, self.config.hang_threshold)
        device_wait = RankState.DEVICE_WAIT
        for job_id, job in table.jobs.items():
            # Jobs with nobody in a collective need no work beyond their budget.
            if job_id not in table.dirty and not job.in_collective \
                    and not job.by_state[device_wait] and not self.incidents.for_job(job_id):
                continue
            if self._partial(job, now):
                continue
            b = budget(job, table, now, self.budget_cfg)
            self.budgets[job_id] = b
            if self._quiet(job, b, young):
                continue
            found = detect_job(job, table, now, self.detect_cfg)
            findings = [f for f in found
                        if (job_id, f.kind) in self.incidents.active or self._confirmed(job, f)]
            findings += [unconfirmed(job, f) for f in found if f not in findings
                         and now >= f.started_at + self.config.stall_threshold + CONFIRM_PATIENCE]
            if len(findings) < len(found):
                kept = {id(f) for f in findings}
                self._ask_to_confirm(job_id, now, [f for f in found if id(f) not in kept])
            judged = [(f, diagnose_stall(job, table, f, b, now, self.smooth)) for f in findings]
            for inc in self.incidents.update(job, judged, b, now, wall):
                log.warning("stall %s in job %s: %s; watchdog budget %.0fs of %.0fs left",
                            inc.kind.value, job_id, inc.diagnosis.sentence, b.remaining,
                            b.timeout)
            for inc in self.incidents.for_job(job_id):
                if inc.at_risk_since == now:
                    log.warning("job %s at risk (%s): %s", job_id,
                                inc.diagnosis.root_cause.id, inc.diagnosis.sentence)
            self._escalate(job_id, bool(findings), now)
        for job_id in self.incidents.settle(now, table.jobs.get, table.fresh):
            self.budgets.pop(job_id, None)     # its timeout is now the measured one
        table.dirty.clear()
        self.ticks_total += 1
        self.detect_seconds_total += time.perf_counter() - t0

    def _quiet(self, job, b: Budget, young: float) -> bool:
        """Nothing in the job can make a finding, ask for stacks or touch an
        incident this tick: known from its counts (statecounts.py) and the
        budget's longest wait, without a walk over its ranks.

        No rank still (so no shape, no still wait, no still rank worth
        stacks), none in checkpoint work, no incident open, and every live
        waiting rank in its wait for less than ``young`` (half the stall
        threshold, and the hang ceiling if lower): the shortest wait any
        detector or ``_suspicious`` counts. ``b.blocked_seconds`` is the longest
        wait of the job's live waiting ranks (budget.budget); 0 without one.
        """
        counts = self.table.state_counts(job)
        return (counts is not None and counts.quiet() and b.blocked_seconds < young
                and not self.incidents.for_job(job.job_id))

    def _keep_bundle(self, job_id: str, now: float) -> None:
        """Pack the evidence bundle of a job leaving the table whose stall lost
        it, so that the page's and the alert's link still lands on it."""
        for old in [j for j, (t, _, _) in self.kept_bundles.items() if now - t > KEEP_ENDED]:
            del self.kept_bundles[old]
        lost = [i for i in self.incidents.recent(job_id) if i.outcome and i.outcome.lost]
        job = self.table.jobs.get(job_id)
        if not lost or job is None or len(job.ranks) > KEEP_BUNDLE_RANKS:
            return
        from ncclwatch.daemon import bundle  # bundle builds on this module

        name, body = bundle.archive(bundle.collect(self, job_id, {"asked": False,
                                                                  "kept": "left the table"},
                                                   now=now))
        if len(body) > KEEP_BUNDLE_BYTES:
            return
        self.kept_bundles[job_id] = (now, name, body)
        self.kept_bundles.move_to_end(job_id)
        while len(self.kept_bundles) > KEEP_BUNDLES:
            self.kept_bundles.popitem(last=False)

    def _confirmed(self, job, f) -> bool:
        """A culprit's state must come from a stack taken after the others waited a while.

        Stacks lag /proc; a stack that showed rank 0 in torch.save when the
        others entered the barrier says nothing about the five seconds after
        (an overloaded node may take that long to dump again). A new incident
        needs each culprit seen in its state at least ``stall_threshold``
        after the wait began; rank_lost names no culprit and needs none.
        """
        confirm_at = f.started_at + self.config.stall_threshold
        for c in f.culprits:
            rec = job.ranks.get(c.rank)
            if rec is None or rec.stack_at is None or rec.stack_at < confirm_at:
                return False
        return True

    def _ask_to_confirm(self, job_id: str, now: float, unconfirmed) -> None:
        """Ask for the stacks that can confirm a finding as soon as they can.

        A finding waits for culprit stacks taken ``stall_threshold`` after the
        wait began; the periodic escalation may have asked just before that
        moment, and waiting for its next round adds up to ``ESCALATE_EVERY``
        (under load, more) to every detection.
        """
        due = min(f.started_at for f in unconfirmed) + self.config.stall_threshold
        if now >= due and self._escalated.get(job_id, -1e9) < due:
            self._escalated[job_id] = now
            self.request_stacks(job_id, "stall to confirm")

    def _partial(self, job, now: float) -> bool:
        """Too early to judge: not every rank has reported since the job was first seen.

        After a daemon restart (or a job start) the agents' first reports come
        in one by one; a job assembled from half of them would show waiting
        ranks and "missing" ones, a false rank_lost. Ranks that stay missing
        for a staleness period are judged as unknown, as usual.
        """
        return len(job.ranks) < job.world_size and now - job.first_seen < self.config.staleness

    def _escalate(self, job_id: str, stalled: bool, now: float) -> None:
        """Ask for fresh stacks of a job where ranks have waited a while.

        Healthy training is in a collective much of the time: only waits past
        half the stall threshold are worth a round of dumps on every rank.
        The Flight Recorder is asked too, and also while a rank has sat still
        for the stall threshold with its stack fresh: where no frame shows the
        wait (NCCL), the dump is what can name the rank the others wait for.
        """
        job = self.table.jobs[job_id]
        half = self.config.stall_threshold / 2
        suspect = stalled or self._suspicious(job, now, half)
        if suspect:
            every = REFRESH_EVERY if stalled else ESCALATE_EVERY
            if now - self._escalated.get(job_id, -1e9) >= every:
                self._escalated[job_id] = now
                self.request_stacks(job_id, "stall suspected" if not stalled
                                    else "stall refresh")
        if now - self._native_asked.get(job_id, -1e9) >= NATIVE_ASK_EVERY:
            if self._checkpoint_shape(job, now, half):
                self._native_asked[job_id] = now
                self.request_native(job_id, "ranks still beside checkpoint work")
            elif halted(job, self.table, now, half, self.detect_cfg.waits):
                self._native_asked[job_id] = now
                self.request_native(job_id, "every rank still")
        if job.env.get("TORCH_NCCL_DEBUG_INFO_PIPE_FILE") and \
                now - self._fr_asked.get(job_id, -1e9) >= FLIGHT_RECORDER_EVERY and \
                (suspect or self._still_long(job, now)):
            self._fr_asked[job_id] = now
            self.request_flight_recorder(job_id, "stall suspected" if not stalled
                                         else "stall refresh")

    def _checkpoint_shape(self, job, now: float, half: float) -> bool:
        """A stall's shape: a rank in checkpoint work while another has sat
        still for half the stall threshold. With ``shape.halted`` the shapes
        that let agents pause ranks with no history to judge their stillness
        by (stillness.py); healthy steps, however long and still, show neither."""
        still = still_since(job, now - half)
        if not still:
            return False
        agents = self.table.fresh_agents(now)
        ranks = job.ranks   # the ranks in checkpoint work, from the job's index by state
        workers = {r for state in CHECKPOINT_STATES for r in job.by_state[state]
                   if (rec := ranks[r]).gone_at is None and rec.agent_id in agents}
        return bool(workers) and any(r not in workers for r in still)

    def _still_long(self, job, now: float) -> bool:
        """A live rank of the job has made no progress for the stall threshold."""
        return bool(still_since(job, now - self.config.stall_threshold))

    def _suspicious(self, job, now: float, half: float) -> bool:
        """Worth a round of fresh stacks on every rank of the job.

        A rank waits long (below), or a rank has made no progress for a while
        since its last stack: the daemon's picture of it (compute, say) is
        from before it sat down, and where it sits now (a collective, behind
        a saving peer) is what a verdict needs. Once a stack is taken during
        the stillness the rank no longer asks, nor while the still period is
        within the rank's normal ones (a GPU rank is still through every
        step: its agent looks past that normal, policy.within_normal).
        """
        if any(self._long_wait(job.ranks[r], now, half) for r in job.waiting):
            return True
        rule = self.detect_cfg.waits.rank
        ranks = job.ranks   # ranks with a still period are the job's index of still ones
        return any(rec.still_since is not None and now - rec.still_since >= half
                   and not rule.within_normal(rec.history, now - rec.still_since)
                   and (rec.stack_at is None or rec.stack_at < rec.still_since)
                   for rec in (ranks[r] for r in job.still))

    @staticmethod
    def _long_wait(rec, now: float, half: float) -> bool:
        """A wait worth fresh stacks: long, and quiet, still or seen by two dumps.

        Between dumps a rank keeps the state its last stack showed; a busy
        rank last seen in an all_reduce is most likely training on. Its wait
        counts once its CPU went quiet, it made no progress (waiting ranks
        that spin are not quiet), or a later stack showed it still there.
        """
        if now - rec.since < half:
            return False
        confirmed = rec.stack_at is not None and rec.stack_at - rec.since >= half
        still = rec.still_at is not None and now - rec.still_at >= half
        return rec.cpu_util < QUIET_CPU or still or confirmed

    def hang_threshold_of(self, job, now: float) -> float:
        """The job's learned hang threshold now (waits.WaitLearner.current)."""
        ops = {job.ranks[r].still_op for r in job.waiting if job.ranks[r].still_at is not None}
        return job.waits.current(ops, self.detect_cfg.waits, now)

    def budget_of(self, job_id: str, now: float) -> Budget:
        """The job's budget at ``now``: the last tick's, aged to ``now``."""
        b = self.budgets.get(job_id)
        if b is None:
            b = self.budgets[job_id] = budget(self.table.jobs[job_id], self.table, now,
                                              self.budget_cfg)
        return b.aged(now)
