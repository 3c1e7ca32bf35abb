"""Benchmarks (``make bench``): numbers for BENCHMARKS.md, never timed unit tests."""
