"""The page's dump form in headless Chromium: a click POSTs the page's token
from the page's own origin and the daemon asks the job's ranks; the same form
on another site's page (another origin, the token even copied in) asks nothing.

The daemon's real HTTP server serves the stalled job of test_bundle.py; the
commands queued for its agent count the fresh asks (three per ask).
"""

from __future__ import annotations

import asyncio
import functools
import re
import threading
import time
import urllib.request
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ncclwatch.daemon.http import HttpServer
from tests.harness.browser import DevToolsBrowser, devtools_session
from tests.harness.bundles import stalled_daemon

pytestmark = pytest.mark.e2e


def _asks(d) -> int:
    return len(d.table.agents["agent-a"].commands)


def _until(pred, seconds: float = 20.0) -> bool:
    deadline = time.monotonic() + seconds
    while not pred() and time.monotonic() < deadline:
        time.sleep(0.1)
    return pred()


def test_the_pages_dump_form_asks_and_another_sites_copy_does_not(tmp_path) -> None:
    d, _ = stalled_daemon()
    srv = HttpServer(d, "127.0.0.1", 0, lambda fn: fn())
    srv.start()
    daemon = f"http://127.0.0.1:{srv.port}"
    with urllib.request.urlopen(daemon + "/", timeout=10) as r:
        token = re.search(r"name='token' value='([^']+)'", r.read().decode()).group(1)
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text(
        f"<form method='post' action='{daemon}/api/v1/dump?job=job-1&wait=0.2'>"
        f"<input type='hidden' name='token' value='{token}'><button>go</button></form>")
    other = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(
        SimpleHTTPRequestHandler, directory=str(site)))
    threading.Thread(target=other.serve_forever, daemon=True).start()
    browser = DevToolsBrowser(tmp_path)

    async def load(call, js, url):
        await call("Page.navigate", url=url)
        for _ in range(100):
            if await js("document.readyState") == "complete" and \
                    await js("document.querySelector('form') !== null"):
                return
            await asyncio.sleep(0.1)

    async def steps(call, js):
        await call("Page.enable")
        await call("Browser.setDownloadBehavior", behavior="allow",
                   downloadPath=str(tmp_path / "downloads"))
        await load(call, js, f"http://127.0.0.1:{other.server_address[1]}/")
        await js("document.querySelector('form button').click()")
        crossed = await asyncio.to_thread(_until, lambda: srv.dump_guard.counts()[
            "refused_origin"] == 1)
        await load(call, js, daemon + "/")
        await js("document.querySelector('form.dump button').click()")
        served = await asyncio.to_thread(_until, lambda: _asks(d) == 3)
        return crossed, served

    try:
        crossed, served = asyncio.run(devtools_session(browser.ws_url, steps))
        counts = srv.dump_guard.counts()
    finally:
        browser.close()
        other.shutdown()
        srv.stop()
    assert crossed and served, counts
    assert counts == {"served": 1, "refused_origin": 1, "refused_token": 0, "busy": 0,
                      "rate_limited": 0}
    assert _asks(d) == 3
