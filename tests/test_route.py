"""Moved to tests/unit/agent/test_route.py (its helper to tests.harness.shards);
kept for tests/test_shard_views.py until it moves (remove with it)."""

from tests.harness.shards import jobs_on as _jobs_on  # noqa: F401
