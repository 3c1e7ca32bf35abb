"""deploy/slurm/task-prolog.sh, run as Slurm runs a TaskProlog: with the task's
environment, its ``export NAME=value`` lines parsed into the task's.

Every job that states nothing gets the Flight Recorder with a live-dump pipe in
a folder of its own and a declared timeout no longer than torch's default, so
the job lint has nothing to say; whatever the job set stays as it set it. The
real Slurm run (srun --task-prolog) is in tests/e2e/test_slurm.py.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from ncclwatch.agent.timeouts import declared_timeout_from
from ncclwatch.envlint import lint
from tests.harness.slurm import PROLOG, exports, run_prolog, with_site_prolog


def test_a_job_that_states_nothing_gets_the_flight_recorder_and_the_timeout(tmp_path) -> None:
    task = {"SLURM_JOB_ID": "4242", "SLURM_PROCID": "3", "TMPDIR": str(tmp_path),
            "PATH": os.environ["PATH"]}
    got = run_prolog(task)
    folder = tmp_path / "ncclwatch-fr-4242"
    assert got == {
        "TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": f"{folder}/pipe_rank_",
        "TORCH_FR_DUMP_TEMP_FILE": f"{folder}/trace_rank_",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": f"{folder}/trace_rank_"}
    assert folder.is_dir() and folder.stat().st_mode & 0o777 == 0o700
    assert lint({**task, **got}) == ()                        # nothing defeats the watchdog
    # No timeout of its own: a guess would become policy (the daemon says when it assumes one).
    assert declared_timeout_from(got) == (0.0, "")


@pytest.mark.parametrize("job,kept", [
    ({"TORCH_NCCL_TRACE_BUFFER_SIZE": "0"}, ("TORCH_FR_BUFFER_SIZE",)),
    ({"TORCH_FR_BUFFER_SIZE": "500"}, ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")),
    ({"TORCH_NCCL_DEBUG_INFO_PIPE_FILE": "/scratch/p_"}, ("TORCH_NCCL_DEBUG_INFO_PIPE_FILE",)),
    ({"TORCH_NCCL_DUMP_ON_TIMEOUT": "0"}, ("TORCH_NCCL_DUMP_ON_TIMEOUT",)),
    ({"TORCH_FR_DUMP_TEMP_FILE": ""}, ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")),
])
def test_what_the_job_set_stays_as_it_set_it(tmp_path, job, kept) -> None:
    got = run_prolog({"SLURM_JOB_ID": "7", "TMPDIR": str(tmp_path),
                      "PATH": os.environ["PATH"], **job})
    assert not set(kept) & set(got), got
    assert not set(job) & set(got), got


def test_no_timeout_is_exported() -> None:
    text = PROLOG.read_text()
    assert "NCCLWATCH_PG_TIMEOUT_S" not in run_prolog({"PATH": os.environ["PATH"]})
    assert "PG_TIMEOUT" not in text


SITE = """#!/bin/sh
echo "export TORCH_FR_BUFFER_SIZE=100"
echo "export SITE_SCRATCH=/scratch/$SLURM_JOB_ID"
echo "unset TORCH_NCCL_DUMP_ON_TIMEOUT"
echo "print site prolog ran"
"""


def test_a_sites_own_prolog_runs_first_and_its_exports_win(tmp_path) -> None:
    """Slurm takes one TaskProlog: ours runs the site's, passes its lines through
    unchanged, and gives no default to a variable the site's exported or unset."""
    site = tmp_path / "task-prolog.site"
    site.write_text(SITE)
    site.chmod(0o755)
    prolog = with_site_prolog(site, tmp_path)
    env = {"SLURM_JOB_ID": "9", "TMPDIR": str(tmp_path), "PATH": os.environ["PATH"]}
    p = subprocess.run([str(prolog)], env=env, capture_output=True, text=True, timeout=30)
    assert p.returncode == 0 and not p.stderr, p
    lines = p.stdout.splitlines()
    assert lines[:4] == ["export TORCH_FR_BUFFER_SIZE=100", "export SITE_SCRATCH=/scratch/9",
                         "unset TORCH_NCCL_DUMP_ON_TIMEOUT", "print site prolog ran"], lines
    got = exports(p.stdout)
    assert got["TORCH_FR_BUFFER_SIZE"] == "100" and got["SITE_SCRATCH"] == "/scratch/9"
    assert "TORCH_NCCL_TRACE_BUFFER_SIZE" not in got           # the pair is the site's call
    assert not any(x.endswith("TORCH_NCCL_DUMP_ON_TIMEOUT=1") for x in lines), lines
    assert got["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"].endswith("/ncclwatch-fr-9/pipe_rank_")
    # A site prolog that is not executable is not run.
    site.chmod(0o644)
    assert "SITE_SCRATCH" not in run_prolog(env, prolog)


def test_a_job_cannot_name_the_site_prolog(tmp_path) -> None:
    """Nothing a job sets chooses what the prolog runs: an executable named in a
    variable of the task's environment is never run by the shipped prolog."""
    marker = tmp_path / "ran"
    planted = tmp_path / "planted.sh"
    planted.write_text(f"#!/bin/sh\ntouch {marker}\necho export PLANTED=1\n")
    planted.chmod(0o755)
    env = {"SLURM_JOB_ID": "9", "TMPDIR": str(tmp_path), "PATH": os.environ["PATH"],
           "NCCLWATCH_SITE_TASK_PROLOG": str(planted), "SITE_TASK_PROLOG": str(planted)}
    assert "PLANTED" not in run_prolog(env)
    assert not marker.exists()


def test_the_prolog_is_posix_sh_and_executable() -> None:
    assert os.access(PROLOG, os.X_OK)
    assert PROLOG.read_text().startswith("#!/bin/sh\n")
    p = subprocess.run(["sh", "-n", str(PROLOG)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def _fr_folder(got: dict[str, str]) -> Path:
    """The one folder the pipe and dump stems name."""
    folders = {Path(got[n]).parent for n in ("TORCH_NCCL_DEBUG_INFO_PIPE_FILE",
                                             "TORCH_FR_DUMP_TEMP_FILE",
                                             "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")}
    assert len(folders) == 1, got
    return folders.pop()


def _owner_only(folder: Path) -> bool:
    st = os.lstat(folder)
    return (folder.is_dir() and not folder.is_symlink() and st.st_uid == os.getuid()
            and st.st_mode & 0o777 == 0o700)


def _task(tmp_path: Path) -> dict[str, str]:
    return {"SLURM_JOB_ID": "4242", "TMPDIR": str(tmp_path), "PATH": os.environ["PATH"]}


@pytest.mark.parametrize("mode", [0o777, 0o700])
def test_a_folder_another_user_made_first_is_not_used(tmp_path, mode) -> None:
    """Anyone can make /tmp/ncclwatch-fr-<job> before the job starts: made by
    another uid (nobody, 65534), it is left alone and the task gets its own."""
    assert os.getuid() == 0, "needs root to act as another uid"
    tmp_path.chmod(0o1777)  # a shared /tmp
    planted = tmp_path / "ncclwatch-fr-4242"
    planted.mkdir()
    os.chown(planted, 65534, 65534)  # as if nobody had made it (pytest's parents are 700)
    planted.chmod(mode)
    got = run_prolog(_task(tmp_path))
    folder = _fr_folder(got)
    assert folder != planted and folder.parent == tmp_path
    assert folder.name.startswith("ncclwatch-fr-4242.") and _owner_only(folder)
    assert list(planted.iterdir()) == []


def test_a_symlink_planted_at_the_folder_is_not_followed(tmp_path) -> None:
    """A link to the job user's own folder (owner-only, as a good one looks)
    would have torch's dumps overwrite the user's files: never used."""
    victim = tmp_path / "home"
    victim.mkdir(mode=0o700)
    (victim / "trace_rank_0").write_text("the user's file\n")
    planted = tmp_path / "ncclwatch-fr-4242"
    planted.symlink_to(victim)
    folder = _fr_folder(run_prolog(_task(tmp_path)))
    assert folder.parent == tmp_path and _owner_only(folder)
    assert Path(os.path.realpath(folder)) == folder
    assert planted.is_symlink() and sorted(p.name for p in victim.iterdir()) == ["trace_rank_0"]
    # A dangling one too: nothing is made where it points.
    planted.unlink()
    planted.symlink_to(tmp_path / "nowhere")
    folder = _fr_folder(run_prolog(_task(tmp_path)))
    assert _owner_only(folder) and not (tmp_path / "nowhere").exists()


def test_the_jobs_own_folder_is_shared_by_its_tasks_only_when_owner_only(tmp_path) -> None:
    """The tasks of one job meet in the job's folder while it is the user's own,
    mode 700; loosened, each task gets a fresh one."""
    first = _fr_folder(run_prolog(_task(tmp_path)))
    assert first == tmp_path / "ncclwatch-fr-4242"
    assert _fr_folder(run_prolog(_task(tmp_path))) == first
    first.chmod(0o755)
    other = _fr_folder(run_prolog(_task(tmp_path)))
    assert other != first and _owner_only(other)


def test_no_safe_folder_exports_no_pipe_nor_dump(tmp_path) -> None:
    """TMPDIR that cannot hold a folder: the stems are not exported (envlint
    then says the live dump is off), the Flight Recorder still is."""
    got = run_prolog({**_task(tmp_path), "TMPDIR": str(tmp_path / "missing")})
    assert got["TORCH_FR_BUFFER_SIZE"] == "2000"
    assert not {"TORCH_NCCL_DEBUG_INFO_PIPE_FILE", "TORCH_FR_DUMP_TEMP_FILE",
                "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"} & set(got), got
