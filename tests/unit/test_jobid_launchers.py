"""Job identity under each launcher, from the environment it documents giving
its ranks: one job id on every node of a job, another for the next job, from
the expected source; and the launcher's own processes are never ranks.

The environments are those each launcher's source or docs say it sets (real
names and formats), with torchrun's worker variables where torchrun runs
under it (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT, TORCHELASTIC_RUN_ID:
``none`` with its default static rendezvous).
"""

from __future__ import annotations

from typing import Callable

import pytest

from ncclwatch.agent.launchers import launcher_of
from ncclwatch.jobid import identify

PY = "/venv/bin/python3.11"
NODES, PER_NODE = 2, 4
WORLD = NODES * PER_NODE


def _torchrun_worker(node: int, local: int, master: str, port: str,
                     run_id: str = "none") -> dict[str, str]:
    """What torchrun (static rendezvous unless ``run_id``) sets in each worker."""
    return {"RANK": str(node * PER_NODE + local), "LOCAL_RANK": str(local),
            "WORLD_SIZE": str(WORLD), "LOCAL_WORLD_SIZE": str(PER_NODE),
            "GROUP_RANK": str(node), "MASTER_ADDR": master, "MASTER_PORT": port,
            "TORCHELASTIC_RUN_ID": run_id, "TORCHELASTIC_RESTART_COUNT": "0"}


def _torchx(job: int) -> Callable[[int, int], dict[str, str]]:
    # torchx/runner/api.py dryrun: TORCHX_JOB_ID = make_app_handle(scheduler,
    # session, app id); dist.ddp: torchrun --rdzv_backend c10d --rdzv_id <app id>.
    app = ("trainer-k3n8fzq2wd1x", "trainer-pq7cv0m2hh5b")[job]
    return lambda node, local: {
        **_torchrun_worker(node, local, "trainer-k3n8-0.trainer", "29500", run_id=app),
        "TORCHX_JOB_ID": f"kubernetes://torchx/default:{app}",
        "TORCHX_TRACKING_EXPERIMENT_NAME": "default-experiment",
        "TORCHX_TRACKING_RUN_NAME": "trainer", "LOGLEVEL": "WARNING"}


def _kubeflow(job: int) -> Callable[[int, int], dict[str, str]]:
    # training-operator (pkg/controller.v1/pytorch): the Master pod is replica 0,
    # Worker pod i is node i+1; MASTER_ADDR/PET_MASTER_ADDR name the master
    # Service <job>-master-0; the container port pytorchjob-port (23456).
    name = ("llama-pretrain", "llama-finetune")[job]
    service = f"{name}-master-0"
    return lambda node, local: {
        "PYTHONUNBUFFERED": "0", "PET_NNODES": str(NODES), "PET_NPROC_PER_NODE": str(PER_NODE),
        "PET_NODE_RANK": str(node), "PET_MASTER_ADDR": service, "PET_MASTER_PORT": "23456",
        **_torchrun_worker(node, local, service, "23456")}


def _skypilot(job: int) -> Callable[[int, int], dict[str, str]]:
    # docs.skypilot.co "Distributed Multi-Node Jobs" and "Environment Variables":
    # the run section's torchrun on the head node's IP, static rendezvous.
    task = ("sky-2024-11-05-09-41-27-163049_mingpt_1",
            "sky-managed-2024-11-05-10-02-51-482114_mingpt-ddp_7-0")[job]
    return lambda node, local: {
        "SKYPILOT_NODE_RANK": str(node), "SKYPILOT_NODE_IPS": "10.128.0.5\n10.128.0.7",
        "SKYPILOT_NUM_NODES": str(NODES), "SKYPILOT_NUM_GPUS_PER_NODE": str(PER_NODE),
        "SKYPILOT_TASK_ID": task, "SKYPILOT_CLUSTER_INFO": '{"cluster_name": "mingpt"}',
        **_torchrun_worker(node, local, "10.128.0.5", "8008")}


def _deepspeed(job: int) -> Callable[[int, int], dict[str, str]]:
    # deepspeed/launcher/launch.py, started on each host by the runner (pdsh):
    # the first host's address, the runner's --master_port.
    port = ("29500", "29511")[job]
    return lambda node, local: {
        "MASTER_ADDR": "10.0.0.4", "MASTER_PORT": port, "WORLD_SIZE": str(WORLD),
        "RANK": str(node * PER_NODE + local), "LOCAL_RANK": str(local),
        "CROSS_RANK": str(node), "CROSS_SIZE": str(NODES), "LOCAL_SIZE": str(PER_NODE)}


def _torch_launch(job: int) -> Callable[[int, int], dict[str, str]]:
    # python -m torch.distributed.launch --nnodes 2 --node-rank N --master-addr ...:
    # torchrun's static rendezvous.
    port = ("29500", "29600")[job]
    return lambda node, local: _torchrun_worker(node, local, "10.0.0.4", port)


#: launcher -> (environment of job 0 or 1 at (node, local rank), expected source, id of job 0)
CASES: dict[str, tuple[Callable[[int], Callable[[int, int], dict[str, str]]], str, str]] = {
    "torchx": (_torchx, "torchx", "torchx:kubernetes://torchx/default:trainer-k3n8fzq2wd1x"),
    "kubeflow-pytorchjob": (_kubeflow, "kubeflow", "kubeflow:llama-pretrain-master-0:23456/2"),
    "skypilot": (_skypilot, "skypilot", "skypilot:sky-2024-11-05-09-41-27-163049_mingpt_1"),
    "deepspeed": (_deepspeed, "master", "master:10.0.0.4:29500/8"),
    "torch-launch": (_torch_launch, "master", "master:10.0.0.4:29500/8"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_one_job_id_on_every_node_another_for_the_next_job(name) -> None:
    env_of, source, first = CASES[name]
    ids = {}
    for job in (0, 1):
        seen = set()
        for node in range(NODES):
            for local in range(PER_NODE):
                ident = identify(env_of(job)(node, local), f"node-{node}")
                assert ident is not None, (name, job, node, local)
                assert (ident.rank, ident.world_size, ident.job_source) == (
                    node * PER_NODE + local, WORLD, source), ident
                seen.add(ident.job_id)
        assert len(seen) == 1, (name, job, seen)   # the same on every node
        ids[job] = seen.pop()
    assert ids[0] == first
    assert ids[0] != ids[1]


def test_a_single_node_replay_with_a_loopback_rendezvous_keeps_its_source() -> None:
    """The e2e replays dial 127.0.0.1; the job ids that do not rest on the
    rendezvous address stay the same (the Kubeflow Service name is in
    PET_MASTER_ADDR; torchrun's MASTER_ADDR is loopback)."""
    env = {**_kubeflow(0)(0, 1), "MASTER_ADDR": "127.0.0.1"}
    assert identify(env, "n").job_id == "kubeflow:llama-pretrain-master-0:23456/2"
    env = {**_skypilot(0)(0, 1), "MASTER_ADDR": "127.0.0.1", "SKYPILOT_NODE_IPS": "127.0.0.1"}
    assert identify(env, "n").job_source == "skypilot"
    # DeepSpeed and torch.distributed.launch on one node: scoped to the host.
    env = {**_deepspeed(0)(0, 1), "MASTER_ADDR": "127.0.0.1"}
    assert identify(env, "gpu-7").job_id == "master:gpu-7/127.0.0.1:29500/8"


def test_the_shells_around_a_launcher_do_not_name_the_job() -> None:
    """TorchX's and SkyPilot's bash (no rank variables) is no rank."""
    env = {k: v for k, v in _skypilot(0)(0, 0).items() if k.startswith("SKYPILOT_")}
    assert identify(env, "n") is None
    env = {k: v for k, v in _torchx(0)(0, 0).items() if k.startswith(("TORCHX_", "LOG"))}
    assert identify(env, "n") is None


#: Each launcher's own processes, as their command lines read in ps.
LAUNCHER_PROCESSES = [
    # DeepSpeed's runner, and the per-node launch.py it starts (runner.py)
    ([PY, "-u", "/venv/bin/deepspeed", "--num_gpus", "2", "--master_port", "29500",
      "--module", "ncclwatch.demo.job"], "deepspeed"),
    ([PY, "-u", "-m", "deepspeed.launcher.launch", "--world_info=eyJsb2NhbGhvc3QiOiBbMCwgMV19",
      "--master_addr=127.0.0.1", "--master_port=29500", "--module", "ncclwatch.demo.job"],
     "deepspeed"),
    # the legacy torch.distributed.launch, with and without --use-env
    ([PY, "-m", "torch.distributed.launch", "--nproc-per-node=2", "--master-port=29500",
      "-m", "ncclwatch.demo.job"], "torchrun"),
    ([PY, "-m", "torch.distributed.launch", "--use-env", "--nproc-per-node=2", "train.py"],
     "torchrun"),
    # TorchX's local scheduler: bash -c "torchrun ...", then torchrun
    ([PY, "/venv/bin/torchrun", "--rdzv_backend", "c10d", "--rdzv_endpoint", "localhost:0",
      "--rdzv_id", "job-k3n8fzq2wd1x", "--nnodes", "1", "--nproc_per_node", "2", "--tee", "3",
      "--role", "", "-m", "ncclwatch.demo.job"], "torchrun"),
    # the Kubeflow image's and SkyPilot's torchrun
    ([PY, "/venv/bin/torchrun", "--master-addr=127.0.0.1", "train.py"], "torchrun"),
    ([PY, "/venv/bin/torchrun", "--nnodes=2", "--nproc_per_node=4", "--node_rank=0",
      "--master_addr=10.128.0.5", "--master_port=8008", "main.py"], "torchrun"),
    # the ranks themselves are not launchers (nor is the shell loop: no torch)
    ([PY, "-u", "-m", "ncclwatch.demo.job", "--local_rank=1"], None),
    ([PY, "-m", "ncclwatch.demo.job", "--init-method", "tcp://127.0.0.1:29500", "--rank",
      "1", "--world-size", "3"], None),
    (["bash", "-c", "for i in 0 1 2; do python -m ncclwatch.demo.job --rank $i & done; wait"],
     None),
]


@pytest.mark.parametrize("cmdline,expected", LAUNCHER_PROCESSES)
def test_launcher_processes_are_never_ranks(cmdline, expected) -> None:
    assert launcher_of(cmdline) == expected


def test_the_shell_loops_ranks_inherit_no_launcher_variables() -> None:
    """The matrix's shell launchers start ranks through ``env -u``: whatever
    launcher ran the tests, its variables never reach them (a leaked RANK or
    SLURM_JOB_ID would name the job for them); what a launcher sets is kept."""
    import subprocess

    from tests.harness.launchers import scrubbed
    dirty = {"PATH": "/usr/bin:/bin", "RANK": "3", "WORLD_SIZE": "8", "MASTER_ADDR": "10.0.0.1",
             "MASTER_PORT": "29500", "SLURM_JOB_ID": "77", "SLURM_PROCID": "3",
             "TORCHELASTIC_RUN_ID": "r1", "PMI_RANK": "3", "PMIX_NAMESPACE": "ns",
             "OMPI_COMM_WORLD_RANK": "3", "LOCAL_RANK": "1", "HOME": "/root",
             "SKYPILOT_TASK_ID": "sky-1"}
    out = subprocess.run([*scrubbed(environ=dirty), "env"], env=dirty, capture_output=True,
                         text=True, check=True).stdout
    names = {line.split("=", 1)[0] for line in out.splitlines()}
    assert names == {"PATH", "HOME"}, names
    kept = subprocess.run([*scrubbed({"SKYPILOT_TASK_ID": "sky-1"}, environ=dirty), "env"],
                          env=dirty, capture_output=True, text=True, check=True).stdout
    assert "SKYPILOT_TASK_ID=sky-1" in kept.splitlines()
