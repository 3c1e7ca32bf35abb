"""End to end: ``ncclwatch dump`` of a real stalled gloo job, read back by ``diagnose``.

Rank 0 of a 3-rank job sits in a slow torch.save while ranks 1-2 wait in
barrier, watched by ``ncclwatch daemon`` and ``ncclwatch agent``. Once the
daemon names the stall, ``ncclwatch dump`` must bring one archive with every
rank's stacks, the verdict and the Flight Recorder, and ``ncclwatch diagnose``
must give that archive the daemon's verdict: same class, same culprit. A GET
of the same URL asks nothing fresh, and another site's POST is refused.
"""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
import time
import urllib.error
import urllib.request
from urllib.parse import quote

import pytest

from tests.harness.monitor import job_id_of
from tests.harness.tools import need

pytestmark = pytest.mark.e2e

PG_TIMEOUT = 90


def test_dump_of_a_stalled_job_reads_back_with_the_daemon_verdict(
        ncclwatch_split, torch_job, tmp_path) -> None:
    mon = ncclwatch_split()
    job = torch_job("slow-save", 3, {
        "NCCLWATCH_WATCHDOG_TIMEOUT_SECONDS": str(PG_TIMEOUT), "TORCH_FR_BUFFER_SIZE": "2000",
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": str(tmp_path / "pipe_"),
        "TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "fr_rank_")},
        "--model-mb", "8", "--save-seconds", "60", "--pg-timeout", str(PG_TIMEOUT))
    job.wait_marker("ready", timeout=120, count=3)
    job_id = job_id_of(mon, job.pids())
    job.wait_marker("save_start", timeout=120)
    deadline, stall = time.time() + 30, None
    while time.time() < deadline and stall is None:
        stalls = mon.job_of(job.pids())["stalls"]
        stall = stalls[0] if stalls else None
        time.sleep(0.5)
    assert stall is not None, mon.output()[-3000:]

    # A GET (a link, another site's page) serves what the daemon holds and
    # asks no rank anything; another site's POST is refused.
    url = f"{mon.http}/api/v1/dump?job={quote(job_id, safe='')}&wait=15"
    with urllib.request.urlopen(url, timeout=30) as resp:
        held = resp.read()
    with tarfile.open(fileobj=io.BytesIO(held)) as tar:
        head = json.load(tar.extractfile(next(m for m in tar.getmembers()
                                              if m.name.endswith("/bundle.json"))))
    assert head["fresh"] == {"asked": False}, head
    cross = urllib.request.Request(url, data=b"", method="POST", headers={
        "Origin": "http://evil.example", "X-Ncclwatch-Request": "dump"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(cross, timeout=30)
    assert refused.value.code == 403

    out = tmp_path / "bundles"
    out.mkdir()
    r = subprocess.run([need("ncclwatch"), "dump", job_id, "--daemon", mon.http,
                        "--out", str(out), "--wait", "15"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    [archive] = list(out.iterdir())
    with tarfile.open(archive) as tar:
        files = {m.name.partition("/")[2]: tar.extractfile(m).read()
                 for m in tar.getmembers() if m.isfile()}
    for rank in range(3):
        text = files[f"stacks/rank-{rank}.txt"].decode()
        assert "python stack, thread" in text, text      # a real py-spy stack per rank
    assert any("save" in line for line in files["stacks/rank-0.txt"].decode().splitlines()[3:])
    head = json.loads(files["bundle.json"])
    assert head["fresh"]["asked"] and head["fresh"]["agents"] == 1, head
    assert head["fresh"]["ranks_without_fresh_flight_recorder"] == [], head
    fr = json.loads(files["flight_recorder.json"])
    assert sorted(fr["ranks"]) == ["0", "1", "2"], fr     # taken after the ask
    assert fr["analysis"]["missing_ranks"] == [0], fr["analysis"]
    assert json.loads(files["env.json"]).get("TORCH_FR_BUFFER_SIZE") == "2000"
    live = json.loads(files["verdict.json"])["stalls"][0]
    assert live["kind"] == stall["kind"] == "checkpoint_gather"
    assert job.proc.alive(), "a dump must not stop the job"
    with urllib.request.urlopen(mon.http + "/metrics", timeout=10) as resp:
        metrics = resp.read().decode()
    for outcome, n in (("served", 1), ("refused_origin", 1), ("busy", 0)):
        assert f'ncclwatch_daemon_dump_requests_total{{outcome="{outcome}"}} {n:.1f}' \
            in metrics, outcome

    dx = subprocess.run([need("ncclwatch"), "diagnose", "--json", str(archive)],
                        capture_output=True, text=True, timeout=60)
    assert dx.returncode == 1, dx.stderr                 # a failure found
    v = json.loads(dx.stdout)
    assert v["class"] == "checkpoint_gather_timeout", v
    assert v["initiating_ranks"] == [c["rank"] for c in stall["culprits"]] == [0], v
