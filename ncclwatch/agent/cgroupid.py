"""Which container and pod a cgroup path names, anchored at the runtimes' own slices.

A cgroup names a container or a pod only where a container runtime or the
kubelet made it: the path must start, at the host's cgroup root, with one of
the rows below (``kubepods.slice/...``, ``system.slice/docker-<id>.scope``,
...). A name matched anywhere else proves nothing: a process in a delegated
subtree (``user.slice/user-1000.slice/user@1000.service/...``, where systemd
lets the user make cgroups of any name) could otherwise call its cgroup
``kubepods-burstable-pod<uid>.slice`` and take that pod's name, which the node
attests. Anything under ``user.slice`` or a ``user@UID.service`` names nothing.

A path read from inside a private cgroup namespace (an agent pod on cgroup
v2) is relative to the reader's own cgroup: ``/../../kubepods-besteffort.slice
/...``. Its rest then starts below an ancestor of the reader's own cgroup (a
runtime's slice, where no user makes cgroups) and is matched against the tail
of a row from any of the row's components on; a relative path whose rest
starts at the host's root (``/../../../user.slice/...``) is matched as an
absolute one.

The rows are data: each is a runtime and the path from the root, one regex
per component, with ``{id}`` (a 64-hex container id), ``{uid}`` / ``{uid_}``
(a pod UID, ``-`` or systemd's ``_``) and the QoS class of a Kubernetes pod
(``{qs}`` its slice component, ``{q}`` its ``-burstable`` infix) filled in.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

_FILL = {
    "id": r"(?P<id>[0-9a-f]{64})",
    "uid": r"(?P<uid>[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})",
    "uid_": r"(?P<uid>[0-9a-f]{8}_[0-9a-f]{4}_[0-9a-f]{4}_[0-9a-f]{4}_[0-9a-f]{12})",
}
#: Kubernetes QoS classes: (systemd slice component, kind's, cgroupfs directory, infix).
_QOS = (("", "", "", ""),
        ("kubepods-burstable.slice/", "kubelet-kubepods-burstable.slice/", "burstable/",
         "-burstable"),
        ("kubepods-besteffort.slice/", "kubelet-kubepods-besteffort.slice/", "besteffort/",
         "-besteffort"))

#: Where the kubelet puts a pod, per cgroup driver: systemd, kind's kubelet
#: root (``--cgroup-root=/kubelet``), cgroupfs.
_POD_SYSTEMD = r"kubepods\.slice/{qs}kubepods{q}-pod{uid_}\.slice"
_POD_KIND = r"kubelet\.slice/kubelet-kubepods\.slice/{ks}kubelet-kubepods{q}-pod{uid_}\.slice"
_POD_CGROUPFS = r"kubepods/{cq}pod{uid}"

#: (runtime, path from the host's cgroup root): the first row a cgroup path
#: starts with names its container ("" runtime: the pod only).
ROWS: tuple[tuple[str, str], ...] = (
    ("containerd", _POD_SYSTEMD + r"/cri-containerd-{id}\.scope"),
    ("crio", _POD_SYSTEMD + r"/crio-{id}\.scope"),
    ("docker", _POD_SYSTEMD + r"/docker-{id}\.scope"),               # cri-dockerd
    ("", _POD_SYSTEMD),                                                 # crio-conmon-<id>, the pause
    ("containerd", _POD_KIND + r"/cri-containerd-{id}\.scope"),
    ("", _POD_KIND),
    ("kubernetes", _POD_CGROUPFS + r"/{id}"),
    ("", _POD_CGROUPFS),
    # containerd's systemd driver on cgroup v1 where runc made no scope.
    ("containerd",
     r"system\.slice/containerd\.service/kubepods{q}-pod{uid_}\.slice:cri-containerd:{id}"),
    ("docker", r"system\.slice/docker-{id}\.scope"),
    ("docker", r"docker/{id}"),
    ("podman", r"machine\.slice/libpod-{id}\.scope"),
    ("podman", r"libpod_parent/libpod-{id}"),
)

#: Components that start a delegated subtree: nothing at or under one names a
#: container or a pod, whatever the rest of the path says.
DELEGATED = re.compile(r"user\.slice|user-\d+\.slice|user@\d+\.service")


def _expand(runtime: str, template: str) -> list[tuple[str, tuple[re.Pattern[str], ...]]]:
    out = []
    qos = _QOS if re.search(r"\{(q|qs|ks|cq)\}", template) else _QOS[:1]
    for qs, ks, cq, q in qos:
        path = (template.replace("{qs}", qs).replace("{ks}", ks).replace("{cq}", cq)
                .replace("{q}", q))
        for key, rx in _FILL.items():
            path = path.replace("{" + key + "}", rx)
        out.append((runtime, tuple(re.compile(c) for c in path.split("/"))))
    return out


_COMPILED = tuple(row for runtime, t in ROWS for row in _expand(runtime, t))


def _match(parts: Sequence[str], comps: Sequence[re.Pattern[str]]) -> dict[str, str] | None:
    if len(parts) < len(comps):
        return None
    got: dict[str, str] = {}
    for part, comp in zip(parts, comps):
        m = comp.fullmatch(part)
        if m is None:
            return None
        got.update({k: v for k, v in m.groupdict().items() if v})
    return got


def name_of_path(path: str) -> tuple[str, str, str]:
    """(runtime, container id, pod uid) that one cgroup path names ("" each: none)."""
    parts = [p for p in path.split("/") if p]
    climbed = 0
    while climbed < len(parts) and parts[climbed] == "..":
        climbed += 1
    parts = parts[climbed:]
    if not parts or any(p == ".." or DELEGATED.fullmatch(p) for p in parts):
        return "", "", ""
    for runtime, comps in _COMPILED:
        # Absolute: from the root. Relative: from any component of the row on.
        for start in range(len(comps) if climbed else 1):
            got = _match(parts, comps[start:])
            if got is not None:
                return runtime, got.get("id", ""), got.get("uid", "").replace("_", "-")
    return "", "", ""


def container_of_cgroup(text: str) -> tuple[str, str, str]:
    """(runtime, container id, pod uid) from /proc/PID/cgroup's text ("" when absent):
    the first line whose path a row names."""
    runtime = cid = uid = ""
    for line in text.splitlines():
        r, c, u = name_of_path(line.split(":", 2)[-1])
        if c and not cid:
            runtime, cid = r, c
        if u and not uid:
            uid = u
    if uid and not runtime:
        runtime = "kubernetes"
    return runtime, cid, uid
