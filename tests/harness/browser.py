"""Headless Chromium for the page tests: one binary and flag set, two ways to drive it.

``Browser``: the DevTools protocol on a pipe (no extra package).
``--remote-debugging-pipe``: Chromium reads commands from its fd 3 and writes
answers and events to its fd 4, each a JSON message ended by a NUL byte.
Enough of the protocol for a page test: open a tab, run JS, set a file input,
drag a file onto the page, take a screenshot.

``DevToolsBrowser`` and ``devtools_session``: the same protocol over the
DevTools websocket (aiohttp), as an async session at a fixed window size.
``run_chromium``: one headless run (``--dump-dom``, ``--screenshot``).
"""

from __future__ import annotations

import asyncio
import base64
import fcntl
import json
import os
import select
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from tests.harness.procs import free_port
from tests.harness.tools import need_system

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars"]
#: The window of ``DevToolsBrowser`` and ``devtools_session``.
WIDTH, HEIGHT = 1400, 1000


def chromium() -> str:
    return need_system("chromium", "chromium")


def run_chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """One headless Chromium run with ``args`` in a fresh profile under ``tmp_path``."""
    profile = tmp_path / f"profile-{time.monotonic_ns()}"
    return subprocess.run([chromium(), *FLAGS, f"--user-data-dir={profile}", *args],
                          capture_output=True, text=True, timeout=90)


class CdpError(RuntimeError):
    pass


class Browser:
    def __init__(self, profile: Path) -> None:
        to_chrome_r, self._w = os.pipe()   # our commands -> Chromium's fd 3
        self._r, from_chrome_w = os.pipe()  # Chromium's fd 4 -> us
        # Above 4, so that putting one on 3 cannot overwrite the other.
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (to_chrome_r, from_chrome_w)]
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        to_chrome_r, from_chrome_w = high

        def fds() -> None:  # in the child, before exec
            os.dup2(to_chrome_r, 3)
            os.dup2(from_chrome_w, 4)

        self.proc = subprocess.Popen(
            [chromium(), *FLAGS, "--remote-debugging-pipe", f"--user-data-dir={profile}",
             "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            pass_fds=(3, 4), preexec_fn=fds)  # kept open after preexec_fn
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buf = b""
        self._id = 0
        self.events: list[dict] = []
        self.session: str | None = None

    def close(self) -> None:
        try:
            self.call("Browser.close", session=False, timeout=5)
        except (CdpError, OSError):
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        for fd in (self._w, self._r):
            os.close(fd)

    def _recv(self, deadline: float) -> dict:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._r], [], [], left)[0]:
                raise CdpError("no answer from Chromium in time")
            data = os.read(self._r, 1 << 20)
            if not data:
                raise CdpError(f"Chromium closed the pipe: {self.proc.stderr.read()[-2000:]!r}")
            self._buf += data
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def call(self, method: str, params: dict | None = None, session: bool = True,
             timeout: float = 30) -> dict:
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session and self.session:
            msg["sessionId"] = self.session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            m = self._recv(deadline)
            if m.get("id") == self._id:
                if "error" in m:
                    raise CdpError(f"{method}: {m['error']}")
                return m.get("result", {})
            self.events.append(m)

    def open(self, url: str) -> None:
        """A new tab on ``url``, attached; returns when the page has loaded."""
        target = self.call("Target.createTarget", {"url": "about:blank"},
                           session=False)["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True},
                                 session=False)["sessionId"]
        self.call("Page.navigate", {"url": url})
        self.wait_for(f"location.href === {json.dumps(url)} && document.readyState === 'complete'")

    def js(self, expr: str, timeout: float = 30) -> Any:
        r = self.call("Runtime.evaluate", {"expression": expr, "returnByValue": True,
                                           "awaitPromise": True}, timeout=timeout)
        if "exceptionDetails" in r:
            raise CdpError(f"{expr[:80]}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait_for(self, expr: str, timeout: float = 30) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            v = self.js(expr)
            if v:
                return v
            time.sleep(0.1)
        raise CdpError(f"not true within {timeout}s: {expr}")

    def node(self, selector: str) -> int:
        root = self.call("DOM.getDocument")["root"]["nodeId"]
        return self.call("DOM.querySelector", {"nodeId": root, "selector": selector})["nodeId"]

    def center(self, selector: str) -> tuple[float, float]:
        box = self.js(f"(() => {{ const r = document.querySelector({json.dumps(selector)})"
                      ".getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()")
        return box[0], box[1]

    def drop_files(self, selector: str, paths: list[Path]) -> None:
        """A real drag of files from outside the page onto ``selector`` (Input.dispatchDragEvent)."""
        x, y = self.center(selector)
        data = {"items": [], "files": [str(p) for p in paths], "dragOperationsMask": 1}
        for kind in ("dragEnter", "dragOver", "drop"):
            self.call("Input.dispatchDragEvent", {"type": kind, "x": x, "y": y, "data": data})

    def screenshot(self, path: Path) -> None:
        png = self.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})
        path.write_bytes(base64.b64decode(png["data"]))


class DevToolsBrowser:
    """Headless Chromium driven over the DevTools protocol (aiohttp's websocket)."""

    def __init__(self, tmp_path: Path) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [chromium(), *FLAGS, f"--remote-debugging-port={self.port}",
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


async def devtools_session(ws_url: str, steps):
    """``await steps(call, js)`` on the page at ``ws_url``: ``call(method, **params)``
    sends a DevTools command, ``js(expr)`` evaluates (promises awaited)."""
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
