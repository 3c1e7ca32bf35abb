"""Containers and Kubernetes pods from /proc: the cgroup table, the kubelet's
pod directories, the pod's environment, NSpid, and a container's files read
without following a symlink (recorded /proc-like trees, no namespaces)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ncclwatch.agent.container import (
    NONE, container_of_cgroup, inspect, nspid, pod_from_env, pod_of, read_in_root,
)
from ncclwatch.daemon.api import container_view
from ncclwatch.model import describe_container as describe
from ncclwatch.jobid import identify
from ncclwatch.v1 import collector_pb2 as pb

CID = "4c15c0c881a44144b7774865c3119703e422dcbcbfe04f40945bec0a212e8013"
UID = "ff59a92d-efc4-4ac2-9ba7-12aa5ba20854"
UID_ = UID.replace("-", "_")

#: (/proc/PID/cgroup text, runtime, container id, pod uid), as each runtime writes it.
CGROUP_CASES = [
    (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/"
     f"cri-containerd-{CID}.scope\n", "containerd", CID, UID),                 # k8s, systemd, v2
    (f"12:memory:/kubepods/besteffort/pod{UID}/{CID}\n1:name=systemd:/kubepods/besteffort/"
     f"pod{UID}/{CID}\n", "kubernetes", CID, UID),                             # k8s, cgroupfs, v1
    (f"0::/kubepods/pod{UID}/{CID}\n", "kubernetes", CID, UID),               # guaranteed QoS
    (f"0::/kubepods.slice/kubepods-pod{UID_}.slice/crio-{CID}.scope\n", "crio", CID, UID),
    (f"0::/kubepods.slice/kubepods-pod{UID_}.slice/crio-conmon-{CID}.scope\n",
     "kubernetes", "", UID),                                                   # the monitor, no container
    (f"0::/system.slice/containerd.service/kubepods-besteffort-pod{UID_}.slice:cri-containerd:"
     f"{CID}\n", "containerd", CID, UID),
    (f"0::/system.slice/docker-{CID}.scope\n", "docker", CID, ""),            # docker run, systemd
    (f"13:pids:/docker/{CID}\n0::/docker/{CID}\n", "docker", CID, ""),        # docker, cgroupfs
    (f"0::/machine.slice/libpod-{CID}.scope/container\n", "podman", CID, ""),
    (f"1:name=systemd:/libpod_parent/libpod-{CID}\n", "podman", CID, ""),
    ("0::/user.slice/user-1000.slice/session-3.scope\n", "", "", ""),           # a login session
    ("0::/\n", "", "", ""),
    (f"0::/docker/{CID[:12]}\n", "", "", ""),                                  # no full id: nothing guessed
    (f"0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
     f"kubelet-kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope\n",
     "containerd", CID, UID),                                                  # kind's kubelet root
    (f"0::/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope/init.scope\n",
     "containerd", CID, UID),                                                  # a cgroup it made inside
    # Read from a private cgroup namespace (an agent pod): relative to the agent's cgroup.
    (f"0::/../../kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/"
     f"cri-containerd-{CID}.scope\n", "containerd", CID, UID),
    (f"0::/../../../pod{UID}/{CID}\n", "kubernetes", CID, UID),
    # Named by the process itself in a delegated subtree: never a pod, never a container.
    (f"0::/user.slice/user-0.slice/user@0.service/kubepods.slice/kubepods-burstable.slice/"
     f"kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope\n", "", "", ""),
    (f"0::/user.slice/user-1000.slice/user@1000.service/app.slice/kubepods-burstable-pod{UID_}"
     f".slice/crio-{CID}.scope\n", "", "", ""),
    (f"0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{CID}.scope\n",
     "", "", ""),                                                              # rootless podman: its word
    (f"0::/../../../../user.slice/user-0.slice/user@0.service/kubepods/pod{UID}/{CID}\n",
     "", "", ""),
    (f"1:name=systemd:/user.slice/user-1000.slice/user@1000.service/docker/{CID}\n", "", "", ""),
    (f"0::/system.slice/slurmstepd.scope/job_7/step_0/user/kubepods/pod{UID}/{CID}\n",
     "", "", ""),                                                              # not at the root
    (f"0::/system.slice/mine.service/kubepods-burstable-pod{UID_}.slice/docker-{CID}.scope\n",
     "", "", ""),
    (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-besteffort-pod{UID_}.slice/"
     f"cri-containerd-{CID}.scope\n", "", "", ""),                            # QoS slices disagree
]


@pytest.mark.parametrize("text,runtime,cid,uid", CGROUP_CASES)
def test_cgroup_table(text, runtime, cid, uid) -> None:
    assert container_of_cgroup(text) == (runtime, cid, uid)


def test_kubelet_pod_directories_name_the_pod(tmp_path) -> None:
    (tmp_path / f"ml-team_trainer-0_{UID}").mkdir()
    (tmp_path / "kube-system_coredns-abc_11111111-2222-3333-4444-555555555555").mkdir()
    assert pod_of(UID, str(tmp_path)) == ("ml-team", "trainer-0")
    assert pod_of("99999999-2222-3333-4444-555555555555", str(tmp_path)) == ("", "")
    assert pod_of("", str(tmp_path)) == ("", "")
    assert pod_of(UID, str(tmp_path / "absent")) == ("", "")


def test_a_malformed_pod_directory_names_nothing(tmp_path) -> None:
    (tmp_path / f"Bad_Name_{UID}").mkdir()
    assert pod_of(UID, str(tmp_path)) == ("", "")


@pytest.mark.parametrize("env,expected", [
    ({"POD_NAME": "trainer-0", "POD_NAMESPACE": "ml"}, ("ml", "trainer-0")),
    ({"MY_POD_NAME": "w-1", "MY_POD_NAMESPACE": "team"}, ("team", "w-1")),
    ({"KUBERNETES_SERVICE_HOST": "10.0.0.1", "HOSTNAME": "job-x-0-abcde"}, ("", "job-x-0-abcde")),
    ({"HOSTNAME": "laptop"}, ("", "")),                      # not in a pod: HOSTNAME says nothing
    ({"POD_NAME": "Not A Name", "POD_NAMESPACE": "ml"}, ("ml", "")),
    ({}, ("", "")),
])
def test_pod_from_env(env, expected) -> None:
    assert pod_from_env(env) == expected


@pytest.mark.parametrize("status,expected", [
    ("Name:\tpython\nNSpid:\t12014\t32\n", 32),
    ("NSpid:\t900\t40\t7\n", 7),                              # nested: the innermost
    ("NSpid:\t12014\n", 0),                                  # the agent's own namespace
    ("Name:\tpython\n", 0),
])
def test_nspid(status, expected) -> None:
    assert nspid(status) == expected


def _proc_tree(tmp: Path, pid: int, *, cgroup: str, status: str, uts: str,
               hostname: str | None = "trainer-0") -> Path:
    """A recorded /proc: <pid>/{status,cgroup,ns/uts,root/etc/hostname} and self/ns/uts."""
    proc = tmp / "proc"
    (proc / "self" / "ns").mkdir(parents=True)
    os.symlink("uts:[4026531838]", proc / "self" / "ns" / "uts")
    d = proc / str(pid)
    (d / "ns").mkdir(parents=True)
    (d / "status").write_text(status)
    (d / "cgroup").write_text(cgroup)
    os.symlink(uts, d / "ns" / "uts")
    (d / "root" / "etc").mkdir(parents=True)
    if hostname is not None:
        (d / "root" / "etc" / "hostname").write_text(hostname + "\n")
    return proc


def test_inspect_a_rank_in_a_kubernetes_pod(tmp_path) -> None:
    proc = _proc_tree(tmp_path, 12014, status="NSpid:\t12014\t32\n", uts="uts:[4026532999]",
                      cgroup=CGROUP_CASES[0][0])
    pods = tmp_path / "pods"
    (pods / f"ml-team_trainer-0_{UID}").mkdir(parents=True)
    info = inspect(12014, {"POD_NAME": "env-says-other"}, proc=str(proc), pods_root=str(pods))
    assert (info.container_pid, info.hostname, info.runtime, info.container_id, info.pod_uid,
            info.namespace, info.pod) == (32, "trainer-0", "containerd", CID, UID,
                                          "ml-team", "trainer-0")
    assert (info.declared_namespace, info.declared_pod) == ("", "env-says-other")
    # Without the kubelet's directories the node names no pod: the pod's own
    # environment is only what the rank declares (issue 29, item 5).
    info = inspect(12014, {"POD_NAME": "trainer-0", "POD_NAMESPACE": "ns2"}, proc=str(proc),
                   pods_root=str(tmp_path / "none"))
    assert (info.namespace, info.pod) == ("", "")
    assert (info.declared_namespace, info.declared_pod) == ("ns2", "trainer-0")
    assert info.pod_uid == UID                          # the node's own word stays


def test_a_delegated_cgroup_does_not_take_a_pods_name(tmp_path) -> None:
    """A process under user@0.service names its cgroups as a pod's container:
    the kubelet's directory of that pod exists, and still no pod is named."""
    fake = (f"0::/user.slice/user-0.slice/user@0.service/kubepods.slice/kubepods-burstable."
            f"slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope\n")
    proc = _proc_tree(tmp_path, 12014, status="NSpid:\t12014\n", uts="uts:[4026531838]",
                      cgroup=fake)
    pods = tmp_path / "pods"
    (pods / f"ml-team_trainer-0_{UID}").mkdir(parents=True)
    info = inspect(12014, {}, proc=str(proc), pods_root=str(pods))
    assert (info.runtime, info.container_id, info.pod_uid, info.namespace, info.pod) == \
        ("", "", "", "", "")


def test_a_rank_cannot_name_its_pod(tmp_path) -> None:
    """A rank's POD_NAME/POD_NAMESPACE (its own environment) is shown as declared
    by the rank and never becomes the culprit's pod label; the node's pod does."""
    from ncclwatch import status
    from ncclwatch.agent.discover import RankProcess
    from ncclwatch.agent.report import identity_pb
    from ncclwatch.daemon.api import jobs_view
    from ncclwatch.daemon.core import Daemon, DaemonConfig
    from ncclwatch.daemon.export import build, capture
    from ncclwatch.jobid import RankIdentity
    from tests.harness.reports import checkpoint_job

    proc = _proc_tree(tmp_path, 12014, status="NSpid:\t12014\t32\n", uts="uts:[4026532999]",
                      cgroup=CGROUP_CASES[0][0])
    pods = tmp_path / "pods"
    pods.mkdir()
    lying = {"POD_NAME": "payments-api-0", "POD_NAMESPACE": "prod"}
    infos = [inspect(12014, lying, proc=str(proc), pods_root=str(pods))]   # kubelet dir absent
    (pods / f"ml-team_trainer-0_{UID}").mkdir()
    infos.append(inspect(12014, lying, proc=str(proc), pods_root=str(pods)))
    for info, node_pod in zip(infos, [("", ""), ("ml-team", "trainer-0")]):
        d = Daemon(DaemonConfig())
        req = checkpoint_job("job-k", world=2)
        ident = RankIdentity(job_id="job-k", job_source="test", rank=0, local_rank=0,
                             world_size=2, rank_source="env:RANK")
        rp = RankProcess(pid=1000, create_time=0.0, identity=ident, env={}, local={},
                         container=info)
        req.report.samples[0].identity.CopyFrom(identity_pb(rp))
        d.ingest(req, now=100.0)
        d.tick(now=100.0)
        view = jobs_view(d, now=100.0)
        culprit = view["jobs"][0]["stalls"][0]["culprits"][0]
        c = culprit["container"]
        assert (c["namespace"] or "", c["pod"] or "") == node_pod
        assert c["declared_by_rank"] == {"namespace": "prod", "pod": "payments-api-0"}
        text = status.render(view)
        assert "pod prod/payments-api-0 declared by the rank" in text, text
        series = [(f.name, labels) for f in build(capture(d, now=100.0))
                  for labels, _ in f.rows]
        assert not any("payments-api-0" in lab or "prod" in lab for _, lab in series)
        labels = [dict(zip(("job", "kind", "rank", "host", "node", "state", "namespace", "pod"),
                           lab))
                  for name, lab in series if name == "ncclwatch_stall_culprit_info"]
        assert [(x["namespace"], x["pod"]) for x in labels] == [node_pod]


def test_inspect_a_host_process_is_no_container(tmp_path) -> None:
    proc = _proc_tree(tmp_path, 77, status="NSpid:\t77\n", uts="uts:[4026531838]",
                      cgroup="0::/user.slice/session-1.scope\n")
    info = inspect(77, {"HOSTNAME": "node-1"}, proc=str(proc), pods_root=str(tmp_path))
    assert info == NONE and not info
    assert describe(container_view(None)) == ""


def test_a_symlinked_hostname_is_never_followed(tmp_path) -> None:
    """A hostile image's /etc/hostname -> /etc/shadow (or any host file) reads as nothing."""
    secret = tmp_path / "host-secret"
    secret.write_text("root:$6$hash\n")
    proc = _proc_tree(tmp_path, 5, status="NSpid:\t5\t1\n", uts="uts:[4026532999]",
                      cgroup="0::/\n", hostname=None)
    os.symlink(str(secret), proc / "5" / "root" / "etc" / "hostname")
    assert read_in_root(5, "/etc/hostname", proc=str(proc)) == ""
    assert inspect(5, {}, proc=str(proc)).hostname == ""
    # A symlinked directory on the way is refused just the same.
    os.rename(proc / "5" / "root" / "etc", proc / "5" / "root" / "etc2")
    (proc / "5" / "root" / "etc2" / "hostname").unlink()
    (proc / "5" / "root" / "etc2" / "hostname").write_text("x\n")
    os.symlink("etc2", proc / "5" / "root" / "etc")
    assert read_in_root(5, "/etc/hostname", proc=str(proc)) == ""
    assert read_in_root(5, "/../host-secret", proc=str(proc)) == ""
    assert read_in_root(5, "etc2/hostname", proc=str(proc)) == ""     # relative: refused
    assert read_in_root(5, "/etc2/hostname", proc=str(proc)) == "x\n"


@pytest.mark.parametrize("written,shown", [
    ("trainer-0", "trainer-0"), ("Node_7.local", "Node_7.local"),
    ("\x1b[2Jpwned", ""), ("<b>x</b>", ""), ("a" * 300, ""), ("", ""),
])
def test_a_hostname_is_shown_only_when_it_is_one(tmp_path, written, shown) -> None:
    """The container's /etc/hostname is the image's to write: no terminal
    escapes or markup reach ``ncclwatch status`` or the page."""
    proc = _proc_tree(tmp_path, 9, status="NSpid:\t9\t1\n", uts="uts:[4026532999]",
                      cgroup="0::/\n", hostname=written)
    assert inspect(9, {}, proc=str(proc), pods_root=str(tmp_path)).hostname == shown


def test_describe_and_the_api_view() -> None:
    view = container_view((32, "trainer-0", CID, "containerd", UID, "ml-team", "trainer-0",
                           "ml-team", "trainer-0"))
    assert view == {"pid": 32, "hostname": "trainer-0", "id": CID, "runtime": "containerd",
                    "pod_uid": UID, "namespace": "ml-team", "pod": "trainer-0",
                    "declared_by_rank": {"namespace": "ml-team", "pod": "trainer-0"}}
    # what the rank declares is said only where it differs from the node's word
    assert describe(view) == ("pid 32 in container trainer-0 (containerd 4c15c0c881a4), "
                              "pod ml-team/trainer-0")
    assert describe(container_view((0, "", CID, "docker", "", "", "", "", ""))) == \
        "in container (docker 4c15c0c881a4)"
    assert describe(container_view((0, "", CID, "docker", UID, "", "", "x", "y"))) == \
        "in container (docker 4c15c0c881a4), pod x/y declared by the rank"


#: (environment, job source, job id): the Kubernetes rows of JOB_ID_SOURCES.
K8S_JOB_CASES = [
    # Kubeflow Trainer / PyTorchJob: torchrun's defaults as PET_*, static rendezvous
    # (TORCHELASTIC_RUN_ID none); the master service names the job.
    ({"RANK": "3", "WORLD_SIZE": "8", "TORCHELASTIC_RUN_ID": "none",
      "PET_MASTER_ADDR": "llama-node-0-0.llama", "PET_MASTER_PORT": "29400", "PET_NNODES": "2",
      "MASTER_ADDR": "llama-node-0-0.llama", "MASTER_PORT": "29400"},
     "kubeflow", "kubeflow:llama-node-0-0.llama:29400/2"),
    # JobSet: its name (downward API), in its namespace.
    ({"RANK": "1", "WORLD_SIZE": "4", "JOBSET_NAME": "pretrain", "POD_NAMESPACE": "ml",
      "MASTER_ADDR": "pretrain-workers-0-0.pretrain", "MASTER_PORT": "29500",
      "PET_MASTER_ADDR": "pretrain-workers-0-0.pretrain", "PET_MASTER_PORT": "29500"},
     "jobset", "jobset:ml/pretrain"),
    # An elastic rendezvous id still wins (the same for every pod).
    ({"RANK": "0", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "abc", "JOBSET_NAME": "x"},
     "torchelastic", "torchelastic:abc"),
    # An indexed Job with torchrun: the rendezvous address names the job.
    ({"RANK": "2", "WORLD_SIZE": "4", "JOB_COMPLETION_INDEX": "1",
      "MASTER_ADDR": "train-0.train-svc", "MASTER_PORT": "29500"},
     "master", "master:train-0.train-svc:29500/4"),
]


@pytest.mark.parametrize("env,source,job", K8S_JOB_CASES)
def test_kubernetes_job_ids(env, source, job) -> None:
    ident = identify(env, "node-1")
    assert ident is not None and (ident.job_source, ident.job_id) == (source, job)
    assert ident.rank == int(env["RANK"])


def test_the_daemon_shows_the_container_and_labels_the_culprit_with_its_pod() -> None:
    """Through the daemon: API rank and culprit, status, page, and only the
    culprit's metric series carrying namespace and pod."""
    from ncclwatch import status
    from ncclwatch.daemon import page
    from ncclwatch.daemon.api import jobs_view
    from ncclwatch.daemon.core import Daemon, DaemonConfig
    from ncclwatch.daemon.export import build, capture
    from tests.harness.reports import checkpoint_job

    d = Daemon(DaemonConfig())
    req = checkpoint_job("job-k", world=3)
    for i, s in enumerate(req.report.samples):
        s.identity.container.CopyFrom(pb.ContainerInfo(
            container_pid=32 + i, hostname=f"trainer-{i}", container_id=CID,
            runtime="containerd", pod_uid=UID, namespace="ml-team", pod=f"trainer-{i}"))
    d.ingest(req, now=100.0)
    d.tick(now=100.0)
    view = jobs_view(d, now=100.0)
    job = view["jobs"][0]
    assert [(r["rank"], r["pid"], r["container"]["pid"], r["container"]["pod"])
            for r in job["ranks"]] == [(0, 1000, 32, "trainer-0"), (1, 1001, 33, "trainer-1"),
                                       (2, 1002, 34, "trainer-2")]
    culprit = job["stalls"][0]["culprits"][0]
    assert culprit["container"]["hostname"] == "trainer-0", culprit
    text = status.render(view)
    assert ("culprit: rank 0 on node-a (pid 1000; pid 32 in container trainer-0 "
            "(containerd 4c15c0c881a4), pod ml-team/trainer-0) saving") in text, text
    assert "pid 33 in container trainer-1" in page.render(view)
    families = build(capture(d, now=100.0))
    series = [(f.name, labels) for f in families for labels, _ in f.rows]
    fam = next(f for f in families if f.name == "ncclwatch_stall_culprit_info")
    culprits = [dict(zip(fam.labels, lab)) for lab, _ in fam.rows]
    # rank_*: the Prometheus Operator's target labels namespace/pod would overwrite these.
    assert [(c["rank"], c["rank_namespace"], c["rank_pod"]) for c in culprits] == [
        ("0", "ml-team", "trainer-0")], culprits
    assert not {"namespace", "pod", "container", "endpoint", "service"} & set(fam.labels)
    # No other family grows a per-pod label.
    assert not any("trainer-1" in lab for _, lab in series), series


def test_open_files_through_the_fds(tmp_path) -> None:
    """The sampler's own fd listing: modes as psutil's, unlinked files skipped."""
    from ncclwatch.agent.sample import open_files
    w = open(tmp_path / "ckpt.pt", "wb")
    a = open(tmp_path / "log.txt", "a")
    r = open(tmp_path / "ckpt.pt", "rb")
    gone = open(tmp_path / "tmp.bin", "wb")
    os.unlink(tmp_path / "tmp.bin")
    try:
        w.write(b"x" * 100)
        w.flush()
        mine = {h.fd: (h.path, h.mode, h.size) for h in open_files(os.getpid())}
        assert mine[w.fileno()] == (str(tmp_path / "ckpt.pt"), "w", 100)
        assert mine[a.fileno()][1] == "a"
        assert mine[r.fileno()][1] == "r"
        assert gone.fileno() not in mine
    finally:
        for f in (w, a, r, gone):
            f.close()


def test_the_agent_takes_the_kubelet_pod_directory_from_its_config() -> None:
    from ncclwatch.cli import AGENT_OPTIONS, build_parser
    from ncclwatch.config import resolve
    args = build_parser().parse_args(["agent"])
    assert resolve(AGENT_OPTIONS, args, {}, env={})["pods_log_dir"] == "/var/log/pods"
    args = build_parser().parse_args(["agent", "--pods-log-dir", "/host/var/log/pods"])
    assert resolve(AGENT_OPTIONS, args, {}, env={})["pods_log_dir"] == "/host/var/log/pods"
    assert resolve(AGENT_OPTIONS, build_parser().parse_args(["agent"]), {},
                   env={"NCCLWATCH_PODS_LOG_DIR": "/k/pods"})["pods_log_dir"] == "/k/pods"
