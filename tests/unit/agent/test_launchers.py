"""The identification tables: launcher command lines, rank variables, spawn
index, and members with unknown rank through the daemon (tables of cases,
hypothesis where a rule holds for every environment)."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ncclwatch.agent.launchers import is_spawn_child, job_wide_id, launcher_of, wrap_index
from ncclwatch.daemon.api import jobs_view
from ncclwatch.daemon.core import Daemon, DaemonConfig
from ncclwatch.jobid import RANK_VARIABLES, UNKNOWN_RANK, identify, rank_of
from ncclwatch.model import CollectiveOp, RankState, StallKind, rank_ranges
from ncclwatch.stacks import stack_id
from tests.harness.paths import DATA
from tests.harness.reports import BARRIER, SAVE, report, sample, stack_pb

PY = "/venv/bin/python3.11"

LAUNCHER_CASES = [
    ([PY, "/venv/bin/torchrun", "--standalone", "--nproc-per-node=2", "train.py"], "torchrun"),
    ([PY, "-m", "torch.distributed.run", "--nproc-per-node=2", "train.py"], "torchrun"),
    ([PY, "-u", "-m", "torch.distributed.launch", "train.py"], "torchrun"),
    (["/usr/bin/mpirun", "--allow-run-as-root", "--oversubscribe", "-n", "2", PY, "t.py"],
     "openmpi"),
    (["orted", "-mca", "ess", "env"], "openmpi"),
    (["mpiexec.mpich", "-n", "2", PY, "t.py"], "hydra"),
    (["/usr/bin/hydra_pmi_proxy", "--control-port", "vm:3"], "hydra"),
    ([PY, "/venv/bin/deepspeed", "--num_gpus", "2", "train.py"], "deepspeed"),
    ([PY, "-u", "-m", "deepspeed.launcher.launch", "--world_info=e30=", "train.py"],
     "deepspeed"),
    ([PY, "/venv/bin/accelerate", "launch", "--multi_gpu", "train.py"], "accelerate"),
    ([PY, "/venv/bin/accelerate", "config"], None),      # not a launch
    ([PY, "/venv/bin/accelerate-launch", "train.py"], "accelerate"),
    ([PY, "/venv/bin/lightning", "run", "model", "train.py"], "lightning"),
    (["srun", "-n", "3", PY, "train.py"], "slurm"),
    (["/usr/sbin/slurmstepd"], "slurm"),
    ([PY, "-B", "-c", "from multiprocessing.resource_tracker import main;main(3)"],
     "multiprocessing"),
    ([PY, "train.py", "--deepspeed"], None),              # the user's script is no launcher
    ([PY, "-m", "tests.workloads.launch_job"], None),
    ([PY, "-B", "-c", "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=4, "
      "pipe_handle=6)", "--multiprocessing-fork"], None),
    (["bash", "/var/spool/slurmd/job1/slurm_script"], None),
    ([], None),
]


@pytest.mark.parametrize("cmdline,expected", LAUNCHER_CASES)
def test_launcher_table(cmdline, expected) -> None:
    assert launcher_of(cmdline) == expected


#: hydra_pmi_proxy as Debian's mpiexec.mpich starts it (one per host, each
#: given mpiexec's control port and the process group id).
PROXY = ["/usr/bin/hydra_pmi_proxy", "--control-port", "vm:36483", "--rmk", "user",
         "--launcher", "ssh", "--demux", "poll", "--pgid", "0", "--retries", "10",
         "--usize", "-2", "--pmi-port", "0", "--gpus-per-proc", "-2", "--proxy-id", "1"]


@pytest.mark.parametrize("cmdline,expected", [
    (PROXY, "hydra/vm:36483/0"),
    ([*PROXY[:-1], "0"], "hydra/vm:36483/0"),           # another node's proxy: the same job
    ([*PROXY[:2], "[fe80::1]:80", *PROXY[3:]], "hydra/[fe80::1]:80/0"),
    ([*PROXY[:2], "a b", *PROXY[3:]], None),            # not an address
    ([*PROXY[:2], "x" * 300, *PROXY[3:]], None),
    ([*PROXY[:10], "-1", *PROXY[11:]], None),           # not a group id
    (PROXY[:1], None),
    (["mpiexec.mpich", "--control-port", "vm:1", "--pgid", "0"], None),  # only the proxy
    ([], None),
])
def test_hydra_names_the_job_the_same_on_every_node(cmdline, expected) -> None:
    assert job_wide_id(cmdline) == expected


@pytest.mark.parametrize("cmdline,expected", [
    ([PY, "-B", "-c", "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=4, "
      "pipe_handle=6)", "--multiprocessing-fork"], True),
    ([PY, "-c", "from multiprocessing.spawn import spawn_main; spawn_main(pipe_handle=6)",
      "--multiprocessing-fork"], True),
    ([PY, "train.py", "-c", "from multiprocessing.spawn import spawn_main"], False),
    ([PY, "-c", "from multiprocessing.forkserver import main"], False),
])
def test_spawn_children_by_command_line(cmdline, expected) -> None:
    assert is_spawn_child(cmdline) is expected


def _spawn_worker_dump() -> tuple[list[dict], list[dict], list[str]]:
    """Recorded from worker 1 of tests/workloads/launch_spawn.py (py-spy --locals):
    the threads, the main thread's frames and their names."""
    threads = json.loads((DATA / "launchers" / "spawn_worker_locals.json").read_text())
    frames = threads[0]["frames"]
    return threads, frames, [f["name"] for f in frames]


def test_spawn_index_from_a_real_py_spy_locals_dump() -> None:
    threads, _, _ = _spawn_worker_dump()
    assert wrap_index(threads) == (1, True)


def test_spawn_index_not_final_while_bootstrapping_and_final_for_other_children() -> None:
    threads, frames, names = _spawn_worker_dump()
    # Still unpickling its target: nothing to say yet, look again later.
    starting = [{**threads[0], "frames": frames[names.index("_main"):]}]
    assert wrap_index(starting) == (None, False)
    # Running a target that is not torch's _wrap (a DataLoader spawn worker).
    other = [{**threads[0], "frames": frames[names.index("BaseProcess.run"):]}]
    assert wrap_index(other) == (None, True)


def test_spawn_index_not_final_before_the_target_runs_or_when_locals_were_not_read() -> None:
    """A nonblocking read of a running child can catch it between ``_bootstrap``
    and its target, or read ``_wrap`` without its locals: neither is "some other
    target" (final), or the worker keeps its environment's identity for life."""
    threads, frames, names = _spawn_worker_dump()
    bootstrapping = [{**threads[0], "frames": frames[names.index("BaseProcess._bootstrap"):]}]
    assert wrap_index(bootstrapping) == (None, False)
    no_locals = [{**threads[0], "frames": [{**f, "locals": None} for f in frames]}]
    assert wrap_index(no_locals) == (None, False)


def test_spawn_index_reads_again_before_calling_a_child_no_worker(tmp_path) -> None:
    """One read that finds a running target without ``_wrap`` is confirmed by a
    second: a real py-spy's first read missed the frame (a shim replays the
    recorded dumps: the first without ``_wrap``, then the whole one)."""
    import os
    import stat
    import sys

    from ncclwatch.agent.launchers import spawn_index
    threads, frames, names = _spawn_worker_dump()
    other = [{**threads[0], "frames": frames[names.index("BaseProcess.run"):]}]
    (tmp_path / "1.json").write_text(json.dumps(other))
    (tmp_path / "2.json").write_text(json.dumps(threads))
    calls = tmp_path / "calls"
    shim = tmp_path / "py-spy"
    shim.write_text(f"#!{sys.executable}\n"
                    "import pathlib, sys\n"
                    f"calls = pathlib.Path({str(calls)!r})\n"
                    "n = len(calls.read_text().splitlines()) + 1 if calls.exists() else 1\n"
                    "calls.write_text((calls.read_text() if calls.exists() else '') "
                    "+ ' '.join(sys.argv[1:]) + '\\n')\n"
                    f"sys.stdout.write(pathlib.Path({str(tmp_path)!r}, f'{{min(n, 2)}}.json')"
                    ".read_text())\n")
    shim.chmod(shim.stat().st_mode | stat.S_IEXEC)
    assert spawn_index(os.getpid(), str(shim)) == (1, True)
    lines = calls.read_text().splitlines()
    assert len(lines) == 2 and all("--nonblocking" in line for line in lines), lines
    # A child that runs another target in both reads is no worker: final.
    calls.unlink()
    (tmp_path / "2.json").write_text(json.dumps(other))
    assert spawn_index(os.getpid(), str(shim)) == (None, True)
    assert len(calls.read_text().splitlines()) == 2


# -- rank variables -------------------------------------------------------------

JOB = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}

IDENTIFY_CASES = [
    # (env, rank, world, local, rank_source, job source)
    ({**JOB, "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}, 3, 4, 1, "env:RANK", "master"),
    # torchrun under srun: RANK wins over SLURM_PROCID, torchelastic's run id over the job id
    ({**JOB, "RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "SLURM_PROCID": "1",
      "SLURM_NTASKS": "2", "SLURM_JOB_ID": "77", "TORCHELASTIC_RUN_ID": "r1"},
     5, 8, 1, "env:RANK", "torchelastic"),
    ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
      "OMPI_COMM_WORLD_LOCAL_RANK": "1", "PMIX_RANK": "1", "PMIX_NAMESPACE": "1156972545"},
     1, 2, 1, "env:OMPI_COMM_WORLD_RANK", "pmix"),
    ({"PMI_RANK": "1", "PMI_SIZE": "3", "MPI_LOCALRANKID": "1", "SLURM_JOB_ID": "9"},
     1, 3, 1, "env:PMI_RANK", "slurm"),
    ({"SLURM_PROCID": "2", "SLURM_NTASKS": "3", "SLURM_LOCALID": "2", "SLURM_JOB_ID": "12",
      "SLURM_STEP_ID": "0"}, 2, 3, 2, "env:SLURM_PROCID", "slurm"),
    # PMIx alone does not say the world size: 0, unknown
    ({"PMIX_RANK": "4", "PMIX_NAMESPACE": "prterun-vm-1@1"}, 4, 0, -1, "env:PMIX_RANK", "pmix"),
    # Lightning's children: node 0 -> LOCAL_RANK
    ({**JOB, "LOCAL_RANK": "2", "NODE_RANK": "0", "WORLD_SIZE": "3"}, 2, 3, 2,
     "env:NODE_RANK+LOCAL_RANK", "master"),
    # ... node 1: the process count of the node is unknown here: no number
    ({**JOB, "LOCAL_RANK": "1", "NODE_RANK": "1", "WORLD_SIZE": "6"}, UNKNOWN_RANK, 6, 1,
     "unknown", "master"),
    # a member whose rank only its command line knows
    ({**JOB, "WORLD_SIZE": "2"}, UNKNOWN_RANK, 2, -1, "unknown", "master"),
]


@pytest.mark.parametrize("env,rank,world,local,source,job_source", IDENTIFY_CASES)
def test_identify_table(env, rank, world, local, source, job_source) -> None:
    ident = identify(env, "n1")
    assert ident is not None
    assert (ident.rank, ident.world_size, ident.local_rank, ident.rank_source,
            ident.job_source) == (rank, world, local, source, job_source)


def test_lightning_child_on_node_1_numbered_with_the_node_process_count() -> None:
    env = {**JOB, "LOCAL_RANK": "1", "NODE_RANK": "1", "WORLD_SIZE": "6"}
    assert identify(env, "n", local_world=3).rank == 4
    assert identify(env, "n", local_world=4).rank == UNKNOWN_RANK  # 6 % 4: inconsistent


def test_mpich_ranks_without_a_job_id_take_their_launcher_process() -> None:
    env = {"PMI_RANK": "0", "PMI_SIZE": "2", "MPI_LOCALRANKID": "0"}
    assert identify(env, "n") is None
    ident = identify(env, "n", launcher="n/4242.1700000000")
    assert (ident.job_id, ident.job_source, ident.rank) == ("launcher:n/4242.1700000000",
                                                           "launcher", 0)


RANK_NAMES = [r for r, _, _ in RANK_VARIABLES]
small = st.integers(min_value=-2, max_value=9).map(str) | st.sampled_from(["", "x", "1.5"])


def _valid(env, row) -> bool:
    """A RANK_VARIABLES row the environment fills with a rank inside its world."""
    rank_name, size_name, _ = row
    try:
        rank = int(env[rank_name])
        size = int(env[size_name]) if size_name else 0
    except (KeyError, ValueError):
        return False
    return rank >= 0 and (not size_name or rank < size)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(
    [n for row in RANK_VARIABLES for n in row if n] + ["NODE_RANK", "MASTER_ADDR",
                                                       "MASTER_PORT", "PMIX_NAMESPACE"]),
    small), st.integers(min_value=1, max_value=4) | st.none())
def test_a_rank_is_never_invented(env, local_world) -> None:
    """Any number identify gives is the value of the first rank variable that
    is valid, or NODE_RANK * local_world + LOCAL_RANK; otherwise unknown."""
    found = rank_of(env, local_world)
    if found is None:
        return
    rank, size, _, source = found
    if rank == UNKNOWN_RANK:
        assert source == "unknown"
        return
    if source.startswith("env:") and source != "env:NODE_RANK+LOCAL_RANK":
        var = source.removeprefix("env:")
        assert int(env[var]) == rank
        # Precedence: no earlier row of the table was valid.
        for row in RANK_VARIABLES[:RANK_NAMES.index(var)]:
            assert not _valid(env, row), (row, env)
    else:
        node, local = int(env["NODE_RANK"]), int(env["LOCAL_RANK"])
        assert rank == (local if node == 0 else node * local_world + local)
    assert size == 0 or 0 <= rank < size


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 63), st.integers(1, 64), st.sampled_from(
    [("SLURM_PROCID", "SLURM_NTASKS"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
     ("PMI_RANK", "PMI_SIZE")]))
def test_rank_wins_over_any_outer_launcher(rank, extra, outer) -> None:
    """torchrun (RANK) under srun or mpirun: the worker's RANK, whatever the outer ids say."""
    world = rank + extra
    env = {**JOB, "RANK": str(rank), "WORLD_SIZE": str(world), outer[0]: "0", outer[1]: "1"}
    ident = identify(env, "n")
    assert (ident.rank, ident.world_size, ident.rank_source) == (rank, world, "env:RANK")


# -- members with unknown rank, through the daemon -------------------------------

def _member(state, op, pid, secs=20.0, stack=""):
    s = sample("job-u", -1, 3, state, op, seconds=secs, stack=stack, pid=pid)
    s.identity.rank_source = "unknown"
    return s


def test_an_unnumbered_member_can_be_the_culprit_and_others_wait_under_labels() -> None:
    d = Daemon(DaemonConfig())
    d.ingest(report([_member(RankState.SAVING, CollectiveOp.NONE, 501, stack=stack_id(SAVE)),
                     _member(RankState.COLLECTIVE, CollectiveOp.BARRIER, 502,
                             stack=stack_id(BARRIER)),
                     _member(RankState.COLLECTIVE, CollectiveOp.BARRIER, 503,
                             stack=stack_id(BARRIER))],
                    stacks=[stack_pb(SAVE), stack_pb(BARRIER)]), now=100.0)
    d.tick(now=100.0)
    kinds = {k for (j, k) in d.incidents.active if j == "job-u"}
    # Three members fill the world of 3: nobody is lost, the saver is the culprit.
    assert kinds == {StallKind.CHECKPOINT_GATHER}
    view = jobs_view(d, now=100.0)["jobs"][0]
    assert [(r["rank"], r["member"], r["identified_by"], r["pid"]) for r in view["ranks"]] == [
        (None, "?3", "unknown", 503), (None, "?2", "unknown", 502),
        (None, "?1", "unknown", 501)]
    stall = view["stalls"][0]
    c = stall["culprits"][0]
    assert (c["rank"], c["member"], c["pid"], c["state"], c["identified_by"]) == (
        None, "?1", 501, "saving", "unknown")
    assert stall["waiting"]["ranks"] == ["?3", "?2"]
    assert "unidentified rank ?1 (pid 501)" in stall["summary"]
    # The members are the world's numbers: no group of "missing" ranks.
    assert sorted((g["ranks"], g["state"]) for g in stall["rank_groups"]) == [
        ("?1", "saving"), ("?2,?3", "collective")]
    # The CLI and the page say who the members are, by label and pid.
    from ncclwatch import status
    from ncclwatch.daemon import page
    full = jobs_view(d, now=100.0)
    text = status.render(full)
    assert "culprit: rank ?1 on node-a (pid 501) saving" in text, text
    assert "waiting: ranks ?3,?2 in barrier" in text, text
    assert "unidentified rank ?1" in page.render(full)
    assert all(r["rank_conflict"] is None for r in full["jobs"][0]["ranks"])
    # A metric label names its process, never an empty or daemon-only rank.
    from ncclwatch.daemon.export import build, capture
    fam = next(f for f in build(capture(d, now=100.0))
               if f.name == "ncclwatch_stall_culprit_info")
    assert [dict(zip(fam.labels, lab))["rank"] for lab, _ in fam.rows] == ["node-a:501"]
    # Exiting by pid ends that member, and only it.
    exit_report = report([], seq=2, full=False)
    exit_report.report.exited.add(job_id="job-u", rank=-1, pid=502, rank_source="unknown")
    d.ingest(exit_report, now=101.0)
    job = d.table.jobs["job-u"]
    assert [k for k, r in job.ranks.items() if r.gone_at is not None] == [-2]


def test_missing_numbers_beyond_the_unnumbered_members_are_lost() -> None:
    d = Daemon(DaemonConfig(staleness=10))
    samples = [sample("job-u", 1, 4, RankState.COLLECTIVE, CollectiveOp.BARRIER, seconds=40,
                      stack=stack_id(BARRIER)),
               _member(RankState.COLLECTIVE, CollectiveOp.BARRIER, 600, secs=40,
                       stack=stack_id(BARRIER))]
    for r in samples:
        r.identity.world_size = 4
    d.ingest(report(samples, stacks=[stack_pb(BARRIER)]), now=100.0)
    d.tick(now=100.0)
    d.ingest(report(samples, seq=2, stacks=[stack_pb(BARRIER)]), now=115.0)
    d.tick(now=115.0)
    lost = d.incidents.active.get(("job-u", StallKind.RANK_LOST))
    # Ranks 0, 2, 3 unreported, one member unnumbered: two ranks at least are lost.
    assert lost is not None and lost.finding.unknown == (0, 2, 3)


def test_rank_ranges_lists_unnumbered_members_after_the_numbers() -> None:
    assert rank_ranges([2, -1, 0, 1, -2, 5]) == "0-2,5,?1,?2"
    assert rank_ranges([-1]) == "?1"


# -- discovery against real processes ------------------------------------------

#: A job id of this test run's own: a process of another run (or a leftover)
#: with the same job and rank is older, and discovery keeps the oldest per
#: rank (a fork of it is not the rank), so a shared id made these tests flaky
#: whenever two runs shared the machine.
SLURM_JOB = str(100000 + os.getpid() % 800000)
SLURM = {"SLURM_JOB_ID": SLURM_JOB, "SLURM_STEP_ID": "0", "SLURM_PROCID": "0",
         "SLURM_NTASKS": "1", "SLURM_LOCALID": "0"}
TORCH_IDLE = "import torch.distributed, time; print('up', flush=True); time.sleep(60)"


@pytest.fixture
def spawned():
    """Start real processes in their own sessions; all killed at teardown."""
    import os
    import signal
    import subprocess
    import sys
    procs: list[subprocess.Popen] = []

    def start(argv: list[str], env: dict[str, str], wait_up: bool = False) -> subprocess.Popen:
        argv = [sys.executable if a == "PY" else a for a in argv]
        p = subprocess.Popen(argv, env={**os.environ, **env}, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True, start_new_session=True)
        procs.append(p)
        if wait_up:
            assert p.stdout.readline().strip() == "up"
        return p

    yield start
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()


def _found(d, pids) -> dict[int, tuple]:
    return {r.pid: (r.identity.rank, r.identity.world_size, r.identity.rank_source,
                    r.identity.job_id) for r in d.scan() if r.pid in pids}


def test_srun_style_ranks_and_what_is_not_a_rank(spawned) -> None:
    """SLURM_PROCID maps to the rank of a torch process; ``srun hostname``-like
    processes and a bash batch script with the same variables are no ranks."""
    import time

    from ncclwatch.agent.discover import Discovery
    from ncclwatch.agent.discover import YOUNG
    t0 = time.time()
    sleeper = spawned(["sleep", "60"], SLURM)                       # srun sleep/hostname
    batch = spawned(["bash", "-c", "sleep 60; true"], SLURM)        # the batch script
    no_torch = spawned(["PY", "-c", "import time; time.sleep(60)"], SLURM)
    task = spawned(["PY", "-c", TORCH_IDLE], {**SLURM, "SLURM_PROCID": "1", "SLURM_NTASKS": "2",
                                             "SLURM_LOCALID": "1"}, wait_up=True)
    time.sleep(max(0.0, YOUNG + 0.5 - (time.time() - t0)))  # past the fork-exec window
    d = Discovery("n")
    pids = {task.pid, sleeper.pid, batch.pid, no_torch.pid}
    assert _found(d, pids) == {task.pid: (1, 2, "env:SLURM_PROCID", f"slurm:{SLURM_JOB}.0")}
    # Settled: non-Python processes are never looked at again; the Python one
    # without torch is (it may import torch later).
    assert not d._seen[sleeper.pid].recheck and not d._seen[batch.pid].recheck
    assert d._seen[no_torch.pid].recheck


def test_torchrun_under_srun_workers_are_ranks_the_launcher_is_not(spawned, tmp_path) -> None:
    """torchrun's own process has SLURM_PROCID and imports torch: never a rank."""
    import sys
    import time

    from ncclwatch.agent.discover import Discovery
    from tests.harness.tools import need
    script = tmp_path / "w.py"
    script.write_text(TORCH_IDLE)
    run = spawned([need("torchrun"), "--standalone", "--nproc-per-node=2", "--max-restarts=0",
                   str(script)], SLURM)
    d = Discovery("n")
    deadline, found = time.time() + 60, {}
    import psutil
    while time.time() < deadline:
        kids = {c.pid for c in psutil.Process(run.pid).children(recursive=True)} | {run.pid}
        found = _found(d, kids)
        if len(found) == 2:
            break
        time.sleep(0.5)
    assert run.pid not in found, found  # the launcher (python .../torchrun)
    assert sorted((r, w, s) for r, w, s, _ in found.values()) == [
        (0, 2, "env:RANK"), (1, 2, "env:RANK")], found
    # One job: torchrun's run id comes before the Slurm job id (JOB_ID_SOURCES).
    assert len({j for *_, j in found.values()}) == 1
    assert next(iter(found.values()))[3].startswith("torchelastic:")
    assert launcher_of(psutil.Process(run.pid).cmdline()) == "torchrun", sys.executable


#: A launcher's child between fork and exec: the launcher's command line (here
#: ``python .../torchrun``) until it execs the rank, with the same pid and start time.
FORKED = """
import os, sys
print("up", flush=True)
sys.stdin.readline()
os.execv(sys.executable, [sys.executable, "-c", sys.argv[1]])
"""


def test_a_launchers_child_seen_before_its_exec_is_found_after_it(spawned, tmp_path,
                                                                   monkeypatch) -> None:
    """torchrun's workers show torchrun's command line until they exec: a
    scan in that window saw a launcher, cached it, and never saw the rank (CI
    watched ranks 0, 1, 3 of 4: issue 27). Young verdicts are not final."""
    import os
    import subprocess
    import sys

    from ncclwatch.agent import discover
    # Whatever the load, the look before the exec counts as young here.
    monkeypatch.setattr(discover, "YOUNG", 600.0)
    fake = tmp_path / "torchrun"
    fake.write_text(FORKED)
    env = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "10.1.1.2",
           "MASTER_PORT": "29402"}
    child = subprocess.Popen([sys.executable, str(fake), TORCH_IDLE],
                             env={**os.environ, **env}, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert child.stdout.readline() == "up\n"
        d = discover.Discovery("n")
        assert _found(d, {child.pid}) == {}
        assert d._seen[child.pid].launcher == "torchrun"
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline() == "up\n"  # exec'd, torch imported
        assert _found(d, {child.pid}) == {
            child.pid: (1, 2, "env:RANK", "master:10.1.1.2:29402/2")}
    finally:
        child.kill()
        child.wait()


LIGHTNING_PARENT = """
import os, subprocess, sys, time
import torch.distributed
env = {**os.environ, "MASTER_ADDR": "10.1.1.1", "MASTER_PORT": "29401", "NODE_RANK": "1",
       "WORLD_SIZE": "6"}
kids = [subprocess.Popen([sys.executable, "-c", sys.argv[1]], env={**env, "LOCAL_RANK": str(i)})
        for i in (1, 2)]
print("up", flush=True)
time.sleep(60)
"""


def test_lightning_node_1_numbered_once_all_children_are_up(spawned) -> None:
    """Node 1 of 2, devices=3: the parent is rank 3, its children 4 and 5."""
    import time

    import psutil

    from ncclwatch.agent import discover
    parent = spawned(["PY", "-c", LIGHTNING_PARENT, TORCH_IDLE], {}, wait_up=True)
    d = discover.Discovery("n")
    deadline, found = time.time() + 60, {}
    while time.time() < deadline:
        kids = {c.pid for c in psutil.Process(parent.pid).children()} | {parent.pid}
        found = _found(d, kids)
        if len(found) == 3 and all(r >= 0 for r, *_ in found.values()):
            break
        time.sleep(0.5)
    by_rank = {r: (pid, s) for pid, (r, w, s, j) in found.items()}
    assert by_rank[3] == (parent.pid, "children_env"), found
    assert {by_rank[4][1], by_rank[5][1]} == {"env:NODE_RANK+LOCAL_RANK"}, found
    assert {j for *_, j in found.values()} == {"master:10.1.1.1:29401/6"}


def test_a_child_between_fork_and_exec_is_no_rank_while_young(spawned) -> None:
    """A child that has not exec'd shows its parent's command line, environment
    and maps: a worker of mp.spawn under srun, caught there under load, was read
    as the srun task (rank 0 of 1) and kept for life (CI, 1 in 22 runs under a
    CPU hog). Here the fork never execs: no verdict while it is young; from
    YOUNG on it is read again (a fork of a rank: the oldest process keeps it)."""
    import time

    import psutil

    from ncclwatch.agent.discover import YOUNG, Discovery
    parent = spawned(["PY", "-c", "import torch.distributed, os, sys, time\n"
                      "pid = os.fork()\n"
                      "if pid == 0:\n    time.sleep(60); os._exit(0)\n"
                      "print(pid, flush=True); time.sleep(60)"], SLURM)
    child = int(parent.stdout.readline())
    d = Discovery("n")
    born = psutil.Process(child).create_time()
    found = _found(d, {parent.pid, child})
    assert time.time() - born < YOUNG, "the machine is too slow to see the fork young"
    assert d._seen[child].rank is None and d._seen[child].recheck, d._seen[child]
    assert found == {parent.pid: (0, 1, "env:SLURM_PROCID", f"slurm:{SLURM_JOB}.0")}, found
    time.sleep(max(0.0, born + YOUNG + 0.5 - time.time()))
    found = _found(d, {parent.pid, child})
    assert d._seen[child].rank is not None  # read again once it is no longer young
    assert found == {parent.pid: (0, 1, "env:SLURM_PROCID", f"slurm:{SLURM_JOB}.0")}, found


def test_a_young_rank_is_read_again_until_it_is_no_longer_young(spawned, monkeypatch) -> None:
    """A look at a young process may straddle its exec (the command line read
    before it, the checks after it): such a verdict stays open until the
    process is YOUNG seconds old (CI: an mp.spawn worker under srun was kept as
    rank 0 of 1, the identity its environment inherited from the srun task).
    YOUNG is widened, then narrowed, so that a slow machine sees both ages."""
    from ncclwatch.agent import discover
    p = spawned(["PY", "-c", TORCH_IDLE], SLURM, wait_up=True)
    d = discover.Discovery("n")
    monkeypatch.setattr(discover, "YOUNG", 3600.0)
    found = _found(d, {p.pid})
    assert found == {p.pid: (0, 1, "env:SLURM_PROCID", f"slurm:{SLURM_JOB}.0")}, found
    assert d._seen[p.pid].recheck, "a young verdict was taken as final"
    monkeypatch.setattr(discover, "YOUNG", 0.0)
    assert _found(d, {p.pid}) == found
    assert not d._seen[p.pid].recheck, "a rank no longer young is read again every round"


def test_mp_spawn_under_srun_workers_by_spawn_index_parent_is_no_rank(spawned) -> None:
    """The spawning parent carries SLURM_PROCID=0 and torch, and waits in join():
    not a rank; its workers' inherited SLURM_PROCID is not theirs either."""
    import time

    import psutil

    from ncclwatch.agent.discover import Discovery
    from tests.harness.paths import ROOT
    from tests.harness.procs import free_port
    parent = spawned(["PY", "-m", "tests.workloads.launch_spawn", "--port", str(free_port()),
                      "--go", "/nonexistent/never"], {**SLURM, "PYTHONPATH": str(ROOT)})
    d = Discovery("n")
    deadline, found = time.time() + 90, {}
    while time.time() < deadline:
        kids = {c.pid for c in psutil.Process(parent.pid).children()} | {parent.pid}
        found = _found(d, kids)
        if len(found) == 2 and all(s == "spawn_index" for _, _, s, _ in found.values()):
            break
        time.sleep(0.5)
    assert parent.pid not in found, found
    assert sorted((r, w, s) for r, w, s, _ in found.values()) == [
        (0, 2, "spawn_index"), (1, 2, "spawn_index")], found
    assert {j for *_, j in found.values()} == {f"slurm:{SLURM_JOB}.0"}


def test_numbers_that_disagree_are_shown_beside_the_unnumbered_member() -> None:
    from ncclwatch.daemon import page
    d = Daemon(DaemonConfig())
    s = _member(RankState.COLLECTIVE, CollectiveOp.BARRIER, 601, stack=stack_id(BARRIER))
    s.identity.rank_conflict = "ray_train_log:1 locals:init_process_group:2"
    d.ingest(report([s], stacks=[stack_pb(BARRIER)]), now=100.0)
    view = jobs_view(d, now=100.0)
    (r,) = view["jobs"][0]["ranks"]
    assert (r["rank"], r["member"]) == (None, "?1")
    assert r["rank_conflict"] == "ray_train_log:1 locals:init_process_group:2"
    assert "(shown as ray_train_log:1 locals:init_process_group:2)" in page.render(view)
