"""The commands a stall shows for acting on the job where it runs: the
platform each job's facts pick, and quoting that keeps a rank's text a word
(a pasted command runs what it shows). The Slurm commands run against a real
cluster in tests/e2e/test_slurm.py."""

from __future__ import annotations

import shlex

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
}
#: The steps that place each field, per platform (the others must still work).
_BASE = {"slurm": dict(slurm_job="123"), "kubernetes": dict(namespace="ns", pod="job-w-0"),
         "host": {}}


@pytest.mark.parametrize("platform", ["slurm", "kubernetes", "host"])
@pytest.mark.parametrize("field", sorted(HOSTILE_VALUES))
def test_a_value_out_of_its_grammar_gets_no_command(platform, field) -> None:
    for value in HOSTILE_VALUES[field]:
        f = Facts(**{"job_id": "job", "rank": 3, "node": "gpu-1.cluster", "pid": 4242,
                     "pipe_stem": "/tmp/nccl_pipe_", **_BASE[platform], field: value})
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
              **_BASE[platform])
    steps = {c["step"]: c["command"] for c in commands(f)}
    assert not any(cmd.startswith("#") for cmd in steps.values()), steps
    if platform == "host":
        assert all(_tokens(steps[s])[:3] == ["ssh", "--", "gpu-1.cluster"]
                   for s in ("flight_recorder", "stacks", "logs", "stop"))
    if platform == "slurm":
        assert _tokens(steps["stop"])[-2:] == ["--", "123"]
    if platform == "kubernetes":
        assert _tokens(steps["logs"])[-2:] == ["--", "job-w-0"]


def test_the_host_stop_never_signals_pid_1(tmp_path) -> None:
    """The rank's parent may be pid 1 (a rank re-parented when its launcher
    died, a container's init): the stop command's own shell guard sends nothing."""
    import subprocess

    stop = {c["step"]: c["command"] for c in commands(Facts("j", 0, "n", 4242))}["stop"]
    remote = _tokens(stop)[3]
    log = tmp_path / "kills"
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "ps").write_text("#!/bin/sh\necho '    1'\n")
    (fake / "kill").write_text(f"#!/bin/sh\necho \"$@\" >> {log}\n")
    for tool in ("ps", "kill"):
        (fake / tool).chmod(0o755)
    # `kill` is a shell builtin: run the remote text with the builtin disabled.
    subprocess.run(["bash", "-c", "enable -n kill; " + remote], check=False,
                   env={"PATH": f"{fake}:/usr/bin:/bin"})
    assert not log.exists(), log.read_text()
    (fake / "ps").write_text("#!/bin/sh\necho ' 777'\n")
    subprocess.run(["bash", "-c", "enable -n kill; " + remote], check=False,
                   env={"PATH": f"{fake}:/usr/bin:/bin"})
    assert log.read_text().split() == ["-TERM", "--", "777"]


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
