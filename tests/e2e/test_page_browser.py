"""The daemon's page in a real browser during a real stall (headless Chromium).

When Grafana cannot show stacks, an operator opens http://daemon:7471/. The
page must show the culprit, its host, the budget and the grouped stacks of a
live stall. A screenshot is kept under artifacts/ for the humans.
"""

from __future__ import annotations

import time

import pytest

from tests.harness.browser import run_chromium
from tests.harness.monitor import job_id_of
from tests.harness.paths import ARTIFACTS

pytestmark = pytest.mark.e2e

PG_TIMEOUT = 90


def test_page_in_chromium_names_the_culprit_during_a_stall(ncclwatch_run, torch_job,
                                                           tmp_path) -> None:
    mon = ncclwatch_run()
    job = torch_job("slow-save", 3, {"NCCLWATCH_PG_TIMEOUT_S": str(PG_TIMEOUT)},
                    "--model-mb", "8", "--saver", "1", "--save-seconds", "120",
                    "--pg-timeout", str(PG_TIMEOUT))
    job.wait_marker("ready", timeout=120, count=3)
    pids = job.pids()
    job_id_of(mon, pids)
    job.wait_marker("save_start", timeout=120)
    deadline, view = time.time() + 40, None
    while time.time() < deadline:
        view = mon.job_of(pids)
        stalls = (view or {}).get("stalls", [])
        if stalls and stalls[0]["culprits"] and stalls[0]["waiting"]["ranks"] == [0, 2]:
            break
        time.sleep(0.5)
    else:
        pytest.fail(f"no checkpoint stall seen: {view}")
    host = view["stalls"][0]["culprits"][0]["host"]

    dom = run_chromium(tmp_path, "--dump-dom", mon.http + "/")
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    assert "<p class=\"culprit\" data-rank=\"1\">culprit: <b>rank 1</b> on <b>" + host in html, \
        html[:3000]
    assert "checkpoint_gather" in html and "STALLED" in html
    assert "2 rank(s) 0,2" in html                # the waiters, grouped by stack
    assert "torch/serialization.py" in html or "serialization.py" in html  # culprit's stack
    assert "<meter" in html and "left" in html

    shot = ARTIFACTS / "daemon-page.png"
    ARTIFACTS.mkdir(exist_ok=True)
    shot.unlink(missing_ok=True)
    out = run_chromium(tmp_path, f"--screenshot={shot}", "--window-size=1280,1600", mon.http + "/")
    assert out.returncode == 0, out.stderr[-2000:]
    assert shot.exists() and shot.stat().st_size > 10_000, "screenshot missing or blank"
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
