"""One RUN step of the image build, kept off the build host as an engine keeps it.

``deploy/imageroot.py`` runs the Containerfile's RUN steps on the host that
builds the image, as root in a ``chroot`` of it. Each one gets mount, PID, IPC
and UTS namespaces of its own: its shell is PID 1, it sees only its own
processes and none outlives it; a fresh ``/proc`` with the kernel's settings
read-only and kernel memory masked; a ``/dev`` of its own holding only ``null
zero full random urandom tty`` (the host's nodes bound one by one, never the
host's ``/dev``), a new ``pts`` instance and a ``shm``; the host files it is
lent (resolver, CA bundle) bound read-only; and Docker's default capabilities
less ``MKNOD``, ``NET_RAW`` and ``SYS_CHROOT``, so it can neither remount what
it was lent writable (no ``SYS_ADMIN``) nor leave the chroot. The network is
the host's (apt and pip download).

The build itself never writes, mounts or deletes through a symlink a step left
in the image that leads out of it (``inside``).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path


class BuildError(RuntimeError):
    pass


#: Host files a RUN step is lent, read-only, when the host has them.
HOST_FILES = ("/etc/resolv.conf", "/etc/hosts")
#: A RUN step's /dev: these host device nodes bound in one by one (never the
#: host's whole /dev: no disks, no kmsg, no GPUs), a fresh devpts and shm, links.
DEV_NODES = ("null", "zero", "full", "random", "urandom", "tty")
DEV_LINKS = {"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1",
             "stderr": "/proc/self/fd/2", "ptmx": "pts/ptmx"}
#: Its /proc (Docker's defaults): the kernel's settings readable, not writable;
#: kernel memory and timers not seen at all.
PROC_READONLY = ("bus", "fs", "irq", "sys", "sysrq-trigger")
PROC_MASKED = ("acpi", "kcore", "keys", "latency_stats", "timer_list", "timer_stats",
               "sched_debug", "scsi")
#: The capabilities a RUN step keeps (number by name): Docker's default set
#: less MKNOD (it has no device cgroup here), NET_RAW and SYS_CHROOT (a chroot,
#: not a pivot_root, is left with it). Every other one leaves the bounding set.
STEP_CAPS = {"CHOWN": 0, "DAC_OVERRIDE": 1, "FOWNER": 3, "FSETID": 4, "KILL": 5,
             "SETGID": 6, "SETUID": 7, "SETPCAP": 8, "NET_BIND_SERVICE": 10,
             "AUDIT_WRITE": 29, "SETFCAP": 31}
#: Run by the host's Python as the step's PID 1, after the mounts: chroot,
#: drop the capabilities, become USER, exec the step's shell.
_ENTER = r"""
import ctypes, json, os, sys
spec = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
def ok(rc, what):
    if rc != 0:
        err = ctypes.get_errno()
        sys.exit(f"imageroot: {what}: {os.strerror(err)}")
last = int(open("/proc/sys/kernel/cap_last_cap").read())
os.chroot(spec["root"])
os.chdir("/")
for cap in range(last + 1):
    if cap not in spec["caps"]:
        ok(libc.prctl(24, cap, 0, 0, 0), f"PR_CAPBSET_DROP {cap}")
ok(libc.prctl(47, 4, 0, 0, 0), "PR_CAP_AMBIENT_CLEAR_ALL")
class Head(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
class Data(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]
head, data = Head(0x20080522, 0), (Data * 2)()
ok(libc.capget(ctypes.byref(head), data), "capget")
data[0].inheritable = data[1].inheritable = 0
ok(libc.capset(ctypes.byref(head), data), "capset")
if spec["uid"] is not None:
    os.setgroups(spec["groups"])
    os.setgid(spec["gid"])
    os.setuid(spec["uid"])
os.execve("/bin/sh", ["/bin/sh", "-ec", spec["command"]], spec["env"])
"""


def inside(root: Path, path: str | Path) -> Path:
    """The image's ``path`` (absolute in the image, or already under ``root``)
    as this host's path, symlinks resolved; a BuildError when one leads out of
    ``root``. A RUN step may leave ``/run -> /etc`` or ``/src/x -> /home``: the
    build never writes, mounts or deletes through such a link onto the host."""
    path, top = Path(path), Path(os.path.realpath(root))
    target = path if path.is_relative_to(root) or path.is_relative_to(top) \
        else root / str(path).lstrip("/")
    real = Path(os.path.realpath(target))
    if not real.is_relative_to(top):
        raise BuildError(f"{path}: a symlink in the image leads out of it (to {real}); "
                         "the build does not follow it onto this host")
    return real


def user_ids(root: Path, user: str) -> tuple[int, int, list[int]]:
    """USER ``name|uid[:group|gid]`` as (uid, gid, supplementary gids), names
    read from the image's /etc/passwd and /etc/group, as an engine does."""
    def table(name: str) -> list[list[str]]:
        path = inside(root, f"/etc/{name}")
        return [line.split(":") for line in path.read_text().splitlines()
                if line and not line.startswith("#")] if path.is_file() else []
    name, _, group = user.partition(":")
    passwd, groups = table("passwd"), table("group")
    entry = next((e for e in passwd if len(e) > 3 and name in (e[0], e[2])), None)
    if name.isdigit():
        uid = int(name)
    elif entry:
        uid = int(entry[2])
    else:
        raise BuildError(f"USER {user}: no user {name} in the image's /etc/passwd")
    if not group:
        gid = int(entry[3]) if entry else 0
    elif group.isdigit():
        gid = int(group)
    else:
        found = next((g for g in groups if len(g) > 2 and g[0] == group), None)
        if not found:
            raise BuildError(f"USER {user}: no group {group} in the image's /etc/group")
        gid = int(found[2])
    extra = [int(g[2]) for g in groups
             if entry and len(g) > 3 and entry[0] in g[3].split(",")]
    return uid, gid, sorted({gid, *extra})


def run_step(root: Path, command: str, env: dict[str, str], user: str, workdir: str,
             lend: list[tuple[str, str]]) -> int:
    """Run ``command`` with ``env`` in ``root`` under ``user`` (``""``: root) from
    ``workdir``, as the module says; ``lend`` is (host file, path in the image)
    pairs, bound read-only beside HOST_FILES, their mount points gone after.
    Returns the step's exit status."""
    q = shlex.quote
    proc = inside(root, "/proc")
    mounts = [f"mount -t proc -o nosuid,nodev,noexec proc {q(str(proc))}"]
    for name in PROC_READONLY:
        p = q(f"{proc}/{name}")
        mounts.append(f"if [ -e {p} ]; then mount --bind {p} {p} && "
                      f"mount -o remount,bind,ro,nosuid,nodev,noexec {p}; fi")
    for name in PROC_MASKED:
        p = q(f"{proc}/{name}")
        mounts.append(f"if [ -d {p} ]; then mount -t tmpfs -o ro,size=0 tmpfs {p}; "
                      f"elif [ -e {p} ]; then mount --bind /dev/null {p}; fi")
    dev = inside(root, "/dev")
    dev.mkdir(exist_ok=True)
    mounts.append(f"mount -t tmpfs -o mode=755,size=64k,nosuid,noexec tmpfs {q(str(dev))}")
    for name in DEV_NODES:
        node = q(f"{dev}/{name}")
        mounts.append(f"touch {node} && mount --bind /dev/{name} {node}")
    mounts += [f"mkdir -m 755 {q(f'{dev}/pts')} && mkdir -m 1777 {q(f'{dev}/shm')}",
               "mount -t devpts -o newinstance,ptmxmode=0666,mode=0620,gid=5,nosuid,noexec "
               f"devpts {q(f'{dev}/pts')}",
               f"mount -t tmpfs -o mode=1777,size=64m,nosuid,nodev,noexec shm {q(f'{dev}/shm')}"]
    mounts += [f"ln -s {q(to)} {q(f'{dev}/{name}')}" for name, to in DEV_LINKS.items()]
    for src, dst in [(f, f) for f in HOST_FILES if Path(f).exists()] + lend:
        target = inside(root, dst)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.touch()
        mounts.append(f"mount --bind {q(src)} {q(str(target))} && "
                      f"mount -o remount,bind,ro,nosuid,nodev,noexec {q(str(target))}")
    uid, gid, groups = user_ids(root, user) if user else (None, 0, [])
    spec = {"root": str(root), "caps": sorted(STEP_CAPS.values()), "uid": uid, "gid": gid,
            "groups": groups, "env": env, "command": f"cd {q(workdir)} && {command}"}
    enter = [sys.executable, "-I", "-c", _ENTER, json.dumps(spec)]
    done = subprocess.run(["unshare", "--mount", "--pid", "--ipc", "--uts",
                           "--propagation", "private", "--fork", "--kill-child", "--",
                           "/bin/sh", "-ec", "\n".join([*mounts, "exec " + shlex.join(enter)])])
    for _, dst in lend:
        # Checked again: the step may have swapped a folder above it for a link.
        inside(root, dst).unlink(missing_ok=True)
    return done.returncode
