"""bench.run.splice: ``--only gpu`` rewrites its own section of BENCHMARKS.md and no other."""

from __future__ import annotations

from bench.run import GPU_HEADING, splice

DOC = "# Benchmarks\n\nintro\n\n## Agent overhead\n\nold agent\n\n## Daemon targets\n\nd\n"


def test_a_missing_section_goes_after_the_agent_overhead() -> None:
    out = splice(DOC, GPU_HEADING, f"{GPU_HEADING}\n\nrows 1\n")
    assert out.index("old agent") < out.index(GPU_HEADING) < out.index("## Daemon targets")
    assert out.count(GPU_HEADING) == 1 and out.endswith("d\n")


def test_a_present_section_is_replaced_and_the_rest_kept() -> None:
    once = splice(DOC, GPU_HEADING, f"{GPU_HEADING}\n\nrows 1\n")
    twice = splice(once, GPU_HEADING, f"{GPU_HEADING}\n\nrows 2\n")
    assert "rows 1" not in twice and "rows 2" in twice
    assert twice.replace("rows 2", "rows 1") == once
    assert "old agent" in twice and "## Daemon targets\n\nd\n" in twice


def test_without_an_agent_section_it_is_appended() -> None:
    out = splice("# Benchmarks\n\nx\n", GPU_HEADING, f"{GPU_HEADING}\n\nrows\n")
    assert out.startswith("# Benchmarks\n\nx\n") and out.rstrip().endswith("rows")
