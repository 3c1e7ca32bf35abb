"""The daemon's page at / renders a stall an operator can act on, safely escaped."""

from __future__ import annotations

import pytest

from ncclwatch.daemon import api, page
from ncclwatch.daemon.core import Daemon, DaemonConfig
from ncclwatch.model import RankState as S
from tests.harness.reports import MB, drive_job, rank0_sample


def test_page_shows_culprit_budget_forecast_groups_and_fix() -> None:
    d, now = drive_job(lambda i: rank0_sample(S.SAVING, i, file_size=(i + 1) * MB, prev=200 * MB,
                                     seconds=i), 12)
    html = page.render(api.jobs_view(d, now=now))
    assert "<p class='culprit' data-rank='0'>culprit: <b>rank 0</b>" in html
    assert "checkpoint_gather" in html and "AT RISK" in html
    assert "<meter" in html and "of 90s left" in html
    assert "past the watchdog" in html          # 200 MiB at 1 MiB/s cannot fit in 90 s
    assert "1 rank(s) 0: saving" in html        # the outlier group first ...
    assert html.index("1 rank(s) 0:") < html.index("3 rank(s) 1-3: collective / barrier")
    assert "<b>Fix in PyTorch</b>" in html and "dcp.save(" in html
    assert "href='/runbooks/checkpoint_gather.md#save_overruns_watchdog'>runbook</a>" in html


def test_page_escapes_what_jobs_report() -> None:
    d, now = drive_job(lambda i: rank0_sample(S.SAVING, i, file_size=(i + 1) * MB, seconds=i), 8)
    view = api.jobs_view(d, now=now)
    view["jobs"][0]["job"] = "<script>alert(1)</script>"
    html = page.render(view)
    assert "<script>" not in html and "&lt;script&gt;" in html


def test_page_without_jobs_says_so() -> None:
    html = page.render({"jobs": [], "agents": []})
    assert "No training jobs seen yet" in html


def test_page_puts_advice_before_the_fix_and_stacks_once_folded() -> None:
    from tests.harness.reports import feed_lightning_save

    d = Daemon(DaemonConfig(stall_threshold=5.0))
    feed_lightning_save(d, 4, 1000.0, 12)
    html = page.render(api.jobs_view(d, now=1011.0))
    order = [html.index(x) for x in ("class='verdict'", "class='now act-stop_cleanly'",
                                     "class='remaining'", "class='forecast'", "class='culprit'",
                                     "class='why'", "<b>Fix in Lightning</b>")]
    assert order == sorted(order)
    assert "<meta http-equiv='refresh'" not in html.replace("<noscript><meta http-equiv='refresh'", "")
    assert html.count("save_checkpoint (") == 1          # the culprit's stack, once
    assert "(the culprit's stack, above)" in html
    assert "<details data-key='job-1|checkpoint_gather|stack|0'>" in html  # folded
    assert "href='/runbooks/checkpoint_gather.md#what-to-do-now'" in html


@pytest.mark.budget(300)   # a 16k-rank job driven in process: 75-97 s in fresh-clone runs
def test_page_at_16k_ranks_stays_small() -> None:
    import time

    from tests.harness.reports import feed_lightning_save

    d = Daemon(DaemonConfig(stall_threshold=5.0))
    feed_lightning_save(d, 16384, 1000.0, 8)
    t0 = time.perf_counter()
    html = page.render(api.jobs_view(d, now=1007.0, ranks=False))
    print(f"16k-rank page: {len(html)} bytes in {time.perf_counter() - t0:.3f}s")
    assert len(html) < 200_000
    assert "ranks by state (16384)" in html and "16383 rank(s) 1-16383: collective / barrier" in html
