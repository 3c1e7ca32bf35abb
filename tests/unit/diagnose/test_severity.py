"""The severity grammar: every level of every log format, behind every launcher's tag.

"No failure found" is decided by the level a line declares (severity.py), not by the
shapes the corpus happens to hold: so the property walks the grammar's own tables.
Every format x every level x every tag goes into a healthy corpus log (the log and the
place walking the corpus); a line at error or fatal level, or a warning in error words,
makes the verdict something other than ``none`` and is quoted with its line number; a
warning in plain words, an info or debug line, and every row of BENIGN keep ``none``.
"""

from __future__ import annotations

import pytest

from ncclwatch.diagnose import diagnose
from ncclwatch.diagnose.severity import (
    BENIGN,
    FORMATS,
    KERNEL_ERRORS,
    TAGS,
    Level,
    benign,
    failing,
    level_of,
)
from tests.harness.corpus import HEALTHY, with_lines

#: A message in error words, and one in plain words.
ERROR_TEXT = "the optimizer step failed on this node"
PLAIN_TEXT = "step 900 done in 1.25 s"
#: Every tag of the grammar's table, and none.
TAG_FORMS = ("{}",) + tuple(example + "{}" for _n, _rx, example in TAGS)


def _line(fmt, level: Level, text: str) -> str:
    return fmt.template.format(level=fmt.spell[level], text=text)


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_every_format_reads_every_level_it_spells(fmt):
    for level in fmt.spell:
        for tag in TAG_FORMS:
            line = tag.format(_line(fmt, level, PLAIN_TEXT))
            got = level_of(line)
            assert got is not None and got[0] == level, (fmt.name, level, line, got)


def test_the_failure_rule():
    for fmt in FORMATS:
        for level in fmt.spell:
            for text in (ERROR_TEXT, PLAIN_TEXT):
                fails = failing(_line(fmt, level, text)) is not None
                want = level >= Level.ERROR or (level == Level.WARNING and text == ERROR_TEXT)
                assert fails == want, (fmt.name, level, text)


def test_every_benign_row_has_its_reason_and_an_example_it_spares():
    names = [b.name for b in BENIGN]
    assert len(names) == len(set(names))
    for b in BENIGN:
        assert len(b.why) > 20, b.name
        assert benign(b.example) is b, b.name
        assert failing(b.example) is None, b.name


def test_kernel_messages_are_errors_by_their_words():
    lines = ("[1482015.999488] Out of memory: Killed process 402287 (python) total-vm:79905000kB",
             "Dec  3 12:33:03 node7 kernel: python[402287]: segfault at 0 ip 00007f3c1a6d0a22 "
             "sp 00007ffd5c2e1f30 error 4 in libtorch_cuda.so",
             "[1482015.999488] NVRM: Xid (PCI:0000:3b:00): 79, pid=402287, GPU has fallen off the bus.")
    for line in lines:
        assert failing(line) == (Level.ERROR, "kernel"), line
    assert len(KERNEL_ERRORS) >= len(lines)


def _walk():
    """(format, level, text, tag, healthy case, place) for every format x level x tag,
    the healthy log and the place walking the corpus."""
    k = 0
    for fmt in FORMATS:
        for level in fmt.spell:
            for tag in TAG_FORMS:
                texts = (PLAIN_TEXT,) if level >= Level.ERROR else (ERROR_TEXT, PLAIN_TEXT)
                for text in texts:
                    yield fmt, level, text, tag, HEALTHY[k % len(HEALTHY)], (k * 8 % 21) / 20
                    k += 1


def test_every_level_of_every_format_behind_every_tag_in_a_healthy_log(tmp_path):
    for fmt, level, text, tag, case, at in _walk():
        line = tag.format(_line(fmt, level, text))
        inputs, target, first = with_lines(tmp_path, case, [line], at)
        d = diagnose(inputs)
        if level >= Level.ERROR or (level == Level.WARNING and text == ERROR_TEXT):
            assert d.cls != "none", (fmt.name, level, line, case.name, at)
            if d.cls == "unknown":
                wanted = {f"{target}:{first + k}" for k in (-1, 0)}
                assert any(w in wanted for w, _why in d.evidence), (line, d.evidence)
        else:
            assert d.cls == "none", (fmt.name, level, line, case.name, d.summary, d.evidence)


def test_benign_rows_behind_every_tag_stay_none(tmp_path):
    k = 0
    for b in BENIGN:
        for tag in TAG_FORMS:
            case = HEALTHY[k % len(HEALTHY)]
            inputs, _t, _f = with_lines(tmp_path, case, [tag.format(b.example)], (k * 8 % 21) / 20)
            d = diagnose(inputs)
            assert d.cls == "none", (b.name, tag, case.name, d.summary, d.evidence)
            k += 1
