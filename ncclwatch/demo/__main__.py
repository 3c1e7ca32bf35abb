"""``make demo``: ncclwatch catches a checkpoint stall before the watchdog.

Starts ``ncclwatch run`` (daemon + agent, loopback), then a real 4-rank
torchrun job (gloo on CPU) whose rank 0 writes its checkpoint to slow
storage for longer than the process-group timeout, while ranks 1-3 wait in
barrier. You see ncclwatch name rank 0 and count the budget down, then the
watchdog (gloo's timeout) kill the job and blame the waiting ranks.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from ncclwatch import status

BIN = Path(sys.executable).parent


def _port(preferred: int) -> int:
    for port in (preferred, 0):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise OSError("no free port")


def _get(url: str):
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.load(r)


def _say(msg: str = "") -> None:
    print(msg, flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--pg-timeout", type=float, default=60.0, help="the job's watchdog timeout")
    p.add_argument("--save-seconds", type=float, default=90.0,
                   help="how long rank 0's torch.save takes (longer than --pg-timeout)")
    p.add_argument("--model-mb", type=float, default=32.0)
    args = p.parse_args(argv)

    grpc_port, http_port = _port(7470), _port(7471)
    base = f"http://127.0.0.1:{http_port}"
    monitor = subprocess.Popen(
        [str(BIN / "ncclwatch"), "run", "--grpc", f"127.0.0.1:{grpc_port}",
         "--http", f"127.0.0.1:{http_port}", "--log-level", "warning"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    job = None
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(base + "/healthz", timeout=1)
                break
            except OSError:
                time.sleep(0.2)
        _say(f"== ncclwatch run is up: {base}/ (page), {base}/metrics; "
             f"`.venv/bin/ncclwatch status --daemon {base}`")
        _say(f"== starting a {args.ranks}-rank torch job (gloo, process-group timeout "
             f"{args.pg_timeout:.0f}s); rank 0 will save a checkpoint to slow storage "
             f"for ~{args.save_seconds:.0f}s")
        fr_dir = tempfile.mkdtemp(prefix="ncclwatch-demo-fr-")
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
               "NCCLWATCH_WATCHDOG_TIMEOUT_SECONDS": str(args.pg_timeout),
               # The job's own Flight Recorder, and the pipe ncclwatch asks it through
               # during the stall (gloo has none: ncclwatch/demo/debug_pipe.py).
               "TORCH_FR_BUFFER_SIZE": "2000",
               "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": os.path.join(fr_dir, "pipe_"),
               "TORCH_FR_DUMP_TEMP_FILE": os.path.join(fr_dir, "fr_rank_")}
        job = subprocess.Popen(
            [str(BIN / "torchrun"), "--standalone", f"--nproc-per-node={args.ranks}",
             "--max-restarts=0", "-m", "ncclwatch.demo.job", "--scenario", "slow-save",
             "--model-mb", str(args.model_mb), "--save-seconds", str(args.save_seconds),
             "--pg-timeout", str(args.pg_timeout)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
            start_new_session=True)
        lines: list[str] = []
        threading.Thread(target=_pump, args=(job, lines), daemon=True).start()
        return _watch(base, job, lines, args)
    finally:
        for proc in (job, monitor):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)


def _pump(job: subprocess.Popen, lines: list[str]) -> None:
    for line in job.stdout:
        line = line.rstrip()
        lines.append(line)
        if line.startswith("[rank") or "Timed out" in line or "ChildFailedError" in line:
            _say(f"   job | {line[:160]}")


def _watch(base: str, job: subprocess.Popen, lines: list[str], args) -> int:
    alerted = None
    last_print = 0.0
    while job.poll() is None:
        time.sleep(0.5)
        view = _get(base + "/api/v1/jobs")
        stalls = [(j, s) for j in view["jobs"] for s in j["stalls"]]
        if stalls and alerted is None:
            alerted = time.time()
            _say()
            _say("=" * 78)
            # Measured from the job's own log line (torch.save's start, as rank 0
            # printed it), not from ncclwatch's estimate of that moment: its
            # ``culprit_began`` anchor is the earliest the evidence allows, which
            # may be the rank's previous stack, seconds before.
            anchors = {a["id"]: a for a in (stalls[0][1].get("clock") or {}).get("anchors", [])}
            began = _save_start(lines)
            delay = (f"opened {anchors['opened']['at'] - began:.0f}s after rank 0's torch.save "
                     "began (the job's own save_start line)"
                     if began is not None and "opened" in anchors else "")
            _say(f"!! ncclwatch ALERT {delay}")
            _say(status.render({"jobs": [stalls[0][0]], "agents": view["agents"]}, base))
            _say("=" * 78)
            last_print = time.time()
        elif stalls and time.time() - last_print >= 5:
            j, s = stalls[0]
            _say(f"== ncclwatch: {s['kind']}: rank {s['culprits'][0]['rank']} still "
                 f"{s['culprits'][0]['state']}; watchdog budget {s['watchdog']['remaining_seconds']:.0f}s "
                 f"of {s['watchdog']['timeout_seconds']:.0f}s left")
            last_print = time.time()
    _say()
    timed_out = [line for line in lines if "Timed out" in line]
    if alerted and timed_out:
        _say(f"== the watchdog fired {time.time() - alerted:.0f}s after ncclwatch's alert; "
             "the waiting ranks' logs blame a recv timeout, ncclwatch named the real culprit "
             "(rank 0, saving).")
    elif alerted:
        _say(f"== the job ended (exit {job.returncode}); ncclwatch had named rank 0 while it saved.")
    else:
        _say("== no alert was raised: see `ncclwatch status` and the job output above.")
        return 1
    _say("== fix: save sharded (torch.distributed.checkpoint) or raise the timeout around saves.")
    _post_mortem(lines)
    return 0


def _save_start(lines: list[str]) -> float | None:
    """When the saver's torch.save began, by the job's own clock line."""
    for line in lines:
        if line.startswith("NCCLWATCH_DEMO phase=save_start "):
            for word in line.split():
                if word.startswith("t="):
                    return float(word[2:])
    return None


def _post_mortem(lines: list[str]) -> None:
    """`ncclwatch diagnose` on the job's console log: the after-the-fact view."""
    with tempfile.NamedTemporaryFile("w", prefix="ncclwatch-demo-", suffix=".log",
                                     delete=False) as f:
        f.write("\n".join(lines) + "\n")
    out = subprocess.run([str(BIN / "ncclwatch"), "diagnose", f.name], capture_output=True,
                         text=True, timeout=60)
    head = out.stdout.split("\nEvidence:")[0].rstrip()
    _say()
    _say(f"== after the fact: `ncclwatch diagnose {f.name}` says:")
    for line in head.splitlines():
        _say("   " + line)


if __name__ == "__main__":
    sys.exit(main())
