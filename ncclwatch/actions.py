"""The commands that act on a stalled job, in the job's own terms (data).

advice.py says what to do now; this says how, where the job runs: a Slurm
job is reached with ``srun --overlap`` and stopped with ``scancel``, a pod
with ``kubectl``, a job started by hand on a host through its pids. The
commands are shown for an operator to run; ncclwatch runs none of them.
Every value filled in comes from what the agent observed (a rank's pod name
is its own text), so each is quoted for the shell, and none is ever put in a
comment (a newline in it would end the comment): a pasted command runs what
it shows, never what a rank chose.
"""

from __future__ import annotations

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

    @property
    def pipe(self) -> str:
        """The culprit's Flight Recorder pipe (torch: <stem><global rank>.pipe)."""
        return f"{self.pipe_stem}{self.rank}.pipe"


Command = Callable[[Facts], str]


@dataclass(frozen=True)
class Platform:
    """Where a job runs and how each step is done there."""

    name: str
    #: Whether the job runs here, from its facts.
    applies: Callable[[Facts], bool]
    #: step -> the command, every observed value quoted for the shell.
    commands: Mapping[str, Command]


q = shlex.quote


def _on(f: Facts, remote: str) -> str:
    """``remote`` (already quoted for the node's shell) run on the culprit's node."""
    return f"ssh {q(f.node)} {q(remote)}"


def _srun(f: Facts, argv: str) -> str:
    return f"srun --jobid={q(f.slurm_job)} --overlap -w {q(f.node)} -N1 -n1 {argv}"


def evidence(f: Facts) -> str:
    """``ncclwatch dump``: the one step that asks the daemon, not the job's platform."""
    return f"ncclwatch dump {q(f.job_id)}"


#: First match wins; the last applies to every job.
PLATFORMS: tuple[Platform, ...] = (
    Platform("slurm", lambda f: bool(f.slurm_job), {
        "evidence": evidence,
        "flight_recorder": lambda f: _srun(f, f"sh -c {q('echo 1 > ' + q(f.pipe))}"),
        "stacks": lambda f: _srun(f, f"py-spy dump --native --pid {f.pid}"),
        "logs": lambda f: f"scontrol show job {q(f.slurm_job)} | grep -E 'StdOut|StdErr'",
        "stop": lambda f: (f"scancel --signal=TERM --full {q(f.slurm_job)}   "
                           "# still there after a minute: the same without --signal"),
    }),
    Platform("kubernetes", lambda f: bool(f.pod and f.namespace), {
        "evidence": evidence,
        "flight_recorder": lambda f: (f"kubectl -n {q(f.namespace)} exec {q(f.pod)} -- "
                                      f"sh -c {q('echo 1 > ' + q(f.pipe))}"),
        "stacks": lambda f: (f"kubectl -n {q(f.namespace)} exec {q(f.pod)} -- "
                             f"py-spy dump --native --pid {f.container_pid or f.pid}   "
                             f"# py-spy in the image, and SYS_PTRACE; else ncclwatch's "
                             f"stacks on the daemon page"),
        "logs": lambda f: (f"kubectl -n {q(f.namespace)} logs {q(f.pod)} --all-containers "
                           f"--timestamps --tail=2000"),
        "stop": lambda f: (f"kubectl -n {q(f.namespace)} delete $(kubectl -n {q(f.namespace)} "
                           f"get pod {q(f.pod)} -o jsonpath="
                           "'{.metadata.ownerReferences[0].kind}/"
                           "{.metadata.ownerReferences[0].name}') --wait=false   "
                           "# the job that owns the pod: its pods get their grace period"),
    }),
    Platform("host", lambda f: True, {
        "evidence": evidence,
        "flight_recorder": lambda f: _on(f, f"echo 1 > {q(f.pipe)}"),
        "stacks": lambda f: _on(f, f"py-spy dump --native --pid {f.pid}"),
        "logs": lambda f: _on(f, f"ls -l /proc/{f.pid}/fd/1 /proc/{f.pid}/fd/2") + (
            "   # where the rank writes its output"),
        "stop": lambda f: _on(f, f"kill -TERM $(ps -o ppid= -p {f.pid})") + (
            "   # the rank's launcher (torchrun) stops every rank it started"),
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
        if step == "flight_recorder" and (not f.pipe_stem or f.rank < 0):
            cmd = ("# not enabled for this job: TORCH_NCCL_DEBUG_INFO_PIPE_FILE is unset "
                   "(set it, with TORCH_NCCL_TRACE_BUFFER_SIZE, for the next run)")
        else:
            cmd = p.commands[step](f)
        out.append({"step": step, "what": what, "platform": p.name, "command": cmd})
    return out


#: Placeholders for the runbooks' table (shell-safe words: quoting leaves them).
EXAMPLE = Facts(job_id="JOB", rank=0, node="NODE", pid=12345, slurm_job="SLURM_JOB_ID",
                namespace="NAMESPACE", pod="POD", pipe_stem="/tmp/nccl_pipe_",
                container_pid=1)


def reference() -> list[tuple[str, str, str]]:
    """(platform, step, command for EXAMPLE) of every platform: the runbooks' table."""
    return [(p.name, step, p.commands[step](EXAMPLE)) for p in PLATFORMS for step in STEPS]
