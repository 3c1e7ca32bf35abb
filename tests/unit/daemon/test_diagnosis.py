"""The remediation table, its rules, its runbooks and the job env lint."""

from __future__ import annotations

import os
import resource
import string
import subprocess
import sys
import time

import pytest

from ncclwatch import runbooks
from ncclwatch.agent.sample import ProcessSampler
from ncclwatch.daemon.core import Daemon, DaemonConfig
from ncclwatch.daemon.diagnosis import RULES, facts, stall_evidence
from ncclwatch.envlint import lint
from ncclwatch.model import CollectiveOp, RankState, StallKind
from ncclwatch.remediation import BY_ID, ROOT_CAUSES
from tests.harness.reports import checkpoint_job, report, sample

S, Op = RankState, CollectiveOp


def test_every_root_cause_has_a_rule_and_every_kind_a_fallback() -> None:
    ruled = {rid for rules in RULES.values() for rid, _ in rules}
    assert ruled == set(BY_ID), "root causes without a rule, or rules without an entry"
    for kind in StallKind:
        rid, _ = RULES[kind][-1]
        assert BY_ID[rid].kind is kind
    for kind, rules in RULES.items():
        assert all(BY_ID[rid].kind is kind for rid, _ in rules)


def test_templates_only_use_known_facts() -> None:
    d = Daemon(DaemonConfig())
    d.ingest(checkpoint_job(save_for=30, wait_for=30), now=100.0)
    d.tick(now=100.0, wall=100.0)
    inc = d.incidents.active[("job-1", StallKind.CHECKPOINT_GATHER)]
    keys = set(facts(stall_evidence(d.table.jobs["job-1"], d.table, inc.finding, inc.budget, 100.0),
                     100.0))
    for rc in ROOT_CAUSES:
        used = {f for _, f, _, _ in string.Formatter().parse(rc.cause) if f}
        assert used <= keys, (rc.id, used - keys)
        assert rc.fix and rc.title


def test_runbooks_are_generated_from_the_table(tmp_path) -> None:
    runbooks.generate(tmp_path)
    for kind in StallKind:
        committed = runbooks.OUT / f"{kind.value}.md"
        assert committed.exists(), f"{committed} missing: run `make runbooks`"
        assert committed.read_text() == (tmp_path / committed.name).read_text(), \
            f"{committed} is stale: run `make runbooks`"
        for rc in ROOT_CAUSES:
            if rc.kind is kind:
                assert f'id="{rc.id}"' in committed.read_text()


@pytest.mark.parametrize("env, codes", [
    ({}, set()),
    ({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}, {"watchdog_cannot_abort"}),
    ({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0", "TORCH_NCCL_BLOCKING_WAIT": "1"}, set()),
    ({"NCCL_ASYNC_ERROR_HANDLING": "0"}, {"watchdog_cannot_abort"}),
    ({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"}, set()),
    ({"TORCH_FR_BUFFER_SIZE": "0"}, {"flight_recorder_disabled"}),
    ({"TORCH_NCCL_TRACE_BUFFER_SIZE": "0"}, {"flight_recorder_disabled"}),
    ({"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_TRACE_BUFFER_SIZE": "0"},
     {"flight_recorder_no_pipe"}),
    ({"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": "/tmp/pipe_"}, set()),
    ({"TORCH_NCCL_DUMP_ON_TIMEOUT": "false", "TORCH_NCCL_ENABLE_MONITORING": "0"},
     {"dump_on_timeout_disabled", "watchdog_monitoring_disabled"}),
])
def test_env_lint(env, codes) -> None:
    assert {w.code for w in lint(env)} == codes


def test_env_warnings_reach_the_job() -> None:
    d = Daemon(DaemonConfig())
    s = sample("job-1", 0, 1, S.COMPUTE, timeout=60.0)
    s.job.env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "0"
    d.ingest(report([s]), now=10.0)
    assert [w.code for w in d.table.jobs["job-1"].warnings] == ["watchdog_cannot_abort"]


def test_sampler_reads_a_real_address_space_limit_and_the_previous_checkpoint(tmp_path) -> None:
    limit = 8 << 30
    (tmp_path / "ckpt-step100.pt").write_bytes(b"x" * 4096)
    (tmp_path / "notes.txt").write_bytes(b"y" * 100)
    os.utime(tmp_path / "ckpt-step100.pt", (time.time() - 60,) * 2)
    code = (f"import resource,time; resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}));"
            f"f=open({str(tmp_path / 'ckpt-step200.pt')!r}, 'wb'); f.write(b'z'*10); f.flush();"
            "print('ok', flush=True); time.sleep(30)")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ok"
        s = ProcessSampler().sample(child.pid)
        assert s is not None
        kinds = {m.kind: m for m in s.memory_limits}
        assert kinds["address_space"].limit_bytes == limit
        assert kinds["address_space"].used_bytes == s.vms_bytes > 0
        assert kinds["host"].limit_bytes > kinds["host"].used_bytes == s.rss_bytes
        [f] = s.files_writing
        assert f.path.endswith("ckpt-step200.pt") and f.size_bytes == 10
        assert f.previous_path.endswith("ckpt-step100.pt") and f.previous_size_bytes == 4096
    finally:
        child.kill()
        child.wait()
    assert resource.getrlimit(resource.RLIMIT_AS)[0] != limit  # the test process untouched


def test_sampler_reads_cgroup_v2_memory_bounds(tmp_path) -> None:
    """A cgroup tree laid out as the kernel does (memory.max, memory.current)."""
    with open("/proc/self/cgroup") as f:
        path = next(line.split(":", 2)[2].strip() for line in f if line.startswith("0:"))
    d = tmp_path / path.lstrip("/")
    d.mkdir(parents=True, exist_ok=True)
    (d / "memory.max").write_text("4294967296\n")
    (d / "memory.current").write_text("1073741824\n")
    s = ProcessSampler(cgroup_root=str(tmp_path)).sample(os.getpid())
    cg = {m.kind: m for m in s.memory_limits}["cgroup"]
    assert (cg.used_bytes, cg.limit_bytes) == (1 << 30, 4 << 30)
    (d / "memory.max").write_text("max\n")
    s = ProcessSampler(cgroup_root=str(tmp_path)).sample(os.getpid())
    assert "cgroup" not in {m.kind for m in s.memory_limits}


def _hang_with_cpu(readings: list[float]) -> str:
    """Rank 1 (compute) keeps ranks 0 and 2 in all_reduce; its CPU reads as given,
    one report a second; returns the hang's culprit state as the verdict says it."""
    d = Daemon(DaemonConfig())
    for i, cpu in enumerate(readings):
        t = 100.0 + i
        samples = [sample("job-1", r, 3, S.COLLECTIVE, Op.ALL_REDUCE, seconds=40 + i)
                   for r in (0, 2)]
        late = sample("job-1", 1, 3, S.COMPUTE, seconds=40 + i)
        late.process.cpu_utilization = cpu
        d.ingest(report(samples + [late], seq=i + 1), now=t)
    d.tick(now=t, wall=t)
    inc = d.incidents.active[("job-1", StallKind.COLLECTIVE_HANG)]
    return stall_evidence(d.table.jobs["job-1"], d.table, inc.finding, inc.budget, t).culprit_states[0]


def test_a_computing_rank_starved_for_one_round_still_reads_as_computing() -> None:
    # On a loaded node one round's CPU reading of a busy rank can be near 0.
    assert _hang_with_cpu([0.9, 0.8, 0.9, 0.01]) == "compute"
    assert _hang_with_cpu([0.9, 0.8, 0.9, 0.7]) == "compute"


def test_a_rank_that_stopped_computing_reads_idle_after_a_few_seconds() -> None:
    assert _hang_with_cpu([0.9, 0.9] + [0.0] * 8) == "idle"
    assert _hang_with_cpu([0.0] * 4) == "idle"
