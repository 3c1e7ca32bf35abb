"""Paste damage: what terminals, issue trackers and log viewers do to a log must not
change the verdict.

The unit tests pin each form paste.py undoes; the property tests take the corpus
(tests/data/diagnose, cases made here and public pastes), damage every text log
of a case the way real pastes are damaged (markdown quoting, viewer line numbers,
MPI tags, time and host prefixes, ANSI colours, a progress bar gluing the next
line on, a terminal hard wrap inside a word, CRLF, code fences) and check that
``diagnose`` reaches the same verdict: class, initiating ranks, candidates.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ncclwatch.diagnose import diagnose, paste
from ncclwatch.diagnose.lineprefix import split_prefix
from ncclwatch.diagnose.logscan import scan
from tests.harness import paths
from tests.harness.mangle import PASTE_ROWS, TABLE

DATA = paths.DATA / "diagnose"
CASES = sorted(p.parent for root in ("cases", "public")
               for p in (DATA / root).glob("*/expected.json"))
TEXT_SUFFIXES = (".log", ".out", ".txt")


# -- the forms, one by one -------------------------------------------------------------

@pytest.mark.parametrize("line,rank,rest", [
    ("> [rank3]:hello", 3, "hello"),
    ("[80746] [rank0]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] x", 0,
     "[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] x"),
    ("[1,2]<stderr>:[E ProcessGroupNCCL.cpp:523] x", 2, "[E ProcessGroupNCCL.cpp:523] x"),
    ("`\x1b[36m(RayWorkerWrapper pid=4009) [rank1]:x", 1, "x"),
    ("`[36m(RayWorkerWrapper pid=4009) [rank1]:x", 1, "x"),
    ("18:11:06.680 [rank4]:x", 4, "x"),
    ("dinov2-giant-nodes.cn-d004 [stderr] [rank14]:x", 14, "x"),
    ("(MegatronPolicyWorker[rank=31] pid=3264030, ip=10.1.101.236) [rank31]:x", 31, "x"),
    ("> [] [rank=0] RuntimeError: CUDA out of memory.", 0, " RuntimeError: CUDA out of memory."),
])
def test_decorated_prefixes(line, rank, rest):
    assert split_prefix(line) == (rank, rest)


def test_glued_progress_bar_is_two_lines():
    bar = "Tokenizing Prompts (num_proc=64):  92%|█████████▏| 328986/359152 [29:58<12:05, 41.59 examples/s]"
    parts = paste.split_glued(bar + "[rank1]:[W516 14:34:56.853490829 socket.cpp:464] x")
    assert parts == [bar, "[rank1]:[W516 14:34:56.853490829 socket.cpp:464] x"]
    # A launcher prefix after plain decoration is not a glued line.
    assert paste.split_glued("18:11:06.680 [rank4]:x") == ["18:11:06.680 [rank4]:x"]


def test_two_ranks_written_into_one_line_are_two_lines(tmp_path):
    """Two ranks writing to one console at once: the second rank's prefix inside the
    first rank's line starts a line of its own, its evidence that rank's."""
    parts = paste.split_glued("[rank0]: saving shard 3[rank1]:[E1203 12:36:12.482 "
                              "ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught x")
    assert parts == ["[rank0]: saving shard 3",
                     "[rank1]:[E1203 12:36:12.482 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught x"]
    # A prefix after decoration, or repeated, is one line.
    assert paste.split_glued("18:11:06.680 [rank4]:x") == ["18:11:06.680 [rank4]:x"]
    assert paste.split_glued("[rank4]:[rank4]: x") == ["[rank4]:[rank4]: x"]
    log = tmp_path / "console.log"
    log.write_text("[rank0]:step 900 loss 1.2[rank1]:[E1203 12:36:12.482 ProcessGroupNCCL.cpp:632] "
                   "[PG ID 0 PG GUID 0(default_pg) Rank 1] Watchdog caught collective operation "
                   "timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
                   "Timeout(ms)=600000) ran for 600012 milliseconds before timing out.\n")
    d = diagnose([log])
    assert d.cls == "collective_hang" and 1 in d.collateral and 0 not in d.collateral, d.summary


def test_hard_wrap_is_joined(tmp_path):
    log = tmp_path / "console.log"
    log.write_text(
        "[rank6]:[E429 13:55:49.384372190 ProcessGroupNCCL.cpp:1743] [PG ID 0 PG GUID "
        "0(default_pg) Rank 6] ProcessGroupNCCL'\n"
        "s watchdog got stuck for 480 seconds without making progress in monitoring enqueued"
        " collectives.\n")
    d = diagnose([log])
    assert (d.cls, d.collateral) == ("collective_hang", [6]), d.summary
    assert d.candidates == [0, 1, 2, 3, 4, 5]


def test_short_lines_are_not_joined():
    assert paste.ends_line("Loading extension module utils...")
    assert paste.ends_line("x" * 80 + " before timing out.")
    assert not paste.ends_line("x" * 80 + " NumelIn=1, N")
    assert paste.continues("umelOut=1, Timeout(ms)=600000) ran for 600005 milliseconds")
    assert not paste.continues("[rank4]:[E430 05:09:48.830445837 ProcessGroupNCCL.cpp:2268]")
    assert not paste.continues('  File "/x.py", line 3, in f')


def test_a_record_tag_starts_a_record_behind_a_paste_s_decoration():
    """A tag written once per record (a Kubernetes CRI line's, a Ray actor's) leads a
    record, whatever follows it: the piece "2023-09-0" after a CRI tag is no rest of the
    line before. A paste's quote or viewer number in front changes nothing; a CRI line
    after a partial one (tag P) goes on with it."""
    cri = "2026-12-03T10:00:06.123456789Z stderr F 2023-09-0"
    assert paste.continues(paste.undecorate(cri))  # (the text after the tag alone would)
    assert paste.tagged(cri)
    assert paste.tagged("> [88716] \x1b[31m(RayTrainWorker pid=4009, ip=10.0.0.7) cc:2593] x")
    assert not paste.tagged(cri, prev="2026-12-03T10:00:06.1Z stdout P first part of it")
    assert not paste.tagged("cc:2593] Execution of replica 3 failed")
    assert not paste.tagged("[rank3]: x")  # (continues() reads launcher prefixes)


def test_a_piece_that_starts_with_a_record_tag_is_no_rest_of_the_line_before(tmp_path):
    """A narrow terminal cut a CRI-tagged XLA error line right after the tag: the line
    before it, which does not end a sentence, is not joined to it, and its level is read."""
    line = ("2026-12-03T10:00:06.123456789Z stderr F 2023-09-01 10:20:11.257981: E external/"
            "xla/xla/pjrt/pjrt_stream_executor_client.cc:2593] Execution of replica 3 failed: "
            "INTERNAL: Failed to execute XLA Runtime executable")
    log = tmp_path / "job.log"
    before = "[2026-12-03 10:00:04,000] INFO train.py:212 step 4 loss 1.25 lr 3.0e-04 tokens/s"
    log.write_text(before + "\n" + "\n".join(line[i:i + 49] for i in range(0, len(line), 49))
                   + "\n")
    r = scan([log])
    assert r.hits["level_line"][0] == f"{log}:2", r.hits


# -- damage, as a property ----------------------------------------------------------------

#: The damage kinds: rows of the one table of transformations (tests/harness/mangle.py)
#: that the corpus's mangled twins and tests/unit/test_logstream_mangled.py use too.
DAMAGE = {k: TABLE[k] for k in PASTE_ROWS}


def _damaged_copy(case: Path, dest: Path, kinds: list[str], seed: int) -> list[Path]:
    rng = random.Random(seed)
    out = []
    for src in sorted(p for p in case.rglob("*") if p.is_file() and p.name != "expected.json"):
        dst = dest / src.relative_to(case)
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.suffix in TEXT_SUFFIXES:
            # (Bytes decoded as they are: a carriage return is the log's, not a line end.)
            text = src.read_bytes().decode("utf-8", "replace")
            for k in kinds:
                text = DAMAGE[k](text, rng)
            dst.write_bytes(text.encode())
        else:
            shutil.copyfile(src, dst)
        out.append(dst)
    return out


_VERDICTS: dict[Path, tuple] = {}


def _verdict(files) -> tuple:
    d = diagnose(files)
    return d.cls, d.initiating, d.candidates


def _clean_verdict(case: Path) -> tuple:
    if case not in _VERDICTS:
        _VERDICTS[case] = _verdict(sorted(p for p in case.rglob("*")
                                          if p.is_file() and p.name != "expected.json"))
    return _VERDICTS[case]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=st.sampled_from(CASES),
       kinds=st.lists(st.sampled_from(sorted(DAMAGE)), min_size=1, max_size=3, unique=True),
       seed=st.integers(0, 2**32 - 1))
def test_damage_keeps_the_verdict(tmp_path_factory, case, kinds, seed):
    dest = tmp_path_factory.mktemp("damaged") / case.name
    files = _damaged_copy(case, dest, kinds, seed)
    assert _verdict(files) == _clean_verdict(case), (case.name, kinds, seed)


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_each_damage_on_every_case(tmp_path, kind):
    """Every kind of damage alone, on every case (the property test samples; this sweeps)."""
    wrong = []
    for case in CASES:
        files = _damaged_copy(case, tmp_path / case.name, [kind], seed=len(case.name))
        if _verdict(files) != _clean_verdict(case):
            wrong.append((case.name, _verdict(files), _clean_verdict(case)))
    assert not wrong, wrong
