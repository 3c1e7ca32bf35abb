"""The daemon's page at / renders a stall an operator can act on, safely escaped."""

from __future__ import annotations

from ncclwatch.daemon import api, page
from ncclwatch.model import RankState as S
from tests.test_forecast import MB, _drive, _rank0


def test_page_shows_culprit_budget_forecast_groups_and_fix() -> None:
    d, now = _drive(lambda i: _rank0(S.SAVING, i, file_size=(i + 1) * MB, prev=200 * MB,
                                     seconds=i), 12)
    html = page.render(api.jobs_view(d, now=now))
    assert "<p class='culprit' data-rank='0'>culprit: <b>rank 0</b>" in html
    assert "checkpoint_gather" in html and "AT RISK" in html
    assert "<meter" in html and "of 90s left" in html
    assert "past the watchdog" in html          # 200 MiB at 1 MiB/s cannot fit in 90 s
    assert "1 rank(s) 0: saving" in html        # the outlier group first ...
    assert html.index("1 rank(s) 0:") < html.index("3 rank(s) 1-3: collective / barrier")
    assert "<b>Fix:</b>" in html and "docs/runbooks/checkpoint_gather.md" in html


def test_page_escapes_what_jobs_report() -> None:
    d, now = _drive(lambda i: _rank0(S.SAVING, i, file_size=(i + 1) * MB, seconds=i), 8)
    view = api.jobs_view(d, now=now)
    view["jobs"][0]["job"] = "<script>alert(1)</script>"
    html = page.render(view)
    assert "<script>" not in html and "&lt;script&gt;" in html


def test_page_without_jobs_says_so() -> None:
    html = page.render({"jobs": [], "agents": []})
    assert "No training jobs seen yet" in html
