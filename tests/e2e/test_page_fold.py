"""The page in headless Chromium at 1400x1000: what to do comes first, and it updates in place.

A daemon judges a Lightning job whose rank 0 writes a checkpoint too slowly
for the watchdog (4 ranks, and 16k ranks), served by the daemon's real HTTP
server. Through the DevTools protocol the test measures where the verdict,
the time left, the forecast, the culprit, the advice and the framework's fix
are laid out: all inside the first 1000 px. Then the daemon moves on and the
page must show the new budget without reloading (a marker set in the window
survives). Screenshots are kept under artifacts/.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time

import pytest

from ncclwatch.daemon.core import Daemon, DaemonConfig
from ncclwatch.daemon.http import HttpServer
from tests.harness.browser import HEIGHT, DevToolsBrowser, devtools_session
from tests.harness.paths import ARTIFACTS
from tests.harness.reports import feed_lightning_save

pytestmark = pytest.mark.e2e

#: What must be on the first screen (CSS selectors of the page).
ABOVE_THE_FOLD = {"verdict": ".stall .verdict", "advice": ".stall .now",
                  "time left": ".stall .now .left", "budget": ".stall .remaining",
                  "forecast": ".stall .forecast", "culprit": ".stall p.culprit",
                  "why": ".stall .why", "fix": ".stall .fix pre"}


_RECTS = """JSON.stringify(Object.fromEntries(Object.entries(%s).map(([k, sel]) => {
  const el = document.querySelector(sel);
  if (!el) return [k, null];
  const r = el.getBoundingClientRect();
  return [k, {top: r.top, bottom: r.bottom, height: r.height, text: el.innerText.slice(0, 200)}];
})))"""


@pytest.mark.parametrize("world", [4, 16384])
def test_verdict_time_left_advice_and_fix_above_the_fold(tmp_path, world: int) -> None:
    d = Daemon(DaemonConfig(stall_threshold=5.0))
    start = time.monotonic() - 12
    feed_lightning_save(d, world, start, 12)
    srv = HttpServer(d, "127.0.0.1", 0, lambda fn: fn())
    srv.start()
    browser = DevToolsBrowser(tmp_path)
    url = f"http://127.0.0.1:{srv.port}/"
    shot = ARTIFACTS / f"daemon-page-fold-{world}.png"

    async def steps(call, js):
        await call("Page.enable")
        await call("Page.navigate", url=url)
        for _ in range(100):
            if await js("document.readyState") == "complete":
                break
            await asyncio.sleep(0.1)
        rects = json.loads(await js(_RECTS % json.dumps(ABOVE_THE_FOLD)))
        png = await call("Page.captureScreenshot", format="png")
        await js("window.__notReloaded = 1")
        before = await js("document.querySelector('.stall .remaining').innerText")
        feed_lightning_save(d, world, start, 4, first=12)          # the daemon moves on: 4 s later
        await asyncio.sleep(4.5)                     # two refreshes of the page
        after = await js("document.querySelector('.stall .remaining').innerText")
        marker = await js("window.__notReloaded")
        return rects, png, before, after, marker

    try:
        rects, png, before, after, marker = asyncio.run(devtools_session(browser.ws_url, steps))
    finally:
        browser.close()
        srv.stop()
    ARTIFACTS.mkdir(exist_ok=True)
    shot.write_bytes(base64.b64decode(png["data"]))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
    print({k: (v["top"], v["bottom"]) if v else None for k, v in rects.items()})
    for what, r in rects.items():
        assert r is not None, f"{what}: not on the page"
        assert r["height"] > 0 and 0 <= r["top"] and r["bottom"] <= HEIGHT, (what, r)
    assert rects["advice"]["text"].startswith("STOP THE JOB CLEANLY NOW"), rects["advice"]
    assert "left before the watchdog fires" in rects["time left"]["text"]
    assert "FSDPStrategy(state_dict_type=\"sharded\")" in rects["fix"]["text"]  # Lightning's
    assert "save_overruns_watchdog" in rects["verdict"]["text"]
    assert marker == 1, "the page reloaded instead of updating in place"
    assert before != after, (before, after)            # 4 s less budget, shown in place
