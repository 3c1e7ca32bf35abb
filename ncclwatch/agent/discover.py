"""Find the training ranks on this node with a psutil process scan.

Environments never change after exec, so each pid is read once and the
verdict cached by (pid, create time); a round only looks at new pids (and
the few still settling: young ones, Python processes with rank variables
that have not imported torch yet, spawn children still starting).

Who is a rank (each rule decided once per pid):

- launchers and their helpers (``launchers.LAUNCHERS``) never are;
- only a Python process that loaded torch is (``srun hostname`` is not);
- its rank comes from its environment (``jobid.RANK_VARIABLES``), else
  from what it shows from outside: an ``mp.spawn`` worker's spawn index
  (py-spy ``--locals``), Lightning's children's NODE_RANK/LOCAL_RANK and,
  for Lightning's rank 0, which has no variables at all, its children's;
- a member of a job whose number none of that shows is a rank with
  ``UNKNOWN_RANK``: still watched, never numbered by guess;
- a Ray Train worker (``agent.raytrain``) is a member of its Ray job, rank 0
  once it is seen serving the job's TCPStore, the others unnumbered; once
  its title showed a train worker it stays one (Ray retitles it per task);
- a Python process with torch loaded that none of the above names (a shell
  loop's ``python train.py --rank $i``) is a candidate: a member of the job
  its rendezvous shows (``agent.rendezvous``: its TCPStore connection or
  the URL on its command line), rank 0 when it serves the store, else
  numbered by its own ``--rank`` only where the node's members corroborate
  it. Candidates are looked at every round while young (torch is imported,
  and the rendezvous joined, seconds after start), then ever more rarely
  (a Jupyter kernel with torch that never joins costs one fd walk every
  ``CANDIDATE_BACKOFF_MAX`` seconds at most).

A verdict on a young process is not final: a launcher's child between fork
and exec shows the launcher's command line and environment.

A rank in a container is read through /proc like any other; what the
container shows of it (its own pid, hostname, cgroup id, Kubernetes pod)
is read once per rank (``agent.container``).

Forked children of a rank (DataLoader workers, compile workers) inherit its
environment and are skipped: a rank is the oldest process of its (job,
rank), and an unnumbered member whose parent is in the same job is a fork.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import psutil

from ncclwatch.agent import (
    caps, container as containers, launchers, procstat, rankenv, rankfs, raytrain, rendezvous,
)
from ncclwatch.agent.container import NONE as NO_CONTAINER, ContainerInfo
from ncclwatch.agent.pyspy import find_pyspy
from ncclwatch.agent.timeouts import stated_timeout
from ncclwatch.envpolicy import local_env, redact_patterns
from ncclwatch.jobid import (
    LOOPBACK, MAX_JOB_ID_LEN, NODE_LOCAL_SOURCE, UNKNOWN_RANK, UNKNOWN_SOURCE, RankIdentity,
    identify, job_of, node_local_fields, rank_of,
)
from ncclwatch.sanitize import filter_env

log = logging.getLogger(__name__)

#: A process younger than this (seconds) that is no rank is looked at again
#: each round: a launcher's child between fork and exec still shows the
#: launcher's command line and environment.
YOUNG = 5.0
#: A spawn child is asked for its spawn index until it is this old (seconds).
SPAWN_PATIENCE = 60.0
#: Lightning's children on node > 0 are numbered once the youngest is this old
#: (seconds): their count is the node's process count only when all started.
FAMILY_SETTLE = 3.0
#: Job sources of members grouped by their rendezvous (the last rule applied).
RENDEZVOUS_SOURCES = (rendezvous.STORE_JOB_SOURCE, rendezvous.FILE_JOB_SOURCE)
#: rank_source of mp.spawn workers and of Lightning's rank 0.
SPAWN_SOURCE = "spawn_index"
CHILDREN_SOURCE = "children_env"
#: A candidate (Python, no rank named) is looked at every round until this
#: old (seconds), then after a quarter of its age, at most this long apart.
CANDIDATE_YOUNG = 60.0
CANDIDATE_BACKOFF_MAX = 300.0


@dataclass(frozen=True, slots=True)
class RankProcess:
    pid: int
    create_time: float
    identity: RankIdentity
    env: dict[str, str]  # allowlisted and redacted: what is reported
    #: Raw paths the agent uses itself (envpolicy.LOCAL_USE_NAMES); never reported.
    local: dict[str, str] = field(default_factory=dict)
    #: The container (and Kubernetes pod) it runs in; empty on the host.
    container: ContainerInfo = NO_CONTAINER
    #: The process-group timeout it states (its environment, command line or
    #: the config file that names: agent.timeouts.stated_timeout), 0: none,
    #: and where it was read (``args:--ddp_timeout``).
    timeout: float = 0.0
    timeout_source: str = ""
    #: Its start as /proc/PID/stat field 22 shows it (clock ticks after boot,
    #: 0: not read) and its owner's uid (-1: not read): what the commands shown
    #: for it check at paste time, so that they never act on a reused pid
    #: (ncclwatch/actions.py).
    start_ticks: int = 0
    uid: int = -1

    @classmethod
    def of(cls, pid: int, create_time: float, identity: RankIdentity,
           env: Mapping[str, str], container: ContainerInfo = NO_CONTAINER,
           cmdline: Sequence[str] = (), proc: str = "/proc") -> "RankProcess":
        shown = filter_env(rankenv.within_budget(env))
        seconds, source = stated_timeout(
            shown, cmdline, lambda path, limit: read_config(pid, path, limit, proc))
        return cls(pid, create_time, identity, shown, local_env(env), container,
                   seconds, source, *proc_id(pid, proc))

    @property
    def key(self) -> tuple[str, int]:
        return (self.identity.job_id, self.identity.rank)


def proc_id(pid: int, proc: str = "/proc") -> tuple[int, int]:
    """(start ticks, owner uid) of ``pid``: /proc/PID/stat field 22
    (procstat.py) and the owner of /proc/PID, as a shown command's guard reads them again
    (``ls -n``: the effective uid); (0, -1) where unread."""
    ticks, uid = 0, -1
    try:
        ticks = procstat.start_ticks(pid, proc)
        uid = os.stat(f"{proc}/{pid}").st_uid
    except (OSError, ValueError, IndexError):
        pass
    return ticks, uid


def read_config(pid: int, path: str, limit: int, proc: str = "/proc") -> bytes | None:
    """A config file the rank's command line names, as the rank sees it: walked
    inside its root (``rankfs.open_in_root``: relative to its working
    directory, never out of its root), a regular file of at most ``limit``
    bytes, else None. Read once per process (discovery caches the verdict)."""
    try:
        got = rankfs.open_in_root(pid, path, rankfs.REGULAR, os.O_RDONLY, follow_last=True,
                                  proc=proc)
    except (OSError, ValueError):
        return None
    if got is None:
        return None
    fd, st = got
    try:
        if st.st_size > limit:
            return None
        data = os.read(fd, limit + 1)
        return data if len(data) <= limit else None
    except OSError:
        return None
    finally:
        os.close(fd)


@dataclass(slots=True)
class _Seen:
    """What one look at a pid found (kept until the pid goes)."""

    create_time: float
    ppid: int = 0
    rank: RankProcess | None = None
    launcher: str = ""         # a LAUNCHERS row: never a rank
    recheck: bool = False      # look again next round
    node_local: tuple[int, int, int] | None = None   # Lightning child: node, local, world
    ray_since: float = 0.0     # a Ray Train worker with torch loaded, since (agent clock)
    ray_worker: bool = False   # a Ray Train worker by its title once: one for life
    settled: bool = False      # its identity is final (a Ray worker's, once its store is seen)
    spawn: bool = False        # an mp.spawn child (its parent is a spawner, no candidate)
    next_look: float = 0.0     # a recheck before this time (time.time()) is skipped
    argv: tuple[str, ...] = ()  # the command line this look read (an exec since voids it)
    #: A rendezvous candidate (Python, torch loaded, no rank named): what its
    #: grouping needs, kept until it is grouped or gone.
    candidate: "_Candidate | None" = None


@dataclass(slots=True)
class _Candidate:
    cmdline: list[str]
    env: dict[str, str]
    due: bool = True                              # inspected this round: read its sockets
    socks: list[rendezvous.Conn] = field(default_factory=list)   # last reading
    args: tuple[int, int, str] | None = None      # its own argv's (rank, world, source)
    c10d: bool = False                            # runs a torch.distributed thread


class Discovery:
    """Incremental scan: ``scan()`` returns the rank processes alive now."""

    def __init__(self, host: str, own_pid: int | None = None,
                 ranks: frozenset[int] | None = None, pyspy: str | None = None,
                 proc: str = "/proc", pods_root: str = containers.PODS_LOG_ROOT) -> None:
        self._host = host
        self._pods_root = pods_root
        # Only these global ranks (None: all): lets two agents split one job's
        # ranks, as two nodes would. Unnumbered members go with ranks=None only.
        self._ranks = ranks
        self._own = own_pid if own_pid is not None else psutil.Process().pid
        self._pyspy = pyspy if pyspy is not None else find_pyspy()
        self._proc = proc
        self._seen: dict[int, _Seen] = {}
        # Lightning's rank 0, found through its children: pid -> RankProcess.
        self._parents: dict[int, RankProcess | None] = {}
        self.errors_total = 0
        self.spawn_probes_total = 0
        #: Pids the last scan's budget put off: looked at first by the next.
        self._put_off: set[int] = set()

    def scan(self, budget: float | None = None) -> list[RankProcess]:
        """``budget``: seconds the scan may spend looking at new processes (and
        young ones again); those past it are looked at first next round,
        counted (caps: scan_time). Known ranks are never put off."""
        pids = set(psutil.pids())
        for gone in self._seen.keys() - pids:
            del self._seen[gone]
        for gone in self._parents.keys() - pids:
            del self._parents[gone]
        now = time.time()
        deadline = time.monotonic() + budget if budget is not None else None
        put_off, self._put_off = self._put_off & pids, set()
        for pid in [*put_off, *(pids - put_off)]:
            if pid == self._own:
                continue
            cached = self._seen.get(pid)
            # Re-check pid reuse only for ranks (cheap: few); a reused pid of a
            # non-rank is caught when it vanishes between two rounds.
            if cached is not None and not cached.recheck and (
                    cached.rank is None or not self._reused(pid, cached.create_time)):
                continue
            if cached is not None and cached.recheck and cached.next_look > now:
                continue   # a candidate backing off
            if deadline is not None and (cached is None or cached.rank is None) \
                    and time.monotonic() > deadline:
                self._put_off.add(pid)
                continue
            seen = self._inspect(pid, now)
            if seen.create_time and now - seen.create_time < YOUNG:
                # A child caught between fork and exec shows its parent's (a
                # launcher's) command line, environment and maps: young verdicts
                # are not final, and a young child that still runs its parent's
                # command line is no rank yet (an mp.spawn worker under srun was
                # read as the srun task, rank 0 of 1, for life; CI). A fork that
                # never execs is read once it is no longer young. An exec during
                # the look (the command line read first was the parent's, the
                # checks after it saw the new one) voids it too, and every young
                # verdict is read again until it is no longer young.
                if seen.rank is not None and _exec_pending(pid, seen.ppid, seen.argv):
                    seen.rank = None
                # (A spawn index read from torch's own frame is final: that
                # frame runs only after the exec.)
                seen.recheck = seen.rank is None or seen.rank.identity.rank_source != SPAWN_SOURCE
            self._seen[pid] = seen
        if self._put_off:
            caps.COUNTS.hit("scan_time", len(self._put_off))
        self._settle_ray(now)
        self._settle_rendezvous()
        return _one_per_rank(self._resolve())

    def _reused(self, pid: int, create_time: float) -> bool:
        """Pid reused, or the rank died and is a zombie its parent has not reaped."""
        try:
            p = psutil.Process(pid)
            return p.create_time() != create_time or p.status() == psutil.STATUS_ZOMBIE
        except psutil.Error:
            return True

    def _inspect(self, pid: int, now: float) -> _Seen:
        create_time = 0.0
        try:
            proc = psutil.Process(pid)
            with proc.oneshot():
                create_time = proc.create_time()
                if proc.status() == psutil.STATUS_ZOMBIE:
                    return _Seen(create_time)  # dead, not yet reaped by its parent
                ppid = proc.ppid()
            cmdline = proc.cmdline()
            seen = _Seen(create_time, ppid, launcher=launchers.launcher_of(cmdline) or "",
                         argv=tuple(cmdline))
            if seen.launcher:
                return seen
            env = rankenv.read_environ(pid, self._proc)   # within its budget (caps.py)
            shown = rank_of(env)
            if (shown is None or shown[0] == UNKNOWN_RANK) and raytrain.is_ray_process(cmdline,
                                                                                     env):
                # A Ray actor whose rank Ray sets in-process (one whose env
                # names its rank, or a child process, goes the usual way).
                return self._ray_worker(pid, cmdline, env, seen, now)
            spawn = seen.spawn = launchers.is_spawn_child(cmdline)
            if shown is None and not spawn:
                # A Ray worker not yet titled is looked at again until it is.
                if raytrain.is_starting(cmdline, env):
                    seen.recheck = now - create_time < SPAWN_PATIENCE
                    return seen
                # No rank variables, no spawn child: a rendezvous candidate at most.
                return self._candidate(pid, proc, cmdline, env, seen, now)
            maps = launchers.read_maps(pid, self._proc)
            if maps is None:
                return seen
            if not launchers.torch_loaded(maps):
                # Python may import torch later; anything else never will. A
                # spawn child of some other program is given SPAWN_PATIENCE.
                seen.recheck = launchers.python_loaded(maps, _exe(proc)) and (
                    shown is not None or now - create_time < SPAWN_PATIENCE)
                return seen
            if spawn:
                identity = self._spawn_identity(pid, ppid, env, seen, now)
                if identity is not None:
                    seen.rank = RankProcess.of(pid, create_time, identity, env,
                                               self._container(pid, env), cmdline, self._proc)
                    return seen
                if seen.recheck:
                    return seen
            identity = identify(env, self._host) or identify(
                env, self._host, launcher=self._launcher_id(ppid))
            if identity is None:
                return seen
            if identity.rank_source in (NODE_LOCAL_SOURCE, UNKNOWN_SOURCE):
                seen.node_local = node_local_fields(env)
            seen.rank = RankProcess.of(pid, create_time, identity, env, self._container(pid, env),
                                       cmdline, self._proc)
            return seen
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            return _Seen(0.0)
        except (psutil.AccessDenied, OSError) as e:
            self.errors_total += 1
            log.debug("cannot read pid %d: %s", pid, e)
            return _Seen(create_time)  # looked at again while young (scan)

    def _ray_worker(self, pid: int, cmdline: list[str], env: dict[str, str], seen: _Seen,
                    now: float) -> _Seen:
        """A Ray process: a train worker is a member of its Ray job once torch is
        loaded; its rank is settled in ``_resolve`` from the job's TCPStore."""
        old = self._seen.get(pid)
        if old is not None and old.create_time != seen.create_time:
            old = None
        if old is not None and old.settled:
            return old
        # An actor process hosts one actor for life: once its title showed a
        # train worker it is one, whatever task its title names later.
        if not (old is not None and old.ray_worker or raytrain.is_train_worker(cmdline, env)):
            # A pooled worker, or one in a named task, may still show as one.
            seen.recheck = raytrain.may_become_worker(cmdline, env)
            return seen
        seen.recheck = seen.ray_worker = True
        maps = launchers.read_maps(pid, self._proc)
        if maps is None or not launchers.torch_loaded(maps):
            return seen
        job = raytrain.job_id(env, self._host, self._proc)
        if job is None:
            return seen
        seen.ray_since = old.ray_since if old is not None and old.ray_since else now
        identity = RankIdentity(job_id=f"{raytrain.JOB_SOURCE}:{job}"[:MAX_JOB_ID_LEN],
                                job_source=raytrain.JOB_SOURCE, rank=UNKNOWN_RANK,
                                local_rank=-1, world_size=0, rank_source=UNKNOWN_SOURCE)
        if old is not None and old.rank is not None and old.rank.identity.job_id == identity.job_id:
            seen.rank = old.rank  # keep what the store showed so far
        else:
            seen.rank = RankProcess.of(pid, seen.create_time, identity, env,
                                       self._container(pid, env))
        return seen

    def _candidate(self, pid: int, proc: psutil.Process, cmdline: list[str],
                   env: dict[str, str], seen: _Seen, now: float) -> _Seen:
        """A Python process no rule names: looked at again (backing off) until
        torch is loaded and its rendezvous shows (``_settle_rendezvous``)."""
        exe = _exe(proc)
        if not (launchers._is_python(exe) or cmdline and launchers._is_python(cmdline[0])):
            return seen   # not Python: never a rank
        age = now - seen.create_time
        seen.recheck = True
        seen.next_look = now + (0.0 if age < CANDIDATE_YOUNG
                                else min(CANDIDATE_BACKOFF_MAX, age / 4))
        old = self._seen.get(pid)
        if old is not None and old.create_time == seen.create_time and old.candidate:
            seen.candidate = old.candidate   # torch stays loaded: no maps read again
            seen.candidate.due = True
            return seen
        maps = launchers.read_maps(pid, self._proc)
        if maps is None or not launchers.torch_loaded(maps):
            return seen   # Python may import torch later
        seen.candidate = _Candidate(list(cmdline), dict(env),
                                    args=rendezvous.args_rank(cmdline))
        return seen

    def _settle_rendezvous(self) -> None:
        """Group the candidates looked at this round by their rendezvous
        (``agent.rendezvous``): one fd walk each, one socket table per
        network namespace; the others' last readings count as theirs."""
        cands = {pid: s for pid, s in self._seen.items()
                 if s.candidate is not None and s.rank is None}
        due = [pid for pid, s in cands.items() if s.candidate.due]
        if not due:
            return
        # A spawner, or the parent of ranks another rule names (Lightning's rank 0,
        # whose children say NODE_RANK/LOCAL_RANK), is that rule's to number.
        spawners = {s.ppid for s in self._seen.values() if s.spawn or (
            s.rank is not None and s.rank.identity.job_source not in RENDEZVOUS_SOURCES)}
        for pid, socks in rendezvous.owned(due, self._proc).items():
            c = cands[pid].candidate
            c.socks = socks
            c.c10d = c.c10d or bool(socks) and rendezvous.c10d_threads(pid, self._proc)
        found = rendezvous.find({pid: s.candidate.socks for pid, s in cands.items()},
                                {pid: rendezvous.command_line_url(s.candidate.cmdline)
                                 for pid, s in cands.items()}, due,
                                [pid for pid, s in cands.items() if s.candidate.c10d])
        for pid in due:
            seen = cands[pid]
            c = seen.candidate
            c.due = False
            ep = found.get(pid)
            if ep is None or pid in spawners:
                continue   # not joined yet, or it only starts the ranks
            shared = ep.source == rendezvous.FILE_JOB_SOURCE and \
                rendezvous.shared_path(pid, ep.path, self._proc)
            world = c.args[1] if c.args else 0
            identity = RankIdentity(
                job_id=redact_patterns(ep.job_id(self._host, shared))[:MAX_JOB_ID_LEN],
                job_source=ep.source, rank=0 if ep.server else UNKNOWN_RANK, local_rank=-1,
                world_size=world,
                rank_source=rendezvous.STORE_SOURCE if ep.server else UNKNOWN_SOURCE)
            try:
                seen.rank = RankProcess.of(pid, seen.create_time, identity, c.env,
                                           self._container(pid, c.env), c.cmdline, self._proc)
            except OSError:
                self.errors_total += 1
                continue
            seen.recheck, seen.next_look = False, 0.0

    def _settle_ray(self, now: float) -> None:
        """Rank 0 of each Ray job: the worker serving its TCPStore (raytrain).

        The others stay members of unknown rank; a worker is settled (no longer
        re-read) once a store of its job is seen, or after SPAWN_PATIENCE."""
        jobs: dict[str, list[int]] = {}
        for pid, seen in self._seen.items():
            if seen.ray_since and seen.rank is not None and not seen.settled:
                jobs.setdefault(seen.rank.identity.job_id, []).append(pid)
        for job_id, pids in jobs.items():
            members = [p for p, s in self._seen.items()
                       if s.ray_since and s.rank is not None and s.rank.identity.job_id == job_id]
            servers = raytrain.store_servers(members, self._proc)
            for pid in pids:
                seen = self._seen[pid]
                if pid in servers:
                    seen.rank = replace(seen.rank, identity=replace(
                        seen.rank.identity, rank=0, rank_source=raytrain.STORE_SOURCE))
                if servers or now - seen.ray_since >= SPAWN_PATIENCE:
                    seen.settled, seen.recheck = True, False

    def _container(self, pid: int, env: Mapping[str, str]) -> ContainerInfo:
        """The container a rank runs in, read once per rank (agent.container)."""
        return containers.inspect(pid, env, proc=self._proc, pods_root=self._pods_root)

    def _spawn_identity(self, pid: int, ppid: int, env: dict[str, str], seen: _Seen,
                        now: float) -> RankIdentity | None:
        """An ``mp.spawn`` worker: rank from its spawn index where that is sound.

        The index is the rank when the spawn makes the whole world (WORLD_SIZE
        equal to the number of workers, or unset with a rendezvous only this
        node reaches: no MASTER_ADDR, or a loopback one; no outer multi-task
        launcher); with NODE_RANK and WORLD_SIZE it is NODE_RANK * nprocs + i.
        Otherwise the worker is a member with an unknown rank (a spawn on each
        of several nodes, its node's number only on its command line: the
        index repeats on every node), numbered later if the job shows it
        (ranklearn).
        """
        self.spawn_probes_total += 1
        index, final = launchers.spawn_index(pid, self._pyspy)
        if index is None:
            seen.recheck = not final and now - seen.create_time < SPAWN_PATIENCE
            return None
        job = job_of(env, self._host, self._launcher_id(pid, spawn_parent=ppid))
        if job is None:
            return None
        nprocs = self._spawn_siblings(ppid)
        size = _int(env.get("WORLD_SIZE"))
        node = _int(env.get("NODE_RANK"))
        outer = rank_of({k: v for k, v in env.items() if k not in ("MASTER_ADDR", "MASTER_PORT")})
        multi_task = outer is not None and outer[1] > 1
        rank, world = UNKNOWN_RANK, size or 0
        addr = env.get("MASTER_ADDR", "")
        whole = size == nprocs or (size is None and (not addr or addr.startswith(LOOPBACK)))
        if index < nprocs and whole and not multi_task and not node:
            rank, world = index, nprocs
        elif size and node is not None and size % nprocs == 0 and node * nprocs + index < size:
            rank = node * nprocs + index
        return RankIdentity(job_id=job[1], job_source=job[0], rank=rank, local_rank=index,
                            world_size=world,
                            rank_source=SPAWN_SOURCE if rank != UNKNOWN_RANK else UNKNOWN_SOURCE)

    def _spawn_siblings(self, ppid: int) -> int:
        try:
            kids = psutil.Process(ppid).children()
        except psutil.Error:
            return 0
        n = 0
        for k in kids:
            try:
                n += launchers.is_spawn_child(k.cmdline())
            except psutil.Error:
                pass
        return n

    def _launcher_id(self, ppid: int, spawn_parent: int | None = None) -> str | None:
        """Job id for ranks whose environment names no job.

        The nearest launcher ancestor (hydra_pmi_proxy, mpirun, ...), else the
        spawning parent: the job-wide id its command line names
        (``launchers.JOB_WIDE``: hydra's control port, the same on every
        node), else node-local, ``<host>/<pid>.<start time>``.
        """
        pid, hops = ppid, 0
        while pid > 1 and hops < 8:
            try:
                p = psutil.Process(pid)
                cmdline = p.cmdline()
                if launchers.launcher_of(cmdline) or pid == spawn_parent:
                    return launchers.job_wide_id(cmdline) or \
                        f"{self._host}/{pid}.{int(p.create_time())}"
                pid, hops = p.ppid(), hops + 1
            except psutil.Error:
                return None
        return None

    def _resolve(self) -> list[RankProcess]:
        """Ranks only the process tree shows: Lightning's children and rank 0."""
        out: list[RankProcess] = []
        families: dict[tuple[int, str], list[tuple[int, _Seen]]] = {}
        for pid, seen in self._seen.items():
            rp = seen.rank
            if rp is None:
                continue
            if seen.node_local is not None:
                families.setdefault((seen.ppid, rp.identity.job_id), []).append((pid, seen))
            else:
                out.append(rp)
        now = time.time()
        for (ppid, job_id), kids in families.items():
            local_world = len(kids) + 1  # the parent is local rank 0
            node, _, size = kids[0][1].node_local
            # The parent starts its children in one loop: once the youngest is
            # FAMILY_SETTLE old, the count is the node's process count.
            settled = now - max(s.create_time for _, s in kids) >= FAMILY_SETTLE
            for pid, seen in kids:
                rp = seen.rank
                n, local, _ = seen.node_local
                if rp.identity.rank == UNKNOWN_RANK and settled and local < local_world \
                        and size % local_world == 0 and n * local_world + local < size:
                    rp = replace(rp, identity=replace(
                        rp.identity, rank=n * local_world + local, rank_source=NODE_LOCAL_SOURCE))
                out.append(rp)
            if node == 0 or settled:
                parent = self._parent_rank(ppid, kids[0][1].rank.identity, node, local_world,
                                           size)
                if parent is not None:
                    out = [rp for rp in out if rp.pid != ppid]
                    out.append(parent)
        return _drop_forks_and_parents(_number_by_args(out, self._seen), self._seen,
                                       self._ranks)

    def _parent_rank(self, ppid: int, child: RankIdentity, node: int, local_world: int,
                     size: int) -> RankProcess | None:
        """Lightning's rank 0 (of its node): the torch parent of the children."""
        parent = self._seen.get(ppid)
        if parent is None or parent.launcher or (
                parent.rank is not None and parent.rank.identity.known
                and parent.rank.identity.job_source not in RENDEZVOUS_SOURCES):
            return None  # a launcher, or a parent that says its own rank
        # (one its rendezvous numbered before its children were seen is theirs)
        if ppid not in self._parents:
            self._parents[ppid] = None
            try:
                proc = psutil.Process(ppid)
                maps = launchers.read_maps(ppid, self._proc)
                if maps and launchers.torch_loaded(maps):
                    rank = node * local_world
                    known = rank < size
                    ident = replace(child, rank=rank if known else UNKNOWN_RANK, local_rank=0,
                                    rank_source=CHILDREN_SOURCE if known else UNKNOWN_SOURCE)
                    env = rankenv.read_environ(ppid, self._proc)
                    self._parents[ppid] = RankProcess.of(ppid, proc.create_time(), ident, env,
                                                         self._container(ppid, env))
            except (psutil.Error, OSError):
                self.errors_total += 1
        return self._parents[ppid]


def _drop_forks_and_parents(found: list[RankProcess], seen: dict[int, _Seen],
                            ranks: frozenset[int] | None) -> list[RankProcess]:
    """Drop forks of members, and a spawning parent that looks like a member."""
    by_pid = {rp.pid: rp for rp in found}
    spawners = {seen[rp.pid].ppid for rp in found
                if rp.identity.rank_source == SPAWN_SOURCE and rp.pid in seen}
    out = []
    for rp in found:
        i = rp.identity
        if rp.pid in spawners and i.rank_source != CHILDREN_SOURCE:
            continue  # mp.spawn's parent, waiting in join(): not a rank
        if not i.known:
            s = seen.get(rp.pid)
            parent = by_pid.get(s.ppid) if s is not None else None
            if parent is not None and parent.identity.job_id == i.job_id:
                continue  # a fork (DataLoader worker) of a member
        if ranks is not None and i.rank not in ranks:
            continue
        out.append(rp)
    return out


def _number_by_args(found: list[RankProcess], seen: dict[int, _Seen]) -> list[RankProcess]:
    """Rendezvous members numbered by their own ``--rank`` (``args:--rank``)
    where this node's members of the job corroborate it: the numbers are
    distinct, below the world size all of them state, and the store's
    server (when on this node) says 0. A server saying otherwise is left
    unnumbered with both shown (``rank_conflict``), and so is a member
    claiming a number another claims; nothing else is numbered then."""
    jobs: dict[str, list[RankProcess]] = {}
    for rp in found:
        if rp.identity.job_source in (rendezvous.STORE_JOB_SOURCE, rendezvous.FILE_JOB_SOURCE):
            jobs.setdefault(rp.identity.job_id, []).append(rp)
    if not jobs:
        return found
    changed: dict[int, RankProcess] = {}
    for members in jobs.values():
        pids = {rp.pid for rp in members}
        # Forks of a member (DataLoader workers) share its argv and sockets.
        members = [rp for rp in members if seen.get(rp.pid) is None
                   or seen[rp.pid].ppid not in pids]
        claims = {rp.pid: c.args for rp in members
                  if (s := seen.get(rp.pid)) and (c := s.candidate) and c.args}
        worlds = {w for _, w, _ in claims.values()}
        server = next((rp for rp in members
                       if rp.identity.rank_source == rendezvous.STORE_SOURCE), None)
        said = claims.get(server.pid) if server is not None else None
        if said is not None and said[0] != 0:
            changed[server.pid] = replace(server, identity=replace(
                server.identity, rank=UNKNOWN_RANK, rank_source=UNKNOWN_SOURCE,
                rank_conflict=f"{rendezvous.STORE_SOURCE}:0 {said[2]}:{said[0]}"))
            continue
        if len(worlds) != 1 or 0 in worlds:
            continue   # no world size stated, or stated differently
        world = worlds.pop()
        by_rank: dict[int, list[int]] = {}
        for pid, (rank, _, _) in claims.items():
            by_rank.setdefault(rank, []).append(pid)
        if server is not None:
            by_rank.setdefault(0, [])
            if server.pid not in by_rank[0]:
                by_rank[0].append(server.pid)
        for rp in members:
            claim = claims.get(rp.pid)
            if claim is None:
                continue
            rank, _, source = claim
            i = rp.identity
            others = [p for p in by_rank[rank] if p != rp.pid]
            if others:
                changed[rp.pid] = replace(rp, identity=replace(
                    i, rank=UNKNOWN_RANK, rank_source=UNKNOWN_SOURCE,
                    rank_conflict=f"{source}:{rank} " + " ".join(
                        f"{_source_of(found, p)}:{rank}@pid{p}" for p in others)))
            elif rank < world:
                changed[rp.pid] = replace(rp, identity=replace(
                    i, rank=rank, world_size=world,
                    rank_source=i.rank_source if i.known else source))
    return [changed.get(rp.pid, rp) for rp in found]


def _source_of(found: list[RankProcess], pid: int) -> str:
    rp = next((r for r in found if r.pid == pid), None)
    return rp.identity.rank_source if rp is not None and rp.identity.known else "args"


def _exe(proc: psutil.Process) -> str:
    try:
        return proc.exe()
    except psutil.Error:
        return ""


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _exec_pending(pid: int, ppid: int, argv: tuple[str, ...]) -> bool:
    """``pid`` runs its parent's command line (a fork that has not exec'd yet), or
    no longer the one a look read (it exec'd during the look); one read of each."""
    try:
        now = tuple(psutil.Process(pid).cmdline())
    except psutil.Error:
        return True   # gone or unreadable: no verdict from this look
    try:
        return now != argv or (ppid > 1 and now == tuple(psutil.Process(ppid).cmdline()))
    except psutil.Error:
        return False


def _one_per_rank(candidates: list[RankProcess]) -> list[RankProcess]:
    """Keep the oldest process per (job, rank); the others are its forks.

    Unnumbered members are kept each (forks of them are already dropped).
    """
    best: dict[tuple[str, int], RankProcess] = {}
    for rp in candidates:
        key = rp.key if rp.identity.known else (rp.identity.job_id, -rp.pid - 1)
        cur = best.get(key)
        if cur is None or (rp.create_time, rp.pid) < (cur.create_time, cur.pid):
            best[key] = rp
    return sorted(best.values(), key=lambda rp: (rp.identity.job_id, rp.identity.rank, rp.pid))

