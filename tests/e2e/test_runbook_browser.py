"""A runbook link from an alert, opened in headless Chromium: the page is HTML and
the browser lands on the section the link names (``#what-to-do-now``).

The daemon's real HTTP server serves the page; the test reads the scroll
position and where the section's heading is laid out over the DevTools
protocol (the page-fold test's browser), and that no script runs on it.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from ncclwatch.daemon.core import Daemon
from ncclwatch.daemon.http import HttpServer
from tests.harness.browser import DevToolsBrowser, devtools_session

pytestmark = pytest.mark.e2e

_WHERE = """JSON.stringify({y: window.scrollY, top: (document.getElementById(%s) || {
  getBoundingClientRect: () => ({top: null})}).getBoundingClientRect().top,
  text: (document.getElementById(%s) || {}).innerText || null,
  pre: document.querySelectorAll('pre').length})"""


@pytest.mark.parametrize("name,anchor,heading", [
    ("checkpoint_gather.md", "what-to-do-now", "What to do now"),
    ("ncclwatch_health.md", "daemon-down", "Daemon down"),
    ("collective_hang", "what-to-do-now", "What to do now"),
])
def test_a_runbook_link_lands_on_its_section(tmp_path, name, anchor, heading) -> None:
    srv = HttpServer(Daemon(), "127.0.0.1", 0, lambda fn: fn())
    srv.start()
    browser = DevToolsBrowser(tmp_path)
    url = f"http://127.0.0.1:{srv.port}/runbooks/{name}#{anchor}"

    async def steps(call, js):
        await call("Page.enable")
        await call("Page.navigate", url=url)
        for _ in range(100):
            if await js("document.readyState") == "complete":
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.3)  # the fragment scroll after layout
        return (json.loads(await js(_WHERE % (json.dumps(anchor), json.dumps(anchor)))),
                await js("document.contentType"))

    try:
        t0 = time.monotonic()
        where, ctype = asyncio.run(devtools_session(browser.ws_url, steps))
    finally:
        browser.close()
        srv.stop()
    print(where, f"{time.monotonic() - t0:.1f}s")
    assert ctype == "text/html"
    assert where["text"] and where["text"].startswith(heading), where
    assert where["y"] > 0, where                       # scrolled down to the section
    assert where["top"] is not None and abs(where["top"]) < 5, where   # its heading on top
