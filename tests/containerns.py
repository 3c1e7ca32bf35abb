"""A container made by the test: new PID, mount and UTS namespaces, as
``docker run`` makes them, without an image or a runtime.

Inside, the interpreter, the site-packages and the source tree sit under a
root that exists only in the container's mount namespace (a tmpfs over an
empty host directory), the host's own interpreter path is hidden, and the
checkpoint directory is a tmpfs the host cannot see. The process is placed in
a cgroup named as a container runtime names it (``cri-containerd-<id>.scope``
under a Kubernetes pod slice) when a cgroup hierarchy is writable, so the
agent reads a real ``/proc/PID/cgroup``.

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

ROOT = Path(__file__).resolve().parent.parent
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

    @property
    def ckpt(self) -> str:
        return f"{self.root}/ckpt"   # a path only the container has

    @property
    def python(self) -> str:
        return f"{self.root}/py/bin/{Path(sys.executable).resolve().name}"


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
