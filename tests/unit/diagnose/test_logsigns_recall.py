"""Recall first: every sign of the table is found however the log reached us.

A "no failure found" on a failing log is the worst answer ``diagnose`` can give
(issue 21). Each row of logsigns.SIGNS carries an example line; these tests put
it in a log between ordinary step lines, damaged the ways real logs are: glued
to a tqdm bar (after ``\\r`` redraws, or straight after ``100%|####|``),
behind each launcher's tag (srun, torchrun, mpirun, Ray, pdsh/deepspeed,
Kubernetes CRI and JSON lines), ANSI-coloured (whole line, or a code dropped
anywhere, inside a trigger too), and hard-wrapped by a terminal of any width
of at least logsigns.MAX_TRIGGER columns (counted as it shows them: from a
redraw's carriage return on), wherever the cut falls (inside the trigger too).
The sign must be found, on a line its text is on.
A log holding a failure sign and nothing else gets ``unknown``, never ``none``.
"""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ncclwatch.diagnose import diagnose
from ncclwatch.diagnose.logscan import scan
from ncclwatch.diagnose.logsigns import MAX_TRIGGER, MIN_TRIGGER, SIGNS
from ncclwatch.diagnose.signtypes import LogSign
from tests.harness.mangle import hard_wrap

NOISE = ("[2026-12-03 10:00:0{i},000] INFO train.py:212 step {i} loss 1.25 lr 3.0e-04 "
         "grad_norm 0.51 tokens/s 100000")
BEFORE, AFTER = 5, 3


def _with_tag(kind: str, line: str) -> str:
    return {
        "none": line,
        "srun": f"3: {line}",
        "torchrun_default": f"[default3]:{line}",
        "torchrun_rank": f"[rank3]:{line}",
        "mpirun": f"[1,3]<stderr>:{line}",
        "ray": f"(RayTrainWorker pid=4009, ip=10.0.0.7) {line}",
        "ray_repeated": f"(RayTrainWorker pid=4009, ip=10.0.0.7) {line} [repeated 7x across cluster]",
        "pdsh_deepspeed": f"worker-3: {line}",
        "kubernetes_cri": f"2026-12-03T10:00:06.123456789Z stderr F {line}",
        "json": json.dumps({"log": line + "\n", "stream": "stderr",
                            "time": "2026-12-03T10:00:06.123456789Z"}),
    }[kind]


TAGS = ("none", "srun", "torchrun_default", "torchrun_rank", "mpirun", "ray", "ray_repeated",
        "pdsh_deepspeed", "kubernetes_cri", "json")


def _glue(kind: str, line: str) -> str:
    return {
        "none": line,
        "tqdm_cr": "  0%|          | 0/10 [00:00<?, ?it/s]\r 50%|#####     | 5/10 "
                   "[00:01<00:01,  4.99it/s]\r" + line,
        "tqdm_done": "100%|##########| 10/10 [00:02<00:00,  4.99it/s]" + line,
        "bar_only": "100%|####|" + line,
    }[kind]


GLUES = ("none", "tqdm_cr", "tqdm_done", "bar_only")


def _colour(kind: str, line: str, rng: random.Random) -> str:
    if kind == "line":
        return f"\x1b[31m{line}\x1b[0m"
    if kind == "anywhere":  # a code dropped at a random column, inside a trigger too
        c = rng.randrange(1, len(line))
        return f"{line[:c]}\x1b[1;33m{line[c:]}"
    return line


def _wrap(line: str, width: int) -> list[str]:
    """What a terminal of ``width`` columns does to a long line (copied back as lines):
    mangle.hard_wrap, the terminal's own cut, where a carriage return goes back to
    column 0. (Cut by characters, the bars a redraw overwrote would count as columns:
    "...\\rsrun: error: nid008637: task " + "3: Exited with exit code 1" is then a line
    that showed 29 columns and what reads as srun's own labelled line; the width that
    tells them apart is that of text no terminal showed, so no paste can carry it.)"""
    return hard_wrap(line, width).split("\n")


def _log(lines: list[str]) -> str:
    noise = [NOISE.format(i=i) for i in range(BEFORE)]
    after = [NOISE.format(i=i) for i in range(AFTER)]
    return "\n".join(noise + lines + after) + "\n"


def _found(tmp_path, sign: LogSign, lines: list[str], name: str = "job.log") -> None:
    log = tmp_path / name
    log.write_text(_log(lines))
    r = scan([log])
    assert sign.id in r.hits, (sign.id, lines)
    where, _text = r.hits[sign.id]
    # The line its first piece starts on (or a later piece's, where that holds a whole
    # trigger of the sign itself).
    assert where in {f"{log}:{BEFORE + 1 + i}" for i in range(len(lines))}, (sign.id, where, lines)


def test_every_sign_has_an_example_it_finds(tmp_path):
    for sign in SIGNS:
        assert sign.example, f"{sign.id}: no example line"
        assert any(t in sign.example for t in sign.triggers), sign.id
        assert all(len(t) <= MAX_TRIGGER for t in sign.triggers), sign.id
        _found(tmp_path, sign, [sign.example])


@pytest.mark.parametrize("tag", TAGS)
def test_every_sign_behind_every_launcher_tag(tmp_path, tag):
    for sign in SIGNS:
        _found(tmp_path, sign, [_with_tag(tag, sign.example)])


@pytest.mark.parametrize("glue", GLUES)
def test_every_sign_glued_to_a_progress_bar(tmp_path, glue):
    for sign in SIGNS:
        _found(tmp_path, sign, [_glue(glue, sign.example)])


def test_every_sign_coloured(tmp_path):
    rng = random.Random(21)
    for sign in SIGNS:
        for kind in ("line", "anywhere", "anywhere", "anywhere"):
            _found(tmp_path, sign, [_colour(kind, sign.example, rng)])


def test_every_sign_cut_at_every_column_of_its_trigger(tmp_path):
    """One cut, at every position inside every trigger occurrence of the example."""
    for sign in SIGNS:
        line = sign.example
        # (A level token shorter than MIN_TRIGGER stands at a line's head: no cut there.)
        cuts = {s + k for t in sign.triggers for s in _starts(line, t) for k in range(1, len(t))
                if not (sign.whole_only and len(t) < MIN_TRIGGER)}
        for c in sorted(cuts):
            _found(tmp_path, sign, [line[:c], line[c:]])


def _starts(line: str, t: str) -> list[int]:
    out, i = [], line.find(t)
    while i >= 0:
        out.append(i)
        i = line.find(t, i + 1)
    return out


@pytest.mark.parametrize("width", range(MAX_TRIGGER, 141))
def test_every_sign_wrapped_by_a_terminal_of_any_width(tmp_path, width):
    for sign in SIGNS:
        _found(tmp_path, sign, _wrap(_with_tag("torchrun_rank", sign.example), width))


_SIGN = {s.id: s for s in SIGNS}


@settings(max_examples=400, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
# Mixes the random search found missed, each standing for its kind:
# the wrap cut "..._client." | "cc:2593] ..." (a full stop inside a file name) with a Ray tag
# and a bar in front: the level is read after the bar, on the trigger's line;
@example(sign=_SIGN["level_line"], tag="ray", glue="tqdm_done", colour="none", width=83, seed=0)
# the same cut with the bar on the trigger's own line: the run is read as a line is read
# (the CRI tag and the bar split off before the level);
@example(sign=_SIGN["level_line"], tag="kubernetes_cri", glue="bar_only", colour="none",
         width=130, seed=0)
# a narrow terminal over a redrawn bar: a piece's width counts from its last \r;
@example(sign=_SIGN["traceback_frame"], tag="none", glue="tqdm_cr", colour="none", width=40,
         seed=0)
@example(sign=_SIGN["nccl_watchdog_timeout"], tag="none", glue="tqdm_cr", colour="none",
         width=41, seed=0)
# a CRI tag starts a record: its line is never the rest of the one before it;
@example(sign=_SIGN["level_line"], tag="kubernetes_cri", glue="none", colour="none", width=49,
         seed=0)
@example(sign=_SIGN["deepspeed_exit"], tag="kubernetes_cri", glue="bar_only", colour="none",
         width=43, seed=0)
# the rest of a wider line, as wide as the log's line after it by chance.
@example(sign=_SIGN["store_timeout"], tag="ray_repeated", glue="tqdm_done", colour="none",
         width=173, seed=0)
@given(sign=st.sampled_from(SIGNS), tag=st.sampled_from(TAGS), glue=st.sampled_from(GLUES),
       colour=st.sampled_from(("none", "line", "anywhere")),
       width=st.one_of(st.none(), st.integers(MAX_TRIGGER, 300)), seed=st.integers(0, 2**31))
def test_sign_survives_any_mix_of_damage(tmp_path_factory, sign, tag, glue, colour, width, seed):
    rng = random.Random(seed)
    line = _glue(glue, sign.example)
    line = _with_tag(tag, line) if tag != "json" or width is None else line
    # Colour codes take no columns: a terminal wraps what shows.
    lines = [line] if width is None else _wrap(line, width)
    i = rng.randrange(len(lines))
    lines[i] = _colour(colour, lines[i], rng) if len(lines[i]) > 1 else lines[i]
    _found(tmp_path_factory.mktemp("recall"), sign, lines)


@pytest.mark.parametrize("sign", [s for s in SIGNS if s.failure], ids=lambda s: s.id)
def test_a_failure_sign_alone_is_never_no_failure(tmp_path, sign):
    """The sign wrapped inside its trigger and coloured: at least ``unknown``, quoted, with
    its line number."""
    t = sign.triggers[0]
    line = sign.example
    c = line.find(t) + len(t) // 2 if t in line else len(line) // 2
    log = tmp_path / "job.log"
    log.write_text(_log([f"\x1b[31m{line[:c]}", f"{line[c:]}\x1b[0m"]))
    d = diagnose([log])
    assert d.cls != "none", (sign.id, d.summary)
    if d.cls == "unknown":
        assert any(f"{log}:{BEFORE + 1}" == w and sign.id in why for w, why in d.evidence), \
            (sign.id, d.evidence)


# The five shapes of issue 21's misses (each was "no failure found"), in the formats of
# the threads cited: pytorch/pytorch#118369 (a Lightning bar glued to torch 1.x lines),
# open-r1#620 (hard wraps inside the words), torchtune#2676 (gloo's wait), the gloo
# "Read error ... Connection reset by peer" of RVC-Project#1882, and Ray's NCCL lines of
# ray-project/ray#59778 with NCCL's IB completion error of NVIDIA/nccl#1664.
MISSES = {
    "torch1x_glued_to_a_bar": (
        "Epoch 0:   6%|██        | 32040/500150 [6:28:43<94:39:17,  1.37it/s, loss=2.6, "
        "v_num=95nc][E ProcessGroupNCCL.cpp:458] [Rank 0] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=96120, OpType=ALLREDUCE, Timeout(ms)=1800000) ran for "
        "25624887 milliseconds before timing out.\n"
        "[E ProcessGroupNCCL.cpp:458] [Rank 7] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=64088, OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 25625251 "
        "milliseconds before timing out.\n"),
    "wrapped_inside_the_words": (
        "[rank2]:[E424 01:11:21.160832730 ProcessGroupNCCL.cpp:629] [Rank 2] Watchdog caught col\n"
        "lective operation timeout: WorkNCCL(SeqNum=4, OpType=BROADCAST, NumelIn=112, NumelOut=112"
        ", Timeout(ms)=1800000) ran for 1800010 milliseconds before timing out.\n"),
    "gloo_send_timeout": (
        "[rank2]:     work.wait()\n"
        "[rank2]: RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:"
        "133] Timed out waiting 1800000ms for send operation to complete\n"),
    "store_connection_reset": (
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:589] Read error "
        "[192.168.70.92]:25266: Connection reset by peer\n"),
    "ray_ib_remote_error": (
        "(RayWorkerWrapper pid=581, ip=10.225.128.18) k8s17:581:581 [0] NCCL INFO Channel 00/0 : "
        "16[17000] -> 18[21000] via P2P/IPC comm 0x5609976f9470 nRanks 32\n"
        "(RayWorkerWrapper pid=581, ip=10.225.128.18) k8s17:581:2506 [0] NCCL WARN NET/IBP:Got "
        "completion from peer 7.6.13.83<36315> with status=12 opcode=32698 len=32696 vendor err "
        "129 (Send)\n"),
}


@pytest.mark.parametrize("name", sorted(MISSES))
def test_issue21_misses_are_not_no_failure(tmp_path, name):
    log = tmp_path / "pasted.log"
    log.write_text(MISSES[name])
    d = diagnose([log])
    assert d.cls != "none", (name, d.summary)
    assert d.evidence, name
