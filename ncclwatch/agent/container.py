"""Where a rank runs when it runs in a container, seen from the host's /proc.

A rank in a container has two pids (``NSpid`` in /proc/PID/status: the
host's, then its own namespace's), a hostname of its own (its UTS namespace;
the container's /etc/hostname), a cgroup that names the container (and, on
Kubernetes, the pod) as the runtime named it, and paths that exist only in
its mount namespace (read through /proc/PID/root and /proc/PID/fd).

Nothing here runs a program: every fact is read from /proc, and a file
inside the container is opened one component at a time with O_NOFOLLOW so
that a symlink in a hostile image cannot make the agent read a host file.

Kubernetes: the pod UID is in the cgroup path where the kubelet made it
(``cgroupid``: paths anchored at the runtimes' own slices); the kubelet's log directory
``/var/log/pods/<namespace>_<pod>_<uid>`` names the pod, else the pod's own
environment (``POD_NAME``/``POD_NAMESPACE`` from the downward API).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from ncclwatch.agent import rankfs
from ncclwatch.agent.cgroupid import container_of_cgroup

#: The kubelet's per-pod log directories on the node.
PODS_LOG_ROOT = "/var/log/pods"
MAX_NAME = 253


@dataclass(frozen=True, slots=True)
class ContainerInfo:
    """The container a rank runs in; every field empty: the host's own process."""

    container_pid: int = 0      # its pid in its own PID namespace (0: the agent's namespace)
    hostname: str = ""          # its UTS name, when it differs from the host's
    container_id: str = ""      # from the cgroup
    runtime: str = ""           # docker | containerd | crio | podman | kubernetes
    pod_uid: str = ""
    namespace: str = ""         # Kubernetes namespace, from the node (kubelet's directories)
    pod: str = ""               # Kubernetes pod name, from the node
    # What the rank's own environment says (POD_NAMESPACE/POD_NAME): the rank's
    # word, shown as such, never a label or a culprit's pod.
    declared_namespace: str = ""
    declared_pod: str = ""

    def __bool__(self) -> bool:
        return any((self.container_pid, self.hostname, self.container_id, self.pod_uid,
                    self.namespace, self.pod, self.declared_pod))


NONE = ContainerInfo()

#: Pod environment that names the pod (the downward API's usual names),
#: in order of preference.
POD_NAME_VARIABLES = ("POD_NAME", "MY_POD_NAME", "K8S_POD_NAME", "KUBERNETES_POD_NAME")
POD_NAMESPACE_VARIABLES = ("POD_NAMESPACE", "MY_POD_NAMESPACE", "K8S_POD_NAMESPACE",
                           "KUBERNETES_NAMESPACE")
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
#: A hostname as an image may set it; anything else (control characters for
#: an operator's terminal, markup) is not shown at all.
_HOSTNAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,252})?$")


def pod_of(uid: str, root: str = PODS_LOG_ROOT) -> tuple[str, str]:
    """(namespace, pod) of a pod UID from the kubelet's ``<ns>_<pod>_<uid>`` directories."""
    if not uid:
        return "", ""
    suffix = "_" + uid
    try:
        with os.scandir(root) as it:
            for e in it:
                if e.name.endswith(suffix):
                    ns, sep, pod = e.name[:-len(suffix)].partition("_")
                    if sep and _NAME.match(ns) and _NAME.match(pod):
                        return ns, pod
    except OSError:
        pass
    return "", ""


def pod_from_env(env: Mapping[str, str]) -> tuple[str, str]:
    """(namespace, pod) the pod's own environment declares (downward API)."""
    ns = next((env[v] for v in POD_NAMESPACE_VARIABLES if env.get(v)), "")
    pod = next((env[v] for v in POD_NAME_VARIABLES if env.get(v)), "")
    # A pod's HOSTNAME is its name (unless spec.hostname overrides it).
    if not pod and env.get("KUBERNETES_SERVICE_HOST"):
        pod = env.get("HOSTNAME", "")
    return (ns if _NAME.match(ns) else ""), (pod if _NAME.match(pod) else "")


def nspid(status_text: str) -> int:
    """The innermost pid from /proc/PID/status's NSpid line (0: no inner namespace)."""
    for line in status_text.splitlines():
        if line.startswith("NSpid:"):
            pids = line.split()[1:]
            return int(pids[-1]) if len(pids) > 1 else 0
    return 0


def _ns(pid: int | str, kind: str, proc: str) -> str:
    try:
        return os.readlink(f"{proc}/{pid}/ns/{kind}")
    except OSError:
        return ""


def read_in_root(pid: int, path: str, limit: int = 4096, proc: str = "/proc") -> str:
    """The start of the regular file ``path`` as the process sees it ("" when
    it cannot be read), walked inside its root following no symlink at all
    (``rankfs.open_in_root`` with ``symlinks=False``): a symlink anywhere
    (``/etc/hostname -> /etc/shadow`` in a hostile image) fails the walk, and
    a FIFO or device there is named and refused, never opened."""
    try:
        got = rankfs.open_in_root(pid, path, rankfs.REGULAR, os.O_RDONLY, symlinks=False,
                                  proc=proc)
    except OSError:
        return ""
    if got is None:
        return ""
    fd = got[0]
    try:
        return os.read(fd, limit).decode(errors="replace")
    except OSError:
        return ""
    finally:
        os.close(fd)


def inspect(pid: int, env: Mapping[str, str], *, proc: str = "/proc",
            pods_root: str = PODS_LOG_ROOT) -> ContainerInfo:
    """What the host shows of the container ``pid`` runs in (NONE: not in one).

    ``env``: the process's raw environment (only the pod variables are read).
    """
    try:
        with open(f"{proc}/{pid}/status") as f:
            inner = nspid(f.read())
    except (OSError, ValueError):
        inner = 0
    try:
        with open(f"{proc}/{pid}/cgroup") as f:
            runtime, cid, uid = container_of_cgroup(f.read())
    except OSError:
        runtime = cid = uid = ""
    hostname = ""
    uts = _ns(pid, "uts", proc)
    if uts and uts != _ns("self", "uts", proc):
        hostname = read_in_root(pid, "/etc/hostname", 512, proc).strip()
        hostname = hostname.splitlines()[0] if hostname else ""
        hostname = hostname if _HOSTNAME.match(hostname) else ""
    # The pod is what the node says (the cgroup's pod UID, the kubelet's
    # directory of it): the rank's environment can name any pod, so it is only
    # kept as what the rank declares.
    ns, pod = pod_of(uid, pods_root)
    ns_env, pod_env = pod_from_env(env)
    if not (pod_env and (uid or env.get("KUBERNETES_SERVICE_HOST") or ns_env)):
        ns_env = pod_env = ""
    return ContainerInfo(container_pid=inner, hostname=hostname, container_id=cid,
                         runtime=runtime, pod_uid=uid, namespace=ns[:MAX_NAME],
                         pod=pod[:MAX_NAME], declared_namespace=ns_env[:MAX_NAME],
                         declared_pod=pod_env[:MAX_NAME])
