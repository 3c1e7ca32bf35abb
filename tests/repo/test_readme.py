"""README.md is a newcomer's page: short, and its sample ``ncclwatch status``
output is the real output of the recorded demo run (tests/unit/test_status_render.py)."""

from __future__ import annotations

import re

from tests.harness.paths import ROOT
from tests.harness.statusview import demo_text

README = ROOT / "README.md"
#: The sample: the fenced block that starts with this command.
PROMPT = "$ .venv/bin/ncclwatch status"
#: Characters: a page one reads, the reference lives in docs/.
MAX_CHARS = 8000


def readme_sample() -> list[str]:
    text = README.read_text()
    m = re.search(r"```\n" + re.escape(PROMPT) + r"\n(.*?)```", text, re.S)
    assert m, f"README.md has no sample block starting with {PROMPT!r}"
    return m.group(1).rstrip("\n").split("\n")


def test_readme_sample_is_the_status_output_of_the_recorded_demo() -> None:
    """Every line of the README's sample is a line of the real output, in
    order; a line '...' stands for lines left out. The parts a reader needs
    are there: the table's header, the stall, budget, culprit, waiting, fix."""
    real = demo_text().split("\n")
    sample = readme_sample()
    assert sample[:2] == real[:2], "the table's columns differ from status's"
    at = 0
    for line in sample:
        if line.strip() == "...":
            continue
        # A long line may be cut with '...' at its end.
        head = line[:-3] if line.endswith("...") else None
        found = next((i for i in range(at, len(real))
                      if real[i] == line or (head is not None and real[i].startswith(head))),
                     None)
        assert found is not None, (f"README sample line not in the real output (in order):\n"
                                   f"{line!r}\n--- real output ---\n" + "\n".join(real))
        at = found + 1
    shown = " ".join(sample)
    for part in ("JOB ", "RANKS", "STALL", "WATCHDOG LEFT", "STALL checkpoint_gather",
                 "  watchdog: ", "  culprit: rank 0", "  waiting: ranks 1-3",
                 "  fix for PyTorch: ", "      import torch.distributed.checkpoint as dcp"):
        assert part in shown, f"README sample lacks {part!r}"


def test_readme_is_short_and_says_no_false_demo_time() -> None:
    text = README.read_text()
    assert len(text) < MAX_CHARS, f"README.md has {len(text)} characters (< {MAX_CHARS})"
    assert "make demo" in text and "make test" in text
    # The demo prints its own measured delay; the README never promises less.
    assert not re.search(r"about [1-9] s after", text), "the README quotes the demo's own measured line"
