"""A real single-node Slurm cluster for the tests (munged, slurmctld, slurmd), and the
shipped TaskProlog run as slurmstepd runs it.

Everything lives in one fresh directory (key, sockets, state, spool, logs),
on free ports, so a run never touches /etc/slurm or /etc/munge and never
meets what an earlier run left behind. The daemons run in the foreground as
children that die with the test process (PR_SET_PDEATHSIG), so even a killed
pytest leaves none behind. Cgroups are off (proctrack/linuxproc, task/none):
CI machines and containers often have neither cgroup v2 delegation nor systemd.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from tests.harness.paths import ROOT
from tests.harness.procs import free_port

#: Daemons and clients the cluster needs: (command, Debian package).
BINARIES = (
    ("munged", "munge"), ("slurmctld", "slurmctld"), ("slurmd", "slurmd"),
    ("slurmstepd", "slurmd"), ("sbatch", "slurm-client"), ("srun", "slurm-client"),
    ("scontrol", "slurm-client"), ("sinfo", "slurm-client"), ("scancel", "slurm-client"),
)
SBIN_PATH = os.pathsep.join((os.environ.get("PATH", ""), "/usr/sbin", "/sbin"))

NODE = "ncclwatch1"
PARTITION = "debug"
#: Declared CPUs (the machine may have 2): config_overrides lets three jobs of
#: three tasks run side by side, as oversubscription.
CPUS = 16

SLURM_CONF = """\
ClusterName=ncclwatch
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser={user}
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig={dir}/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=2
MinJobAge=600
InactiveLimit=0
NodeName={node} NodeAddr=127.0.0.1 NodeHostname=localhost CPUs={cpus} State=UNKNOWN
PartitionName={partition} Nodes={node} Default=YES MaxTime=30 State=UP OverSubscribe=YES
"""


class SlurmError(RuntimeError):
    pass


def missing_binaries() -> list[str]:
    """'command (Debian package)' for each binary not installed."""
    return [f"{cmd} (Debian package {pkg})" for cmd, pkg in BINARIES
            if shutil.which(cmd, path=SBIN_PATH) is None]


PREFIX = "ncclwatch-slurm-"


def remove_stale(base: Path, min_age: float = 120.0) -> list[Path]:
    """Delete cluster directories of earlier runs whose controller is gone.

    Their daemons died with their test process (PDEATHSIG); slurmstepd and
    the job's tasks outlive slurmd, and are found by the SLURM_CONF slurmd gave
    them. A directory younger than ``min_age`` may belong to a run starting now.
    """
    removed = []
    for d in base.glob(PREFIX + "*"):
        pid = _read_pid(d / "slurmctld.pid")
        if d.is_dir() and time.time() - d.stat().st_mtime > min_age and not _held(d) and not (
                pid and _is_process(pid, "slurmctld")):
            kill_job_processes(d)
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    return removed


#: Held (flock) by the test process whose cluster lives in the directory. Its
#: pids may be in another pid namespace (a worker of ``make test``'s, nsinit.py),
#: where no pid check can see them; a lock is seen from every namespace.
HELD = "held.lock"


def _held(cluster_dir: Path) -> bool:
    """A live test process holds the cluster directory's lock."""
    try:
        fd = os.open(cluster_dir / HELD, os.O_RDONLY)
    except OSError:
        return False   # no lock file: an earlier run's layout (the pid check decides)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def kill_job_processes(cluster_dir: Path) -> list[int]:
    """SIGKILL what this cluster started: tasks (their SLURM_CONF is ours) and
    slurmstepd (its title overwrites its environment; it holds our slurmd.log)."""
    conf, inside, killed = str(cluster_dir / "slurm.conf"), f"{cluster_dir}/", []
    for p in psutil.process_iter(["name"]):
        try:
            ours = (p.environ().get("SLURM_CONF") == conf or (
                p.info["name"].startswith("slurmstep") and any(
                    os.readlink(f"/proc/{p.pid}/fd/{fd}").startswith(inside)
                    for fd in os.listdir(f"/proc/{p.pid}/fd"))))
            if ours and p.pid != os.getpid():
                p.kill()
                killed.append(p.pid)
        except (psutil.Error, OSError):
            pass
    return killed


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _is_process(pid: int, name: str) -> bool:
    try:
        return name in Path(f"/proc/{pid}/comm").read_text()
    except OSError:
        return False


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@dataclass
class SlurmCluster:
    """One controller and one node; ``env`` points clients at it (SLURM_CONF)."""

    dir: Path
    daemons: list[subprocess.Popen] = field(default_factory=list)
    jobs: list[str] = field(default_factory=list)
    start_seconds: float = 0.0

    @property
    def conf(self) -> Path:
        return self.dir / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf), "PATH": SBIN_PATH}

    # -- lifecycle ------------------------------------------------------------

    def start(self, timeout: float = 60.0) -> None:
        missing = missing_binaries()
        if missing:
            raise SlurmError("Slurm is not installed: missing " + ", ".join(missing)
                             + " (make test installs them: apt-get install -y munge "
                             "slurmctld slurmd slurm-client)")
        t0 = time.monotonic()
        for sub in ("state", "spool", "munge"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        self._lock = os.open(self.dir / HELD, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self._lock, fcntl.LOCK_EX)   # released when this process ends
        # munged wants its socket directory (and every one above) searchable by all.
        os.chmod(self.dir, 0o755)
        os.chmod(self.dir / "munge", 0o755)
        key = self.dir / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o600)
        (self.dir / "plugstack.conf").write_text("")
        sock = self.dir / "munge" / "munge.socket"
        self.conf.write_text(SLURM_CONF.format(
            host=socket.gethostname().split(".")[0], ctld_port=free_port(),
            slurmd_port=free_port(), user=_user(), munge_socket=sock, dir=self.dir,
            node=NODE, cpus=CPUS, partition=PARTITION))
        self._spawn("munged", "--foreground", f"--socket={sock}", f"--key-file={key}",
                    f"--pid-file={self.dir}/munge/munged.pid",
                    f"--log-file={self.dir}/munge/munged.log",
                    f"--seed-file={self.dir}/munge/munged.seed")
        self._wait(lambda: sock.exists(), timeout, "munged never created its socket")
        self._spawn("slurmctld", "-D", "-c", "-f", str(self.conf))
        self._spawn("slurmd", "-D", "-c", "-f", str(self.conf), "-N", NODE)
        self._wait(self._node_idle, timeout, f"node {NODE} never became idle in sinfo")
        self.start_seconds = time.monotonic() - t0

    def stop(self) -> None:
        """Cancel the jobs, then stop the daemons (node, controller, munge)."""
        if self.jobs and self.alive():
            self.run("scancel", *self.jobs, check=False)
            self._wait(lambda: not self.active_jobs(), 15.0, "", fail=False)
        for p in reversed(self.daemons):
            if p.poll() is None:
                p.terminate()
        for p in reversed(self.daemons):
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        kill_job_processes(self.dir)  # steps that outlived a scancel

    def alive(self) -> bool:
        return bool(self.daemons) and all(p.poll() is None for p in self.daemons)

    # -- clients --------------------------------------------------------------

    def run(self, *argv: str, check: bool = True, timeout: float = 30.0) -> str:
        r = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise SlurmError(f"{' '.join(argv)} failed ({r.returncode}): "
                             f"{r.stderr.strip()}\n{self.logs()}")
        return r.stdout

    def sbatch(self, script: str, *options: str, cwd: Path | None = None) -> str:
        """Submit a batch script (text); returns the job id."""
        r = subprocess.run(["sbatch", "--parsable", *options], input=script, env=self.env,
                           capture_output=True, text=True, timeout=30, cwd=cwd)
        if r.returncode != 0:
            raise SlurmError(f"sbatch failed: {r.stderr.strip()}\n{self.logs()}")
        job = r.stdout.strip().split(";")[0]
        self.jobs.append(job)
        return job

    def job_state(self, job: str) -> str:
        out = self.run("scontrol", "show", "job", job, "--oneliner", check=False)
        m = re.search(r"\bJobState=(\S+)", out)
        return m.group(1) if m else ""

    def active_jobs(self) -> list[str]:
        out = self.run("squeue", "-h", "-o", "%i", check=False)
        return out.split()

    def logs(self, tail: int = 1500) -> str:
        parts = []
        for name in ("slurmctld.log", "slurmd.log", "munge/munged.log"):
            path = self.dir / name
            if path.exists():
                parts.append(f"--- {name}\n{path.read_text(errors='replace')[-tail:]}")
        return "\n".join(parts)

    # -- internals ------------------------------------------------------------

    def _spawn(self, binary: str, *args: str) -> None:
        log = open(self.dir / f"{binary}.out", "wb")  # noqa: SIM115 - kept for the daemon's life
        self.daemons.append(subprocess.Popen(
            [shutil.which(binary, path=SBIN_PATH), *args], env=self.env, stdout=log,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent))
        log.close()

    def _node_idle(self) -> bool:
        out = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False, timeout=10)
        return f"{NODE} idle" in out

    def _wait(self, cond, timeout: float, what: str, fail: bool = True) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if cond():
                return
            dead = [p.args[0] for p in self.daemons if p.poll() is not None]
            if dead and fail:
                raise SlurmError(f"{', '.join(dead)} exited: {what}\n{self._outputs()}"
                                 f"\n{self.logs()}")
            time.sleep(0.2)
        if fail:
            raise SlurmError(f"{what} within {timeout:.0f}s\n{self._outputs()}\n{self.logs()}")

    def _outputs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}"
                         for p in sorted(self.dir.glob("*.out")))


def _user() -> str:
    import pwd
    return pwd.getpwuid(os.getuid()).pw_name


# -- the TaskProlog (deploy/slurm/task-prolog.sh), run as slurmstepd runs it ----------

PROLOG = ROOT / "deploy" / "slurm" / "task-prolog.sh"


def exports(text: str) -> dict[str, str]:
    """What slurmstepd sets from a TaskProlog's output (``export NAME=value`` lines)."""
    out = {}
    for line in text.splitlines():
        if line.startswith("export ") and "=" in line:
            name, _, value = line[len("export "):].partition("=")
            out[name] = value
    return out


def run_prolog(env: dict[str, str], script: Path = PROLOG) -> dict[str, str]:
    """The variables a task gets from the prolog run with ``env`` (it must succeed quietly)."""
    p = subprocess.run([str(script)], env=env, capture_output=True, text=True, timeout=30,
                       cwd="/")
    assert p.returncode == 0 and not p.stderr, p
    return exports(p.stdout)


def with_site_prolog(site: Path, where: Path) -> Path:
    """The shipped prolog with its SITE_TASK_PROLOG line pointed at ``site``, as
    a site edits it (the job's environment cannot name it)."""
    text = PROLOG.read_text()
    line = "SITE_TASK_PROLOG=/etc/slurm/task-prolog.site\n"
    assert text.count(line) == 1, "the prolog's SITE_TASK_PROLOG line moved"
    out = where / "ncclwatch-task-prolog.sh"
    out.write_text(text.replace(line, f"SITE_TASK_PROLOG={site}\n"))
    out.chmod(0o755)
    return out
