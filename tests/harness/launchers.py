"""The scenario matrix's launchers: how each starts a world of N ranks.

A table, launcher name -> how its argv and environment are built for a
world running ``ncclwatch.demo.job`` (or a workload script), and the job
source ncclwatch must name the job by. Every entry is a real process tree:
the launcher's own program (torchrun, ``torch.distributed.launch``,
DeepSpeed's runner, a bash loop), started with the environment the
scheduler around it gives its ranks. Where that scheduler cannot run here
(TorchX's CLI is not installed, no Kubernetes, no SkyPilot cluster) its
environment and the command it runs are replayed, from its source or docs:

- TorchX ``torchx run -s local_cwd dist.ddp -j 1xN -m MODULE``: the local
  scheduler runs the role's entrypoint, ``bash -c "torchrun --rdzv_backend
  c10d --rdzv_endpoint localhost:0 --rdzv_id <app id> --nnodes 1
  --nproc_per_node N --tee 3 --role '' -m MODULE ..."``, with the role's env:
  TORCHX_JOB_ID (``<scheduler>://<session>/<app id>``, torchx/runner/api.py
  dryrun), TORCHX_TRACKING_EXPERIMENT_NAME, TORCHX_TRACKING_RUN_NAME and
  LOGLEVEL (torchx/components/dist.py ``ddp``).
- Kubeflow PyTorchJob (training-operator, pkg/controller.v1/pytorch:
  envvar.go, master.go, elastic.go): a Master pod gets PYTHONUNBUFFERED=0,
  MASTER_ADDR=``<job>-master-0`` (the master Service), MASTER_PORT (the
  container's ``pytorchjob-port``), WORLD_SIZE (replicas), RANK (replica
  index) and torchrun's defaults as PET_NNODES, PET_NPROC_PER_NODE,
  PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT; its image runs
  ``torchrun MODULE``. The Service name does not resolve here, so torchrun
  dials 127.0.0.1 (``--master-addr``) while PET_MASTER_ADDR keeps the name
  the job id is made of.
- SkyPilot (docs.skypilot.co, "Distributed Multi-Node Jobs"): the ``run:``
  section, ``MASTER_ADDR=$(echo "$SKYPILOT_NODE_IPS" | head -n1); torchrun
  --nnodes=$SKYPILOT_NUM_NODES --nproc_per_node=$SKYPILOT_NUM_GPUS_PER_NODE
  --node_rank=$SKYPILOT_NODE_RANK --master_addr=$MASTER_ADDR
  --master_port=PORT main.py`` under bash, with SKYPILOT_TASK_ID.
"""

from __future__ import annotations

import os
import random
import shlex
import string
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from tests.harness.procs import free_port
from tests.harness.tools import need

#: What a hand-rolled launcher's ranks must not inherit from the test's own
#: environment: names, and prefixes ending in ``_`` or ``*``.
SCRUBBED: tuple[str, ...] = (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR",
    "MASTER_PORT", "NCCLWATCH_JOB_ID", "SLURM_", "TORCHELASTIC_", "PMI*", "OMPI_", "PET_",
    "SKYPILOT_", "TORCHX_", "JOBSET_NAME",
)


@dataclass(frozen=True)
class World:
    """One row's job: how many ranks, what each runs, where it may write."""

    size: int
    #: What Python runs: ``("-m", "ncclwatch.demo.job", *args)`` or ``(script, *args)``.
    program: tuple[str, ...]
    #: A scratch directory of the row (a rendezvous file lives there).
    work: str
    #: The row's name: made into the scheduler's job name.
    name: str

    @property
    def module(self) -> str | None:
        return self.program[1] if self.program[:1] == ("-m",) else None


@dataclass(frozen=True)
class Launch:
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Launcher:
    build: Callable[[World], Launch]
    #: The job source (``/api/v1/jobs`` ``source``) ncclwatch must name the job
    #: by; None: not judged.
    job_source: str | None = None
    #: Only ``ncclwatch.demo.job`` can run under it (its own rendezvous flags).
    demo_only: bool = False


def scrubbed(keep: dict[str, str] | None = None,
             environ: dict[str, str] | None = None) -> list[str]:
    """``env -u NAME ...`` for each SCRUBBED variable the environment holds, but
    those the launcher sets itself (``keep``)."""
    environ = os.environ if environ is None else environ
    out = []
    for name in sorted(set(environ) - set(keep or ())):
        if any(name == s or (s[-1] in "_*" and name.startswith(s.rstrip("*")))
               for s in SCRUBBED):
            out += ["-u", name]
    return ["env", *out]


def _slug(world: World, n: int = 5) -> str:
    """A Kubernetes-style name for the row's job, unique per launch."""
    tail = "".join(random.choices(string.ascii_lowercase + string.digits, k=n))
    return f"{world.name.lower().replace('_', '-')[:40]}-{tail}"


def _torchrun(w: World) -> Launch:
    return Launch([need("torchrun"), "--standalone", f"--nproc-per-node={w.size}",
                   "--max-restarts=0", *w.program])


def _demo_launch(w: World) -> Launch:
    # ncclwatch.demo.launch: like ranks on other nodes, it leaves the others
    # waiting when one dies.
    return Launch([sys.executable, "-m", "ncclwatch.demo.launch", "--nproc", str(w.size),
                   "--", *w.program[2:]])


def _shell(init_method: Callable[[World], str]) -> Callable[[World], Launch]:
    """A bash loop that starts each rank with its rank and the rendezvous on its
    command line, and none of it in the environment."""
    def build(w: World) -> Launch:
        rank_cmd = shlex.join([sys.executable, *w.program, "--init-method", init_method(w),
                               "--world-size", str(w.size)])
        script = (f'pids=(); for i in $(seq 0 {w.size - 1}); do {rank_cmd} --rank "$i" & '
                  'pids+=($!); done; rc=0; for p in "${pids[@]}"; do wait "$p" || rc=$?; '
                  'done; exit $rc')
        return Launch([*scrubbed(), "bash", "-c", script])
    return build


def _deepspeed(w: World) -> Launch:
    program = ("--module", *w.program[1:]) if w.module else w.program
    return Launch([need("deepspeed"), "--num_gpus", str(w.size), "--master_port",
                   str(free_port()), *program], {"DS_ACCELERATOR": "cpu"})


def _torch_launch(*flags: str) -> Callable[[World], Launch]:
    """The legacy ``python -m torch.distributed.launch`` (still in torch 2.x):
    without ``--use-env`` it passes ``--local-rank=N`` to each rank."""
    def build(w: World) -> Launch:
        return Launch([sys.executable, "-m", "torch.distributed.launch", *flags,
                       f"--nproc-per-node={w.size}", f"--master-port={free_port()}",
                       *w.program])
    return build


def _torchx_local(w: World) -> Launch:
    # dist.ddp names the app (and its role) after the module or script.
    run_name = w.module.rpartition(".")[2] if w.module else Path(w.program[0]).stem
    app_id = f"{run_name}-{_slug(w, 12).rsplit('-', 1)[1]}"
    cmd = ["torchrun", "--rdzv_backend", "c10d", "--rdzv_endpoint", "localhost:0",
           "--rdzv_id", app_id, "--nnodes", "1", "--nproc_per_node", str(w.size),
           "--tee", "3", "--role", "", *w.program]
    bindir = os.path.dirname(need("torchrun"))
    env = {"PATH": f"{bindir}:{os.environ.get('PATH', '')}",
           "TORCHX_JOB_ID": f"local_cwd://torchx/{app_id}",
           "TORCHX_TRACKING_EXPERIMENT_NAME": "default-experiment",
           "TORCHX_TRACKING_RUN_NAME": run_name, "LOGLEVEL": "WARNING"}
    return Launch([*scrubbed(env), "bash", "-c", shlex.join(cmd)], env)


def _kubeflow_pytorchjob(w: World) -> Launch:
    job, port = _slug(w), str(free_port())
    service = f"{job}-master-0"
    env = {"PYTHONUNBUFFERED": "0", "MASTER_ADDR": service, "MASTER_PORT": port,
           "WORLD_SIZE": "1", "RANK": "0",
           "PET_NNODES": "1", "PET_NPROC_PER_NODE": str(w.size), "PET_NODE_RANK": "0",
           "PET_MASTER_ADDR": service, "PET_MASTER_PORT": port}
    # The Service name resolves only in the cluster: torchrun dials loopback.
    return Launch([*scrubbed(env), need("torchrun"), "--master-addr=127.0.0.1", *w.program],
                  env)


def _skypilot(w: World) -> Launch:
    cluster = _slug(w, 4)
    stamp = time.strftime("%Y-%m-%d-%H-%M-%S", time.gmtime()) + f"-{random.randrange(10**6):06d}"
    torchrun = shlex.quote(need("torchrun"))
    run = ('MASTER_ADDR=$(echo "$SKYPILOT_NODE_IPS" | head -n1)\n'
           f"{torchrun} --nnodes=$SKYPILOT_NUM_NODES"
           " --nproc_per_node=$SKYPILOT_NUM_GPUS_PER_NODE --node_rank=${SKYPILOT_NODE_RANK}"
           f" --master_addr=$MASTER_ADDR --master_port={free_port()} {shlex.join(w.program)}")
    env = {"SKYPILOT_NODE_RANK": "0", "SKYPILOT_NODE_IPS": "127.0.0.1",
           "SKYPILOT_NUM_NODES": "1", "SKYPILOT_NUM_GPUS_PER_NODE": str(w.size),
           "SKYPILOT_TASK_ID": f"sky-{stamp}_{cluster}_1"}
    return Launch([*scrubbed(env), "bash", "-c", run], env)


#: name -> how it starts a world. ``Scenario.launcher`` names a row here.
LAUNCHERS: dict[str, Launcher] = {
    "torchrun": Launcher(_torchrun),
    "launch": Launcher(_demo_launch, demo_only=True),
    "shell-tcp": Launcher(_shell(lambda w: f"tcp://127.0.0.1:{free_port()}"),
                          job_source="store", demo_only=True),
    "shell-file": Launcher(_shell(lambda w: f"file://{w.work}/rdzv"),
                           job_source="file", demo_only=True),
    "deepspeed": Launcher(_deepspeed, job_source="master"),
    "torch-launch": Launcher(_torch_launch(), job_source="master"),
    "torch-launch-use-env": Launcher(_torch_launch("--use-env"), job_source="master"),
    "torchx-local": Launcher(_torchx_local, job_source="torchx"),
    "kubeflow-pytorchjob": Launcher(_kubeflow_pytorchjob, job_source="kubeflow"),
    "skypilot": Launcher(_skypilot, job_source="skypilot"),
}


def launch(name: str, world: World) -> Launch:
    """The argv and environment that start ``world`` under launcher ``name``."""
    row = LAUNCHERS[name]
    if row.demo_only and world.module != "ncclwatch.demo.job":
        raise ValueError(f"launcher {name} runs only ncclwatch.demo.job, not {world.program}")
    return row.build(world)
