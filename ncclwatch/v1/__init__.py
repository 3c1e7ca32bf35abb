"""Generated protocol code for ``ncclwatch.v1`` (``make proto``; do not edit)."""
