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
import subprocess
import time
import urllib.request

import pytest

from ncclwatch.daemon.core import Daemon, DaemonConfig
from ncclwatch.daemon.http import HttpServer
from ncclwatch.model import CollectiveOp as Op, RankState as S
from ncclwatch.stacks import Frame, stack_id
from tests.conftest import ARTIFACTS, free_port, need_system
from tests.e2e.test_page_browser import FLAGS
from tests.factories import C10D, report, sample, stack_pb
from tests.test_forecast import MB, _rank0

pytestmark = pytest.mark.e2e

WIDTH, HEIGHT = 1400, 1000
PER_NODE = 512
LIGHTNING = "/venv/lib/python3.11/site-packages/lightning/pytorch/trainer/trainer.py"
SAVE = [Frame("write", "/job/storage.py", 10),
        Frame("save", "/venv/lib/python3.11/site-packages/torch/serialization.py", 20),
        Frame("save_checkpoint", LIGHTNING, 30), Frame("fit", LIGHTNING, 40),
        Frame("main", "/job/train.py", 50)]
WAIT = [Frame("barrier", C10D, 1), Frame("training_step", LIGHTNING, 2),
        Frame("main", "/job/train.py", 3)]
#: What must be on the first screen (CSS selectors of the page).
ABOVE_THE_FOLD = {"verdict": ".stall .verdict", "advice": ".stall .now",
                  "time left": ".stall .now .left", "budget": ".stall .remaining",
                  "forecast": ".stall .forecast", "culprit": ".stall p.culprit",
                  "why": ".stall .why", "fix": ".stall .fix pre"}


def _feed(d: Daemon, world: int, start: float, seconds: int, first: int = 0) -> None:
    for i in range(first, first + seconds):
        now = start + i
        r0 = _rank0(S.SAVING, i, file_size=(i + 1) * MB, prev=400 * MB, seconds=i)
        r0.identity.world_size = world
        r0.stack_id = stack_id(SAVE)
        samples = [r0] + [sample("job-1", r, world, S.COLLECTIVE, Op.BARRIER, seconds=i,
                                 stack=stack_id(WAIT), timeout=90.0) for r in range(1, world)]
        for n in range(0, world, PER_NODE):  # one report per node, as agents send them
            d.ingest(report(samples[n:n + PER_NODE], node=f"node-{n // PER_NODE}",
                            agent=f"agent-{n // PER_NODE}", seq=i + 1,
                            stacks=[stack_pb(SAVE), stack_pb(WAIT)]), now=now)
        d.tick(now=now, wall=time.time() - (time.monotonic() - now))


class Browser:
    """Headless Chromium driven over the DevTools protocol (aiohttp's websocket)."""

    def __init__(self, tmp_path) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [need_system("chromium", "chromium"), *FLAGS, f"--remote-debugging-port={self.port}",
             f"--user-data-dir={tmp_path / 'profile'}", f"--window-size={WIDTH},{HEIGHT}",
             "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.time() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/json/list") as r:
                    pages = [t for t in json.loads(r.read()) if t["type"] == "page"]
                if pages:
                    self.ws_url = pages[0]["webSocketDebuggerUrl"]
                    break
            except OSError:
                pass
            if time.time() > deadline or self.proc.poll() is not None:
                raise RuntimeError("chromium did not start: " + self.proc.stderr.read().decode())
            time.sleep(0.2)

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


async def _session(ws_url: str, steps):
    import aiohttp

    async with aiohttp.ClientSession() as http, http.ws_connect(ws_url, max_msg_size=0) as ws:
        ids = iter(range(1, 1 << 30))

        async def call(method: str, **params):
            n = next(ids)
            await ws.send_json({"id": n, "method": method, "params": params})
            while True:
                msg = await asyncio.wait_for(ws.receive_json(), 30)
                if msg.get("id") == n:
                    if "error" in msg:
                        raise RuntimeError(f"{method}: {msg['error']}")
                    return msg["result"]

        async def js(expr: str):
            r = await call("Runtime.evaluate", expression=expr, returnByValue=True,
                           awaitPromise=True)
            return r["result"].get("value")

        await call("Emulation.setDeviceMetricsOverride", width=WIDTH, height=HEIGHT,
                   deviceScaleFactor=1, mobile=False)
        return await steps(call, js)


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
    _feed(d, world, start, 12)
    srv = HttpServer(d, "127.0.0.1", 0, lambda fn: fn())
    srv.start()
    browser = Browser(tmp_path)
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
        _feed(d, world, start, 4, first=12)          # the daemon moves on: 4 s later
        await asyncio.sleep(4.5)                     # two refreshes of the page
        after = await js("document.querySelector('.stall .remaining').innerText")
        marker = await js("window.__notReloaded")
        return rects, png, before, after, marker

    try:
        rects, png, before, after, marker = asyncio.run(_session(browser.ws_url, steps))
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
