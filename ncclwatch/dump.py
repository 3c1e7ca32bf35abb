"""``ncclwatch dump JOB``: fetch a job's evidence bundle from the daemon.

Before a stalled job is stopped: a POST, with the header that tells the
daemon's dump guard (daemon/dumpguard.py) no web page sent it, makes the
daemon ask the job's agents for fresh stacks and Flight Recorder dumps
(pausing only ranks already sitting still, within the pause budget), then
answer one tar.gz (daemon/bundle.py) that ``ncclwatch diagnose BUNDLE``
reads back. ``--wait 0``: a GET, what the daemon holds, no ask. Same
address, credentials and CA handling as ``ncclwatch status`` (status.py).

The file is written where the operator said, never where the answer says: a
redirect to another origin is refused, the daemon's file name is kept only
when it fits ``NAME`` (else one is made from the job id), and the file is made
new (O_EXCL|O_NOFOLLOW): an existing file or a symlink at the path is an error
(exit 2), never overwritten or followed.
"""

from __future__ import annotations

import argparse
import base64
import os
import re
import ssl
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import quote

from ncclwatch import status
from ncclwatch.daemon.dumpguard import HEADER

#: Seconds the client waits beyond the daemon's own bounded wait.
SLACK = 30.0

#: A file name from the daemon kept as given: a plain tar.gz name in the folder,
#: no path, no dot file.
NAME = re.compile(r"(?!\.)[A-Za-z0-9._-]{1,128}\.tar\.gz")

#: Of the file written: the bundle holds the job's environment and stacks.
MODE = 0o600


class OutputExists(Exception):
    """The output path holds a file or a symlink: nothing was written."""


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
    try:
        out = write_new(Path(args.out) if args.out else None, name, body)
    except OutputExists as e:
        print(f"ncclwatch dump: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"ncclwatch dump: cannot write {e.filename or args.out}: {e.strerror or e}",
              file=sys.stderr)
        return 1
    print(f"{out} ({len(body)} bytes): read it with `ncclwatch diagnose {out}`")
    return 0


def write_new(out: Path | None, name: str, body: bytes) -> Path:
    """Write ``body`` to a file made new: ``out`` when it names a file, ``name``
    in ``out`` when it is a folder (the current one when None). Neither ``out``
    nor the file is followed through a symlink; an existing one is OutputExists."""
    folder, leaf = Path("."), name
    dir_fd = None
    if out is not None:
        try:
            dir_fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            folder = out
        except FileNotFoundError:
            folder, leaf = out.parent, out.name
        except OSError:
            if out.is_symlink():
                raise OutputExists(f"{out} is a symlink: not followed (give the real "
                                   "path)") from None
            folder, leaf = out.parent, out.name   # a file: O_EXCL below says it exists
    path = folder / leaf
    if dir_fd is None:
        dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            fd = os.open(leaf, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, MODE,
                         dir_fd=dir_fd)
        except FileExistsError:
            what = "a symlink" if path.is_symlink() else "a file"
            raise OutputExists(f"{path} exists ({what}): not overwritten; move it away or "
                               "give another --out") from None
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(body)
        except OSError:
            os.unlink(leaf, dir_fd=dir_fd)   # ours: made just now, exclusively
            raise
    finally:
        os.close(dir_fd)
    return path


def file_name(disposition: str, job: str) -> str:
    """The daemon's file name when it fits NAME, else ``ncclwatch-dump-<job>-<UTC
    time>.tar.gz`` (the daemon's own grammar, bundle.archive_name)."""
    m = re.search(r'filename="([^"]*)"', disposition)
    if m and NAME.fullmatch(m.group(1)):
        return m.group(1)
    from ncclwatch.daemon.bundle import archive_name  # only here: it loads the daemon
    return archive_name(job, time.time()) + ".tar.gz"


class _NoCrossOrigin(status._SameOriginAuth):  # noqa: SLF001 (one rule)
    """Follows a redirect only within the daemon's origin: another origin never
    chooses what is written (nor gets the credentials)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: ANN001
        if status.origin(newurl) != status.origin(req.full_url):
            fp.close()
            raise status.StatusError(f"{req.full_url}: HTTP {code} redirect to another "
                                     f"origin refused: {newurl}")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


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
                                         _NoCrossOrigin())
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
    return file_name(cd, job), body
