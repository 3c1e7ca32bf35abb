"""The commands a stall shows for acting on the job where it runs: the
platform each job's facts pick, and quoting that keeps a rank's text a word
(a pasted command runs what it shows). The Slurm commands run against a real
cluster in tests/e2e/test_slurm.py."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time

import pytest

from ncclwatch import actions
from ncclwatch.actions import Facts, commands, platform_of

HOSTILE = "x'; touch /tmp/pwned; echo '$(id)`id`\n"


@pytest.mark.parametrize("facts,platform", [
    (Facts("slurm:7.0", 0, "gpu1", 10, slurm_job="7"), "slurm"),
    (Facts("slurm:7.0", 0, "gpu1", 10, slurm_job="7", pod="p", namespace="ns"), "slurm"),
    (Facts("pytorchjob:ns/j", 2, "gpu1", 10, pod="j-worker-2", namespace="ns"), "kubernetes"),
    (Facts("j", 0, "gpu1", 10, pod="p"), "host"),              # a pod with no namespace
    (Facts("10.0.0.1:29500/8", 3, "gpu1", 10), "host"),
])
def test_a_jobs_facts_pick_its_platform(facts, platform) -> None:
    assert platform_of(facts).name == platform
    assert {c["platform"] for c in commands(facts)} == {platform}


def test_every_platform_has_every_step_in_order() -> None:
    for p in actions.PLATFORMS:
        assert list(p.commands) == list(actions.STEPS), p.name
    assert [c["step"] for c in commands(actions.EXAMPLE)] == list(actions.STEPS)


def _tokens(cmd: str) -> list[str]:
    return shlex.split(cmd, comments=True)


@pytest.mark.parametrize("platform", ["slurm", "kubernetes", "host"])
def test_a_ranks_text_stays_one_word_of_the_command(platform) -> None:
    f = Facts(HOSTILE, 3, HOSTILE, 4242, slurm_job=HOSTILE if platform == "slurm" else "",
              pod=HOSTILE if platform == "kubernetes" else "",
              namespace="ns" if platform == "kubernetes" else "", pipe_stem=HOSTILE)
    for c in commands(f):
        toks = _tokens(c["command"])
        if c["step"] == "evidence":         # the same everywhere: the daemon's bundle
            assert toks == ["ncclwatch", "dump", "--", HOSTILE], toks
            continue
        # Out of every grammar: no command at all, the step says which value.
        assert c["command"].startswith("# no command: the observed "), c


def test_without_a_pipe_the_dump_step_says_why() -> None:
    steps = {c["step"]: c["command"] for c in commands(Facts("j", 0, "n", 1, slurm_job="5"))}
    assert steps["flight_recorder"].startswith("# not enabled") \
        and "TORCH_NCCL_DEBUG_INFO_PIPE_FILE" in steps["flight_recorder"]
    assert steps["stop"].startswith("scancel --signal=TERM --full -- 5")


def test_the_pipe_is_the_culprits_own() -> None:
    f = Facts("j", 5, "n", 1, pipe_stem="/tmp/nccl_pipe_")
    steps = {c["step"]: c["command"] for c in commands(f)}
    assert _tokens(steps["flight_recorder"])[:2] == ["ssh", "--"]
    assert _tokens(_tokens(steps["flight_recorder"])[3]) == [
        "test", "-p", "/tmp/nccl_pipe_5.pipe", "&&", "echo", "1", ">", "/tmp/nccl_pipe_5.pipe"]


def test_the_runbook_shows_each_platforms_commands() -> None:
    from ncclwatch import runbooks
    from ncclwatch.model import StallKind

    page = runbooks.render(StallKind.CHECKPOINT_GATHER)
    for _, _, command in actions.reference():
        assert command in page


#: Hostile values for every field a command places: options, shell text,
#: out-of-grammar names. Each must leave its steps with no command.
HOSTILE_VALUES: dict[str, tuple[str, ...]] = {
    "slurm_job": ("--state=RUNNING", "-u root", "7;id", "7 8", "7\n8", "", "0x10", "７"),
    "node": ("-oProxyCommand=touch /tmp/x", "-p 22", "a b", "a;b", "a\nb", ".a", "a..b",
             "x" * 254),
    "namespace": ("--all-namespaces", "-A", "Default", "ns;id", "a" * 64, "a_b"),
    "pod": ("--selector=app", "-lx", "Pod", "p;id", "p/q", "p q"),
    "pipe_stem": ("/etc/../root/x", "relative/", "-x", "/tmp/a b", "/tmp/$(id)", "/tmp/a\nb"),
    "pid": (-1, 0, 1, actions.PID_MAX + 1),
    "start_ticks": (-1, "12 13", "--1", "$(id)", 2**64, ""),
    "uid": (-2, "-1", "0;id", "0 0", 2**32 - 1),
}
#: The steps that place each field, per platform (the others must still work).
_BASE = {"slurm": dict(slurm_job="123"), "kubernetes": dict(namespace="ns", pod="job-w-0"),
         "host": {}}


@pytest.mark.parametrize("platform", ["slurm", "kubernetes", "host"])
@pytest.mark.parametrize("field", sorted(HOSTILE_VALUES))
def test_a_value_out_of_its_grammar_gets_no_command(platform, field) -> None:
    for value in HOSTILE_VALUES[field]:
        f = Facts(**{"job_id": "job", "rank": 3, "node": "gpu-1.cluster", "pid": 4242,
                     "start_ticks": 777, "pipe_stem": "/tmp/nccl_pipe_", **_BASE[platform],
                     field: value})
        if platform_of(f).name != platform:
            continue  # an empty slurm job id or pod is another platform's job
        for c in commands(f):
            step = platform_of(f).commands[c["step"]]
            name = "pipe" if field == "pipe_stem" else field
            if name in step.fields:
                assert c["command"].startswith("# no command: the observed " + name), (
                    field, value, c)
                assert str(value) not in c["command"] or str(value) in actions.GRAMMARS[name][0]
            elif c["step"] != "flight_recorder":
                assert not c["command"].startswith("#"), (field, value, c)


@pytest.mark.parametrize("platform", ["slurm", "kubernetes", "host"])
def test_values_in_their_grammar_make_commands_whose_options_are_ended(platform) -> None:
    f = Facts("job", 3, "gpu-1.cluster", 4242, pipe_stem="/tmp/nccl_pipe_", container_pid=7,
              start_ticks=777, uid=1000, **_BASE[platform])
    steps = {c["step"]: c["command"] for c in commands(f)}
    assert not any(cmd.startswith("#") for cmd in steps.values()), steps
    if platform == "host":
        assert all(_tokens(steps[s])[:3] == ["ssh", "--", "gpu-1.cluster"]
                   for s in ("flight_recorder", "stacks", "logs", "stop"))
    if platform == "slurm":
        assert _tokens(steps["stop"])[-2:] == ["--", "123"]
    if platform == "kubernetes":
        assert _tokens(steps["logs"])[-2:] == ["--", "job-w-0"]


def _ticks(pid: int) -> int:
    """The process's start: /proc/PID/stat field 22 (after the command name)."""
    raw = open(f"/proc/{pid}/stat", "rb").read()
    return int(raw[raw.rindex(b")") + 2:].split()[19])


def _tools(tmp_path, login: str):
    """A bin folder of stand-ins that run the shown command's remote part as
    the real tools would hand it on (ssh: to the node's login shell, srun and
    kubectl exec: as argv), and a py-spy that records its argv."""
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    log = tmp_path / "py-spy.argv"
    scripts = {
        "ssh": f'#!/bin/sh\n[ "$1" = -- ] && shift\nshift\nexec {login} -c "$*"\n',
        "srun": '#!/bin/sh\nwhile [ "$1" != -n1 ]; do shift; done\nshift\nexec "$@"\n',
        "kubectl": '#!/bin/sh\nwhile [ "$1" != -- ]; do shift; done\nshift\nexec "$@"\n',
        "py-spy": f'#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done >> {log}\n',
    }
    for name, text in scripts.items():
        (fake / name).write_text(text)
        (fake / name).chmod(0o755)
    return fake, log


def _run(cmd: str, shell: str, fake) -> subprocess.CompletedProcess:
    return subprocess.run([shell, "-c", cmd], capture_output=True, text=True, timeout=30,
                          env={"PATH": f"{fake}:/usr/bin:/bin"}, check=False)


#: platform -> the Facts that pick it, for a rank whose pid (and pid in its pod) is given.
_AT = {"host": lambda pid: dict(pid=pid),
       "slurm": lambda pid: dict(pid=pid, slurm_job="123"),
       "kubernetes": lambda pid: dict(pid=4242, container_pid=pid, namespace="ns",
                                      pod="job-w-0")}


def _guarded(platform: str, step: str, pid: int, ticks: int, uid: int = -1) -> str:
    f = Facts("job", 3, "gpu-1", start_ticks=ticks, uid=uid, **_AT[platform](pid))
    return {c["step"]: c["command"] for c in commands(f)}[step]


@pytest.fixture
def rank():
    """A live process standing for the rank (its parent: this test)."""
    p = subprocess.Popen(["sleep", "60"])
    yield p
    p.kill()
    p.wait()


@pytest.fixture
def dead_pid() -> tuple[int, int]:
    """(pid, start) of a process that has exited and been reaped."""
    p = subprocess.Popen(["sleep", "60"])
    ticks = _ticks(p.pid)
    p.kill()
    p.wait()
    return p.pid, ticks


#: Each shown command that hands a pid to py-spy, per platform.
STACKS = [("host", "stacks"), ("slurm", "stacks"), ("kubernetes", "stacks")]


def _refused(got: subprocess.CompletedProcess, pid: int, rank: int = 3) -> None:
    assert got.returncode != 0
    assert got.stderr == f"not run: pid {pid} no longer names the process of rank {rank}\n", got


@pytest.mark.parametrize("shell", ["sh", "bash"])
@pytest.mark.parametrize("platform,step", STACKS)
def test_py_spy_runs_on_the_pid_while_it_names_the_ranks_process(tmp_path, shell, platform,
                                                                   step, rank) -> None:
    fake, log = _tools(tmp_path, shell)
    got = _run(_guarded(platform, step, rank.pid, _ticks(rank.pid), os.getuid()), shell, fake)
    assert got.returncode == 0, got
    assert log.read_text().split() == ["dump", "--native", "--pid", str(rank.pid)]


@pytest.mark.parametrize("shell", ["sh", "bash"])
@pytest.mark.parametrize("platform,step", STACKS)
def test_py_spy_refuses_a_pid_that_names_another_process(tmp_path, shell, platform, step,
                                                          rank) -> None:
    """A reused pid: live, but not started when the agent saw the rank."""
    fake, log = _tools(tmp_path, shell)
    _refused(_run(_guarded(platform, step, rank.pid, _ticks(rank.pid) + 1), shell, fake),
             rank.pid)
    assert not log.exists()


@pytest.mark.parametrize("shell", ["sh", "bash"])
@pytest.mark.parametrize("platform,step", STACKS)
def test_py_spy_refuses_a_dead_pid(tmp_path, shell, platform, step, dead_pid) -> None:
    fake, log = _tools(tmp_path, shell)
    pid, ticks = dead_pid
    _refused(_run(_guarded(platform, step, pid, ticks), shell, fake), pid)
    assert not log.exists()


@pytest.mark.parametrize("shell", ["sh", "bash"])
def test_a_pid_of_another_user_is_not_the_ranks(tmp_path, shell, rank) -> None:
    """Where the rank's uid is known (host, Slurm), a process of another uid
    with the same start is not the rank's either."""
    fake, log = _tools(tmp_path, shell)
    for platform in ("host", "slurm"):
        cmd = _guarded(platform, "stacks", rank.pid, _ticks(rank.pid), os.getuid() + 1)
        _refused(_run(cmd, shell, fake), rank.pid)
    assert not log.exists()


@pytest.mark.parametrize("shell", ["sh", "bash"])
def test_the_guard_reads_the_start_past_a_hostile_process_name(tmp_path, shell) -> None:
    """The command name in /proc/PID/stat is the rank's own text: parentheses,
    spaces, a newline and a glob in it move no field the guard reads."""
    import shutil

    exe = tmp_path / "s) *\n) 1 2 3"
    shutil.copy(shutil.which("sleep"), exe)
    p = subprocess.Popen([str(exe), "60"])
    try:
        for _ in range(500):
            if open(f"/proc/{p.pid}/comm", "rb").read().startswith(b"s) *"):
                break
            time.sleep(0.01)
        fake, log = _tools(tmp_path, shell)
        ticks = _ticks(p.pid)
        _refused(_run(_guarded("host", "stacks", p.pid, ticks + 1, os.getuid()), shell, fake),
                 p.pid)
        assert not log.exists()
        got = _run(_guarded("host", "stacks", p.pid, ticks, os.getuid()), shell, fake)
        assert got.returncode == 0, got
        assert log.read_text().split() == ["dump", "--native", "--pid", str(p.pid)]
    finally:
        p.kill()
        p.wait()


@pytest.fixture
def launched(tmp_path):
    """A launcher (a shell that notes a TERM in a file) and its child, the rank."""
    termed = tmp_path / "termed"
    child = tmp_path / "child"
    p = subprocess.Popen(["sh", "-c", f"trap 'echo TERM > {termed}; exit 0' TERM; "
                                      f"sleep 60 & echo $! > {child}; wait"])
    for _ in range(500):
        if child.exists() and child.read_text().strip():
            break
        time.sleep(0.01)
    kid = int(child.read_text())
    yield p, kid, termed
    for pid in (p.pid, kid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    p.wait()


@pytest.mark.parametrize("shell", ["sh", "bash"])
def test_the_host_stop_terms_the_launcher_of_the_ranks_own_process(tmp_path, shell,
                                                                    launched) -> None:
    launcher, kid, termed = launched
    fake, _ = _tools(tmp_path, shell)
    got = _run(_guarded("host", "stop", kid, _ticks(kid), os.getuid()), shell, fake)
    assert got.returncode == 0, got
    assert launcher.wait(timeout=10) == 0 and termed.read_text() == "TERM\n"


@pytest.mark.parametrize("shell", ["sh", "bash"])
def test_the_host_stop_refuses_a_reused_or_dead_pid(tmp_path, shell, launched,
                                                     dead_pid) -> None:
    launcher, kid, termed = launched
    fake, _ = _tools(tmp_path, shell)
    for pid, ticks in ((kid, _ticks(kid) + 1), dead_pid):
        _refused(_run(_guarded("host", "stop", pid, ticks, os.getuid()), shell, fake), pid)
    time.sleep(0.2)
    assert launcher.poll() is None and not termed.exists()


@pytest.mark.parametrize("platform", ["slurm", "kubernetes", "host"])
def test_a_pid_whose_start_is_not_known_gets_no_command(platform) -> None:
    f = Facts("job", 3, "gpu-1", pipe_stem="/tmp/nccl_pipe_", **_AT[platform](4242))
    p = platform_of(f)
    for c in commands(f):
        if "pid" in p.commands[c["step"]].fields:
            assert c["command"].startswith("# no command: the pid cannot be checked"), c
            assert "4242" not in c["command"]
        else:
            assert not c["command"].startswith("# no command"), c


def test_the_host_stop_never_signals_pid_1(tmp_path) -> None:
    """The rank's parent may be pid 1 (a rank re-parented when its launcher
    died, a container's init): the stop command's own shell guard sends
    nothing. Run with the shell's kill replaced by one that only records."""
    orphan = tmp_path / "orphan"
    subprocess.run(["sh", "-c", f"sleep 60 >/dev/null 2>&1 & echo $! > {orphan}"], check=True)
    pid = int(orphan.read_text())
    try:
        stat = open(f"/proc/{pid}/stat", "rb").read()
        assert stat[stat.rindex(b")") + 2:].split()[1] == b"1"   # re-parented to init
        remote = _tokens(_tokens(_guarded("host", "stop", pid, _ticks(pid), os.getuid()))[3])
        assert remote[:2] == ["sh", "-c"]
        log = tmp_path / "kills"
        fake = tmp_path / "bin"
        fake.mkdir()
        (fake / "kill").write_text(f"#!/bin/sh\necho \"$@\" >> {log}\n")
        (fake / "kill").chmod(0o755)
        # `kill` is a shell builtin: run the script with the builtin disabled.
        got = subprocess.run(["bash", "-c", "enable -n kill; " + remote[2]], check=False,
                             env={"PATH": f"{fake}:/usr/bin:/bin"}, capture_output=True)
        assert got.stderr == b"" and not log.exists(), (got, log.exists())
    finally:
        os.kill(pid, signal.SIGKILL)


#: What a pod's owner reference may read as (`kind/name`, the pod's own text:
#: whoever creates a pod sets it) -> the word `kubectl delete` gets, or None:
#: nothing deleted. Before, the owner was spliced in unquoted: its spaces
#: became options of `kubectl delete` and its `*` a glob of the operator's folder.
OWNERS: dict[str, str | None] = {
    "Job/train-1": "Job/train-1",
    "PyTorchJob/bert.large-2": "PyTorchJob/bert.large-2",
    "pods --all-namespaces --all x/y": None,
    "Job --all-namespaces --all/y": None,
    "Namespace/kube-system": None,
    "Node/gpu-1": None,
    "ClusterRoleBinding/admin": None,
    "Job/-x": None,
    "Job/a b": None,
    "Job/*": None,
    "Job/a/b": None,
    "Job/x,Namespace/kube-system": None,
    "Job/$(touch pwned)": None,
    "Job/Train": None,
    "Job/..": None,
    "Job/": None,
    "/": None,
    "": None,
}


@pytest.mark.parametrize("shell", ["sh", "bash"])
def test_the_kubernetes_stop_deletes_only_a_job_named_by_its_owner(tmp_path, shell) -> None:
    """The stop command, run by a real shell against a kubectl that answers
    each owner reference above: only a job kind with a plain name is deleted,
    as one word after `--`, in the pod's namespace."""
    import subprocess

    stop = {c["step"]: c["command"] for c in commands(
        Facts("j", 0, "gpu-1", 4242, namespace="ns", pod="job-w-0"))}["stop"]
    fake = tmp_path / "bin"
    fake.mkdir()
    log = tmp_path / "deleted"
    (fake / "kubectl").write_text(
        "#!/bin/sh\n"
        'case "$3" in get) printf "%s" "$OWNER" ;;\n'
        f'  *) for a in "$@"; do printf "%s\\n" "$a"; done >> {log} ;; esac\n')
    (fake / "kubectl").chmod(0o755)
    (tmp_path / "Job").mkdir()               # something for an unquoted glob to find
    (tmp_path / "Job" / "victim").write_text("")
    for owner, deleted in OWNERS.items():
        log.unlink(missing_ok=True)
        subprocess.run([shell, "-c", stop], cwd=tmp_path, check=False, capture_output=True,
                       env={"PATH": f"{fake}:/usr/bin:/bin", "OWNER": owner})
        got = log.read_text().splitlines() if log.exists() else None
        want = None if deleted is None else ["-n", "ns", "delete", "--wait=false", "--", deleted]
        assert got == want, (owner, got)
    assert not (tmp_path / "pwned").exists()


def test_the_agents_read_of_the_rank_reaches_the_shown_command(tmp_path, rank) -> None:
    """The start and uid the agent reads when it finds a rank travel in its
    report to the daemon's record and into the stall's commands: the page's
    stacks command runs on the live rank, and once a report says the pid is
    another process's (its start differs), it refuses."""
    import psutil

    from ncclwatch.agent.discover import RankProcess
    from ncclwatch.agent.report import identity_pb
    from ncclwatch.daemon import api
    from ncclwatch.daemon.core import Daemon, DaemonConfig
    from ncclwatch.jobid import RankIdentity
    from ncclwatch.model import StallKind
    from tests.harness.reports import checkpoint_job

    proc = RankProcess.of(rank.pid, psutil.Process(rank.pid).create_time(),
                          RankIdentity("job-1", "test", 0, 0, 4), {})
    assert (proc.start_ticks, proc.uid) == (_ticks(rank.pid), os.getuid())
    d = Daemon(DaemonConfig())
    fake, log = _tools(tmp_path, "sh")

    def shown(ident, now: float) -> str:
        req = checkpoint_job(seq=int(now))
        req.report.samples[0].identity.CopyFrom(ident)
        d.ingest(req, now=now)
        d.tick(now=now, wall=now)
        inc = d.incidents.active[("job-1", StallKind.CHECKPOINT_GATHER)]
        steps = {c["step"]: c["command"]
                 for c in api.incident_view(d, inc, now)["advice"]["commands"]}
        return steps["stacks"]

    ident = identity_pb(proc)
    got = _run(shown(ident, 100.0), "sh", fake)
    assert got.returncode == 0, got
    assert log.read_text().split() == ["dump", "--native", "--pid", str(rank.pid)]
    log.unlink()
    ident.start_ticks += 1                   # the pid, reported as another process's
    _refused(_run(shown(ident, 101.0), "sh", fake), rank.pid, rank=0)
    ident.start_ticks = 0                    # an agent that does not read it
    assert shown(ident, 102.0).startswith("# no command: the pid cannot be checked")
    assert not log.exists()
