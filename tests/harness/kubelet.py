"""Start a pod from the shipped manifests the way a kubelet and runc would,
from an image root built by ``deploy.imageroot`` (``rootfs/`` and the image
config), without a cluster or an engine.

What is read from the manifest, not chosen here: the container's command and
args (over the image's Entrypoint and Cmd), its env (``fieldRef`` to the node
and pod names included), ``hostPID``, the securityContext (runAsUser,
runAsGroup, fsGroup, readOnlyRootFilesystem, allowPrivilegeEscalation,
capabilities drop/add), every volumeMount (emptyDir as a tmpfs of its
sizeLimit, hostPath as a bind, configMap and secret as files with the
volume's mode and the pod's fsGroup, only the keys ``items`` names where it
names any, readOnly mounts read-only) and the
probes (``exec`` run inside the container with its credentials, ``httpGet``
against the pod's port without verifying the certificate, as kubelets do).

What a cluster would give and this does not: cgroup limits, seccomp and
AppArmor profiles, the CNI (every pod shares one network namespace made by
the test, its /etc/hosts naming the Services), and image pulling.

``host_image`` stands in for the built image where a test is about the
manifests rather than the image: this machine's root as an overlay (what the
runner creates stays in memory) with this venv's ``ncclwatch`` as the entry
point and the image's user.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import psutil
import yaml

from tests.harness.procs import Proc

#: Capabilities this runner grants and reads, by the names Kubernetes uses (setpriv
#: spells them in lower case), with their bit in /proc/PID/status CapEff
#: (linux/capability.h).
CAP_BITS = {"CHOWN": 0, "DAC_READ_SEARCH": 2, "KILL": 5, "SETUID": 7, "NET_BIND_SERVICE": 10,
            "SYS_CHROOT": 18, "SYS_PTRACE": 19, "SYS_ADMIN": 21}
SIZE = re.compile(r"^(\d+)(Ki|Mi|Gi)?$")


def manifest_docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def workload(docs: list[dict], kind: str, name: str) -> dict:
    """The named Deployment/DaemonSet's pod template."""
    for d in docs:
        if d.get("kind") == kind and d["metadata"]["name"] == name:
            return d["spec"]["template"]["spec"]
    raise KeyError(f"no {kind} {name}")


def config_map(docs: list[dict], name: str) -> dict[str, str]:
    for d in docs:
        if d.get("kind") == "ConfigMap" and d["metadata"]["name"] == name:
            return dict(d["data"])
    raise KeyError(f"no ConfigMap {name}")


def _bytes(size: str) -> int:
    m = SIZE.match(size)
    if not m:
        raise ValueError(size)
    return int(m.group(1)) * {None: 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}[m.group(2)]


#: The programs a container's first process runs through before its command
#: (``chroot`` then ``setpriv`` then ``env -i``: one pid, exec'd in turn).
LAUNCH_STEPS = frozenset({"chroot", "setpriv", "env"})


@dataclass
class Netns:
    """One network namespace for the pods (loopback up), their "cluster network"."""
    name: str

    def __enter__(self) -> Netns:
        subprocess.run(["ip", "netns", "add", self.name], check=True)
        subprocess.run(["ip", "-n", self.name, "link", "set", "lo", "up"], check=True)
        return self

    def __exit__(self, *exc) -> None:
        subprocess.run(["ip", "netns", "del", self.name], check=False)

    def fetch(self, url: str, cafile: str = "", timeout: float = 10,
              login: str = "") -> tuple[int, str]:
        """GET from inside the namespace: (status, body); certificate checked when cafile,
        basic auth as ``user:password`` when login (passed on stdin, not in argv)."""
        code = ("import base64,ssl,sys,urllib.request,urllib.error\n"
                "ctx=ssl.create_default_context(cafile=sys.argv[2]) if sys.argv[2] else "
                "ssl._create_unverified_context()\n"
                "req=urllib.request.Request(sys.argv[1])\n"
                "login=sys.stdin.read()\n"
                "if login: req.add_header('Authorization','Basic '+"
                "base64.b64encode(login.encode()).decode())\n"
                "try:\n r=urllib.request.urlopen(req,context=ctx,timeout=%f)\n"
                " print(r.status);sys.stdout.write(r.read().decode())\n"
                "except urllib.error.HTTPError as e:\n print(e.code)\n"
                "except Exception as e:\n print(0);print(e)\n" % timeout)
        out = subprocess.run(["ip", "netns", "exec", self.name, sys.executable, "-c", code,
                              url, cafile], input=login, capture_output=True, text=True,
                             timeout=timeout + 20)
        status, _, body = out.stdout.partition("\n")
        return int(status or 0), body


@dataclass
class Pod:
    name: str
    proc: Proc
    creds: list[str]          # setpriv arguments the container runs under
    env: list[str]
    spec: dict = field(default_factory=dict)
    container: dict = field(default_factory=dict)

    def main_pid(self, timeout: float = 20) -> int:
        """The container's first process as the host sees it (the chroot'd one),
        once it runs the container's command: until then it is still ``chroot``,
        ``setpriv`` or ``env`` on their way to it, with the runner's credentials
        (a loaded run read the agent's capabilities off ``setpriv`` before it
        dropped them)."""
        deadline = time.time() + timeout
        while True:
            try:
                top = psutil.Process(self.proc.popen.pid)
                for p in [top, *top.children(recursive=True)]:
                    if os.readlink(f"/proc/{p.pid}/root") != "/" \
                            and p.name() not in LAUNCH_STEPS:
                        return p.pid
            except (OSError, psutil.Error):
                pass
            if time.time() > deadline or not self.proc.alive():
                raise LookupError(f"{self.name}: no process inside the root\n"
                                  f"{self.proc.output()[-3000:]}")
            time.sleep(0.2)

    def exec(self, argv: list[str], timeout: float = 30) -> subprocess.CompletedProcess:
        """``kubectl exec``: the container's namespaces, root and credentials."""
        pid = self.main_pid()
        return subprocess.run(
            ["nsenter", f"--target={pid}", "--mount", "--uts", "--net", "--root",
             "--wd=/", "/usr/bin/setpriv", *self.creds, "--", "/usr/bin/env", "-i",
             *self.env, *argv], capture_output=True, text=True, timeout=timeout)

    def probe(self, kind: str, netns: Netns) -> bool:
        """The container's ``livenessProbe``/``readinessProbe``, once."""
        p = self.container[kind]
        if "exec" in p:
            return self.exec(p["exec"]["command"], timeout=p.get("timeoutSeconds", 1)
                             + 10).returncode == 0
        get = p["httpGet"]
        port = get["port"]
        if isinstance(port, str):
            port = next(x["containerPort"] for x in self.container["ports"]
                        if x["name"] == port)
        url = f"{get.get('scheme', 'HTTP').lower()}://127.0.0.1:{port}{get['path']}"
        status, _ = netns.fetch(url, timeout=p.get("timeoutSeconds", 1) + 5)
        return 200 <= status < 400


@dataclass
class Kubelet:
    image: Path                     # deploy.imageroot's --out: rootfs/ and config.json
    work: Path
    netns: Netns
    node: str
    hosts: dict[str, str]           # /etc/hosts of every pod: name -> address
    host_paths: dict[str, str] = field(default_factory=dict)   # hostPath -> this test's dir
    config_maps: dict[str, dict[str, str]] = field(default_factory=dict)
    secrets: dict[str, dict[str, bytes]] = field(default_factory=dict)

    def image_config(self) -> dict:
        return json.loads((self.image / "config.json").read_text())["config"]

    def _env(self, container: dict, pod_name: str, namespace: str) -> list[str]:
        env = dict(e.split("=", 1) for e in self.image_config()["Env"])
        env["HOSTNAME"] = pod_name
        fields = {"spec.nodeName": self.node, "metadata.name": pod_name,
                  "metadata.namespace": namespace}
        for e in container.get("env", []):
            if "value" in e:
                env[e["name"]] = str(e["value"])
            else:
                env[e["name"]] = fields[e["valueFrom"]["fieldRef"]["fieldPath"]]
        return [f"{k}={v}" for k, v in env.items()]

    @staticmethod
    def _creds(spec: dict, container: dict) -> list[str]:
        pod_sc, sc = spec.get("securityContext", {}), container.get("securityContext", {})
        uid = sc.get("runAsUser", pod_sc.get("runAsUser", 0))
        gid = sc.get("runAsGroup", pod_sc.get("runAsGroup", 0))
        if sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) and uid == 0:
            raise ValueError("runAsNonRoot with uid 0: the kubelet refuses to start it")
        groups = [str(pod_sc["fsGroup"])] if "fsGroup" in pod_sc else []
        caps = sc.get("capabilities", {})
        if sc.get("privileged"):
            raise ValueError("privileged containers are not run here")
        if "ALL" not in caps.get("drop", []):
            raise ValueError("a container that keeps the runtime's default capabilities: "
                             "drop ALL and add what it needs")
        unknown = set(caps.get("add", [])) - set(CAP_BITS)
        if unknown:
            raise ValueError(f"capabilities this runner does not know: {sorted(unknown)}")
        add = [c.lower() for c in caps.get("add", [])]
        capset = ",".join(["-all", *[f"+{c}" for c in add]])
        creds = [f"--reuid={uid}", f"--regid={gid}",
                 f"--groups={','.join(groups)}" if groups else "--clear-groups",
                 f"--inh-caps={capset}", f"--bounding-set={capset}"]
        if uid != 0:
            creds.append("--ambient-caps=-all")
        if sc.get("allowPrivilegeEscalation") is False:
            creds.append("--no-new-privs")
        return creds

    def _volume_source(self, vol: dict, pod_dir: Path, spec: dict) -> tuple[str, str]:
        """(kind, host path or tmpfs options) for one volume."""
        gid = spec.get("securityContext", {}).get("fsGroup")
        if "emptyDir" in vol:
            size = vol["emptyDir"].get("sizeLimit")
            return "tmpfs", "mode=1777" + (f",size={_bytes(size)}" if size else "")
        if "hostPath" in vol:
            path = vol["hostPath"]["path"]
            path = self.host_paths.get(path, path)
            if vol["hostPath"].get("type") == "Directory" and not Path(path).is_dir():
                raise FileNotFoundError(f"hostPath {path} (type Directory) does not exist")
            return "bind", path
        if "configMap" in vol or "secret" in vol:
            is_secret = "secret" in vol
            src = vol["secret"] if is_secret else vol["configMap"]
            ref = src["secretName"] if is_secret else src["name"]
            data = self.secrets[ref] if is_secret else {
                k: v.encode() for k, v in self.config_maps[ref].items()}
            d = pod_dir / "volumes" / vol["name"]
            d.mkdir(parents=True)
            mode = src.get("defaultMode", 0o644)
            if "items" in src:      # only those keys, at their paths; a missing key fails
                data = {i["path"]: data[i["key"]] for i in src["items"]}
            for key, value in data.items():
                f = d / key
                f.write_bytes(value)
                os.chmod(f, mode)
                if gid is not None:
                    os.chown(f, 0, gid)
            return "bind", str(d)
        raise ValueError(f"volume {vol['name']}: a kind this runner does not make")

    def start(self, spec: dict, pod_name: str, namespace: str = "ncclwatch") -> Pod:
        [container] = spec["containers"]
        cfg = self.image_config()
        rootfs = self.image / "rootfs"
        pod_dir = self.work / pod_name
        pod_dir.mkdir(parents=True)
        mnt = pod_dir / "root"
        mnt.mkdir()
        creds = self._creds(spec, container)
        env = self._env(container, pod_name, namespace)
        hosts = pod_dir / "hosts"
        hosts.write_text("127.0.0.1 localhost\n" + "".join(
            f"{ip} {name}\n" for name, ip in self.hosts.items()) + f"127.0.1.1 {pod_name}\n")
        q = shlex.quote
        sc = container.get("securityContext", {})
        script = [f"mount --bind {q(str(rootfs))} {mnt}"]
        if sc.get("readOnlyRootFilesystem"):
            script.append(f"mount -o remount,bind,ro {mnt}")
        script += [f"mount -t proc -o nosuid,nodev,noexec proc {mnt}/proc",
                   f"mount -t tmpfs -o nosuid,mode=755,size=65536k tmpfs {mnt}/dev",
                   f"mkdir {mnt}/dev/shm {mnt}/dev/pts",
                   f"mount -t tmpfs -o nosuid,nodev,size=65536k tmpfs {mnt}/dev/shm",
                   f"ln -s /proc/self/fd {mnt}/dev/fd"]
        for dev in ("null", "zero", "full", "random", "urandom", "tty"):
            script += [f"touch {mnt}/dev/{dev}", f"mount --bind /dev/{dev} {mnt}/dev/{dev}"]
        script += [f"mount --rbind /sys {mnt}/sys", f"mount -o remount,bind,ro {mnt}/sys"]
        for f in ("hosts",):
            script.append(f"mount --bind {pod_dir}/{f} {mnt}/etc/{f}")
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for vm in container.get("volumeMounts", []):
            path = vm["mountPath"]
            (rootfs / path.lstrip("/")).mkdir(parents=True, exist_ok=True)   # as runc does
            kind, source = self._volume_source(volumes[vm["name"]], pod_dir, spec)
            target = f"{mnt}{path}"
            script.append(f"mkdir -p {q(target)}")   # inside a volume mounted before it
            if kind == "tmpfs":
                script.append(f"mount -t tmpfs -o nosuid,nodev,{source} tmpfs {q(target)}")
            else:
                script.append(f"mount --rbind {q(source)} {q(target)}")
            if vm.get("readOnly"):
                script.append(f"mount -o remount,bind,ro {q(target)}")
        (rootfs / "etc" / "hosts").touch()
        argv = list(container.get("command") or cfg["Entrypoint"] or [])
        argv += list(container.get("args") if "args" in container or "command" in container
                     else cfg["Cmd"] or [])
        workdir = container.get("workingDir") or cfg["WorkingDir"] or "/"
        script.append(f"hostname {q(pod_name)}")
        script.append("exec " + shlex.join(
            ["chroot", str(mnt), "/usr/bin/setpriv", *creds, "--", "/usr/bin/env", "-i",
             "-C", workdir, *env, *argv]))
        ns = ["unshare", "--mount", "--propagation", "private", "--uts"]
        if not spec.get("hostPID"):
            ns += ["--pid", "--fork", "--kill-child"]
        proc = Proc(["ip", "netns", "exec", self.netns.name, *ns, "--", "/bin/sh", "-ec",
                     " && ".join(script)], env={"PYTHONPATH": ""}, name=pod_name)
        return Pod(pod_name, proc, creds, env, spec, container)


@contextlib.contextmanager
def host_image(work: Path, venv: Path, user: str = "65532:65532") -> Iterator[Path]:
    """An image for ``Kubelet``: ``rootfs/``, an overlay of this machine's ``/`` whose
    upper layer is a tmpfs (the mount points and files the runner makes never reach
    the host), and ``config.json`` running ``venv``'s ncclwatch as ``user``. The
    folders above this venv's interpreter (pyenv keeps it under /root) are made
    searchable in the overlay only, so the image's user can run it."""
    layers, rootfs = work / "layers", work / "rootfs"
    layers.mkdir(parents=True)
    rootfs.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m,mode=700", "tmpfs", str(layers)],
                   check=True)
    try:
        (layers / "upper").mkdir()
        (layers / "work").mkdir()
        subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                        f"lowerdir=/,upperdir={layers}/upper,workdir={layers}/work",
                        str(rootfs)], check=True)
        try:
            for real in {Path(os.path.realpath(venv / "bin" / "python")), venv.resolve()}:
                for d in real.parents:
                    inside = rootfs / d.relative_to("/")
                    mode = inside.stat().st_mode & 0o7777
                    if mode & 0o001 == 0:
                        os.chmod(inside, mode | 0o011)
            path = f"{venv}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
            (work / "config.json").write_text(json.dumps({"config": {
                "Env": [f"PATH={path}"], "Entrypoint": [str(venv / "bin" / "ncclwatch")],
                "Cmd": ["daemon"], "User": user, "WorkingDir": "/"}}))
            yield work
        finally:
            subprocess.run(["umount", "-l", str(rootfs)], check=False)
    finally:
        subprocess.run(["umount", "-l", str(layers)], check=False)


def cap_eff(pid: int) -> set[str]:
    """The capabilities a process holds, by Kubernetes' names (those CAP_BITS knows)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            bits = int(line.split()[1], 16)
            return {n for n, b in CAP_BITS.items() if bits >> b & 1} | (
                {"other"} if bits & ~sum(1 << b for b in CAP_BITS.values()) else set())
    raise LookupError(pid)


def root_mount_options(pid: int) -> set[str]:
    """The mount options of a process's ``/`` as it sees it (the topmost mount)."""
    opts: set[str] = set()
    for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
        parts = line.split()
        if parts[4] == "/":
            opts = set(parts[5].split(","))
    return opts
