"""A log as terminals and forums leave it reads as the log itself.

``ncclwatch.logstream.Normaliser`` undoes, before any rule, what a log meets on its
way into a paste; tests/harness/mangle.py does it (one table of transformations,
kept apart from the product). Here:

- the normaliser's steps, one by one, and the line numbers a finding cites;
- the corpus's mangled twins (tests/data/diagnose/twins, written by
  make_twins.py): every public log wrapped at 80 and 120 columns, glued to a
  redrawn progress bar, coloured and quoted as Markdown gets its original's
  verdict, ranks included;
- as a property, any mix of the table's rows never turns a failing log of the
  corpus into "no failure found";
- a launcher's failure summary of every torch era, and Slurm's own line for a
  task, name the failing rank as the initiator when they are the first failure
  in the log, however the log was wrapped, coloured or quoted.
"""

from __future__ import annotations

import importlib.util
import json
import random
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ncclwatch.diagnose import diagnose
from ncclwatch.diagnose import paste
from ncclwatch.diagnose.logscan import scan
from ncclwatch.logstream import Normaliser, resolve_redraws
from tests.harness import paths
from tests.harness.corpus import right
from tests.harness.mangle import EXCLUSIVE, TABLE, TWINS, hard_wrap, mangle

DATA = paths.DATA / "diagnose"
PUBLIC = DATA / "public"
TWINS_DIR = DATA / "twins"
PUBLIC_CASES = sorted(p.parent for p in PUBLIC.glob("*/expected.json"))
ALL_CASES = sorted(p.parent for root in ("cases", "public") for p in (DATA / root).glob("*/expected.json"))
TEXT_SUFFIXES = (".log", ".out", ".txt", ".err")

_spec = importlib.util.spec_from_file_location("make_twins", DATA / "make_twins.py")
assert _spec is not None and _spec.loader is not None
make_twins = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_twins)


def _inputs(case: Path) -> list[Path]:
    return sorted(p for p in case.rglob("*") if p.is_file() and p.name != "expected.json")


def _norm(text: str) -> str:
    return Normaliser(paste.continues, paste.ends_line)(text.encode()).decode()


# -- the normaliser, step by step ------------------------------------------------------

def test_carriage_return_redraws_leave_the_last_text():
    bar = "Map:  45%|████▌     | 450/1000 [00:05<00:06, 90.1 examples/s]"
    line = f"\r{bar.replace('45%', '44%')}\r{bar}[rank1]:[W516 socket.cpp:489] timed out"
    assert resolve_redraws(line) == f"{bar}[rank1]:[W516 socket.cpp:489] timed out"
    # A counter redrawn in place, and a launcher's label written once per line.
    assert resolve_redraws("step 12 loss 1.3\rstep 13 loss 1.2\rstep 14 loss 1.1") == \
        "step 14 loss 1.1"
    assert resolve_redraws("3:  10%|#    | 1/10\r 20%|##   | 2/10\r[E ProcessGroupNCCL.cpp:1] x") \
        == "3: [E ProcessGroupNCCL.cpp:1] x"
    # A line another process printed before the bar came back is kept, apart.
    assert resolve_redraws("[rank0]: saving\r 50%|#####| 5/10") == "[rank0]: saving\r 50%|#####| 5/10"
    assert _norm("a\r\nb\r\n") == "a\nb\n"


def test_escape_sequences_go():
    coloured = ("\x1b]0;train.sh\x07\x1b[1;31mERROR\x1b[0m \x1b]8;;file:///x.py\x1b\\/x.py"
                "\x1b]8;;\x1b\\ \x1b[?25lexit\x1b(B code \x1b[1;36m1\x1b[0m\n")
    assert _norm(coloured) == "ERROR /x.py exit code 1\n"


def test_html_entities_and_markdown_are_undone():
    text = ("```text\n> File &quot;/x.py&quot;, line 3, in &lt;module&gt;\n"
            "> > `RuntimeError: a &amp; b`\n>\nkept &#10;on one line\n```\n")
    assert _norm(text) == ('\nFile "/x.py", line 3, in <module>\nRuntimeError: a & b\n\n'
                           "kept  on one line\n\n")


def test_hard_wraps_are_joined_at_the_terminal_width():
    long = ("[rank3]:[E1203 12:36:12.482 ProcessGroupNCCL.cpp:632] [Rank 3] Watchdog caught "
            "collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE) ran for 600012 "
            "milliseconds before timing out.")
    text = hard_wrap("\n".join([long, "[rank0]: Traceback (most recent call last):", long]) + "\n",
                     80)
    n = Normaliser(paste.continues, paste.ends_line)
    out = n(text.encode()).decode()
    assert n.width == 80
    assert out.split("\n")[:3] == [long, "[rank0]: Traceback (most recent call last):", long]
    # Where it joined: the line numbers map back to the user's.
    assert n.joins == [(0, 2), (2, 2)]


def test_a_log_of_one_width_is_not_joined():
    """Lines that all run to one width but start records (a uniform logger) stay apart."""
    lines = [f"[2026-12-03 10:00:{i:02d},000] INFO train.py:212 step {i:04d} loss 1.25" for i in range(40)]
    text = "\n".join(lines) + "\n"
    n = Normaliser(paste.continues, paste.ends_line)
    assert n(text.encode()).decode() == text and n.width is None


def test_findings_cite_the_users_own_line_numbers(tmp_path):
    """A log wrapped at 80 columns: the watchdog line stands on line 4 of the paste (its
    first piece), the traceback on the line after its pieces."""
    lines = ["step 1 loss 2.0", "step 2 loss 1.9",
             "[rank0]:[I1203 12:00:00.000 ProcessGroupNCCL.cpp:1] Saving model checkpoint to "
             "/ckpt/step900 (rank 0 writes the consolidated state dict)",
             "[rank1]:[E1203 12:36:12.482 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught "
             "collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE, NumelIn=1, "
             "NumelOut=1, Timeout(ms)=600000) ran for 600012 milliseconds before timing out.",
             "[rank1]: Traceback (most recent call last):"]
    log = tmp_path / "pasted.log"
    log.write_text(hard_wrap("\n".join(lines) + "\n", 80))
    raw = log.read_text().split("\n")
    r = scan([log])
    wd = next(e for e in r.evidence if e.sign.startswith("nccl_watchdog") or "Watchdog" in e.text)
    assert raw[wd.line - 1].startswith("[rank1]:[E1203"), (wd.line, raw)
    tb = r.tracebacks[0]
    assert raw[tb.line - 1].startswith("[rank1]: Traceback"), (tb.line, raw)
    assert r.lines_read == len(raw) - 1


# -- the corpus's twins ----------------------------------------------------------------

TWIN_CASES = [(twin, case) for twin in TWINS for case in PUBLIC_CASES]


def test_every_public_log_has_its_twins_as_make_twins_writes_them():
    assert len(PUBLIC_CASES) >= 200
    want = {(twin, case.name) for twin, case in TWIN_CASES}
    have = {(p.parent.parent.name, p.parent.name) for p in TWINS_DIR.glob("*/*/expected.json")}
    assert want == have, (sorted(want - have)[:5], sorted(have - want)[:5])
    for twin, case in TWIN_CASES:
        dst = TWINS_DIR / twin / case.name
        got = json.loads((dst / "expected.json").read_text())
        assert got == make_twins.expected(case, twin), (twin, case.name)
        for src in _inputs(case):
            out = dst / src.relative_to(case)
            assert out.read_bytes() == make_twins.twin_text(src.read_bytes(), twin, case.name), \
                f"{out}: not what make_twins.py writes (rerun it)"


def test_twins_keep_their_originals_expected_verdict():
    for twin, case in TWIN_CASES:
        orig = json.loads((case / "expected.json").read_text())
        got = json.loads((TWINS_DIR / twin / case.name / "expected.json").read_text())
        for k in make_twins.VERDICT_KEYS:
            assert got.get(k) == orig.get(k), (twin, case.name, k)


_ORIGINAL: dict[Path, tuple] = {}


def _verdict(files: list[Path]) -> tuple:
    d = diagnose(files)
    return d.cls, d.initiating, d.candidates, d.collateral


@pytest.mark.parametrize("twin", sorted(TWINS))
def test_every_twin_gets_its_originals_verdict(twin):
    """Class, initiating ranks, candidates and collateral: the original's, and right by
    the original's expected.json."""
    wrong = []
    for case in PUBLIC_CASES:
        if case not in _ORIGINAL:
            _ORIGINAL[case] = _verdict(_inputs(case))
        dst = TWINS_DIR / twin / case.name
        d = diagnose(_inputs(dst))
        got = (d.cls, d.initiating, d.candidates, d.collateral)
        want = json.loads((dst / "expected.json").read_text())
        if got != _ORIGINAL[case] or not right(d, want):
            wrong.append((case.name, got, _ORIGINAL[case]))
    assert not wrong, wrong



def _cited(files: list[Path]) -> set[tuple[str, str, int]]:
    return {(Path(e.file).name, e.sign, e.line) for e in scan(files).evidence}


@pytest.mark.parametrize("twin", ["colour", "markdown"])
def test_twins_of_the_same_lines_cite_their_originals_lines(twin):
    """A twin that keeps every line where it was (coloured; quoted as Markdown, its
    indent lost, its entities kept) cites no sign on a line its original's findings do
    not: the normaliser and the scanner undo the damage without moving a finding. (An
    unindented "what():" under "terminate called ..." is its own line, not the rest of
    the one above it.) It may cite fewer: a traceback's code line quoting a sign's
    words, "raise ChildFailedError(", reads as the rest of its frame once unindented."""
    wrong = []
    for case in PUBLIC_CASES:
        extra = _cited(_inputs(TWINS_DIR / twin / case.name)) - _cited(_inputs(case))
        if extra:
            wrong.append((case.name, sorted(extra)))
    assert not wrong, wrong

# -- any mix, as a property ------------------------------------------------------------

FAILING = [c for c in ALL_CASES if json.loads((c / "expected.json").read_text())["class"] != "none"]


def _mix(rows: set[str]) -> frozenset[str]:
    """The rows, one of each exclusive group kept (one terminal width)."""
    out = set(rows)
    for ex in EXCLUSIVE:
        out -= set(sorted(rows & ex)[1:])
    return frozenset(out)


def _mangled_copy(case: Path, dest: Path, rows: list[str], seed: int) -> list[Path]:
    out = []
    for src in _inputs(case):
        dst = dest / src.relative_to(case)
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.suffix in TEXT_SUFFIXES:
            text = src.read_bytes().decode("utf-8", "surrogateescape")
            dst.write_bytes(mangle(text, rows, seed).encode("utf-8", "surrogateescape"))
        else:
            shutil.copyfile(src, dst)
        out.append(dst)
    return out


_CASE = {c.name: c for c in FAILING}


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
# Mixes the random search found hiding a failure: a wrap that cut at a blank inside a
# trigger, the blank then dropped with the next piece's indent (Markdown outside a code
# block): "...'s watchdog" + "got stuck", "caught collective" + "operation timeout".
@example(case=_CASE["verl_1158_heartbeat_guid_without_desc"],
         rows=frozenset({"mpi_tags", "unindent", "wrap120"}), seed=0)
@example(case=_CASE["lightning_20832_wrapped_padded_broadcast_vs_allgather"],
         rows=frozenset({"unindent", "wrap_any"}), seed=28)
# A redrawn bar with "Killed" glued on, read as a wrap's piece and joined to the next line
# ("...5.04it/s]Killed" + "Done, resuming training ..."): the line alone is read too.
@example(case=_CASE["fast_stable_diffusion_1113_killed_converting_ckpt"],
         rows=frozenset({"ansi_prefixed", "redrawn_bar"}), seed=0)
# The same with "Killed" itself cut by a hard wrap ("...]Kill" + "ed" + "Done, ..."):
# the trigger's pieces joined are read alone too.
@example(case=_CASE["fast_stable_diffusion_1113_killed_converting_ckpt"],
         rows=frozenset({"redrawn_bar", "wrap_in_trigger"}), seed=0)
@given(case=st.sampled_from(FAILING),
       rows=st.sets(st.sampled_from(sorted(TABLE)), min_size=1, max_size=6).map(_mix),
       seed=st.integers(0, 2**32 - 1))
def test_no_mix_of_damage_hides_a_failure(tmp_path_factory, case, rows, seed):
    files = _mangled_copy(case, tmp_path_factory.mktemp("mix") / case.name, sorted(rows), seed)
    d = diagnose(files)
    assert d.cls != "none", (case.name, sorted(rows), seed)


# -- launcher summaries of every era, and Slurm's own lines ------------------------------

#: A worker's failure as each torch era's launcher reports it ({r}: the local rank, one
#: node; {code}: its exit code). Shapes from users' pastes: torch 1.9's table and its
#: no-error-file warning (https://github.com/xzz777/SCTNet/issues/47,
#: https://github.com/facebookresearch/MetaICL/issues/8), 1.10-2.0's logging line
#: (https://github.com/AFeng-x/SMT/issues/18), 2.1-2.2's bracketed one
#: (https://github.com/THU-MIG/RepViT/issues/65), 2.3+'s glog line
#: (https://github.com/OpenBMB/MiniCPM-V/issues/770) and 2.x's table.
SUMMARIES: dict[str, str] = {
    "1.9 table": (
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
        "***************************************\n"
        "            train.py FAILED            \n"
        "=======================================\n"
        "Root Cause:\n[0]:\n  time: 2021-07-12_10:02:58\n  rank: {r} (local_rank: {r})\n"
        "  exitcode: {code} (pid: 4242)\n  error_file: <N/A>\n"
        "  msg: \"Process failed with exitcode {code}\"\n"
        "=======================================\nOther Failures:\n  <NO_OTHER_FAILURES>\n"
        "***************************************\n"),
    "1.9 no error file": (
        "**********************************************************************\n"
        "               CHILD PROCESS FAILED WITH NO ERROR_FILE                \n"
        "**********************************************************************\n"
        "CHILD PROCESS FAILED WITH NO ERROR_FILE\n"
        "Child process 4242 (local_rank {r}) FAILED (exitcode {code})\n"
        "Error msg: Process failed with exitcode {code}\n"
        "Without writing an error file to <N/A>.\n"),
    "1.10-2.0 line": (
        "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: {code}) "
        "local_rank: {r} (pid: 4242) of binary: /home/user/miniconda3/envs/train/bin/python\n"),
    "2.1-2.2 line": (
        "[2024-05-28 14:04:28,584] torch.distributed.elastic.multiprocessing.api: [ERROR] "
        "failed (exitcode: {code}) local_rank: {r} (pid: 4242) of binary: /opt/conda/bin/python\n"),
    "2.3+ line": (
        "E0604 21:12:50.464000 7275 site-packages/torch/distributed/elastic/multiprocessing/"
        "api.py:869] failed (exitcode: {code}) local_rank: {r} (pid: 4242) of binary: "
        "/root/miniconda3/bin/python3.10\n"),
    "2.x table": (
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
        "============================================================\n"
        "train.py FAILED\n"
        "------------------------------------------------------------\n"
        "Failures:\n  <NO_OTHER_FAILURES>\n"
        "------------------------------------------------------------\n"
        "Root Cause (first observed failure):\n[0]:\n"
        "  time      : 2024-05-28_14:04:28\n  host      : gpu-node-07.cluster.example.org\n"
        "  rank      : {r} (local_rank: {r})\n  exitcode  : {code} (pid: 4242)\n"
        "  error_file: <N/A>\n"
        "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html\n"
        "============================================================\n"),
}

NPROC = 8


def _job_log(era: str, r: int, code: int) -> str:
    steps = "".join(f"Epoch: [3]  [{i * 100:4d}/5004]  eta: 0:41:09  lr: 0.000100  loss: 6.9077 "
                    f"(6.9203)  time: 0.4361  data: 0.0004  max mem: 10891\n" for i in range(6))
    own = ("Traceback (most recent call last):\n"
           '  File "main.py", line 412, in <module>\n    main(args)\n'
           '  File "/home/user/deit/engine.py", line 47, in train_one_epoch\n'
           "    loss = criterion(samples, outputs, targets)\n"
           "ValueError: Expected input batch_size (96) to match target batch_size (128).\n"
           if code > 0 else "")
    stop = "".join(f"W0604 21:12:07.358000 7275 torch/distributed/elastic/multiprocessing/api.py:"
                   f"897] Sending process {5000 + k} closing signal SIGTERM\n"
                   for k in range(NPROC) if k != r)
    return steps + own + stop + SUMMARIES[era].format(r=r, code=code)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(era=st.sampled_from(sorted(SUMMARIES)), r=st.integers(0, NPROC - 1),
       code=st.sampled_from([1, 2, -9, -11, -6]),
       width=st.one_of(st.none(), st.integers(40, 200)),
       rows=st.sets(st.sampled_from(["colour", "redrawn_bar", "quote", "entities", "unindent",
                                     "crlf", "fence"]), max_size=3),
       seed=st.integers(0, 2**32 - 1))
def test_a_launchers_summary_names_its_failing_rank(tmp_path_factory, era, r, code, width, rows,
                                                    seed):
    """In any torch era, however wrapped, coloured or quoted: the launcher's failure is
    the first in the log (the rank's own error above it names no rank), and its rank is
    the initiator. A wrapped paste whose pieces also lost their leading blank to
    Markdown included: "failed (exitcode:" + "-9) local_rank:" + "5 (pid: ..." reads
    with no blank at either cut."""
    text = _job_log(era, r, code)
    rng = random.Random(seed)
    for name in ("colour", "redrawn_bar"):
        if name in rows:
            text = TABLE[name](text, rng)
    if width is not None:
        text = hard_wrap(text, width)
    for name in ("unindent", "entities", "quote", "fence", "crlf"):
        if name in rows:
            text = TABLE[name](text, rng)
    log = tmp_path_factory.mktemp("summary") / "console.log"
    log.write_bytes(text.encode())
    d = diagnose([log])
    assert (d.cls, d.initiating) == ("rank_crash", [r]), (era, r, code, width, sorted(rows),
                                                          d.summary, text[-1500:])


@pytest.mark.parametrize("unindented", [False, True], ids=["as_wrapped", "indent_lost"])
def test_every_era_at_every_width(tmp_path, unindented):
    """The property's sweep: each era's summary wrapped at every width from 40 to 200,
    and the same pasted as Markdown outside a code block (each piece's leading blank
    gone: a cut at a blank leaves none, "(exitcode" + "1)", "-9)" + "local_rank:")."""
    wrong = []
    for era in SUMMARIES:
        for width in range(40, 201):
            text = hard_wrap(_job_log(era, 3, 1), width)
            if unindented:
                text = TABLE["unindent"](text, random.Random(0))
            log = tmp_path / "console.log"
            log.write_text(text)
            d = diagnose([log])
            if (d.cls, d.initiating) != ("rank_crash", [3]):
                wrong.append((era, width, d.cls, d.initiating))
    assert not wrong, wrong


@pytest.mark.parametrize("lines, rank", [
    # srun starting the ranks itself: the first task to fail, then the step's end.
    (["FileExistsError: [Errno 17] File exists: '/scratch/cache/S043'",
      "srun: error: nid008637: task 3: Exited with exit code 1",
      "srun: Terminating StepId=45380617.0",
      "slurmstepd: error: *** STEP 45380617.0 ON nid008637 CANCELLED AT 2025-11-19T12:13:27 ***",
      "srun: error: nid008637: tasks 0-2: Terminated"], 3),
    # Older installs' "srun.slurm", a signal in words.
    (["srun.slurm: error: borg01x154: task 4: Killed",
      "srun.slurm: error: borg01x145: tasks 0-3,5: Terminated"], 4),
    # A wrong path: Slurm could not start the program of task 0 at all.
    (["slurmstepd: error: execve(): torchrun: No such file or directory",
      "srun: error: g1301: task 0: Exited with exit code 2",
      "srun: launch/slurm: _step_signal: Terminating StepId=3022331.0"], 0),
], ids=["exit_code_then_terminated", "killed", "wrong_path"])
def test_slurms_own_line_names_the_failing_task(tmp_path, lines, rank):
    for width in (None, 40, 80):
        text = "\n".join(lines) + "\n"
        log = tmp_path / "slurm-1.out"
        log.write_text(text if width is None else hard_wrap(text, width))
        d = diagnose([log])
        assert (d.cls, d.initiating) == ("rank_crash", [rank]), (width, d.summary)


def test_a_slurm_task_is_no_rank_where_torchrun_runs_per_node(tmp_path):
    """srun starting torchrun on two nodes: task 1 is a node, its failure names no rank
    by itself (the failure table does)."""
    log = tmp_path / "slurm-2.out"
    log.write_text("W0604 21:12:07.358000 7275 torch/distributed/elastic/multiprocessing/api.py:"
                   "897] Sending process 5001 closing signal SIGTERM\n"
                   "srun: error: gpu-node-02: task 1: Exited with exit code 1\n")
    d = diagnose([log])
    assert 1 not in d.initiating, d.summary


def test_a_launchers_exit_after_a_timeout_is_not_the_initiator(tmp_path):
    """The launcher's line follows a rank that waited: that rank exits non-zero too, and
    the rank it waited for is the initiator, not the one the launcher names."""
    log = tmp_path / "console.log"
    log.write_text(
        "[rank1]:[E1203 12:36:12.482 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught "
        "collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE, NumelIn=1, "
        "NumelOut=1, Timeout(ms)=600000) ran for 600012 milliseconds before timing out.\n"
        "E0604 21:12:50.464000 7275 torch/distributed/elastic/multiprocessing/api.py:869] failed "
        "(exitcode: 1) local_rank: 1 (pid: 4242) of binary: /usr/bin/python\n")
    d = diagnose([log])
    assert 1 not in d.initiating and d.cls == "collective_hang", d.summary
