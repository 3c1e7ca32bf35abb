"""Where operators reach this daemon: its page and its runbooks, for alerts to link.

An alert is read in a pager, far from the daemon: it must carry the page
of its job (the stack is there) and a runbook that opens. The daemon
exports both as ``ncclwatch_daemon_info{url, runbook_base}``; the rules
build their links from it. ``external_url`` is how operators reach the
daemon (a proxy, a DNS name); without it, this host's name and the HTTP
port. The runbooks default to the ones this daemon serves itself at
``/runbooks/`` (rendered from the package: the same text as
``ncclwatch status``), or any copy of docs/runbooks (``runbook_url``).
"""

from __future__ import annotations

import socket
from urllib.parse import quote_plus


def external_url(configured: str, http: str, tls: bool) -> str:
    """The daemon's URL without a trailing slash."""
    if configured:
        return configured.rstrip("/")
    host, _, port = http.rpartition(":")
    if host in ("", "0.0.0.0", "::", "[::]"):
        host = socket.getfqdn()
    return f"{'https' if tls else 'http'}://{host}:{port}"


def runbook_base(configured: str, url: str) -> str:
    """Base the runbook pages (``<kind>.md``) are under, with a trailing slash."""
    return (configured.rstrip("/") if configured else url + "/runbooks") + "/"


def job_anchor(job_id: str) -> str:
    """The page's anchor of a job, as Go templates' ``urlquery`` writes it."""
    return "job-" + quote_plus(job_id, safe="")
