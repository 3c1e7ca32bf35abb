"""A root for py-spy in which a chroot'd rank's binaries are where its maps say.

py-spy finds ``libpython`` by a path from ``/proc/PID/maps`` and opens it as
``/proc/PID/root`` + that path. The kernel writes maps paths (and the
``/proc/PID/exe`` link) relative to the *reader's* root, or, when the file
is out of the reader's reach (another mount namespace), relative to the top
of the file's own mount tree. ``/proc/PID/root`` is the rank's root. The two
agree when the rank's root is the top of its tree (the host, or a container
whose runtime switched roots with ``pivot_root``), but not when the root was
changed with ``chroot`` (Shifter-style runtimes, chroot images, a chroot
inside a container): the path is then ``<chroot dir>/usr/lib/libpython...``
and py-spy opens ``<chroot dir>/<chroot dir>/usr/lib/...``, which does not
exist. Neither entering the rank's mount namespace (paths stay relative to
its top, ``/proc/PID/root`` still the chroot) nor its root (``/proc`` is
then whatever the image has, often nothing) fixes that.

So the stack is taken in a root of the agent's own making, in a private
mount namespace of the py-spy child only (nothing is mounted where the rank
or the host could see it, and the rank's mounts are never touched):

- ``/proc/PID`` holds the rank's real ``/proc/PID`` entries (symlinks into
  a bind of it), except ``root``, which points at the top of the rank's
  mount tree (``/proc/PID/root/..``, once per level of its chroot), and
  ``exe``, whose link text is the rank's own (so py-spy matches it in the
  maps) and which resolves through that top;
- ``/proc/self`` is py-spy's own, ``/proc/<tid>`` the rank's threads;
- every other top-level name is a symlink to the same name under the top of
  the rank's tree, so a maps path resolves as the rank's mount tree has it.

Nothing else is in that root: a symlink planted in an image cannot lead
py-spy to a host file, and the one program run is the agent's own py-spy,
opened before the child leaves the agent's root and executed through
``/proc/self/fd``. Setting it up needs ``CAP_SYS_ADMIN`` (a mount
namespace and its mounts) and ``CAP_SYS_CHROOT``; a rank that needs no view
(the common case) needs neither.
"""

from __future__ import annotations

import ctypes
import os
import re
from dataclasses import dataclass

from ncclwatch.agent import rankfs

#: py-spy's own test for a shared libpython in the maps (python_process_info.rs).
LIBPYTHON = re.compile(r"/libpython\d.\d\d?(m|d|u)?.so")
#: Where, in the child's private copy of the agent's mounts, the view's tmpfs
#: goes (the first that is a directory); it is the child's root once built.
MOUNT_CANDIDATES = ("/tmp", "/run", "/mnt", "/var/tmp", "/dev")
#: The entry of the view's /proc/PID that holds the rank's real /proc/PID.
REAL = ".real"
#: Top-level names of the rank's tree mirrored into the view, at most.
MAX_TOP_NAMES = 512
#: Capabilities the view needs (bit numbers in /proc/self/status CapEff).
CAP_SYS_CHROOT, CAP_SYS_ADMIN = 18, 21


@dataclass(frozen=True, slots=True)
class View:
    """What the py-spy child builds before it runs py-spy (data, built in the agent)."""

    pid: int
    mount_at: str                           # an existing directory of the agent's
    dirs: tuple[str, ...]                   # made in the view, relative to its root
    binds: tuple[tuple[str, str], ...]      # (agent's path, path in the view)
    links: tuple[tuple[str, str], ...]      # (path in the view, link text)


def chroot_depth(root_link: str) -> int:
    """Levels between a process's root and the top of its mount tree (0: none).

    ``root_link`` is ``/proc/PID/root``'s link text as the agent reads it.
    """
    if not root_link.startswith("/"):
        return 0
    return len([p for p in root_link.split("/") if p])


def libpython_paths(maps: str) -> list[str]:
    """The executable libpython mappings' paths, as py-spy picks them."""
    out = []
    for line in maps.splitlines():
        fields = line.split(None, 5)
        if len(fields) == 6 and "x" in fields[1] and LIBPYTHON.search(fields[5]):
            out.append(fields[5])
    return out


def layout(pid: int, *, root_link: str, exe_link: str, entries: list[str],
           tids: list[str], top_names: list[str], mount_at: str) -> View:
    """The view for ``pid`` from what the agent read of it (pure)."""
    depth = chroot_depth(root_link)
    top = "/".join([f"{REAL}/root"] + [".."] * (depth + 1))
    p = f"proc/{pid}"
    links: list[tuple[str, str]] = [(f"{p}/root", top), (f"{p}/exe", exe_link)]
    for name in entries:
        if name not in ("root", "exe") and "/" not in name and not name.startswith("."):
            links.append((f"{p}/{name}", f"{REAL}/{name}"))
    for tid in tids:
        if tid.isdigit() and tid != str(pid):
            links.append((f"proc/{tid}", f"{pid}/task/{tid}"))
    for name in top_names[:MAX_TOP_NAMES]:
        if name not in ("proc", ".", "..") and "/" not in name:
            links.append((name, f"/{p}/root/{name}"))
    return View(pid=pid, mount_at=mount_at,
                dirs=("proc", "proc/self", p, f"{p}/{REAL}"),
                binds=((f"/proc/{pid}", f"{p}/{REAL}"), ("/proc/self", "proc/self")),
                links=tuple(links))


def chrooted(pid: int, proc: str = "/proc") -> bool:
    """The rank's root is not the top of its tree (a cheap procfs read: the
    common rank, at the top, needs no more)."""
    try:
        return os.readlink(f"{proc}/{pid}/root") != "/"
    except OSError:
        return False


def needed(pid: int, proc: str = "/proc") -> bool:
    """py-spy would miss this rank's libpython: its root is not the top of its tree
    and a mapped libpython is not at ``/proc/PID/root`` + its maps path.

    The path is the rank's text, so it is walked inside the rank's root
    (rankfs: no symlink leads out, nothing is opened but an ``O_PATH``); a
    rank's files may sit on a slow or hung filesystem, so callers on the
    event loop run this in a thread with a timeout (pyspy.view_route)."""
    if not chrooted(pid, proc):
        return False
    try:
        with open(f"{proc}/{pid}/maps") as f:
            maps = f.read()
    except OSError:
        return False
    return any(not rankfs.regular_in_root(pid, m, follow_last=True, proc=proc)
               for m in libpython_paths(maps))


#: ELF program header type of the interpreter (the dynamic loader) path.
_PT_INTERP = 3


def not_static(fd: int) -> str | None:
    """Why the executable open at ``fd`` may not run in a view, or None.

    Executed in the view, a dynamic binary's loader (PT_INTERP), or a
    script's ``#!`` interpreter, is looked up by path in the view, where
    every top-level name leads into the rank's own files: the rank's image
    would supply code that runs as root. Only a static ELF (py-spy's wheels
    ship one) has nothing to look up."""
    head = os.pread(fd, 64, 0)
    if head[:2] == b"#!":
        return "a script (its #! interpreter would come from the rank's image)"
    if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
        return "not a 64-bit little-endian ELF executable"
    phoff = int.from_bytes(head[32:40], "little")
    phentsize = int.from_bytes(head[54:56], "little")
    phnum = int.from_bytes(head[56:58], "little")
    if phentsize < 4 or phnum > 256:
        return "an ELF with unreadable program headers"
    table = os.pread(fd, phentsize * phnum, phoff)
    for i in range(phnum):
        if int.from_bytes(table[i * phentsize:i * phentsize + 4], "little") == _PT_INTERP:
            return "dynamically linked (its loader would come from the rank's image)"
    return None


def missing_capabilities(status: str | None = None) -> list[str]:
    """The capabilities the view needs that this process lacks."""
    if status is None:
        try:
            with open("/proc/self/status") as f:
                status = f.read()
        except OSError:
            return ["CAP_SYS_ADMIN", "CAP_SYS_CHROOT"]
    eff = next((int(ln.split()[1], 16) for ln in status.splitlines()
                if ln.startswith("CapEff:")), 0)
    return [name for bit, name in ((CAP_SYS_ADMIN, "CAP_SYS_ADMIN"),
                                   (CAP_SYS_CHROOT, "CAP_SYS_CHROOT"))
            if not eff >> bit & 1]


def read_view(pid: int, proc: str = "/proc") -> View:
    """Read what the view of ``pid`` needs (OSError: the rank is gone)."""
    base = f"{proc}/{pid}"
    root_link = os.readlink(f"{base}/root")
    top = "/".join([f"{base}/root"] + [".."] * (chroot_depth(root_link) + 1))
    _load_libc()
    mount_at = next((d for d in MOUNT_CANDIDATES if os.path.isdir(d)), "")
    if not mount_at:
        raise OSError("no directory to build the view on")
    return layout(pid, root_link=root_link, exe_link=os.readlink(f"{base}/exe"),
                  entries=sorted(os.listdir(base)), tids=sorted(os.listdir(f"{base}/task")),
                  top_names=sorted(os.listdir(top)), mount_at=mount_at)


# -- in the py-spy child, between fork and exec ------------------------------

_CLONE_NEWNS = 0x00020000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 0x2, 0x4, 0x8
_MS_BIND, _MS_REC, _MS_PRIVATE = 0x1000, 0x4000, 0x40000
#: libc, loaded by read_view in the agent (never between fork and exec).
_libc: ctypes.CDLL | None = None


def _load_libc() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        lib = ctypes.CDLL(None, use_errno=True)
        lib.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p,
                              ctypes.c_ulong, ctypes.c_char_p)
        lib.unshare.argtypes = (ctypes.c_int,)
        _libc = lib
    return _libc


def _check(rc: int, what: str) -> None:
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")


def _mount(src: str | None, dst: str, fstype: str | None, flags: int,
           data: str | None = None) -> None:
    assert _libc is not None
    _check(_libc.mount(src.encode() if src else None, dst.encode(),
                       fstype.encode() if fstype else None, flags,
                       data.encode() if data else None), f"mount {dst}")


def enter(view: View) -> None:
    """Build ``view`` in a new mount namespace and make it this process's root.

    Runs in the forked child (preexec): system calls only, no import, no lock
    (libc was loaded by read_view, before the fork).
    """
    if _libc is None:
        raise OSError("rootview.read_view was not called first")
    _check(_libc.unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)
    root = view.mount_at
    _mount("ncclwatch-view", root, "tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC,
           "mode=0755,size=1m")
    for d in view.dirs:
        os.mkdir(f"{root}/{d}", 0o755)
    for src, dst in view.binds:
        _mount(src, f"{root}/{dst}", None, _MS_BIND)
    for path, text in view.links:
        os.symlink(text, f"{root}/{path}")
    os.chroot(root)
    os.chdir("/")
