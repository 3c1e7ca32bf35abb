"""Ray Train workers from outside: title, Ray's env, the cluster's GCS address,
rank 0 as the TCPStore server (recorded /proc trees), and the rank's own
thread inside a Ray actor (py-spy dumps)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from ncclwatch.agent.raytrain import (
    gcs_address, is_ray_process, is_starting, is_train_worker, job_id, may_become_worker,
    store_servers,
)
from ncclwatch.agent.sample import progress_events, thread_progress
from ncclwatch.stacks import Frame, Stack, ThreadDump, main_thread

RAY_ENV = {"RAY_JOB_ID": "01000000", "RAY_RAYLET_PID": "9799"}
PAD = [""] * 200  # Ray's titles come padded with empty argv slots


@pytest.mark.parametrize("cmdline,env,worker,later", [
    (["ray::RayTrainWorker", *PAD], RAY_ENV, True, False),
    (["ray::RayTrainWorker.run_train_fn"], RAY_ENV, True, True),
    (["ray::_RayTrainWorker__execute.construct_metadata"], RAY_ENV, True, True),  # V1's tasks
    (["ray::IDLE", *PAD], RAY_ENV, False, True),
    # A named task shows no class (V2's worker.execute): it may be a train worker's.
    (["ray::execute._setup_torch_process_group", *PAD], RAY_ENV, False, True),
    (["ray::TrainController"], RAY_ENV, False, False),
    (["ray::RayTrainWorker"], {}, False, False),               # no Ray env: not Ray's
    (["/venv/bin/python", "train.py"], RAY_ENV, False, False),
])
def test_titles(cmdline, env, worker, later) -> None:
    assert is_train_worker(cmdline, env) is worker
    # A process a Ray task started (torchrun under Ray) is no Ray process: its
    # environment is read the usual way.
    assert is_ray_process(cmdline, env) is (bool(env) and cmdline[0].startswith("ray::"))
    assert may_become_worker(cmdline, env) is later


#: A Ray actor process: torch loaded, its title set with Ray's own setproctitle
#: to each line it reads (SPT_NOENV=1, as the raylet starts its workers: the
#: environment stays readable in /proc).
_TITLED = """
import sys
import torch.distributed
from ray._raylet import setproctitle
print("up", flush=True)
for line in sys.stdin:
    setproctitle(line.strip())
    print("set", flush=True)
"""


def test_a_train_worker_stays_one_whatever_task_its_title_names() -> None:
    """Ray titles a worker by the task it runs; V2's named tasks hide the class
    (``ray::execute._setup_torch_process_group``). The worker is a member of its
    job before, during and after such a task (CI lost a Ray job so: issue 27)."""
    import subprocess
    import sys

    from ncclwatch.agent.discover import Discovery
    env = {**os.environ, "RAY_JOB_ID": "0a000000", "RAY_ADDRESS": "10.0.0.9:6379",
           "SPT_NOENV": "1"}
    env.pop("RAY_RAYLET_PID", None)
    p = subprocess.Popen([sys.executable, "-c", _TITLED], env=env, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert p.stdout.readline() == "up\n"
        d = Discovery("n")

        def members(title: str) -> list[tuple[str, bool]]:
            p.stdin.write(title + "\n")
            p.stdin.flush()
            assert p.stdout.readline() == "set\n"
            return [(r.identity.job_id, r.identity.known) for r in d.scan() if r.pid == p.pid]

        # First seen in a named task: not known yet, looked at again.
        assert members("ray::execute.get_metadata") == []
        assert d._seen[p.pid].recheck
        job = [("ray:10.0.0.9:6379/0a000000", False)]
        assert members("ray::RayTrainWorker") == job
        for title in ("ray::execute._setup_torch_process_group", "ray::RayTrainWorker.poll_status",
                      "ray::execute.train_fn", "ray::RayTrainWorker"):
            assert members(title) == job, title
    finally:
        p.kill()
        p.wait()


def _proc(tmp: Path) -> Path:
    proc = tmp / "proc"
    (proc / "9799").mkdir(parents=True)
    (proc / "9799" / "cmdline").write_bytes(
        b"/venv/ray/raylet\0--node_ip_address=10.0.0.5\0--gcs-address=10.0.0.1:6379\0")
    return proc


def test_the_job_is_named_by_the_cluster_and_the_ray_job(tmp_path) -> None:
    proc = _proc(tmp_path)
    assert gcs_address(RAY_ENV, str(proc)) == "10.0.0.1:6379"
    assert job_id(RAY_ENV, "node-1", str(proc)) == "10.0.0.1:6379/01000000"
    # No raylet to read: RAY_ADDRESS, else a node-local name (never another cluster's).
    env = {"RAY_JOB_ID": "02000000", "RAY_RAYLET_PID": "1", "RAY_ADDRESS": "10.0.0.2:6379"}
    assert job_id(env, "node-1", str(proc)) == "10.0.0.2:6379/02000000"
    assert job_id({"RAY_JOB_ID": "03000000"}, "node-1", str(proc)) == "node-1/raylet?/03000000"
    assert job_id({}, "node-1", str(proc)) is None


def _tcp6(rows: list[tuple[int, int, str, int]]) -> str:
    head = "  sl  local_address remote_address st tx_queue rx_queue tr tm->when retrnsmt uid timeout inode\n"
    addr = "0000000000000000FFFF00000200000A"
    lines = [f"   {i}: {addr}:{lp:04X} {addr}:{rp:04X} {st} 00000000:00000000 00:00000000 "
             f"00000000     0        0 {ino} 1 0000000000000000 20 4 0 10 -1"
             for i, (lp, rp, st, ino) in enumerate(rows)]
    return head + "\n".join(lines) + "\n"


def _worker(proc: Path, pid: int, inodes: list[int], table: str) -> None:
    d = proc / str(pid)
    (d / "fd").mkdir(parents=True)
    (d / "net").mkdir()
    for i, ino in enumerate(inodes):
        os.symlink(f"socket:[{ino}]", d / "fd" / str(10 + i))
    os.symlink("/dev/null", d / "fd" / "0")
    (d / "net" / "tcp6").write_text(table)
    (d / "net" / "tcp").write_text("  sl  local_address\n")


#: As recorded from a 3-worker TorchTrainer: worker 100 serves the store on
#: 38047 (and is its own client), 200 and 300 connect to it; each also listens
#: for gloo pairs and Ray's gRPC (connected by others, never by itself).
STORE_ROWS = [
    (38047, 0, "0A", 1), (34884, 38047, "01", 2),                  # 100: listen + self client
    (38047, 34874, "01", 3), (38047, 34884, "01", 4), (38047, 34900, "01", 5),
    (43209, 0, "0A", 6), (43209, 60906, "01", 7),                   # 100: Ray's gRPC server
    (34874, 38047, "01", 11), (38017, 0, "0A", 12), (38017, 48674, "01", 13),   # 200
    (34900, 38047, "01", 21), (45791, 0, "0A", 22),                 # 300
    (48674, 38017, "01", 23),                                       # 300 -> 200's gloo pair
]


def test_rank_0_is_the_worker_serving_the_store(tmp_path) -> None:
    proc = tmp_path / "proc"
    table = _tcp6(STORE_ROWS)
    _worker(proc, 100, [1, 2, 3, 4, 5, 6, 7], table)
    _worker(proc, 200, [11, 12, 13], table)
    _worker(proc, 300, [21, 22, 23], table)
    assert store_servers([100, 200, 300], str(proc)) == {100: 38047}
    # Before the process group exists (no store yet): nobody is numbered.
    assert store_servers([200, 300], str(proc)) == {}
    assert store_servers([100], str(proc)) == {}


def test_a_listener_others_connect_to_is_no_store_without_its_own_client(tmp_path) -> None:
    """gloo's pair listeners: others connect, the owner does not."""
    proc = tmp_path / "proc"
    rows = [(41063, 0, "0A", 1), (41063, 55470, "01", 2),
            (55470, 41063, "01", 11), (55484, 41063, "01", 21)]
    table = _tcp6(rows)
    _worker(proc, 100, [1, 2], table)
    _worker(proc, 200, [11], table)
    _worker(proc, 300, [21], table)
    assert store_servers([100, 200, 300], str(proc)) == {}


def _dump(name: str, tid: int, frames: list[tuple[str, str]]) -> ThreadDump:
    return ThreadDump(thread_id=tid, os_thread_id=tid, thread_name=name, active=False,
                      stack=Stack(tuple(Frame(n, f, 1) for n, f in frames), name))


def test_a_ray_actor_hosts_the_rank_in_its_training_thread() -> None:
    main = _dump("MainThread", 10, [("Worker.main_loop", "/v/ray/_private/worker.py"),
                                    ("<module>", "/v/ray/_private/workers/default_worker.py")])
    gc = _dump("PythonGCThread", 11, [("wait", "/py/threading.py")])
    train = _dump("TrainingThread(train_fn)", 12, [("barrier", "/v/torch/distributed/c10d.py"),
                                                   ("train_fn", "/job/train.py")])
    assert main_thread([main, gc, train], 10) is train
    # A plain process keeps its main thread; a Ray actor without one too.
    plain = _dump("MainThread", 10, [("barrier", "/v/torch/distributed/c10d.py")])
    assert main_thread([plain, gc], 10) is plain
    assert main_thread([main, gc], 10) is main


def test_thread_progress_counts_one_threads_calls() -> None:
    stop = threading.Event()
    tids: list[int] = []

    def idle() -> None:
        tids.append(threading.get_native_id())
        stop.wait()

    t = threading.Thread(target=idle)
    t.start()
    while not tids:
        pass
    try:
        before = thread_progress(os.getpid(), tids[0])
        for _ in range(200):  # this thread's reads are not the idle thread's
            fd = os.open("/proc/self/stat", os.O_RDONLY)
            os.read(fd, 10)
            os.close(fd)
        after = thread_progress(os.getpid(), tids[0])
        assert before is not None and after is not None and after - before < 20
        assert thread_progress(os.getpid(), 1 << 30) is None
        # A native dump's pause is read as the samples read the rank: its own
        # thread's counters, not the process's (whose 200 reads above would be
        # subtracted from the thread's as "the dump's own").
        assert progress_events(os.getpid(), tids[0]) - before < 20
        assert progress_events(os.getpid()) - progress_events(os.getpid(), tids[0]) > 200
    finally:
        stop.set()
        t.join()


def _native(name: str, tid: int, frames: list[tuple[str, str, int]], active=False) -> ThreadDump:
    return ThreadDump(thread_id=tid, os_thread_id=tid, thread_name=name, active=active,
                      stack=Stack(tuple(Frame(n, f, line) for n, f, line in frames), name))


def test_a_native_dumps_host_is_read_past_its_libc_frames() -> None:
    """In a ``--native`` dump frames[0] is libc's: the host is recognised by its
    innermost Python frame; a guest not named TrainingThread by its frames
    that train (torch.distributed), one on the CPU first."""
    main = _native("MainThread", 10, [("epoll_wait", "/lib/libc.so.6", 0),
                                      ("CoreWorker::RunTaskExecutionLoop", "/v/_raylet.so", 0),
                                      ("main_loop", "/v/ray/_private/worker.py", 900)])
    train = _native("TrainingThread(fn)", 12, [("pthread_cond_wait", "/lib/libc.so.6", 0),
                                               ("c10d::Work::wait", "/v/libtorch.so", 0),
                                               ("train_fn", "/job/train.py", 30)])
    assert main_thread([main, train], 10) is train
    renamed = _native("Thread-7 (run)", 12, [("pthread_cond_wait", "/lib/libc.so.6", 0),
                                             ("all_reduce", "/v/torch/distributed/c10d.py", 9),
                                             ("train_fn", "/job/train.py", 30)])
    idle = _native("Thread-8 (poll)", 13, [("select", "/lib/libc.so.6", 0),
                                           ("poll", "/v/ray/util/poll.py", 3)])
    assert main_thread([main, idle, renamed], 10) is renamed
    # A plain rank's native dump keeps its main thread whatever its threads do.
    plain = _native("MainThread", 10, [("pthread_cond_wait", "/lib/libc.so.6", 0),
                                       ("train", "/job/train.py", 5)])
    assert main_thread([plain, renamed], 10) is plain


def test_a_worker_not_yet_titled_is_looked_at_again() -> None:
    """Ray's worker runs default_worker.py until it sets its title (seconds on a
    busy node): that process may still become a train worker."""
    venv = "/venv/lib/python3.11/site-packages/ray/_private/workers"
    starting = ["/venv/bin/python", f"{venv}/setup_worker.py", f"{venv}/default_worker.py",
                "--node-ip-address=10.0.0.1"]
    assert is_starting(starting, RAY_ENV)
    assert not is_starting(starting, {})                           # not Ray's
    assert not is_starting(["/venv/bin/python", "train.py", f"{venv}/default_worker.py"][:2],
                           RAY_ENV)
    assert not is_starting(["ray::RayTrainWorker"], RAY_ENV)        # titled: the usual way
