"""Who a training process is: its job id and rank, from its environment.

The job id must be the same for every rank of a job on every node and
differ between jobs, with no coordination: it comes from the first source in
JOB_ID_SOURCES that the environment has (an explicit id, the launcher's run
id, the scheduler's job id, else the rendezvous address).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from ncclwatch.envpolicy import redact_patterns

_LOOPBACK = ("127.", "localhost", "::1", "0.0.0.0")


@dataclass(frozen=True, slots=True)
class RankIdentity:
    job_id: str
    job_source: str
    rank: int
    local_rank: int
    world_size: int


def _explicit(env: Mapping[str, str], host: str) -> str | None:
    return env.get("NCCLWATCH_JOB_ID") or None


def _torchelastic(env: Mapping[str, str], host: str) -> str | None:
    run_id = env.get("TORCHELASTIC_RUN_ID", "")
    return run_id if run_id and run_id != "none" else None


def _slurm(env: Mapping[str, str], host: str) -> str | None:
    job = env.get("SLURM_JOB_ID")
    if not job:
        return None
    step = env.get("SLURM_STEP_ID")
    return f"{job}.{step}" if step else job


def _master(env: Mapping[str, str], host: str) -> str | None:
    addr, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT")
    if not addr or not port:
        return None
    # A loopback rendezvous is only meaningful on this node.
    scope = f"{host}/" if addr.startswith(_LOOPBACK) else ""
    return f"{scope}{addr}:{port}/{env.get('WORLD_SIZE', '?')}"


#: (source name, extractor) in order of preference.
JOB_ID_SOURCES: tuple[tuple[str, Callable[[Mapping[str, str], str], str | None]], ...] = (
    ("explicit", _explicit),
    ("torchelastic", _torchelastic),
    ("slurm", _slurm),
    ("master", _master),
)

#: (rank, world size, local rank) variable names per launcher, in order of
#: precedence: torch's own variables win (torchrun under srun or mpirun sets
#: RANK for its workers, which also inherit the outer launcher's variables),
#: then the MPI launchers, then Slurm's task ids (``srun python train.py``
#: where the script maps SLURM_PROCID to its rank, as Lightning and submitit do).
RANK_VARIABLES: tuple[tuple[str, str, str], ...] = (
    ("RANK", "WORLD_SIZE", "LOCAL_RANK"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),                # MPICH / Intel MPI (hydra)
    ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),          # srun
)

MAX_JOB_ID_LEN = 128


def identify(env: Mapping[str, str], host: str) -> RankIdentity | None:
    """The rank identity a process environment declares, or None if it is no rank."""
    for rank_var, size_var, local_var in RANK_VARIABLES:
        rank, size = _int(env.get(rank_var)), _int(env.get(size_var))
        if rank is not None and size is not None and 0 <= rank < size:
            local = _int(env.get(local_var))
            break
    else:
        return None
    for source, extract in JOB_ID_SOURCES:
        job = extract(env, host)
        if job:
            # Built from raw env (MASTER_ADDR may be user:password@host): the id
            # travels everywhere, so it is redacted like any value.
            job = redact_patterns(job)
            return RankIdentity(
                job_id=(job if source == "explicit" else f"{source}:{job}")[:MAX_JOB_ID_LEN],
                job_source=source,
                rank=rank,
                local_rank=local if local is not None else -1,
                world_size=size,
            )
    return None


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
