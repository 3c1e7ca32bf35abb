"""Ray Train workers, identified from outside the process.

Ray starts each training worker as an actor process (title
``ray::RayTrainWorker``) and sets RANK/WORLD_SIZE in it after it started:
its initial environment, the one /proc shows, names no rank. What the
outside does show:

- the title, and Ray's own variables (``RAY_JOB_ID``, ``RAY_RAYLET_PID``);
- the cluster: the raylet's ``--gcs-address`` (the worker's parent): with the
  Ray job id it names the job the same on every node, and differs between
  clusters;
- the job's TCPStore: torch's ``env://`` rendezvous (Ray Train's) runs the
  store server in rank 0, which also holds a client connection to it, and
  every other rank connects to it. The worker listening on a port it is
  connected to itself, with another worker of the job connected there too,
  is rank 0. Every other worker is a member of unknown rank: a rank number
  is never guessed.
"""

from __future__ import annotations

from collections.abc import Mapping

# The socket reading is rendezvous.py's (one home); re-exported for Ray's callers.
from ncclwatch.agent.rendezvous import (  # noqa: F401
    STORE_SOURCE, connections, socket_inodes, store_servers,
)

#: Process titles of Ray Train's worker actors: the class (V2 and V1 name it
#: alike), its methods (``ray::RayTrainWorker.run_train_fn``) and V1's named
#: tasks (``ray::_RayTrainWorker__execute.<fn>``). V2's named tasks show only
#: the task (``ray::execute._setup_torch_process_group``): a worker is known
#: by its class first and stays one (discover), whatever task it runs later.
TRAIN_WORKER_TITLES = ("ray::RayTrainWorker", "ray::_RayTrainWorker__execute")
#: Titles of pooled Ray workers that may still become a train worker.
IDLE_TITLES = ("ray::IDLE",)
JOB_SOURCE = "ray"


def title(cmdline: list[str]) -> str:
    return " ".join(cmdline).strip()


def is_ray_process(cmdline: list[str], env: Mapping[str, str]) -> bool:
    """A Ray worker process (``ray::<actor or task>`` title, Ray's own env)."""
    return bool(env.get("RAY_JOB_ID")) and title(cmdline).startswith("ray::")


def is_train_worker(cmdline: list[str], env: Mapping[str, str]) -> bool:
    return bool(env.get("RAY_JOB_ID")) and title(cmdline).startswith(TRAIN_WORKER_TITLES)


def may_become_worker(cmdline: list[str], env: Mapping[str, str]) -> bool:
    """A pooled worker, or one running a named task (``ray::<name>.<fn>``): a
    train worker's class shows again between its tasks."""
    if not env.get("RAY_JOB_ID"):
        return False
    t = title(cmdline)
    return t.startswith(IDLE_TITLES) or "." in t.split(" ", 1)[0]


#: The script a Ray worker process runs until it sets its title: on a busy
#: node that can take longer than discovery's YOUNG (a train worker, first
#: seen untitled, was never looked at again; CI).
STARTING_SCRIPT = "ray/_private/workers/default_worker.py"


def is_starting(cmdline: list[str], env: Mapping[str, str]) -> bool:
    """A Ray worker process (Ray's env) that has not set its ``ray::`` title yet."""
    return bool(env.get("RAY_JOB_ID")) and any(
        a.endswith(STARTING_SCRIPT) for a in cmdline[:4])


def gcs_address(env: Mapping[str, str], proc: str = "/proc") -> str:
    """The cluster's GCS address from the raylet's command line (else RAY_ADDRESS)."""
    raylet = env.get("RAY_RAYLET_PID", "")
    if raylet.isdigit():
        try:
            with open(f"{proc}/{raylet}/cmdline", "rb") as f:
                for arg in f.read().split(b"\0"):
                    if arg.startswith(b"--gcs-address="):
                        return arg.split(b"=", 1)[1].decode(errors="replace")
        except OSError:
            pass
    return env.get("RAY_ADDRESS", "")


def job_id(env: Mapping[str, str], host: str, proc: str = "/proc") -> str | None:
    """``<gcs address>/<ray job id>``: one id per Ray job across its nodes."""
    job = env.get("RAY_JOB_ID")
    if not job:
        return None
    cluster = gcs_address(env, proc) or f"{host}/raylet{env.get('RAY_RAYLET_PID', '?')}"
    return f"{cluster}/{job}"
