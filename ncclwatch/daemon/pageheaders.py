"""The security headers of the daemon's HTML pages, defined once.

Each page may run only its own inline scripts and styles (by their SHA-256
in the Content-Security-Policy), talk only to this daemon, post no forms (the
landing page: only to this daemon, ``forms``), be framed by nobody and send
no Referer elsewhere; every response of the HTTP side is ``nosniff``
(NOSNIFF), so a job name in JSON or text is never run as HTML.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Iterable

NOSNIFF = {"X-Content-Type-Options": "nosniff"}


def csp_hash(text: str) -> str:
    """The CSP source that allows exactly this inline script or style."""
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def page_headers(*, scripts: Iterable[str] = (), styles: Iterable[str] = (),
                 forms: bool = False) -> dict[str, str]:
    """The headers of a page whose inline ``<script>`` and ``<style>`` bodies
    are ``scripts`` and ``styles``, exactly as served. ``forms``: the page
    posts forms to this daemon (``form-action 'self'``), and its Referrer-Policy
    is ``same-origin``: under ``no-referrer`` a browser sends a form's POST
    with ``Origin: null``, which the dump guard (dumpguard.py) refuses."""
    script_src = " ".join(csp_hash(s) for s in scripts) or "'none'"
    style_src = " ".join(csp_hash(s) for s in styles) or "'none'"
    form_action = "'self'" if forms else "'none'"
    return {
        "Content-Security-Policy": (
            f"default-src 'none'; script-src {script_src}; style-src {style_src}; "
            f"connect-src 'self'; form-action {form_action}; "
            "base-uri 'none'; frame-ancestors 'none'"),
        **NOSNIFF,
        "Referrer-Policy": "same-origin" if forms else "no-referrer",
    }
