"""Moved to tests/unit/daemon/test_forecast.py (its helpers to tests.harness.reports);
kept for tests/test_diagnose_bundle.py until it moves (remove with it)."""

from tests.harness.reports import MB  # noqa: F401
from tests.harness.reports import rank0_sample as _rank0  # noqa: F401
