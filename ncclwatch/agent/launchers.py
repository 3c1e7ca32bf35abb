"""What a process is, from outside: a launcher, a helper, a torch process.

Launchers (torchrun, mpirun, deepspeed, ``accelerate launch``, srun, ...)
often carry the very variables their workers are identified by (SLURM_PROCID
under srun, MASTER_ADDR exported by the user) and import torch themselves,
so they are recognised by their command line, from the table below, and
never taken for ranks. A rank is a Python process that loaded torch: its
memory map shows ``torch/_C``; ``srun hostname`` or a bash batch script never
does. ``mp.spawn`` workers show their spawn index only in torch's
``_wrap(fn, i, ...)`` frame, read once with py-spy ``--locals``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from dataclasses import dataclass

from ncclwatch.agent import caps
from ncclwatch.agent.pyspy import PySpyError, locals_sync

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Launcher:
    """How a launcher's own process looks in ``ps``.

    programs: basenames of the executable or, for a Python launcher, of the
    script Python runs; modules: ``python -m`` module names; code: text in a
    ``python -c`` program; subcommand: a word the command line must also hold
    (``accelerate launch``, not ``accelerate config``).
    """

    name: str
    programs: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    code: tuple[str, ...] = ()
    subcommand: str = ""


#: Processes that start ranks (or help them) and are never ranks themselves.
LAUNCHERS: tuple[Launcher, ...] = (
    Launcher("torchrun", programs=("torchrun",),
             modules=("torch.distributed.run", "torch.distributed.launch")),
    Launcher("deepspeed", programs=("deepspeed", "ds"),
             modules=("deepspeed.launcher.runner", "deepspeed.launcher.launch")),
    Launcher("accelerate", programs=("accelerate",),
             modules=("accelerate.commands.launch", "accelerate.commands.accelerate_cli"),
             subcommand="launch"),
    Launcher("accelerate", programs=("accelerate-launch",)),
    Launcher("lightning", programs=("lightning", "fabric"), subcommand="run"),
    Launcher("openmpi", programs=("mpirun", "mpiexec", "orterun", "orted", "prterun", "prted",
                                  "prun", "mpirun.openmpi", "mpiexec.openmpi")),
    Launcher("hydra", programs=("mpiexec.hydra", "mpiexec.mpich", "mpirun.mpich",
                                "hydra_pmi_proxy", "mpiexec.intel")),
    Launcher("slurm", programs=("srun", "slurmstepd", "sbatch", "salloc")),
    # Helpers a rank starts with its own environment (no torch: never ranks,
    # listed so they are settled at once instead of re-read each round).
    Launcher("multiprocessing", code=("multiprocessing.resource_tracker",
                                      "multiprocessing.forkserver")),
)

#: ``python -c`` program of a ``multiprocessing`` spawn child: ``mp.spawn``
#: workers, and DataLoader workers with the spawn start method.
SPAWN_CHILD = "multiprocessing.spawn import spawn_main"
#: torch's per-worker entry point in ``torch/multiprocessing/spawn.py``.
SPAWN_WRAP = ("_wrap", "torch/multiprocessing/spawn.py")


def _is_python(arg0: str) -> bool:
    return os.path.basename(arg0).startswith("python")


#: Launcher processes whose command line names the whole job, the same on
#: every node: program -> (name, flag of the job's address, flag of its group).
#: Hydra starts one ``hydra_pmi_proxy`` per node, each told mpiexec's
#: control port and the process group id: an MPICH job across nodes is one job.
JOB_WIDE: dict[str, tuple[str, str, str]] = {
    "hydra_pmi_proxy": ("hydra", "--control-port", "--pgid"),
}
_ADDRESS = re.compile(r"[A-Za-z0-9._\-\[\]:]{1,200}\Z")


def job_wide_id(cmdline: list[str]) -> str | None:
    """``hydra/<control host:port>/<pgid>`` for a JOB_WIDE launcher, else None."""
    row = JOB_WIDE.get(os.path.basename(cmdline[0])) if cmdline else None
    if row is None:
        return None
    name, addr_flag, group_flag = row
    args = dict(zip(cmdline[1:], cmdline[2:]))
    addr, group = args.get(addr_flag, ""), args.get(group_flag, "")
    if not _ADDRESS.match(addr) or not (group.isascii() and group.isdigit() and len(group) < 10):
        return None
    return f"{name}/{addr}/{group}"


def launcher_of(cmdline: list[str]) -> str | None:
    """The LAUNCHERS row this command line is, or None."""
    if not cmdline:
        return None
    prog, module, code = os.path.basename(cmdline[0]), "", ""
    args = cmdline[1:]
    if _is_python(cmdline[0]):
        prog = ""
        for i, a in enumerate(args):
            if a == "-m" and i + 1 < len(args):
                module = args[i + 1]
                break
            if a == "-c" and i + 1 < len(args):
                code = args[i + 1]
                break
            if not a.startswith("-"):
                prog = os.path.basename(a)
                break
    for row in LAUNCHERS:
        hit = (prog and prog in row.programs) or (module and module in row.modules) or (
            code and any(c in code for c in row.code))
        if hit and (not row.subcommand or row.subcommand in args):
            return row.name
    return None


def is_spawn_child(cmdline: list[str]) -> bool:
    """``python [interpreter flags] -c '<SPAWN_CHILD>...' --multiprocessing-fork``."""
    for i, a in enumerate(cmdline[1:-1], 1):
        if a == "-c":
            return SPAWN_CHILD in cmdline[i + 1]
        if not a.startswith("-"):
            return False
    return False


def read_maps(pid: int, proc: str = "/proc") -> str | None:
    """The rank's mappings, at most caps.MAPS_BYTES of them (counted when cut)."""
    try:
        with open(f"{proc}/{pid}/maps", errors="surrogateescape") as f:
            text = f.read(caps.MAPS_BYTES + 1)
    except OSError:
        return None
    if len(text) > caps.MAPS_BYTES:
        caps.COUNTS.hit("maps_bytes")
        text = text[:text.rfind("\n", 0, caps.MAPS_BYTES) + 1]
    return text


def torch_loaded(maps: str) -> bool:
    """torch's Python extension is mapped: a Python process that imported torch."""
    return "/torch/_C." in maps


def python_loaded(maps: str, exe: str) -> bool:
    return _is_python(exe) or "libpython" in maps


def spawn_index(pid: int, pyspy: str | None, timeout: float = 2.0) -> tuple[int | None, bool]:
    """(``i`` of torch's ``_wrap(fn, i, ...)`` frame or None, whether that is final).

    One ``py-spy dump --locals --nonblocking`` (never pauses the process). Not
    final while the child still bootstraps (unpickling its target, importing
    the user's module) or py-spy failed: the caller may look again later.
    "Running some other target" is final, so it is read twice, a moment
    apart: a nonblocking read of a running process can miss a frame, and a
    rank once taken for a non-worker keeps the identity its environment
    gives it (a worker of mp.spawn under srun read as the srun task, CI).
    """
    if pyspy is None:
        return None, True
    index, final = _dump_index(pid, pyspy, timeout)
    if index is None and final:
        time.sleep(CONFIRM_DELAY)
        index, final = _dump_index(pid, pyspy, timeout)
    return index, final


#: Seconds between the two reads that find no ``_wrap`` under a running target.
CONFIRM_DELAY = 0.2


def _dump_index(pid: int, pyspy: str, timeout: float) -> tuple[int | None, bool]:
    try:
        stdout = locals_sync(pyspy, pid, timeout)
    except PySpyError as e:
        log.debug("py-spy --locals on pid %d: %s", pid, e)
        return None, False
    try:
        threads = json.loads(stdout)
    except ValueError:
        return None, False
    return wrap_index(threads)


#: The frame a multiprocessing child runs its target in: once it is on the
#: stack without SPAWN_WRAP, the child is no mp.spawn worker (``_bootstrap``
#: alone is not enough: the child may not have called its target yet).
RUN = ("run", "multiprocessing/process.py")


def wrap_index(threads: list[dict]) -> tuple[int | None, bool]:
    """(spawn index, final) from a py-spy ``--json --locals`` dump (pure, for tests)."""
    running = False
    for t in threads:
        for fr in t.get("frames", ()):
            name, path = fr.get("name", ""), fr.get("filename", "")
            if name == SPAWN_WRAP[0] and path.endswith(SPAWN_WRAP[1]):
                for var in fr.get("locals") or ():
                    if var.get("name") == "i":
                        try:
                            return int(var.get("repr", "")), True
                        except ValueError:
                            return None, False
                return None, False  # its locals not read this time: look again
            if name.rsplit(".", 1)[-1] == RUN[0] and path.endswith(RUN[1]):
                running = True
    return None, running
