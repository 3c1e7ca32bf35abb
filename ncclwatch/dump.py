"""``ncclwatch dump JOB``: fetch a job's evidence bundle from the daemon.

Before a stalled job is stopped: a POST, with the header that tells the
daemon's dump guard (daemon/dumpguard.py) no web page sent it, makes the
daemon ask the job's agents for fresh stacks and Flight Recorder dumps
(pausing only ranks already sitting still, within the pause budget), then
answer one tar.gz (daemon/bundle.py) that ``ncclwatch diagnose BUNDLE``
reads back. ``--wait 0``: a GET, what the daemon holds, no ask. Same
address, credentials and CA handling as ``ncclwatch status`` (status.py).
"""

from __future__ import annotations

import argparse
import base64
import os
import re
import ssl
import sys
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import quote

from ncclwatch import status
from ncclwatch.daemon.dumpguard import HEADER

#: Seconds the client waits beyond the daemon's own bounded wait.
SLACK = 30.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("job", metavar="JOB", help="the job id, as `ncclwatch status` shows it")
    p.add_argument("--daemon", default=None, metavar="URL",
                   help="daemon HTTP address (default: http://127.0.0.1:7471; env "
                        "NCCLWATCH_DAEMON); the job's owning daemon when jobs are sharded")
    p.add_argument("--out", default=None, metavar="PATH",
                   help="file or folder to write the tar.gz to (default: the current "
                        "folder, under the name the daemon gives)")
    p.add_argument("--wait", type=float, default=5.0, metavar="SECONDS",
                   help="seconds the daemon waits for the ranks' fresh reports (0: no fresh "
                        "ask, only what it holds; at most 30)")
    p.add_argument("--ca", default=None, metavar="FILE", help="CA to verify an https daemon with")


def main(args: argparse.Namespace) -> int:
    daemon = args.daemon or os.environ.get("NCCLWATCH_DAEMON") or status.DEFAULT_DAEMON
    try:
        name, body = fetch(daemon, args.job, args.wait, ca=args.ca,
                           auth=os.environ.get("NCCLWATCH_DAEMON_AUTH"))
    except status.StatusError as e:
        print(f"ncclwatch dump: {e}", file=sys.stderr)
        return 1
    out = Path(args.out) if args.out else Path(".")
    if out.is_dir():
        out = out / name
    out.write_bytes(body)
    print(f"{out} ({len(body)} bytes): read it with `ncclwatch diagnose {out}`")
    return 0


def fetch(daemon: str, job: str, wait: float, *, ca: str | None = None,
          auth: str | None = None) -> tuple[str, bytes]:
    """(file name, tar.gz) of the job's bundle; StatusError says why not."""
    creds = status.Credentials([daemon], auth)
    base = status.split_credentials(daemon)[0].split(",")[0].rstrip("/")
    url = f"{base}/api/v1/dump?job={quote(job, safe='')}&wait={wait:g}"
    # A fresh ask changes the job's state (pauses still ranks): a POST, with
    # the header no cross-site page can send. Without one: a plain GET.
    req = urllib.request.Request(url, data=b"" if wait > 0 else None,
                                 method="POST" if wait > 0 else "GET")
    if wait > 0:
        req.add_header(*HEADER)
    who = creds.for_url(base)
    if who:
        req.add_unredirected_header("Authorization",
                                    "Basic " + base64.b64encode(who.encode()).decode())
    try:
        ctx = ssl.create_default_context(cafile=ca) if ca else None
    except (OSError, ssl.SSLError) as e:
        raise status.StatusError(f"cannot load --ca {ca}: {e}") from None
    opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=ctx),
                                         status._SameOriginAuth())  # noqa: SLF001 (one rule)
    try:
        with opener.open(req, timeout=wait + SLACK) as r:
            body = r.read()
            cd = r.headers.get("Content-Disposition", "")
    except urllib.error.HTTPError as e:
        text = e.read(500).decode(errors="replace").strip()
        raise status.StatusError(f"{base}: HTTP {e.code}: {text or e.reason}") from None
    except (urllib.error.URLError, OSError) as e:
        raise status.StatusError(f"cannot reach the ncclwatch daemon at {base}: "
                                 f"{getattr(e, 'reason', e)}") from None
    m = re.search(r'filename="([A-Za-z0-9._-]+)"', cd)
    return (m.group(1) if m else "ncclwatch-dump.tar.gz"), body
