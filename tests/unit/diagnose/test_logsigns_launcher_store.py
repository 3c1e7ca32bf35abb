"""The deepspeed launcher's exit line, the store-based barrier, the c10d store-get error
and timeouts that name no rank: what each may and may not say about ranks.

Lines in the wordings of deepspeed/launcher/launch.py (sigkill_handler), torch's
distributed_c10d._store_based_barrier (1.x "rank: N ... worker_count", 2.x "rank N ...
num_workers_joined") and ProcessGroupNCCL's ncclUniqueId broadcast over the store; the
corpus (tests/data/diagnose/public) holds the real pastes these came from.
"""

from __future__ import annotations

from pathlib import Path

from ncclwatch.diagnose import diagnose


def _ds_exit(local_rank: int, code: int, host: str = "") -> str:
    return (f"{host}[2023-07-10 04:26:35,999] [ERROR] [launch.py:324:sigkill_handler] "
            f"['/venv/bin/python3.10', '-u', 'train.py', '--local_rank={local_rank}', "
            f"'--deepspeed', 'ds.json'] exits with return code = {code}")


def _kill(pid: int, host: str = "") -> str:
    return (f"{host}[2023-07-10 04:26:05,876] [INFO] [launch.py:318:sigkill_handler] "
            f"Killing subprocess {pid}")


def _wd(rank: int) -> str:
    return (f"[rank{rank}]:[E1108 14:22:31.043329959 ProcessGroupNCCL.cpp:757] [Rank {rank}] "
            "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=12, "
            "OpType=ALLREDUCE, NumelIn=8, NumelOut=8, Timeout(ms)=600000) ran for 600089 "
            "milliseconds before timing out.")


def _diagnose(tmp_path: Path, *lines: str):
    log = tmp_path / "console.log"
    log.write_text("\n".join(lines) + "\n")
    return diagnose([log])


def test_deepspeed_exit_names_the_last_spawned_worker_not_the_failed_one(tmp_path):
    d = _diagnose(tmp_path, _kill(94984), _kill(94985), _ds_exit(1, -11))
    assert (d.cls, d.initiating, d.candidates) == ("rank_crash", [], [0, 1])
    assert "SIGSEGV" in d.summary and "local ranks 0-1" in d.summary
    # The evidence keeps the return code even where the command line is long.
    long = _ds_exit(3, 1).replace("'--deepspeed'", "'--x', " * 60 + "'--deepspeed'")
    d = _diagnose(tmp_path, long)
    assert d.candidates == [0, 1, 2, 3]
    assert any("exits with return code = 1" in why for _w, why in d.evidence), d.evidence


def test_deepspeed_single_worker_is_the_one_that_failed(tmp_path):
    d = _diagnose(tmp_path, _kill(13266), _ds_exit(0, -9))
    assert (d.cls, d.initiating) == ("rank_crash", [0])
    assert any("OOM killer" in n for n in d.notes), d.notes


def test_deepspeed_exit_after_a_hang_is_not_a_crash(tmp_path):
    """The launcher's exit (-6 from the watchdog's abort, or 1) follows the hang; its
    --local_rank=2 only says the node ran ranks 0-2, so rank 2, silent, is the suspect."""
    for code in (-6, 1):
        d = _diagnose(tmp_path, _wd(0), _wd(1), _kill(1), _kill(2), _kill(3),
                      _ds_exit(2, code))
        assert (d.cls, d.initiating, d.candidates, d.collateral) == \
            ("collective_hang", [], [2], [0, 1]), (code, d.summary)


def test_deepspeed_single_worker_that_timed_out_is_a_hang(tmp_path):
    """A node's one worker whose watchdog fired: the -6 is the watchdog's abort, not a
    crash of rank 0 (the rank it waited for is on another node, or its own GPU)."""
    d = _diagnose(tmp_path, _wd(0), _kill(1), _ds_exit(0, -6))
    assert (d.cls, d.collateral) == ("collective_hang", [0]), d.summary


def test_deepspeed_exit_on_several_nodes_names_no_global_ranks(tmp_path):
    d = _diagnose(tmp_path, _kill(249, "worker-1: "), _ds_exit(7, -11, "worker-1: "))
    assert (d.cls, d.initiating, d.candidates) == ("rank_crash", [], [])


def test_unprefixed_timeout_is_a_hang_naming_nobody(tmp_path):
    for line in ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:136] "
                 "Timed out waiting 1800000ms for send operation to complete",
                 "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=49, "
                 "OpType=ALLREDUCE, Timeout(ms)=18000000) ran for 18005607 milliseconds before "
                 "timing out."):
        d = _diagnose(tmp_path, line)
        assert (d.cls, d.initiating, d.candidates, d.collateral) == \
            ("collective_hang", [], [], []), d.summary
        assert d.missing_evidence and d.collect_next_time


def test_store_based_barrier_in_both_wordings(tmp_path):
    v1 = ("RuntimeError: Timed out initializing process group in store based barrier on rank: "
          "0, for key: store_based_barrier_key:1 (world_size=2, worker_count=1, "
          "timeout=0:30:00)")
    d = _diagnose(tmp_path, v1)
    # Rank 0 counted itself; the barrier saw 1 of 2: rank 1 never joined.
    assert (d.cls, d.initiating, d.collateral) == ("collective_hang", [1], [0]), d.summary
    assert "store-based barrier" in d.summary and "1800 s" in d.summary
    assert any("counted 1 of 2 ranks: 1 never arrived" in n for n in d.notes), d.notes
    v2 = ("[rank3]: torch.distributed.DistStoreError: Timed out initializing process group in "
          "store based barrier on rank 3, for key: store_based_barrier_key:1 (world_size=4, "
          "num_workers_joined=3, timeout=0:30:00 error=Wait timeout)")
    d = _diagnose(tmp_path, v2)
    assert (d.cls, d.initiating, d.candidates, d.collateral) == \
        ("collective_hang", [], [0, 1, 2], [3]), d.summary


def test_store_get_reset_is_a_network_error_naming_no_rank(tmp_path):
    reset = ("[rank15]: torch.distributed.DistBackendError: [15] is setting up NCCL "
             "communicator and retrieving ncclUniqueId from [0] via c10d key-value store by "
             "key '0', but store->get('0') got error: Connection reset by peer")
    d = _diagnose(tmp_path, reset)
    assert (d.cls, d.initiating, d.collateral) == ("network_error", [], [15]), d.summary
    assert any("crashed rank 0" in n for n in d.notes)
    # A store wait that timed out is not a broken connection: no network verdict.
    timeout = ("RuntimeError: [2] is setting up NCCL communicator and retreiving ncclUniqueId "
               "from [0] via c10d key-value store by key '0', but store->get('0') got "
               "exception: Socket Timeout")
    d = _diagnose(tmp_path, timeout)
    assert d.cls not in ("network_error", "none"), d.summary


_SUMMARY = ("torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
            "Root Cause (first observed failure):", "[0]:", "  time      : 2024-03-28_18:48:30",
            "  host      : node-3", "  rank      : 3 (local_rank: 3)",
            "  exitcode  : 1 (pid: 4541)", "  error_file: <N/A>")


def test_a_failure_summary_names_its_failing_rank(tmp_path):
    d = _diagnose(tmp_path, "[rank0]:step 100 loss 1.25", *_SUMMARY)
    assert (d.cls, d.initiating) == ("rank_crash", [3])


def test_a_summary_rank_that_only_waited_is_not_named(tmp_path):
    d = _diagnose(tmp_path, _wd(3), *_SUMMARY)
    assert d.cls == "collective_hang" and 3 not in d.initiating


def test_a_rank_that_only_lost_its_store_connection_is_collateral(tmp_path):
    d = _diagnose(
        tmp_path,
        "slurmstepd: error: Detected 1 oom_kill event in StepId=4411.0. Some of the step tasks "
        "have been OOM Killed.",
        "[rank5]:Traceback (most recent call last):",
        '[rank5]:  File "/job/train.py", line 301, in <module>',
        "[rank5]:torch.distributed.DistStoreError: failed to recv, got 0 bytes. Connection was "
        "likely closed. Did the remote server shutdown or crash?")
    assert d.cls == "rank_crash" and 5 not in d.initiating, (d.cls, d.initiating, d.summary)


def test_a_store_never_reached_names_its_address(tmp_path):
    d = _diagnose(
        tmp_path,
        "[W socket.cpp:697] [c10d] The client socket has failed to connect to "
        "[::ffff:10.0.0.7]:29500 (errno: 110 - Connection timed out).",
        "[E socket.cpp:753] [c10d] The client socket has failed to connect to any network "
        "address of (10.0.0.7, 29500).")
    assert d.cls == "network_error" and d.initiating == []
    assert "(10.0.0.7, 29500)" in d.summary


def test_the_retries_alone_are_no_failure(tmp_path):
    d = _diagnose(
        tmp_path,
        "[W socket.cpp:697] [c10d] The client socket has failed to connect to "
        "[::ffff:10.0.0.7]:29500 (errno: 110 - Connection timed out).",
        "[rank0]:step 1 loss 1.25")
    assert d.cls == "none", (d.summary, d.evidence)
