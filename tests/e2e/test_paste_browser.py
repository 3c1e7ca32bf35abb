"""The paste-your-log page in a real browser (headless Chromium over DevTools).

A user opens http://daemon:7471/diagnose, pastes a log or drops the file, and
reads the verdict on the screen: the same class and ranks ``ncclwatch
diagnose`` gives on the command line. An oversized log is refused with a
message on the screen. Screenshots are kept under artifacts/ for the humans.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ncclwatch.diagnose import diagnose
from tests.harness import paths
from tests.harness.browser import Browser
from tests.harness.paths import ARTIFACTS

pytestmark = pytest.mark.e2e

DATA = paths.DATA / "diagnose"
#: Small, so that an oversized log is cheap to make; the corpus logs fit under it.
LIMIT = 65536


@pytest.fixture
def browser(tmp_path):
    b = Browser(tmp_path / "profile")
    yield b
    b.close()


def _screen(b: Browser) -> dict:
    """What the verdict section shows, read from the rendered DOM."""
    return b.js("""(() => { const t = (id) => document.getElementById(id).textContent;
        const li = (id) => [...document.querySelectorAll('#' + id + ' li')].map(e => e.textContent);
        return {visible: !document.getElementById('verdict').hidden,
                cls: document.getElementById('cls').dataset.cls, title: t('cls'),
                initiating: t('initiating'), among: t('among'), collateral: t('collateral'),
                evidence: li('evidence'), collect: li('collect'), fix: t('fix'),
                error: t('error'), state: t('state'),
                text: document.body.innerText}; })()""")


def _wait_verdict(b: Browser) -> dict:
    b.wait_for("!document.getElementById('verdict').hidden || "
               "document.getElementById('error').textContent !== ''", timeout=60)
    return _screen(b)


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks)) if ranks else "-"


def _expect_cli(screen: dict, path: Path) -> None:
    """The screen says what the CLI says about the same file."""
    d = diagnose([path])
    assert screen["visible"] and not screen["error"], screen
    assert screen["cls"] == d.cls, (screen, d.cls)
    assert screen["initiating"] == _ranks(d.initiating), screen
    assert screen["collateral"] == _ranks(d.collateral), screen
    assert len(screen["evidence"]) == len(d.evidence) > 0, screen
    assert d.root_cause is not None and d.root_cause.fix in screen["fix"]


def test_paste_drop_and_oversize_in_chromium(ncclwatch_run, browser, tmp_path) -> None:
    mon = ncclwatch_run("--diagnose-max-bytes", str(LIMIT))
    b = browser
    b.open(mon.http + "/diagnose")
    ARTIFACTS.mkdir(exist_ok=True)

    # 1. Paste: the text typed into the box as a paste inserts it, then the button.
    pasted = DATA / "cases" / "crash_exception" / "console.log"
    want = json.loads((pasted.parent / "expected.json").read_text())
    b.js("document.getElementById('log').focus()")
    b.call("Input.insertText", {"text": pasted.read_text()})
    assert b.js("document.getElementById('log').value") == pasted.read_text()
    b.js("document.getElementById('go').click()")
    screen = _wait_verdict(b)
    _expect_cli(screen, pasted)
    assert screen["cls"] == want["class"] == "rank_crash"
    assert screen["initiating"] == "1" and screen["collateral"] == "0, 2, 3"
    assert "ValueError" in " ".join(screen["evidence"])
    b.screenshot(ARTIFACTS / "paste-page-pasted.png")

    # 2. Drop a gzipped log file onto the page (a real drag from outside it).
    dropped = DATA / "cases" / "hang_sleep_gz" / "console.log.gz"
    b.js("document.getElementById('verdict').hidden = true")
    b.drop_files("#drop", [dropped])
    b.wait_for("document.getElementById('state').textContent.includes('console.log.gz: ')")
    screen = _wait_verdict(b)
    _expect_cli(screen, dropped)
    assert screen["cls"] == "collective_hang" and screen["initiating"] == "1", screen
    assert screen["collateral"] == "0, 2"
    b.screenshot(ARTIFACTS / "paste-page-dropped.png")

    # 3. The file picker: a public log, pasted by a user into a GitHub issue.
    picked = DATA / "public" / "accelerate_2000_saving_fsdp_model" / "console.log"
    b.js("document.getElementById('verdict').hidden = true")
    b.call("DOM.setFileInputFiles", {"files": [str(picked)], "nodeId": b.node("#file")})
    b.wait_for("document.getElementById('state').textContent.startsWith('read console.log')")
    screen = _wait_verdict(b)
    _expect_cli(screen, picked)
    assert screen["cls"] == "checkpoint_gather_timeout" and screen["initiating"] == "0"

    # 4. Log text is shown as text: markup in a log line does not run.
    b.js("document.getElementById('log').value = ''")
    b.js("document.getElementById('log').focus()")
    b.call("Input.insertText", {"text": "[rank0]: Traceback (most recent call last):\n"
                                        '[rank0]:   File "t.py", line 1, in <module>\n'
                                        "[rank0]: RuntimeError: <img src=x onerror="
                                        "\"window.pwned=1\"> CUDA out of memory\n"})
    b.js("document.getElementById('go').click()")
    b.wait_for("document.getElementById('state').textContent.startsWith('read pasted')")
    screen = _wait_verdict(b)
    assert "<img src=x" in screen["text"], screen["text"][:2000]
    assert b.js("document.querySelectorAll('#verdict img').length") == 0
    assert b.js("window.pwned === undefined")

    # 5. Oversized: refused by the daemon, the message on the screen.
    big = tmp_path / "rank0.log"
    big.write_text(pasted.read_text() * (LIMIT // len(pasted.read_text()) + 2))
    assert LIMIT < big.stat().st_size < 4 * LIMIT  # sent, and refused by the daemon
    b.js("document.getElementById('verdict').hidden = true")
    b.drop_files("#drop", [big])
    screen = _wait_verdict(b)
    assert not screen["visible"], screen
    assert "refused (413)" in screen["error"] and "larger than this daemon accepts" \
        in screen["error"] and "64 KiB" in screen["error"], screen["error"]
    b.screenshot(ARTIFACTS / "paste-page-refused.png")
    assert mon.alive(), mon.output()
