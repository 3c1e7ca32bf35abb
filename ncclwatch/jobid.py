"""Who a training process is: its job id and rank, from its environment.

The job id must be the same for every rank of a job on every node and
differ between jobs, with no coordination: it comes from the first source in
JOB_ID_SOURCES that the environment has (an explicit id, TorchX's app
handle, the launcher's run id, SkyPilot's task id, the scheduler's job id,
the PMIx namespace, a Kubernetes JobSet's or Kubeflow job's name, else the
rendezvous address;
discovery may add the launcher process as a last, node-local source).

The rank comes from the first row of RANK_VARIABLES the environment fills.
A process that only shows it belongs to a job (rendezvous variables, no
rank) is a member with rank UNKNOWN_RANK: a rank is never guessed. Each
identity says where its rank came from (``rank_source``), for the API.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from ncclwatch.envpolicy import redact_patterns

LOOPBACK = ("127.", "localhost", "::1", "0.0.0.0")


#: Rank of a job member whose number nothing outside the process shows.
UNKNOWN_RANK = -1
#: rank_source of such a member.
UNKNOWN_SOURCE = "unknown"
#: rank_source of Lightning's subprocess launcher's children (no RANK).
NODE_LOCAL_SOURCE = "env:NODE_RANK+LOCAL_RANK"


@dataclass(frozen=True, slots=True)
class RankIdentity:
    job_id: str
    job_source: str
    rank: int           # UNKNOWN_RANK when not known
    local_rank: int     # -1 when not known
    world_size: int     # 0 when not known (PMIx alone does not say it)
    rank_source: str = "env:RANK"
    #: Sources that showed different numbers ("ray_train_log:1 locals:...:2"):
    #: the rank stays unnumbered, both shown (agent.ranklearn).
    rank_conflict: str = ""

    @property
    def known(self) -> bool:
        return self.rank != UNKNOWN_RANK


def _explicit(env: Mapping[str, str], host: str) -> str | None:
    return env.get("NCCLWATCH_JOB_ID") or None


def _torchx(env: Mapping[str, str], host: str) -> str | None:
    # TorchX's runner gives every role of an app its handle,
    # ``<scheduler>://<session>/<app id>`` (TORCHX_JOB_ID), on every node; its
    # dist.ddp component also passes the app id to torchrun as --rdzv_id.
    return env.get("TORCHX_JOB_ID") or None


def _torchelastic(env: Mapping[str, str], host: str) -> str | None:
    run_id = env.get("TORCHELASTIC_RUN_ID", "")
    return run_id if run_id and run_id != "none" else None


def _skypilot(env: Mapping[str, str], host: str) -> str | None:
    # SkyPilot exports its task id (``sky-<launch time>_<cluster>_<job id>``) to
    # the run section on every node; its torchrun example uses a static
    # rendezvous (no run id) on the head node's IP.
    return env.get("SKYPILOT_TASK_ID") or None


def _slurm(env: Mapping[str, str], host: str) -> str | None:
    job = env.get("SLURM_JOB_ID")
    if not job:
        return None
    step = env.get("SLURM_STEP_ID")
    return f"{job}.{step}" if step else job


def _pmix(env: Mapping[str, str], host: str) -> str | None:
    # OpenMPI's mpirun (and prterun, srun --mpi=pmix) name each job's namespace.
    return env.get("PMIX_NAMESPACE") or None


def _jobset(env: Mapping[str, str], host: str) -> str | None:
    # Kubernetes JobSet (and Kubeflow Trainer, built on it): the JobSet's name,
    # from the downward API (label jobset.sigs.k8s.io/jobset-name), in its namespace.
    name = env.get("JOBSET_NAME")
    if not name:
        return None
    ns = env.get("POD_NAMESPACE")
    return f"{ns}/{name}" if ns else name


def _kubeflow(env: Mapping[str, str], host: str) -> str | None:
    # Kubeflow PyTorchJob / Trainer: torchrun's defaults as PET_* variables;
    # the master service's name holds the job's, the same in every pod.
    addr, port = env.get("PET_MASTER_ADDR"), env.get("PET_MASTER_PORT")
    if not addr or not port or addr.startswith(LOOPBACK):
        return None
    return f"{addr}:{port}/{env.get('PET_NNODES', '?')}"


def _master(env: Mapping[str, str], host: str) -> str | None:
    addr, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT")
    if not addr or not port:
        return None
    # A loopback rendezvous is only meaningful on this node.
    scope = f"{host}/" if addr.startswith(LOOPBACK) else ""
    return f"{scope}{addr}:{port}/{env.get('WORLD_SIZE', '?')}"


#: (source name, extractor) in order of preference.
JOB_ID_SOURCES: tuple[tuple[str, Callable[[Mapping[str, str], str], str | None]], ...] = (
    ("explicit", _explicit),
    ("torchx", _torchx),
    ("torchelastic", _torchelastic),
    ("skypilot", _skypilot),
    ("slurm", _slurm),
    ("pmix", _pmix),
    ("jobset", _jobset),
    ("kubeflow", _kubeflow),
    ("master", _master),
)

#: (rank, world size, local rank) variable names per launcher, in order of
#: precedence: torch's own variables win (torchrun under srun or mpirun sets
#: RANK for its workers, which also inherit the outer launcher's variables),
#: then the MPI launchers, then Slurm's task ids (``srun python train.py``
#: where the script maps SLURM_PROCID to its rank, as Lightning and submitit
#: do), then bare PMIx. An empty size name: the launcher does not say the
#: world size (it stays 0, unknown, until another rank of the job says it).
RANK_VARIABLES: tuple[tuple[str, str, str], ...] = (
    ("RANK", "WORLD_SIZE", "LOCAL_RANK"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),                # MPICH / Intel MPI (hydra)
    ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),          # srun
    ("PMIX_RANK", "", ""),                                      # prterun, srun --mpi=pmix
)

#: Variables that make a process a member of a job whose rank it does not
#: show (the rank was passed on the command line or set in-process).
MEMBER_VARIABLES: tuple[str, ...] = ("MASTER_ADDR", "MASTER_PORT")

MAX_JOB_ID_LEN = 128


def identify(env: Mapping[str, str], host: str, *, launcher: str | None = None,
             local_world: int | None = None) -> RankIdentity | None:
    """The rank identity a process environment declares, or None if it is no rank.

    ``launcher``: a node-local job id from the process's launcher (discovery
    passes it), used when the environment names no job. ``local_world``: how
    many ranks the process's launcher started on this node, which Lightning's
    children on node > 0 need (NODE_RANK * local_world + LOCAL_RANK).
    """
    found = rank_of(env, local_world)
    if found is None:
        return None
    job = job_of(env, host, launcher)
    if job is None:
        return None
    rank, size, local, source = found
    return RankIdentity(job_id=job[1], job_source=job[0], rank=rank, local_rank=local,
                        world_size=size, rank_source=source)


def job_of(env: Mapping[str, str], host: str,
           launcher: str | None = None) -> tuple[str, str] | None:
    """(source, job id) from the first JOB_ID_SOURCES row the environment fills."""
    for name, extract in JOB_ID_SOURCES:
        job = extract(env, host)
        if job:
            # Built from raw env (MASTER_ADDR may be user:password@host): the id
            # travels everywhere, so it is redacted like any value.
            job = redact_patterns(job)
            break
    else:
        if not launcher:
            return None
        name, job = "launcher", launcher
    return name, (job if name == "explicit" else f"{name}:{job}")[:MAX_JOB_ID_LEN]


def rank_of(env: Mapping[str, str],
            local_world: int | None = None) -> tuple[int, int, int, str] | None:
    """(rank, world size, local rank, rank source) the environment shows, or None."""
    for rank_var, size_var, local_var in RANK_VARIABLES:
        rank = _int(env.get(rank_var))
        size = _int(env.get(size_var)) if size_var else 0
        if rank is None or size is None or rank < 0 or (size_var and not 0 <= rank < size):
            continue
        local = _int(env.get(local_var)) if local_var else None
        return rank, size, local if local is not None else -1, f"env:{rank_var}"
    node_local = _node_local(env, local_world)
    if node_local is not None:
        return node_local
    if all(env.get(v) for v in MEMBER_VARIABLES):
        size = _int(env.get("WORLD_SIZE"))
        local = _int(env.get("LOCAL_RANK"))
        return (UNKNOWN_RANK, size if size and size > 0 else 0,
                local if local is not None else -1, UNKNOWN_SOURCE)
    return None


def _node_local(env: Mapping[str, str],
                local_world: int | None) -> tuple[int, int, int, str] | None:
    """Lightning's subprocess launcher: children get NODE_RANK and LOCAL_RANK, no RANK.

    On node 0 the rank is LOCAL_RANK; elsewhere it needs the node's process
    count, which only the process tree shows (``local_world``); without it
    the rank stays unknown.
    """
    fields = node_local_fields(env)
    if fields is None:
        return None
    node, local, size = fields
    if node == 0:
        return local, size, local, NODE_LOCAL_SOURCE
    if local_world and local < local_world and size % local_world == 0 \
            and node * local_world + local < size:
        return node * local_world + local, size, local, NODE_LOCAL_SOURCE
    return UNKNOWN_RANK, size, local, UNKNOWN_SOURCE


def node_local_fields(env: Mapping[str, str]) -> tuple[int, int, int] | None:
    """(NODE_RANK, LOCAL_RANK, WORLD_SIZE) of a Lightning-launched child, or None."""
    local, node, size = (_int(env.get(v)) for v in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE"))
    if (local is None or node is None or size is None or "RANK" in env
            or not all(env.get(v) for v in MEMBER_VARIABLES)
            or not 0 <= local < size or node < 0):
        return None
    return node, local, size


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
