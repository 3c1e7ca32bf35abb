"""Capture real ``py-spy dump --native`` dumps of gloo ranks waiting NCCL-style.

    flock /tmp/ncclwatch-e2e.lock .venv/bin/python tests/data/pyspy/capture_native.py [NAME ...]

For each capture: start ncclwatch.demo.job's slow-save under torchrun with
every rank spinning a busy thread, wait until rank 0 saves and rank 1 waits
in ``--wait-op`` (an async all_reduce's ``work.wait()``, its future, DDP's
next backward), then take one native dump (py-spy pauses the rank for it:
``--native`` does not work with ``--nonblocking``) of rank 1 and store it as
``native-<name>__rank1.json``, with the pause in ``native-manifest.json``.
tests/unit/test_native_signatures.py classifies them.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
VENV_BIN = Path(sys.executable).parent

CAPTURES = {
    "async-wait": ["--wait-op", "async-wait"],
    "future-wait": ["--wait-op", "future-wait"],
    "ddp-backward": ["--wait-op", "ddp-backward"],
    "barrier": ["--wait-op", "barrier"],
    "fsdp2-forward": ["--wait-op", "fsdp2-forward", "--scenario", "fsdp2-save"],
}
MARK = re.compile(r"NCCLWATCH_DEMO phase=(\S+) rank=(\d+) pid=(\d+)")


def capture(name: str, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as ckpt:
        argv = [str(VENV_BIN / "torchrun"), "--standalone", "--nproc-per-node=2",
                "--max-restarts=0", "-m", "ncclwatch.demo.job", "--scenario", "slow-save",
                "--model-mb", "8", "--save-seconds", "20", "--busy-thread", "0.6",
                "--ckpt-dir", ckpt, *extra]
        env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1",
                   PYTHONUNBUFFERED="1")
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, env=env, start_new_session=True)
        seen: dict[tuple[str, int], int] = {}
        try:
            deadline = time.time() + 120
            while (("save_start", 0) not in seen or ("wait_start", 1) not in seen) \
                    and time.time() < deadline:
                line = p.stdout.readline()
                if not line:
                    raise RuntimeError("job ended before the wait")
                m = MARK.search(line)
                if m:
                    seen[(m.group(1), int(m.group(2)))] = int(m.group(3))
            time.sleep(3.0)  # into the wait
            pid = seen[("wait_start", 1)]
            t0 = time.monotonic()
            r = subprocess.run([str(VENV_BIN / "py-spy"), "dump", "--native", "--json",
                                "--pid", str(pid)], capture_output=True, text=True,
                               timeout=30)
            pause = time.monotonic() - t0
            if r.returncode != 0:
                raise RuntimeError(f"py-spy: {r.stderr[-500:]}")
            (HERE / f"native-{name}__rank1.json").write_text(r.stdout)
            threads = len(json.loads(r.stdout))
            return {"pause_seconds": round(pause, 4), "threads_dumped": threads,
                    "num_threads": len(os.listdir(f"/proc/{pid}/task"))}
        finally:
            os.killpg(p.pid, signal.SIGTERM)
            p.wait(30)


def main(names: list[str]) -> int:
    path = HERE / "native-manifest.json"
    manifest = json.loads(path.read_text()) if path.exists() else {}
    for name in names or list(CAPTURES):
        manifest[name] = capture(name, CAPTURES[name])
        print(name, manifest[name], flush=True)
    path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
