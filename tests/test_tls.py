"""Moved to tests/unit/test_tls.py (its helpers to tests.harness); kept for
tests/test_ingest_workers.py until it moves (remove with it)."""

from tests.conftest import pki  # noqa: F401
from tests.harness.credentials import client  # noqa: F401
