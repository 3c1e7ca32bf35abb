"""The commands that act on a stalled job, in the job's own terms (data).

advice.py says what to do now; this says how, where the job runs: a Slurm
job is reached with ``srun --overlap`` and stopped with ``scancel``, a pod
with ``kubectl``, a job started by hand on a host through its pids. The
commands are shown for an operator to run; ncclwatch runs none of them.
Every value filled in comes from what the agent observed (a rank's pod name
is its own text, its SLURM_JOB_ID its own choice), so each must first match
the grammar of what it stands for (``GRAMMARS``: a Slurm job id is digits, a
pod name a DNS name, a pid a number above 1): a value that does not leaves
its step with no command, saying which value is not usable. A pid is more
than a number: the page may be read long after the rank's process exited and
its pid was given to another, so each command that names a pid runs under
``_same``, a POSIX sh guard that acts only while the pid still names the
process the agent saw (its start time, and its uid where known), and a pid
whose start time is not known gets no command at all. Quoting keeps a
value one word; the grammar keeps it from being an option (``--state=RUNNING``
as a job id would make ``scancel`` signal every running job), and options
are ended with ``--`` where the tool reads it. No value is ever put in a
comment (a newline in it would end the comment): a pasted command runs what
it shows, never what a rank chose.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Callable, Mapping

#: The steps of acting on a stall, in the order to take them. The first is the
#: same everywhere (EVIDENCE); each platform says how to take the others.
STEPS: dict[str, str] = {
    "evidence": "every rank's stacks, the Flight Recorder, the environment and the verdict "
                "in one archive, before anything is stopped (`ncclwatch diagnose` reads it)",
    "flight_recorder": "Flight Recorder dump of the culprit (each rank writes its own file)",
    "stacks": "the culprit's Python and native stacks (pauses that one rank for the unwind)",
    "logs": "the job's output",
    "stop": "stop the job cleanly (SIGTERM first, so ranks can flush and exit)",
}


@dataclass(frozen=True)
class Facts:
    """What the daemon knows of a stalled job that its commands need."""

    job_id: str
    rank: int
    node: str
    pid: int
    slurm_job: str = ""
    namespace: str = ""
    pod: str = ""
    #: TORCH_NCCL_DEBUG_INFO_PIPE_FILE of the job ("": not set, no pipe).
    pipe_stem: str = ""
    #: The rank's pid inside its container (the pod's view), 0: on the host.
    container_pid: int = 0
    #: Its process's start as /proc/PID/stat field 22 shows it (clock ticks
    #: after boot; 0: not known) and the uid owning /proc/PID (-1: not
    #: known), as the agent read them: the process the commands' pid must
    #: still name.
    start_ticks: int = 0
    uid: int = -1

    @property
    def pipe(self) -> str:
        """The culprit's Flight Recorder pipe (torch: <stem><global rank>.pipe)."""
        return f"{self.pipe_stem}{self.rank}.pipe"


Command = Callable[[Facts], str]

_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_DNS_LABEL = r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?"
#: Linux's largest pid (pid_max's ceiling, 2^22).
PID_MAX = 4_194_304
#: Numeric fields -> (least, most): a value in grammar must also lie in range.
#: pid 1 is never a rank's; a start of 0 is "not known" (``commands``); a uid
#: of -1 is "not known" (no uid check, ``unusable`` skips it).
RANGES: dict[str, tuple[int, int]] = {
    "pid": (2, PID_MAX), "container_pid": (0, PID_MAX),
    "start_ticks": (0, 2**64 - 1), "uid": (0, 2**32 - 2),
}

#: Field -> (what it stands for, its grammar): a value placed in a command must
#: match all of it. Names as their tools define them: Slurm job ids (an array
#: task ``123_4``, a step ``123.0``; scancel(1)), host names (RFC 1123, which
#: never start with ``-``), Kubernetes namespaces (a DNS label) and pod names
#: (a DNS subdomain), pids (2..PID_MAX: pid 1 is never a rank's), and the
#: Flight Recorder pipe (an absolute path of plain characters, no ``..``).
GRAMMARS: dict[str, tuple[str, re.Pattern[str]]] = {
    "slurm_job": ("a Slurm job id", re.compile(r"[0-9]{1,10}(?:_[0-9]{1,10})?(?:\.[0-9]{1,10})?")),
    "node": ("a host name", re.compile(rf"(?=.{{1,253}}$){_LABEL}(?:\.{_LABEL})*")),
    "namespace": ("a Kubernetes namespace", re.compile(_DNS_LABEL)),
    "pod": ("a Kubernetes pod name", re.compile(rf"(?=.{{1,253}}$){_DNS_LABEL}(?:\.{_DNS_LABEL})*")),
    "pid": ("a process id", re.compile(r"[1-9][0-9]{0,6}")),
    "container_pid": ("a process id in the container", re.compile(r"[0-9]{1,7}")),
    "pipe": ("an absolute path", re.compile(r"(?!.*(?:^|/)\.\.(?:/|$))/[A-Za-z0-9._/+-]{1,4095}")),
    "start_ticks": ("a process start time", re.compile(r"[0-9]{1,20}")),
    "uid": ("a user id", re.compile(r"[0-9]{1,10}")),
}


def unusable(f: Facts, fields: tuple[str, ...]) -> str:
    """The first of ``fields`` whose value in ``f`` is out of its grammar, as
    "<field> is not <what it stands for>"; "" when every one fits."""
    for name in fields:
        what, grammar = GRAMMARS[name]
        raw = getattr(f, name)
        if name == "uid" and raw == -1 and type(raw) is int:
            continue                      # not known: the guard checks no uid
        value = str(raw)
        ok = grammar.fullmatch(value) is not None
        if ok and name in RANGES:
            ok = RANGES[name][0] <= int(value) <= RANGES[name][1]
        if not ok:
            return f"{name} is not {what}"
    return ""


@dataclass(frozen=True)
class Step:
    """One step's command: the observed values it places (checked against
    ``GRAMMARS`` first) and how it is built from them."""

    fields: tuple[str, ...]
    build: Command


@dataclass(frozen=True)
class Platform:
    """Where a job runs and how each step is done there."""

    name: str
    #: Whether the job runs here, from its facts.
    applies: Callable[[Facts], bool]
    #: step -> its command, every observed value checked and quoted for the shell.
    commands: Mapping[str, Step]


q = shlex.quote


def _on(f: Facts, remote: str) -> str:
    """``remote`` (already quoted for the node's shell) run on the culprit's node."""
    return f"ssh -- {q(f.node)} {q(remote)}"


def _srun(f: Facts, argv: str) -> str:
    return f"srun --jobid={q(f.slurm_job)} --overlap -w {q(f.node)} -N1 -n1 {argv}"


def _poke(pipe: str) -> str:
    """Write to the rank's debug-info pipe only if it is one (a FIFO): never
    create or fill a file the rank named."""
    return f"test -p {q(pipe)} && echo 1 > {q(pipe)}"


def evidence(f: Facts) -> str:
    """``ncclwatch dump``: the one step that asks the daemon, not the job's platform."""
    return f"ncclwatch dump -- {q(f.job_id)}"


#: The host's stop: TERM to the rank's parent (its launcher), never to pid 1 or
#: to the shell the parent is not. Run under ``_same``, whose ``pp`` is the
#: parent in the same read of /proc that showed the pid still the rank's: a
#: number above 1 (``-gt`` refuses anything else), so no option; no ``--``
#: either, which dash's builtin kill takes for a pid.
_HOST_STOP = "[ \"${pp:-1}\" -gt 1 ] && kill -s TERM \"$pp\""


def _same(f: Facts, pid: int, then: str, uid: bool = True) -> str:
    """A POSIX sh script (for ``sh -c``) that runs ``then`` only while ``pid``
    names the process the agent saw as the rank: its start, /proc/PID/stat
    field 22 (fields counted after the last ``") "``: the command name before
    it is the rank's own text, spaces and parentheses included, and globbing
    is off), and with ``uid`` its owner (/proc/PID's, as ``ls -n`` shows it).
    ``then`` finds the parent's pid (field 4 of the same read) in ``pp``.
    Else, a dead pid included, one line on stderr and exit 1, nothing run.
    Every value is a number by its grammar, quoted all the same."""
    p, ticks = q(str(pid)), q(str(f.start_ticks))
    own = uid and f.uid != -1          # in grammar (unusable) where it is checked
    return ("set -f; "
            + (f"set -- $(ls -nd /proc/{p} 2>/dev/null); u=$3; " if own else "")
            + f"s=$(cat /proc/{p}/stat 2>/dev/null); set -- ${{s##*\") \"}}; "
            f"pp=$2; if [ \"$#\" -ge 20 ] && shift 19 && [ \"$1\" = {ticks} ]"
            + (f" && [ \"$u\" = {q(str(f.uid))} ]" if own else "")
            + f"; then {then}; else echo \"not run: pid {p} no longer names the "
            f"process of rank {int(f.rank)}\" >&2; exit 1; fi")


def _sh(script: str) -> str:
    return f"sh -c {q(script)}"

#: The kinds of a pod's owner the Kubernetes stop deletes: the namespaced
#: objects a training job runs as. The owner reference is the pod's own text
#: (whoever creates a pod sets it: any kind, any name, spaces included), so
#: the stop deletes the owner only when its kind is one of these and its name
#: a plain object name, as one quoted word after ``--``: never a word-split
#: list of options, never a Namespace, a Node or anything cluster-wide.
OWNER_KINDS = ("Job", "JobSet", "PyTorchJob", "MPIJob", "TFJob", "TrainJob", "RayJob",
               "RayCluster", "LeaderWorkerSet", "StatefulSet")


def _kube_stop(f: Facts) -> str:
    ns = q(f.namespace)
    kinds = "|".join(f"{k}/*" for k in OWNER_KINDS)
    return (f"o=$(kubectl -n {ns} get pod -o jsonpath="
            "'{.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name}' "
            f"-- {q(f.pod)}) && case \"$o\" in {kinds}) ;; *) o= ;; esac && "
            "case \"${o#*/}\" in ''|-*|.*|*[!a-z0-9.-]*) "
            "echo 'not stopped: the pod is owned by no job by name' >&2; false ;; esac && "
            f"kubectl -n {ns} delete --wait=false -- \"$o\"   "
            "# the job that owns the pod: its pods get their grace period")


EVIDENCE = Step((), evidence)
#: A pid with the process it must still name (``_same``); in a pod, no uid:
#: a user namespace maps it to another number there.
NODE, PID, PIPE = ("node",), ("pid", "start_ticks", "uid"), ("pipe",)
POD_PID = ("pid", "start_ticks", "container_pid")

#: First match wins; the last applies to every job.
PLATFORMS: tuple[Platform, ...] = (
    Platform("slurm", lambda f: bool(f.slurm_job), {
        "evidence": EVIDENCE,
        "flight_recorder": Step(("slurm_job", *NODE, *PIPE),
                                lambda f: _srun(f, f"sh -c {q(_poke(f.pipe))}")),
        "stacks": Step(("slurm_job", *NODE, *PID), lambda f: _srun(f, _sh(_same(
            f, f.pid, f"exec py-spy dump --native --pid {q(str(f.pid))}")))),
        "logs": Step(("slurm_job",),
                     lambda f: f"scontrol show job {q(f.slurm_job)} | grep -E 'StdOut|StdErr'"),
        "stop": Step(("slurm_job",),
                     lambda f: (f"scancel --signal=TERM --full -- {q(f.slurm_job)}   "
                                "# still there after a minute: the same without --signal")),
    }),
    Platform("kubernetes", lambda f: bool(f.pod and f.namespace), {
        "evidence": EVIDENCE,
        "flight_recorder": Step(("namespace", "pod", *PIPE), lambda f: (
            f"kubectl -n {q(f.namespace)} exec {q(f.pod)} -- sh -c {q(_poke(f.pipe))}")),
        "stacks": Step(("namespace", "pod", *POD_PID), lambda f: (
            f"kubectl -n {q(f.namespace)} exec {q(f.pod)} -- " + _sh(_same(
                f, f.container_pid or f.pid,
                f"exec py-spy dump --native --pid {q(str(f.container_pid or f.pid))}",
                uid=False)) + "   "
            f"# py-spy in the image, and SYS_PTRACE; else ncclwatch's "
            f"stacks on the daemon page")),
        "logs": Step(("namespace", "pod"), lambda f: (
            f"kubectl -n {q(f.namespace)} logs --all-containers --timestamps "
            f"--tail=2000 -- {q(f.pod)}")),
        "stop": Step(("namespace", "pod"), _kube_stop),
    }),
    Platform("host", lambda f: True, {
        "evidence": EVIDENCE,
        "flight_recorder": Step((*NODE, *PIPE), lambda f: _on(f, _poke(f.pipe))),
        "stacks": Step((*NODE, *PID), lambda f: _on(f, _sh(_same(
            f, f.pid, f"exec py-spy dump --native --pid {q(str(f.pid))}")))),
        "logs": Step((*NODE, *PID), lambda f: _on(f, _sh(_same(
            f, f.pid, "exec ls -l /proc/{0}/fd/1 /proc/{0}/fd/2".format(q(str(f.pid))))))
            + "   # where the rank writes its output"),
        "stop": Step((*NODE, *PID), lambda f: _on(f, _sh(_same(
            f, f.pid, _HOST_STOP))) + (
            "   # the rank's launcher (torchrun) stops every rank it started")),
    }),
)


def platform_of(f: Facts) -> Platform:
    return next(p for p in PLATFORMS if p.applies(f))


def commands(f: Facts) -> list[dict[str, str]]:
    """The steps for this job, each with its command filled in and quoted.

    Without a Flight Recorder pipe (TORCH_NCCL_DEBUG_INFO_PIPE_FILE unset)
    that step says so instead: nothing on the node can make torch dump then.
    """
    p = platform_of(f)
    out = []
    for step, what in STEPS.items():
        cmd = ""
        if step == "flight_recorder" and (not f.pipe_stem or f.rank < 0):
            cmd = ("# not enabled for this job: TORCH_NCCL_DEBUG_INFO_PIPE_FILE is unset "
                   "(set it, with TORCH_NCCL_TRACE_BUFFER_SIZE, for the next run)")
        elif bad := unusable(f, p.commands[step].fields):
            cmd = f"# no command: the observed {bad}"
        elif "start_ticks" in p.commands[step].fields and not f.start_ticks:
            cmd = ("# no command: the pid cannot be checked (its process's start time "
                   "is not known, so it may name another process now)")
        else:
            cmd = p.commands[step].build(f)
        out.append({"step": step, "what": what, "platform": p.name, "command": cmd})
    return out


#: Placeholders for the runbooks' table (shell-safe words: quoting leaves them).
EXAMPLE = Facts(job_id="JOB", rank=0, node="NODE", pid=12345, slurm_job="SLURM_JOB_ID",
                namespace="NAMESPACE", pod="POD", pipe_stem="/tmp/nccl_pipe_",
                container_pid=1, start_ticks=4567890, uid=1000)


def reference() -> list[tuple[str, str, str]]:
    """(platform, step, command for EXAMPLE) of every platform: the runbooks' table."""
    return [(p.name, step, p.commands[step].build(EXAMPLE)) for p in PLATFORMS
            for step in STEPS]
