"""The log scanner's mechanics: inputs, ranks, tracebacks, chunk edges, the CLI.

The verdicts themselves are checked on the corpus of real and source-written
logs (tests/unit/test_diagnose.py); these tests pin the parts a verdict stands on.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pytest

from ncclwatch.diagnose import diagnose, lineprefix, logscan
from ncclwatch.diagnose.lineprefix import rank_of_path, split_prefix
from ncclwatch.diagnose.logscan import scan
from ncclwatch.diagnose.logsigns import SIGNS
from ncclwatch.diagnose.signtypes import Event
from tests.harness import paths

TIMEOUT = ("[rank{r}]:[E1203 10:10:0{r}.000000 12{r} ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog "
           "caught collective operation timeout: WorkNCCL(SeqNum=547, OpType=ALLREDUCE, "
           "NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600088 milliseconds before "
           "timing out.\n")
TRACEBACK = ("[rank{r}]:Traceback (most recent call last):\n"
             '[rank{r}]:  File "/job/train.py", line 88, in <module>\n'
             "[rank{r}]:    dist.barrier()\n"
             '[rank{r}]:  File "/venv/torch/distributed/c10d_logger.py", line 83, in wrapper\n'
             "[rank{r}]:    return func(*args, **kwargs)\n"
             "[rank{r}]:           ^^^^^^^^^^^^^^^^^^^^^\n"
             '[rank{r}]:  File "/venv/torch/distributed/distributed_c10d.py", line 4159, in barrier\n'
             "[rank{r}]:    work.wait()\n"
             "[rank{r}]:torch.distributed.DistBackendError: [Rank {r}] Watchdog caught collective "
             "operation timeout\n")
NOISE = "[rank{r}]:[2026-12-03 10:00:00,000] INFO step 5 loss 1.25\n"


def _job_log(world: int = 4, noise: int = 200) -> str:
    out = [NOISE.format(r=i % world) for i in range(noise)]
    out.append("[rank0]:[2026-12-03 10:00:01,000] INFO Saving checkpoint to /ckpt/step5\n")
    out += [TIMEOUT.format(r=r) for r in range(1, world)]
    out += [TRACEBACK.format(r=r) for r in range(1, world)]
    return "".join(out)


def test_every_sign_compiles_and_has_triggers_it_contains():
    for s in SIGNS:
        s.compile()
        assert s.triggers, s.id
        assert all(t for t in s.triggers), s.id


@pytest.mark.parametrize("line,rank,rest", [
    ("[rank3]:hello", 3, "hello"),
    ("[default2]: hello", 2, " hello"),
    ("12: [rank7]:x", 7, "x"),
    ("  4: x", 4, "x"),
    ("[2026-12-03 10:00:00] x", None, "[2026-12-03 10:00:00] x"),
])
def test_rank_prefixes(line, rank, rest):
    assert split_prefix(line) == (rank, rest)


@pytest.mark.parametrize("path,rank", [
    ("logs/run/attempt_0/3/stderr.log", 3),
    ("out/rank12.log", 12),
    ("out/train_rank_5.txt", 5),
    ("slurm-1234.out", None),
    ("logs/torchrun.log", None),
])
def test_rank_of_path(path, rank):
    assert rank_of_path(path) == rank


def test_traceback_frames_and_exception(tmp_path):
    log = tmp_path / "job.log"
    log.write_text(_job_log())
    r = scan([log])
    tbs = sorted(r.tracebacks, key=lambda t: t.rank)
    assert [t.rank for t in tbs] == [1, 2, 3]
    assert [f.name for f in tbs[0].frames] == ["<module>", "wrapper", "barrier"]
    assert tbs[0].exception.startswith("torch.distributed.DistBackendError: [Rank 1]")
    timeouts = [e for e in r.evidence if e.event is Event.TIMEOUT]
    assert sorted(e.rank for e in timeouts) == [1, 2, 3]
    assert timeouts[0].fields["timeout_ms"] == "600000"
    assert r.ranks_seen == {0, 1, 2, 3}


def test_interleaved_tracebacks_stay_with_their_rank(tmp_path):
    a = TRACEBACK.format(r=1).splitlines(keepends=True)
    b = TRACEBACK.format(r=2).splitlines(keepends=True)
    mixed = [x for pair in zip(a, b) for x in pair]
    log = tmp_path / "job.log"
    log.write_text("".join(mixed))
    tbs = {t.rank: t for t in scan([log]).tracebacks}
    assert set(tbs) == {1, 2}
    for r, t in tbs.items():
        assert len(t.frames) == 3 and f"[Rank {r}]" in t.exception


def test_chunk_edges_change_nothing(tmp_path, monkeypatch):
    """A traceback or a line cut by the chunk boundary reads as if whole."""
    log = tmp_path / "job.log"
    log.write_text(_job_log(noise=50))
    whole = diagnose([log]).to_json()
    for chunk in (61, 97, 256):
        monkeypatch.setattr(logscan, "CHUNK", chunk)
        small = diagnose([log]).to_json()
        for key in ("class", "initiating_ranks", "collateral_ranks", "evidence", "timeline"):
            assert small[key] == whole[key], (chunk, key)


def test_gzip_directory_and_per_rank_files(tmp_path):
    d = tmp_path / "logs" / "run" / "attempt_0"
    for r in range(4):
        (d / str(r)).mkdir(parents=True)
        text = _job_log().replace(f"[rank{r}]:", "")
        own = "".join(ln + "\n" for ln in text.splitlines() if not ln.startswith("[rank"))
        with gzip.open(d / str(r) / "stderr.log.gz", "wt") if r == 2 else \
                open(d / str(r) / "stderr.log", "w") as f:
            f.write(own)
    # gzip keeps the rank from the directory, not the name
    (d / "2" / "stderr.log.gz").rename(d / "2" / "stderr.log")
    r = scan([tmp_path / "logs"])
    assert len(r.files) == 4 and r.ranks_seen == {0, 1, 2, 3}
    assert sorted(t.rank for t in r.tracebacks) == [1, 2, 3]
    d_ = diagnose([tmp_path / "logs"])
    assert (d_.cls, d_.initiating) == ("checkpoint_gather_timeout", [0])


def test_binary_and_unreadable_inputs_are_named_not_fatal(tmp_path):
    (tmp_path / "core").write_bytes(b"\x7fELF\x00\x00\x01\x02" * 100)
    (tmp_path / "job.log").write_text(_job_log())
    d = diagnose([tmp_path])
    assert d.cls == "checkpoint_gather_timeout"
    assert [s["path"] for s in d.inputs["skipped"]] == [str(tmp_path / "core")]
    assert "binary" in d.inputs["skipped"][0]["why"]


def test_healthy_log_is_none(tmp_path):
    log = tmp_path / "ok.log"
    log.write_text("".join(NOISE.format(r=i % 4) for i in range(100)))
    d = diagnose([log])
    assert (d.cls, d.initiating) == ("none", [])


def test_cli_json_and_missing_path(tmp_path):
    log = tmp_path / "job.log"
    log.write_text(_job_log())
    out = subprocess.run([sys.executable, "-m", "ncclwatch", "diagnose", "--json", str(log)],
                         capture_output=True, text=True)
    assert out.returncode == 1, out.stderr  # 1: a failure found
    j = json.loads(out.stdout)
    assert j["class"] == "checkpoint_gather_timeout" and j["initiating_ranks"] == [0]
    assert j["collateral_ranks"] == [1, 2, 3]
    assert j["root_cause"]["id"] == "save_overruns_watchdog"
    assert any(e["where"].endswith(":201") for e in j["evidence"])  # the checkpoint line
    txt = subprocess.run([sys.executable, "-m", "ncclwatch", "diagnose", str(log)],
                         capture_output=True, text=True).stdout
    assert "initiating rank(s): 0" in txt and "Fix (save_overruns_watchdog)" in txt
    bad = subprocess.run([sys.executable, "-m", "ncclwatch", "diagnose", str(tmp_path / "nope")],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "no such file" in bad.stderr
    ok = tmp_path / "ok.log"
    ok.write_text("".join(NOISE.format(r=i % 4) for i in range(50)))
    fine = subprocess.run([sys.executable, "-m", "ncclwatch", "diagnose", str(ok)],
                          capture_output=True, text=True)
    assert fine.returncode == 0 and "No failure found" in fine.stdout  # 0: none found
    usage = subprocess.run([sys.executable, "-m", "ncclwatch", "diagnose"],
                           capture_output=True, text=True)
    assert usage.returncode == 2


FR_REAL = paths.DATA / "flightrec" / "real"


@pytest.mark.parametrize("case,cls,initiating", [
    ("hang", "collective_hang", [2]),      # ranks 0, 1 in all_reduce #4; rank 2 never came
    ("multipg", "collective_hang", [3]),   # only group pair23 is stuck, on rank 3
    ("desync", "desync", [2]),             # rank 2 broadcast 8 elements, the others 4
    ("healthy", "none", []),
])
def test_flight_recorder_dumps_alone(case, cls, initiating):
    d = diagnose([FR_REAL / case])
    assert (d.cls, d.initiating) == (cls, initiating)
    assert len(d.inputs["flight_recorder_dumps"]) >= 3 and not d.inputs["files"]
    assert d.flight_recorder is not None and d.timeout_s == 5.0


def test_a_bad_dump_is_skipped_with_its_reason(tmp_path):
    (tmp_path / "nccl_trace_rank_0").write_bytes(b"\x80\x04garbage")
    (tmp_path / "job.log").write_text(_job_log())
    d = diagnose([tmp_path])
    assert d.cls == "checkpoint_gather_timeout"
    assert d.inputs["skipped"] and d.inputs["skipped"][0]["path"].endswith("nccl_trace_rank_0")


from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

#: Pieces of real evidence lines, so random logs reach the rules, not just the scanner.
_PIECES = [TIMEOUT.format(r=1), TRACEBACK.format(r=2), NOISE.format(r=0),
           "[rank0]:[2026-12-03 10:00:01,000] INFO Saving checkpoint to /c\n",
           "  rank      : 3 (local_rank: 3)\n", "  exitcode  : -9 (pid: 77)\n",
           "Root Cause (first observed failure):\n", "Out of memory: Killed process 77 (python)\n",
           "host:1:2 [0] NCCL WARN NET/IB : error\n", "[rank1]: Traceback (most recent call last):\n",
           "Sending process 12 closing signal SIGTERM\n", "\x00\xff\n", "\n"]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(st.sampled_from(_PIECES), st.text(max_size=200),
                          st.binary(max_size=200).map(lambda b: b.decode("latin-1"))),
                max_size=60),
       st.booleans())
def test_any_log_gets_a_verdict_never_an_exception(tmp_path, parts, gz):
    """Truncated, interleaved, binary-laced logs: a verdict (maybe none/unknown), no crash."""
    data = "".join(parts).encode("utf-8", "surrogateescape")
    path = tmp_path / ("x.log.gz" if gz else "x.log")
    path.write_bytes(gzip.compress(data) if gz else data)
    d = diagnose([path])
    assert d.cls in {"none", "unknown", "checkpoint_gather_timeout", "collective_hang", "desync",
                     "gather_oom", "network_error", "rank_crash"}
    assert set(d.initiating).isdisjoint(d.collateral)
    json.dumps(d.to_json())


def test_a_truncated_gzip_keeps_what_it_had(tmp_path):
    full = gzip.compress(_job_log(noise=2000).encode())
    path = tmp_path / "cut.log.gz"
    path.write_bytes(full[: len(full) - 40])  # the end of the stream is missing
    d = diagnose([path])
    assert d.cls == "checkpoint_gather_timeout" and d.initiating == [0]
    assert "read stopped early" in d.inputs["skipped"][0]["why"]


def test_concatenated_gzip_members_and_a_gzip_bomb(tmp_path):
    one = gzip.compress(_job_log(noise=10).encode())
    (tmp_path / "two.log.gz").write_bytes(gzip.compress(b"hello\n") + one)  # cat a.gz b.gz
    d = diagnose([tmp_path / "two.log.gz"])
    assert (d.cls, d.initiating) == ("checkpoint_gather_timeout", [0])
    bomb = tmp_path / "bomb.log.gz"
    bomb.write_bytes(gzip.compress(b"\n" * (64 << 20), compresslevel=9))  # 64 MiB of newlines
    r = scan([bomb])
    assert r.lines_read == 64 << 20 and not r.evidence  # read in bounded chunks, linear


def test_a_chained_exception_is_two_tracebacks(tmp_path):
    inner = TRACEBACK.format(r=1)
    outer = ("[rank1]: \n[rank1]: During handling of the above exception, another exception "
             "occurred:\n[rank1]: \n[rank1]: Traceback (most recent call last):\n"
             '[rank1]:   File "/job/train.py", line 90, in <module>\n'
             "[rank1]:     raise SystemExit(1)\n[rank1]: ValueError: cleanup failed\n")
    log = tmp_path / "job.log"
    log.write_text(inner + outer)
    tbs = scan([log]).tracebacks
    assert [t.exception.split(":")[0] for t in tbs] == [
        "torch.distributed.DistBackendError", "ValueError"]
    assert [len(t.frames) for t in tbs] == [3, 1] and {t.rank for t in tbs} == {1}


@pytest.mark.parametrize("text,pg,rank", [
    ("[Rank 3] Watchdog caught", None, 3),
    ("[PG 3 Rank 2] Timeout at NCCL work: 5", "3", 2),
    ("[PG 0 Rank 1] Timeout at NCCL work: 5", "0", 1),
    ("[PG 0 (default_pg) Rank 12] Exception", "default_pg", 12),
    ("[PG ID 0 PG GUID 0(default_pg) Rank 6] x", "default_pg", 6),
    ("[PG ID 2 PG GUID 9 Rank 4] x", "2", 4),
    ("[PG ID 12 PG GUID 99(EXPERT_MODEL_PARALLEL_GROUP) Rank 4] x", "EXPERT_MODEL_PARALLEL_GROUP", 4),
    ("no tag here", None, None),
])
def test_process_group_tags(text, pg, rank):
    assert lineprefix.pg_of(text) == (pg, rank)


def test_a_pg_local_rank_is_not_a_global_rank(tmp_path):
    """Unprefixed: "[PG 5 Rank 0]" is rank 0 of group 5, which is not global rank 0."""
    log = tmp_path / "console.log"
    log.write_text("[E ProcessGroupNCCL.cpp:1316] [PG 5 Rank 0] Heartbeat monitor timed out!\n"
                   "[E ProcessGroupNCCL.cpp:1316] [PG 0 Rank 3] Heartbeat monitor timed out!\n")
    ev = scan([log]).evidence
    assert [(e.rank, e.pg, e.pg_rank) for e in ev] == [(None, "5", 0), (3, "0", 3)]


def test_partial_verdict_in_json_says_what_is_missing(tmp_path):
    log = tmp_path / "console.log"
    log.write_text(TIMEOUT.format(r=2))
    out = subprocess.run([sys.executable, "-m", "ncclwatch", "diagnose", "--json", str(log)],
                         capture_output=True, text=True, timeout=120)
    j = json.loads(out.stdout)
    assert (j["class"], j["initiating_ranks"], j["collateral_ranks"]) == ("collective_hang", [], [2])
    assert j["initiator_among"] == [0, 1]
    assert j["missing_evidence"] and any("TORCH_NCCL_DUMP_ON_TIMEOUT" in c
                                         for c in j["collect_next_time"])
    text = subprocess.run([sys.executable, "-m", "ncclwatch", "diagnose", str(log)],
                          capture_output=True, text=True, timeout=120).stdout
    assert "initiator among:    0-1" in text and "Collect next time:" in text


def test_a_busy_main_process_is_late_but_an_old_progress_bar_is_not(tmp_path):
    bar = "Tokenizing Prompts (num_proc=8): 100%|██████████| 5000/5000 [01:02<00:00, 80.1 examples/s]\n"
    wait = TIMEOUT.format(r=1)
    log = tmp_path / "late.log"
    log.write_text(bar + wait)
    d = diagnose([log])
    assert (d.cls, d.initiating, d.collateral) == ("collective_hang", [0], [1])
    assert any("busy" in why for _w, why in d.evidence)
    old = tmp_path / "old.log"
    old.write_text(bar + NOISE.format(r=1) * 500 + wait)
    d = diagnose([old])
    assert (d.cls, d.initiating, d.candidates) == ("collective_hang", [], [0])
