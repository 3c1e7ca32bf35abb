"""``ncclwatch preflight``: the prevention check before the first checkpoint.

Its prediction is held against a real torch.save on the throttled FUSE mount;
its verdict, exit status and words against the live forecast's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import pytest

from ncclwatch import preflight
from ncclwatch.savefit import Fit
from tests.harness.paths import ROOT


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    preflight.add_arguments(p)
    return p.parse_args(list(argv))


#: (text, bytes for --size or None: refused): B is bytes, never billions (issue 29).
SIZES = [("500", 500), ("500B", 500), ("140G", 140e9), ("140GB", 140e9), ("2GiB", 2 << 30),
         ("2Gi", 2 << 30), ("1_000", 1000), ("64Mi", 64 << 20), ("64MiB", 64 << 20),
         ("1e9", 1e9), ("1.5K", 1500), ("500b", None), ("64mib", None), ("7 bananas", None),
         ("", None), ("-5", None)]
#: (text, count for --params or None: refused): B is billions, as models are named.
COUNTS = [("7e9", 7e9), ("7B", 7e9), ("7b", 7e9), ("350M", 350e6), ("1_000", 1000),
          ("2T", 2e12), ("7GB", None), ("2GiB", None), ("7G", None), ("64Mi", None)]


@pytest.mark.parametrize("text,value", SIZES)
def test_sizes_are_bytes(text: str, value: float | None) -> None:
    if value is None:
        with pytest.raises(argparse.ArgumentTypeError, match="B is bytes"):
            preflight.size_bytes(text)
    else:
        assert preflight.size_bytes(text) == value


@pytest.mark.parametrize("text,value", COUNTS)
def test_params_are_counts(text: str, value: float | None) -> None:
    if value is None:
        with pytest.raises(argparse.ArgumentTypeError, match="goes to --size"):
            preflight.count(text)
    else:
        assert preflight.count(text) == value


def test_size_500B_is_500_bytes_and_ambiguous_units_are_explained(tmp_path) -> None:
    """The reproduction: ``--size 500B`` read as 500 GB (B was billions for both)."""
    def cli(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "ncclwatch", "preflight", "--dir",
                               str(tmp_path), "--probe-seconds", "0.2", "--probe-bytes", "4Mi",
                               "--timeout", "60", "--json", *argv], capture_output=True,
                              text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    r = cli("--size", "500B")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["checkpoint_bytes"] == 500
    r = cli("--params", "7GB", "--dtype", "bf16")
    assert r.returncode == 2 and "a size in bytes goes to --size" in r.stderr, r.stderr
    r = cli("--size", "500b")
    assert r.returncode == 2 and "b would be bits" in r.stderr, r.stderr


def test_checkpoint_size_from_parameters_dtype_and_optimizer() -> None:
    assert preflight.checkpoint_bytes(1e9, "bf16", "none") == 2e9
    # bf16 weights + fp32 master copy + two fp32 Adam moments: 14 bytes a parameter
    assert preflight.checkpoint_bytes(1e9, "bf16", "adam") == 14e9
    assert preflight.checkpoint_bytes(1e9, "fp32", "adamw") == 12e9


def test_measure_is_bounded_fsyncs_and_cleans_up(tmp_path) -> None:
    t0 = time.monotonic()
    p = preflight.measure(tmp_path, max_bytes=8 << 20, max_seconds=5.0, block=1 << 20)
    assert p.bytes_written == 8 << 20 and p.rate > 0
    assert p.fsync_done and p.fsync_pid == 0 and p.synced_rate <= p.rate
    p = preflight.measure(tmp_path, max_bytes=1 << 40, max_seconds=0.3, block=1 << 20)
    assert p.bytes_written < 1 << 40 and time.monotonic() - t0 < 30
    if not p.fsync_done:
        # Cut at its bound (a loaded machine): the child still syncing removes the
        # probe file once its fsync returns.
        import psutil
        try:
            psutil.Process(p.fsync_pid).wait(60)
        except psutil.NoSuchProcess:
            pass
    assert list(tmp_path.iterdir()) == []  # the probe file is gone


def test_does_not_fit_exits_1_and_prints_the_frameworks_fix(tmp_path, capsys) -> None:
    code = preflight.main(_args("--dir", str(tmp_path), "--size", "1T", "--timeout", "60",
                                "--probe-seconds", "0.3", "--probe-bytes", "64Mi",
                                "--framework", "lightning"), env={})
    out = capsys.readouterr().out
    assert code == preflight.EXIT_OVERRUNS == 1
    assert out.startswith("DOES NOT FIT: a full save of 931.3GiB on one rank at ")
    assert "too late" in out and "watchdog timeout: 60s (--timeout)" in out
    assert 'FSDPStrategy(state_dict_type="sharded")' in out  # Lightning's own words
    assert list(tmp_path.iterdir()) == []


def test_fits_exits_0_reads_the_timeout_and_lints_the_env(tmp_path, capsys) -> None:
    env = {"NCCLWATCH_PG_TIMEOUT_S": "1800", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}
    code = preflight.main(_args("--dir", str(tmp_path), "--size", "1M", "--json",
                                "--probe-seconds", "1"), env=env)
    v = json.loads(capsys.readouterr().out)
    assert code == 0 and v["exit_code"] == 0 and v["fits"] and not v["fixes"]
    assert v["timeout_seconds"] == 1800 and v["timeout_from"] == "NCCLWATCH_PG_TIMEOUT_S"
    assert "watchdog_cannot_abort" in {w["code"] for w in v["env_warnings"]}


@pytest.mark.parametrize("env,expected", [
    ({}, (0.0, "")),
    ({"NCCLWATCH_PG_TIMEOUT_S": "1800", "DEEPSPEED_TIMEOUT": "60"},
     (1800.0, "NCCLWATCH_PG_TIMEOUT_S")),
    ({"NCCLWATCH_WATCHDOG_TIMEOUT_SECONDS": "900"}, (900.0, "NCCLWATCH_WATCHDOG_TIMEOUT_SECONDS")),
    ({"DEEPSPEED_TIMEOUT": "45"}, (2700.0, "DEEPSPEED_TIMEOUT")),   # minutes
    ({"NCCLWATCH_PG_TIMEOUT_S": "soon", "DEEPSPEED_TIMEOUT": "10"}, (600.0, "DEEPSPEED_TIMEOUT")),
])
def test_the_timeout_a_job_states_in_its_environment(env, expected) -> None:
    from ncclwatch.agent.timeouts import declared_timeout_from
    from ncclwatch.envpolicy import ALLOWED_NAMES

    assert declared_timeout_from(env) == expected
    assert set(env) <= ALLOWED_NAMES   # the agent reads each of them


@pytest.mark.parametrize("argv,seconds", [
    (["python", "train.py", "--ddp_timeout", "3600"], 3600.0),
    (["python", "train.py", "--ddp_timeout=5400", "--lr", "1e-4"], 5400.0),
    (["train.py", "--ddp-timeout", "900", "--ddp_timeout", "1200"], 1200.0),   # the last wins
    (["train.py", "--ddp_timeout"], 0.0), (["train.py", "--ddp_timeout", "soon"], 0.0),
    (["train.py", "--timeout", "3600"], 0.0), ([], 0.0),
])
def test_the_timeout_a_rank_states_on_its_command_line(argv, seconds) -> None:
    from ncclwatch.agent.timeouts import args_timeout

    assert args_timeout(argv) == seconds


def test_tight_margin_exits_3() -> None:
    probe = preflight.Probe(bytes_written=100, seconds=1.0)        # 100 B/s
    v = preflight.judge(ROOT, 8000, "--size", probe, 100.0, "--timeout", 0.25, "torch", {})
    assert v.fits and v.tight and v.exit_code == preflight.EXIT_TIGHT == 3
    assert v.fixes  # tight: the fix is printed too


def test_the_live_forecast_says_it_in_the_same_words() -> None:
    from ncclwatch.model import RankState as S
    from tests.harness.reports import MB, drive_job, rank0_sample

    d, _ = drive_job(lambda i: rank0_sample(S.SAVING, i, file_size=(i + 1) * MB, prev=200 * MB,
                                   seconds=i), 12)
    [inc] = d.incidents.active.values()
    ev = inc.diagnosis.evidence
    words = Fit(ev.write.eta_seconds, ev.budget.remaining).words()
    assert words in inc.diagnosis.sentence
    v = preflight.judge(ROOT, 200 * MB, "--size", preflight.Probe(MB, 1.0), 90.0, "--timeout",
                        0.25, "torch", {})
    assert Fit(200.0, 90.0).words() in v.words and "the watchdog allows" in words


def test_cli_exit_status_in_ci(tmp_path) -> None:
    r = subprocess.run([sys.executable, "-m", "ncclwatch", "preflight", "--dir", str(tmp_path),
                        "--params", "70B", "--dtype", "bf16", "--optimizer", "adam",
                        "--timeout", "30", "--probe-seconds", "0.5", "--probe-bytes", "64Mi"],
                       capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    # 980 GB through one rank in 30 s needs 33 GB/s: not even the page cache here
    # (the rate is torch.save's, buffered writes without fsync)
    assert r.returncode in (1, 3), r.stdout + r.stderr
    assert "70 billion" in r.stdout or "7e+10 parameters in bf16 with adam state" in r.stdout
    r = subprocess.run([sys.executable, "-m", "ncclwatch", "preflight", "--dir", str(tmp_path),
                        "--params", "7B"], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 2 and "--dtype" in r.stderr


RATE = 8_000_000  # bytes/s on the throttled mount


def _predicted_and_real(mount, nbytes: int, *args: str, capsys) -> tuple[dict, float]:
    """The preflight verdict for ``nbytes`` on ``mount``, then a real torch.save of
    that size there, back to back (seconds)."""
    return _verdict(mount, nbytes, *args, capsys=capsys), _real_save(mount, nbytes)


def _verdict(mount, nbytes: int, *args: str, capsys) -> dict:
    capsys.readouterr()   # (what the test printed so far is not the verdict)
    code = preflight.main(_args("--dir", str(mount), "--size", str(nbytes), *args, "--json"),
                          env={})
    out = capsys.readouterr()
    assert out.out, (code, out.err)
    v = json.loads(out.out)
    assert code == 1 and not v["fits"], v
    return v


def _real_save(mount, nbytes: int) -> float:
    """Seconds torch.save takes to write ``nbytes`` of tensor to ``mount``."""
    import torch

    state = {"w": torch.empty(nbytes, dtype=torch.uint8).random_()}
    (mount / "model.pt").unlink(missing_ok=True)
    t0 = time.monotonic()
    torch.save(state, mount / "model.pt")
    return time.monotonic() - t0


#: A prediction and the save it predicts are measured back to back: a CPU-bound
#: neighbour (the FUSE server is a Python process on the same cores) can slow one
#: and not the other. Such a pair is measured again, at most this many times; a
#: prediction that is wrong is wrong every time.
PAIRS = 3


def test_prediction_within_20_percent_of_a_real_torch_save(throttlefs, capsys) -> None:
    """On slow storage (the throttled FUSE mount), the predicted save time of a
    full checkpoint is within 20% of what torch.save of that size really takes."""
    m = throttlefs(write_rate=RATE)
    nbytes = 4 * RATE  # about 4 s at the limit
    pairs = []
    for _ in range(PAIRS):
        v, real = _predicted_and_real(m.mount, nbytes, "--timeout", "2", "--probe-seconds", "3",
                                      capsys=capsys)
        assert (m.backing / "model.pt").stat().st_size >= nbytes
        pairs.append((v["save_seconds"], round(real, 2)))
        print(f"predicted {v['save_seconds']:.2f}s, torch.save {real:.2f}s, "
              f"probe {v['probe_bytes']} B in {v['probe_seconds']}s")
        if abs(v["save_seconds"] - real) <= 0.2 * real:
            break
    else:
        raise AssertionError(f"(predicted, real) seconds, every pair off by more than 20%: "
                             f"{pairs}")


def test_a_slow_fsync_is_its_own_bounded_phase_and_the_rate_is_torch_saves(throttlefs,
                                                                           capsys) -> None:
    """Page cache in front of slow storage (the throttled FUSE mount with a sync
    rate): writes go at RATE, an fsync waits for the storage at a quarter of it.
    The old probe fsync'd inside its rate with no bound: it took the whole
    backlog's time and predicted a save four times too slow. Now the fsync is
    its own phase, cut at its bound and reported, and the rate is torch.save's."""
    m = throttlefs(write_rate=RATE, sync_rate=RATE / 4)
    nbytes = 4 * RATE
    t0 = time.monotonic()
    code = preflight.main(_args("--dir", str(m.mount), "--size", str(nbytes), "--timeout", "2",
                                "--probe-seconds", "2", "--json"), env={})
    took = time.monotonic() - t0
    v = json.loads(capsys.readouterr().out)
    assert code == 1
    # ~16 MB written in 2 s owe ~8 s of sync: the phase stopped at its bound, said so.
    assert not v["fsync_finished"] and v["fsync_seconds"] >= 2.0
    assert v["synced_bytes_per_second"] < v["write_bytes_per_second"] / 1.5
    print(f"preflight took {took:.1f}s: writes {v['probe_seconds']}s, fsync waited "
          f"{v['fsync_seconds']}s (not done)")
    # Unbounded, the fsync alone would wait ~8 s: the phase was cut at its bound (the
    # probe's 2 s), and the whole run stayed far from that (a wide margin for load).
    assert v["fsync_seconds"] < 4.0, v
    assert took < 30.0, took
    text = preflight.render(preflight.Verdict(**{k: v[k] for k in v if k != "exit_code"}))
    assert "fsync: not done after" in text and "no fsync" in text, text
    pairs = []
    for i in range(PAIRS):
        if i:
            v = _verdict(m.mount, nbytes, "--timeout", "2", "--probe-seconds", "2",
                         capsys=capsys)
        # The probe's fsync, cut at its bound, goes on in its child until the
        # mount's backlog is down (~6 s more). A save the prediction is for comes
        # later than that; one run inside it, on a loaded machine, took 40% longer
        # than predicted, three pairs in a row (CI). Measure the save after it.
        time.sleep(min(12.0, max(0.0, v["probe_bytes"] / (RATE / 4) - v["fsync_seconds"])))
        real = _real_save(m.mount, nbytes)
        pairs.append((v["save_seconds"], round(real, 2)))
        print(f"predicted {v['save_seconds']:.2f}s, torch.save {real:.2f}s")
        if abs(v["save_seconds"] - real) <= 0.2 * real:
            break
    else:
        raise AssertionError(f"(predicted, real) seconds, every pair off by more than 20%: "
                             f"{pairs}")
