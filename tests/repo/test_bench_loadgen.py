"""The benchmark's simulated agents send what real agents send (bench/loadgen.py).

Benchmarks built on a generator that drifted from the protocol would
measure something no daemon ever sees: the assembled bytes are checked
against messages built the usual way, and protocol 2's briefs against a
real daemon (no resync, ranks seen, full samples whenever a state moved).
"""

from bench.loadgen import check_assembly


def test_the_load_generator_builds_what_agents_send() -> None:
    check_assembly()
