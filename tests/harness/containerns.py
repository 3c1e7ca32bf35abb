"""A container made by the test: new PID, mount and UTS namespaces, as
``docker run`` makes them, without an image or a runtime.

Inside, the interpreter, the site-packages and the source tree sit under a
root that exists only in the container's mount namespace (a tmpfs over an
empty host directory), the host's own interpreter path is hidden, and the
checkpoint directory is a tmpfs the host cannot see. The process is placed in
a cgroup named as a container runtime names it (``cri-containerd-<id>.scope``
under a Kubernetes pod slice) when a cgroup hierarchy is writable, so the
agent reads a real ``/proc/PID/cgroup``.

Its root (``Container.root_kind``), as runtimes switch it:

- ``""``: the host's root, in the container's own mount namespace (above);
- ``chroot``: ``chroot`` into the image dir (Shifter-style runtimes, chroot
  images): from the host, /proc/PID/root reads the image dir;
- ``pivot_root``: ``pivot_root`` into it, the old root unmounted (runc, crun,
  enroot, bubblewrap): /proc/PID/root reads ``/``;
- ``pivot_root+chroot``: ``pivot_root`` into a root holding the image under
  ``/img``, then ``chroot /img`` (a chroot inside a container).

The image is the host's ``/usr`` (and its /lib links), the interpreter at
``/py``, site-packages at ``/site``, the source at ``/src``, the checkpoint
tmpfs at ``/ckpt``, and ``/gate`` (a host directory: the test's go file).

``tools``: files written into the container's PATH and over the agent's own
py-spy path inside (a hostile image): each touches ``marker`` if it ever runs.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from tests.harness.paths import ROOT

#: Names a hostile image may plant for the agent to run.
TOOL_NAMES = ("py-spy", "python", "python3", "nsenter", "sh", "cat", "ps")
#: Size of ``<ckpt>/previous.pt``, the previous checkpoint made inside.
PREVIOUS_BYTES = 65536


@dataclass(frozen=True)
class Container:
    root: Path        # host directory; inside, a tmpfs holding the container's files
    hostname: str
    container_id: str
    pod_uid: str
    cgroup: str       # the cgroup directory made (host path), "" if none was writable
    root_kind: str = ""   # "" | chroot | pivot_root | pivot_root+chroot (ROOT_KINDS)
    gate: str = ""        # host directory seen at /gate inside an image ("" for none)

    @property
    def image(self) -> str:
        """The image's directory as the container's mount namespace has it."""
        return f"{self.root}/img" if self.root_kind == "pivot_root+chroot" else str(self.root)

    @property
    def inside(self) -> str:
        """Where the image is, as the ranks see it: their root, or the host's root."""
        return "" if self.root_kind else str(self.root)

    @property
    def ckpt(self) -> str:
        return f"{self.inside}/ckpt"   # a path only the container has

    @property
    def python(self) -> str:
        return f"{self.inside}/py/bin/{Path(sys.executable).resolve().name}"

    @property
    def root_link(self) -> str:
        """/proc/PID/root of a rank, as the host reads it."""
        return {"": "/", "chroot": str(self.root), "pivot_root": "/",
                "pivot_root+chroot": "/img"}[self.root_kind]


#: How the container's root is switched (see the module's docstring).
ROOT_KINDS = ("chroot", "pivot_root", "pivot_root+chroot")


def _cgroup_base() -> str | None:
    """A writable cgroup hierarchy: v2 unified, else v1's named systemd one."""
    for base in ("/sys/fs/cgroup/unified", "/sys/fs/cgroup/systemd", "/sys/fs/cgroup"):
        if os.path.exists(f"{base}/cgroup.procs") and os.access(base, os.W_OK):
            return base
    return None


def make_cgroup(container_id: str, pod_uid: str) -> str:
    base = _cgroup_base()
    if base is None:
        return ""
    slice_ = pod_uid.replace("-", "_")
    d = (f"{base}/kubepods.slice/kubepods-besteffort.slice/"
         f"kubepods-besteffort-pod{slice_}.slice/cri-containerd-{container_id}.scope")
    try:
        os.makedirs(d, exist_ok=True)
    except OSError:
        return ""
    return d


def remove_cgroup(path: str) -> None:
    """rmdir the scope and the slices made for it (only once empty)."""
    p = Path(path)
    for _ in range(4):
        if not p.name.endswith((".scope", ".slice")):
            break
        try:
            p.rmdir()
        except OSError:
            return
        p = p.parent


def script(c: Container, argv: list[str], env: dict[str, str], marker: Path | None) -> str:
    """The shell program ``unshare`` runs as the container's pid 1."""
    if c.root_kind:
        return _image_script(c, argv, env, marker)
    base = Path(sys.base_prefix).resolve()
    site = Path(sysconfig.get_paths()["purelib"]).resolve()
    venv_bin = Path(sys.executable).parent
    r = str(c.root)
    lines = [
        "set -e",
        f"R={shlex.quote(r)}",
        'mount -t tmpfs ctr "$R"',
        'mkdir -p "$R/py" "$R/site" "$R/src" "$R/ckpt" "$R/bin" "$R/etc"',
        f'mount --bind {shlex.quote(str(base))} "$R/py"',
        f'mount --bind {shlex.quote(str(site))} "$R/site"',
        f'mount --bind {shlex.quote(str(ROOT))} "$R/src"',
        'mount -t tmpfs ckpt "$R/ckpt"',
        # The previous checkpoint, beside the one the job will write.
        f'head -c {PREVIOUS_BYTES} /dev/zero > "$R/ckpt/previous.pt"',
        # The host's interpreter path does not exist in here.
        f"mount -t tmpfs hidden {shlex.quote(str(base))}",
        f"hostname {shlex.quote(c.hostname)}",
        f'echo {shlex.quote(c.hostname)} > "$R/etc/hostname"',
        'mount --bind "$R/etc/hostname" /etc/hostname',
        # torchrun --standalone resolves the hostname.
        f'{{ cat /etc/hosts; echo "127.0.0.1 {c.hostname}"; }} > "$R/etc/hosts"',
        'mount --bind "$R/etc/hosts" /etc/hosts',
    ]
    if c.cgroup:
        # Where the hierarchy refuses the move, the test sees it in /proc/PID/cgroup.
        lines.insert(1, f"echo 0 > {shlex.quote(c.cgroup)}/cgroup.procs 2>/dev/null || true")
    if marker is not None:
        # A hostile image: every tool name in PATH, and the agent's own py-spy
        # path (and nsenter's) shadowed inside the container's mount namespace.
        body = f"#!/bin/sh\necho \"$0 $*\" >> {shlex.quote(str(marker))}\nexit 0\n"
        lines.append(f"mount -t tmpfs fakebin {shlex.quote(str(venv_bin))}")
        for name in TOOL_NAMES:
            for d in ('"$R/bin"', shlex.quote(str(venv_bin))):
                lines.append(f"printf %s {shlex.quote(body)} > {d}/{name}; chmod +x {d}/{name}")
        nsenter = shutil.which("nsenter")
        if nsenter:
            lines.append(f'mount --bind "$R/bin/nsenter" {shlex.quote(nsenter)}')
    path = f"{r}/bin:/usr/local/bin:/usr/bin:/bin"
    env_args = " ".join(shlex.quote(f"{k}={v}") for k, v in {
        "PATH": path, "PYTHONPATH": f"{r}/src:{r}/site", "HOME": r,
        "HOSTNAME": c.hostname, **env}.items())
    lines.append(f'cd "$R/src"')
    lines.append(f"exec env -i {env_args} {shlex.quote(c.python)} "
                 + " ".join(shlex.quote(a) for a in argv))
    return "\n".join(lines) + "\n"


def unshare_argv(script_text: str) -> list[str]:
    unshare = shutil.which("unshare")
    if unshare is None:
        raise FileNotFoundError("unshare (util-linux) is missing")
    return [unshare, "--pid", "--fork", "--kill-child", "--mount", "--uts", "--mount-proc",
            "--propagation", "private", "sh", "-c", script_text]


def _host_links(image: str) -> list[str]:
    """The host's top-level /lib, /lib64, /bin, /sbin in the image: links stay links
    (merged /usr), directories are bound."""
    lines = []
    for name in ("lib", "lib32", "lib64", "bin", "sbin"):
        host = f"/{name}"
        if os.path.islink(host):
            lines.append(f"ln -s {shlex.quote(os.readlink(host))} {image}/{name}")
        elif os.path.isdir(host):
            lines.append(f"mkdir -p {image}/{name}; mount --bind {host} {image}/{name}")
    return lines


def _image_script(c: Container, argv: list[str], env: dict[str, str],
                  marker: Path | None) -> str:
    """An image under the container's own root (chroot, pivot_root or both)."""
    base = Path(sys.base_prefix).resolve()
    site = Path(sysconfig.get_paths()["purelib"]).resolve()
    R, I = '"$R"', '"$I"'
    lines = [
        "set -e",
        f"R={shlex.quote(str(c.root))}",
        f"I={shlex.quote(c.image)}",
        f"mount -t tmpfs ctr {R}",
        f"mkdir -p {I}/py {I}/site {I}/src {I}/ckpt {I}/etc {I}/tmp {I}/proc {I}/dev "
        f"{I}/usr {I}/gate {I}/tools",
        f"mount --bind /usr {I}/usr",
        *_host_links(I),
        f"mount --bind {shlex.quote(str(base))} {I}/py",
        f"mount --bind {shlex.quote(str(site))} {I}/site",
        f"mount --bind {shlex.quote(str(ROOT))} {I}/src",
        f"mount -t tmpfs ckpt {I}/ckpt",
        f'head -c {PREVIOUS_BYTES} /dev/zero > {I}/ckpt/previous.pt',
        f"mount -t tmpfs tmp {I}/tmp",
        f"mount -t proc proc {I}/proc",
        f"mount --rbind /dev {I}/dev",
        f"cp /etc/passwd /etc/group {I}/etc/",
        f"hostname {shlex.quote(c.hostname)}",
        f"echo {shlex.quote(c.hostname)} > {I}/etc/hostname",
        f'{{ echo "127.0.0.1 localhost {c.hostname}"; }} > {I}/etc/hosts',
    ]
    if c.gate:
        lines.append(f"mount --bind {shlex.quote(c.gate)} {I}/gate")
    if c.cgroup:
        lines.insert(1, f"echo 0 > {shlex.quote(c.cgroup)}/cgroup.procs 2>/dev/null || true")
    if marker is not None:
        # A hostile image: every tool name in its PATH, at the agent's own
        # py-spy path inside it, and over the host's nsenter path inside it.
        body = f"#!/bin/sh\necho \"$0 $*\" >> {shlex.quote(str(marker))}\nexit 0\n"
        venv_bin = f"{I}{shlex.quote(str(Path(sys.executable).parent))}"
        lines.append(f"mkdir -p {venv_bin}")
        for name in TOOL_NAMES:
            for d in (f"{I}/tools", venv_bin):
                lines.append(f"printf %s {shlex.quote(body)} > {d}/{name}; chmod +x {d}/{name}")
        nsenter = shutil.which("nsenter")
        if nsenter:
            lines.append(f"mount --bind {I}/tools/nsenter {I}{shlex.quote(nsenter)}")
    if c.root_kind == "pivot_root+chroot":
        # The container's own root holds the image under /img, and what its
        # pid 1 needs to unmount the old root (umount, its libraries, /proc).
        lines += [f"ln -s img/usr {R}/usr", *_host_links(R), f"mkdir -p {R}/proc",
                  f"mount -t proc proc {R}/proc"]
    env_args = " ".join(shlex.quote(f"{k}={v}") for k, v in {
        "PATH": "/tools:/usr/local/bin:/usr/bin:/bin", "PYTHONPATH": "/src:/site",
        "HOME": "/tmp", "HOSTNAME": c.hostname,
        # The interpreter's own libpython (its RPATH names the host's path).
        "LD_LIBRARY_PATH": "/py/lib", **env}.items())
    run = (f"/usr/bin/env -i {env_args} {shlex.quote(c.python)} "
           + " ".join(shlex.quote(a) for a in argv))
    if c.root_kind == "chroot":
        lines.append(f"exec chroot {I} {run}")
    else:
        lines += [f"cd {R}", "mkdir .old", "pivot_root . .old", "cd /", "umount -l /.old",
                  "rmdir /.old"]
        lines.append(f"exec chroot /img {run}" if c.root_kind == "pivot_root+chroot"
                     else f"exec {run}")
    return "\n".join(lines) + "\n"
