"""One row of the scenario matrix run against a live ncclwatch, and the verdict table.

``run_scenario`` launches the row's job (its launcher, its storage: a throttlefs
mount where the row paces writes), polls the API for the verdict (first stall
kind, culprits, root cause, at-risk, evidence, the detection delay from the
row's start marker and the lead time before the watchdog), watches the ranks
for pauses, and returns an ``Outcome`` whose ``problems`` are what the row got
wrong. ``table`` prints outcomes as the matrix's table.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.pausewatch import PauseWatch
from tests.harness.jobs import Job
from tests.harness.launchers import LAUNCHERS, World, launch
from tests.harness.monitor import Monitor
from tests.harness.paths import ARTIFACTS, WORKLOADS
from tests.harness.procs import Proc
from tests.harness.scenarios import Scenario
from tests.harness.throttlefs import mounted

POLL = 0.5
#: Seconds a row waits after its verdict for the outcome of a stall that already
#: ended (the daemon decides it incidents.SETTLE seconds after the end).
OUTCOME_WAIT = 8.0
#: Seconds a row's ranks have to print their ready line.
START_WITHIN = 300.0


@dataclass
class Outcome:
    scenario: Scenario
    job_id: str = ""
    #: The job's source as the API names it (``/api/v1/jobs`` ``source``).
    job_source: str = ""
    first_kind: str | None = None
    kinds_seen: list[str] = field(default_factory=list)
    culprits: tuple[int, ...] = ()
    states: tuple[str, ...] = ()
    #: How the first stall's waiting ranks were established when it was first
    #: detected (later evidence may confirm it: stillness, then flight_recorder),
    #: every way seen since, and the ops at first detection.
    evidence: tuple[str, ...] = ()
    evidence_seen: tuple[str, ...] = ()
    ops: tuple[str, ...] = ()
    confirmed_at: float | None = None     # first time Scenario.confirmed_by was seen
    ops_seen: tuple[str, ...] = ()
    root_cause: str | None = None
    #: The framework whose fix the stall gives, and the advice for now (issue 22).
    framework: str | None = None
    advice: str | None = None
    unknown: tuple[int, ...] = ()
    at_risk_at: float | None = None
    overrun_at: float | None = None       # first time the forecast overrun was > 0
    overrun_at_flag: float | None = None
    remaining_at_flag: float | None = None
    detected_at: float | None = None
    start_t: float | None = None
    wait_t: float | None = None
    returncode: int | None = None
    error: str = ""
    #: Pauses of the job's ranks while watched (bench/pausewatch.py summary).
    pauses: dict | None = None
    #: Stalls that ended while the row ran: (kind, outcome, the first save
    #: forecast's verdict, right, its end's error in seconds), as the daemon scored it.
    scored: list[tuple] = field(default_factory=list)
    #: Wall seconds of the row, from its launch to its job stopped (a row ends
    #: at its verdict: the stall named and settled, or a healthy job's end).
    wall: float | None = None

    @property
    def delay(self) -> float | None:
        if self.detected_at is None or self.start_t is None:
            return None
        return self.detected_at - self.start_t

    @property
    def lead(self) -> float | None:
        if self.detected_at is None:
            return None
        base = self.wait_t if self.wait_t is not None else self.start_t
        return None if base is None else base + self.scenario.pg_timeout - self.detected_at

    @property
    def flag_delay(self) -> float | None:
        if self.at_risk_at is None or self.start_t is None:
            return None
        return self.at_risk_at - self.start_t

    @property
    def forecast_delay(self) -> float | None:
        """Seconds from the start marker to the first positive overrun forecast."""
        if self.overrun_at is None or self.start_t is None:
            return None
        return self.overrun_at - self.start_t

    def problems(self) -> list[str]:
        s, out = self.scenario, []
        if self.error:
            return [self.error]
        want = expected_source(s)
        if want is not None and self.job_source != want:
            out.append(f"job source {self.job_source or '-'} != {want} ({self.job_id})")
        if s.kind is None:
            if self.kinds_seen:
                out.append(f"false alarm: {self.kinds_seen}")
            if self.returncode not in (0, None):
                out.append(f"healthy job exited {self.returncode}")
        if s.healthy:
            lost = [x[1] for x in self.scored if x[1] not in (None, "completed")]
            if lost:
                out.append(f"a stall of a healthy job ended {lost}")
        else:
            if self.first_kind != s.kind:
                out.append(f"kind {self.first_kind} != {s.kind}")
            extra = set(self.kinds_seen) - {s.kind, *s.then}
            if extra:
                out.append(f"unexpected kinds {sorted(extra)}")
            if self.first_kind == s.kind and self.culprits != s.culprits:
                out.append(f"culprits {list(self.culprits)} != {list(s.culprits)}")
            if (self.first_kind == s.kind and s.root_cause is not None
                    and self.root_cause not in s.root_causes):
                out.append(f"root cause {self.root_cause} != {s.root_cause}")
            if s.state and self.first_kind == s.kind and set(self.states) != {s.state}:
                out.append(f"culprit state {list(self.states)} != {s.state}")
            if s.detect_within is not None and (self.delay is None
                                                or self.delay > s.detect_within):
                out.append(f"detected {_fmt(self.delay)}s after {s.start} "
                           f"(> {s.detect_within}s)")
            # The expected evidence must be seen; at first detection only it, or
            # stillness (provisional) that it then confirms.
            if s.evidence and self.first_kind == s.kind and (
                    not set(s.evidence) <= set(self.evidence_seen)
                    or not set(self.evidence) <= {*s.evidence, "stillness"}):
                out.append(f"evidence {list(self.evidence)} then {list(self.evidence_seen)}"
                           f" lacks or goes beyond {list(s.evidence)}")
            if s.ops and self.first_kind == s.kind and not set(s.ops) <= set(self.ops_seen):
                out.append(f"waiting ops {list(self.ops_seen)} lack {list(s.ops)}")
            if s.confirmed_by and s.confirmed_by not in self.evidence_seen:
                out.append(f"never confirmed by {s.confirmed_by} (saw {list(self.evidence_seen)})")
            if s.framework and self.first_kind == s.kind and (
                    self.framework != s.framework or not self.advice):
                out.append(f"fix for {self.framework} (advice {self.advice}) != {s.framework}")
            if not set(s.unknown) <= set(self.unknown):
                out.append(f"unknown ranks {list(self.unknown)} lack {list(s.unknown)}")
        if s.at_risk is True and self.at_risk_at is None:
            out.append("never flagged at risk")
        if s.at_risk is False and self.at_risk_at is not None:
            out.append("false alarm: flagged at risk")
        if s.no_pause and (self.pauses is None or self.pauses["pauses"]):
            out.append("never watched for pauses" if self.pauses is None else
                       f"{self.pauses['pauses']} pause(s) of healthy ranks "
                       f"({self.pauses['native_dumps']} native dumps, "
                       f"{self.pauses['paused_seconds']:.1f} s; per rank "
                       f"{self.pauses['per_rank']})")
        if s.forecast_overrun:
            if self.flag_delay is None or self.flag_delay > s.forecast_within:
                out.append(f"overrun flagged after {self.flag_delay}s (> {s.forecast_within}s)")
            if self.forecast_delay is None or self.forecast_delay > s.forecast_within:
                out.append(f"overrun forecast after {self.forecast_delay}s "
                           f"(> {s.forecast_within}s)")
            if not (self.overrun_at_flag or 0) > 0:
                out.append(f"forecast overrun at flag {self.overrun_at_flag} not > 0")
            if (self.remaining_at_flag or 0) < s.pg_timeout / 2:
                out.append(f"only {self.remaining_at_flag}s of budget left when flagged")
        return out


def _launch(s: Scenario, ckpt_dir: str, work: str) -> Job:
    if s.script:
        program = (str(WORKLOADS / s.script), "--ckpt-dir", ckpt_dir,
                   "--pg-timeout", str(int(s.pg_timeout)), *s.args)
    else:
        program = ("-m", "ncclwatch.demo.job", *s.args, "--ckpt-dir", ckpt_dir)
    started = launch(s.launcher, World(s.world, program, work, s.name))
    env = {"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1",
           "NCCLWATCH_PG_TIMEOUT_S": str(s.pg_timeout), **started.env,
           **{k: v.replace("{ckpt}", ckpt_dir) for k, v in s.env}}
    if s.script in JIT_BUILDERS:
        env["TORCH_EXTENSIONS_DIR"] = str(jit_extensions())
    return Job(Proc(started.argv, env=env, name=f"scenario-{s.name}"), s.world)


#: Workloads whose ranks JIT-build a C++ op at start (DeepSpeed's shared-memory
#: comm op, in init_distributed) through torch's FileBaton: a build killed midway
#: (a row stopped at its limit) leaves its ``lock`` file, and every later start
#: waits on it forever (seen: 'job did not start' twice in a row).
JIT_BUILDERS = frozenset({"fw_deepspeed.py"})


def jit_extensions() -> Path:
    """This venv's torch extensions folder (a fresh venv builds afresh), without
    the locks of builds that died: one such row runs at a time, so any lock
    there when it starts is a dead build's."""
    root = Path(sys.prefix) / "torch_extensions"
    root.mkdir(exist_ok=True)
    for lock in [*root.glob("*/lock"), *root.glob("*/*/lock")]:
        lock.unlink(missing_ok=True)
    return root


def expected_source(s: Scenario) -> str | None:
    """The job source the row must show: its own, else its launcher's."""
    return s.job_source or LAUNCHERS[s.launcher].job_source


def _first(job: Job, phases: tuple[str, ...]) -> float | None:
    ts = [m["t"] for p in phases for m in job.markers(p)]
    return min(ts) if ts else None


def _ckpt_dir(s: Scenario):
    """Rows with a storage rate write to a throttlefs mount, the others to a temp dir."""
    if s.write_rate is not None or s.read_rate is not None:
        return mounted(s.write_rate, s.read_rate)
    return tempfile.TemporaryDirectory(prefix=f"ncclwatch-{s.name}-")


def run_scenario(mon: Monitor, s: Scenario) -> Outcome:
    out = Outcome(s)
    t0 = time.time()
    with _ckpt_dir(s) as ckpt, tempfile.TemporaryDirectory(prefix="ncclwatch-work-") as work:
        job = _launch(s, str(getattr(ckpt, "mount", ckpt)), work)
        try:
            _observe(mon, s, job, out)
        except Exception as e:  # noqa: BLE001 - one broken scenario must not hide the rest
            out.error = f"{type(e).__name__}: {e}"
        finally:
            out.returncode = job.proc.popen.poll()
            job.proc.stop(signal.SIGTERM)
            ARTIFACTS.mkdir(exist_ok=True)
            (ARTIFACTS / f"{job.proc.name}.log").write_text(job.proc.output())
    out.wall = time.time() - t0
    return out


def _observe(mon: Monitor, s: Scenario, job: Job, out: Outcome) -> None:
    # Start-up is imports, mostly: DeepSpeed's ranks once printed nothing for 150 s
    # beside three other rows and the unit tests (load 13-18); a row that starts is
    # over at its verdict, so a wide bound costs nothing.
    # (a JIT build first, in a fresh venv: twice that)
    deadline = time.time() + START_WITHIN * (2 if s.script in JIT_BUILDERS else 1)
    while len(job.markers("ready")) < s.world:
        if time.time() > deadline or not job.proc.alive():
            out.error = f"job did not start: {job.proc.output()[-1500:]}"
            return
        time.sleep(0.2)
    pids = job.pids()
    by_rank = {m["rank"]: m["pid"] for m in job.markers("ready")}
    watch = PauseWatch(by_rank).start()  # every row's ranks; no_pause rows must show none
    try:
        _watch(mon, s, job, out, pids, by_rank)
    finally:
        # this monitor's py-spys only (another agent on a shared machine is not ours)
        out.pauses = watch.stop().summary(by=mon.procs[0].popen.pid)


def _watch(mon: Monitor, s: Scenario, job: Job, out: Outcome, pids: set[int],
           by_rank: dict[int, int]) -> None:
    end = time.time() + s.limit
    settle_until = None
    while time.time() < end:
        if out.start_t is None and job.markers(s.start):
            if s.kill_rank is not None:
                os.kill(by_rank[s.kill_rank], signal.SIGKILL)
                out.start_t = time.time()
            else:
                out.start_t = _first(job, (s.start,))
        if out.wait_t is None:
            out.wait_t = _first(job, ("wait_start", "gather_start"))
        view = mon.job_of(pids)
        now = time.time()
        if view is not None:
            out.job_id, out.job_source = view["job"], view.get("source", "")
            _fold(view, out, now)
        if not job.proc.alive():
            break
        if settle_until is None and _settled(s, out):
            settle_until = now + 2.0
        if settle_until is not None and now >= settle_until:
            break
        time.sleep(POLL)
    if out.job_id == "":
        out.error = "ncclwatch never saw the job"
    else:
        _score(mon, out)


def _score(mon: Monitor, out: Outcome) -> None:
    """The outcome of each stall that ended while the row ran, and its save
    forecast scored against it (no wait where none ended)."""
    deadline = time.time() + OUTCOME_WAIT
    while True:
        ended = [e for e in json.loads(mon.get("/api/v1/jobs")).get("ended", [])
                 if e["job"] == out.job_id]
        if all(e.get("outcome") for e in ended) or time.time() > deadline:
            break
        time.sleep(POLL)
    for e in ended:
        sc = e.get("forecast_score") or {}
        out.scored.append((e["kind"], (e.get("outcome") or {}).get("outcome"),
                           sc.get("verdict"), sc.get("right"), sc.get("error_seconds")))


def _scored(o: Outcome) -> str:
    """outcome, and the forecast's verdict scored: 'completed: ends_in_time right (+2.1s)'."""
    parts = []
    for kind, outcome, verdict, right, err in o.scored:
        score = "" if verdict is None else f" {verdict} {'right' if right else 'wrong'}" + (
            "" if err is None else f" ({err:+.1f}s)")
        parts.append(f"{outcome or 'undecided'}{':' + score if score else ''}")
    return "; ".join(parts) or "-"


def _fold(view: dict, out: Outcome, now: float) -> None:
    for st in view["stalls"]:
        kind = st["kind"]
        if kind not in out.kinds_seen:
            out.kinds_seen.append(kind)
        if out.first_kind is None:
            out.first_kind, out.detected_at = kind, now
        if kind == out.first_kind:
            out.culprits = tuple(c["rank"] for c in st["culprits"])
            out.states = tuple(c["state"] for c in st["culprits"])
            ev = tuple(sorted((st["waiting"].get("evidence") or {})))
            if out.detected_at == now:
                out.evidence, out.ops = ev, tuple(st["waiting"]["ops"])
            out.evidence_seen = tuple(sorted({*out.evidence_seen, *ev}))
            out.ops_seen = tuple(sorted({*out.ops_seen, *st["waiting"]["ops"]}))
            if out.confirmed_at is None and out.scenario.confirmed_by in ev:
                out.confirmed_at = now
            out.root_cause = st["diagnosis"]["root_cause"]
            out.framework = (st["diagnosis"].get("framework") or {}).get("id")
            out.advice = (st.get("advice") or {}).get("action")
            out.unknown = tuple(st["unknown_ranks"])
        over = ((st.get("forecast") or {}).get("checkpoint") or {}).get("overrun_seconds")
        if over is not None and over > 0 and out.overrun_at is None:
            out.overrun_at = now
        if st["at_risk"] and out.at_risk_at is None:
            out.at_risk_at = now
            ck = (st.get("forecast") or {}).get("checkpoint") or {}
            out.overrun_at_flag = ck.get("overrun_seconds")
            out.remaining_at_flag = st["watchdog"]["remaining_seconds"]


def _settled(s: Scenario, out: Outcome) -> bool:
    """The verdict cannot change any more in a way the expectation cares about."""
    if s.kind is None or s.at_risk is False:
        return False  # healthy: watch until the job ends
    if out.first_kind is None:
        return False
    if s.at_risk and out.at_risk_at is None:
        return False
    if s.confirmed_by and s.confirmed_by not in out.evidence_seen:
        return False
    if not set(s.evidence) <= set(out.evidence_seen):
        return False
    return out.root_cause in s.root_causes or time.time() - out.detected_at > 20


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _pauses(p: dict | None) -> str:
    """Pauses of the job's ranks: count and seconds (native dumps among them)."""
    return "-" if p is None else f"{p['pauses']} / {p['paused_seconds']:.1f}s"


def table(outcomes: list[Outcome]) -> str:
    head = ["scenario", "ranks", "launcher: job source", "expected", "detected", "culprits", "state", "evidence",
            "root cause", "fix for / now", "at risk", "delay s", "goal s", "lead s", "forecast s",
            "pauses", "ended: forecast scored", "row s", "result"]
    rows = []
    for o in outcomes:
        s = o.scenario
        expected = (s.kind or "none") + (f" [{','.join(map(str, s.culprits))}]"
                                          if s.culprits else "")
        problems = o.problems()
        rows.append([s.name, str(s.world), f"{s.launcher}: {o.job_source or '-'}", expected, o.first_kind or "none",
                     ",".join(map(str, o.culprits)) or "-", ",".join(o.states) or "-",
                     ",".join(o.evidence_seen) or "-", o.root_cause or "-",
                     f"{o.framework or '-'} / {o.advice or '-'}",
                     "yes" if o.at_risk_at else "no", _fmt(o.delay), _fmt(s.goal),
                     _fmt(o.lead), _fmt(o.forecast_delay), _pauses(o.pauses), _scored(o),
                     _fmt(o.wall), "ok" if not problems else "FAIL: " + "; ".join(problems)])
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
    return "\n".join([line(head), line(["-" * w for w in widths]), *map(line, rows)])
