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
            assert toks == ["ncclwatch", "dump", HOSTILE], toks
            continue
        if platform == "host":          # ssh NODE 'remote command'
            assert toks[:2] == ["ssh", HOSTILE], toks
            remote = _tokens(toks[2])
            if c["step"] == "flight_recorder":
                assert remote == ["echo", "1", ">", HOSTILE + "3.pipe"], remote
            continue
        assert HOSTILE in toks or any(HOSTILE in t for t in toks), (c, toks)
        if c["step"] == "flight_recorder":   # sh -c 'echo 1 > PIPE'
            inner = _tokens(toks[-1])
            assert inner == ["echo", "1", ">", HOSTILE + "3.pipe"], inner


def test_without_a_pipe_the_dump_step_says_why() -> None:
    steps = {c["step"]: c["command"] for c in commands(Facts("j", 0, "n", 1, slurm_job="5"))}
    assert steps["flight_recorder"].startswith("# not enabled") \
        and "TORCH_NCCL_DEBUG_INFO_PIPE_FILE" in steps["flight_recorder"]
    assert steps["stop"].startswith("scancel --signal=TERM --full 5")


def test_the_pipe_is_the_culprits_own() -> None:
    f = Facts("j", 5, "n", 1, pipe_stem="/tmp/nccl_pipe_")
    steps = {c["step"]: c["command"] for c in commands(f)}
    assert _tokens(_tokens(steps["flight_recorder"])[2]) == ["echo", "1", ">",
                                                            "/tmp/nccl_pipe_5.pipe"]


def test_the_runbook_shows_each_platforms_commands() -> None:
    from ncclwatch import runbooks
    from ncclwatch.model import StallKind

    page = runbooks.render(StallKind.CHECKPOINT_GATHER)
    for _, _, command in actions.reference():
        assert command in page
