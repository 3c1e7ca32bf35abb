"""``ncclwatch diagnose`` on the corpus: every case's class and initiating ranks.

tests/data/diagnose/cases/<case>/ holds a failed (or healthy) job's logs and
Flight Recorder dumps as they were written, and expected.json with the
verdict a careful human reaches from them. Those cases are made here: gloo
jobs run here (tests/data/diagnose/make_corpus.py) and NCCL-era excerpts
written from the torch sources. tests/data/diagnose/public/<case>/ holds
real logs users pasted into public GitHub issues, exactly as pasted, each
citing its thread; the verdict there is what the thread supports, often a
partial one ("initiator among ranks X"). The table of verdicts is printed
with the test output, the two corpora apart.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ncclwatch.diagnose import diagnose
from ncclwatch.diagnose.lineprefix import rank_of_path
from ncclwatch.diagnose.logscan import scan
from ncclwatch.diagnose.logsigns import SIGNS
from ncclwatch.diagnose.verdict import CLASS_BY_ID
from tests.harness import paths
from tests.harness.corpus import right

DATA = paths.DATA / "diagnose"
CORPUS = DATA / "cases"
PUBLIC = DATA / "public"


def _cases(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if (p / "expected.json").exists()) \
        if root.is_dir() else []


MADE = _cases(CORPUS)
REAL = _cases(PUBLIC)
CASES = MADE + REAL
#: The issue asks for at least this many real, public logs (issue 21: 120, issue 28: 40
#: more), of them at least MIN_TORCH1 in the torch 1.x formats and MIN_NONE with no
#: distributed failure (issue 28: at least 20 more healthy logs).
MIN_REAL = 120 + 40 + 20
MIN_TORCH1 = 20
MIN_NONE = 10 + 20
#: Issue 28's additions (``"issue": 28`` in expected.json): failing logs, healthy logs,
#: OOM kills or segfaults during a save, pastes cut off mid-trace.
MIN_28_FAILING, MIN_28_HEALTHY, MIN_28_SAVE_DEATHS, MIN_28_CUT = 40, 20, 10, 5
#: Signs no case of the corpus shows yet (each says why).
UNCOVERED: dict[str, str] = {
    # Signs added for issue 21 from wordings seen in public threads; the corpus helper
    # (i21-corpus-page) adds those logs as cases, and then these rows go.
    "rendezvous_error": "seen in https://github.com/ai4d-iasc/trixie/issues/77 and "
                        "https://github.com/pytorch/pytorch/issues/64926",
    "store_socket_timeout": "seen in https://github.com/aws-samples/"
                            "amazon-eks-machine-learning-with-terraform-and-kubeflow/issues/89",
    # Issue 28: the heartbeat monitor's own frame, as torch 2.2-2.14 name it
    # (ProcessGroupNCCL::heartbeatMonitor, then HeartbeatMonitor::runLoop); no public paste
    # searched holds the frame without the "Heartbeat monitor timed out" line above it.
    "nccl_heartbeat_frame": "from torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp (2.2-2.14)",
}


def _inputs(case: Path) -> list[Path]:
    return sorted(p for p in case.rglob("*")
                  if p.is_file() and p.name not in ("expected.json", "README.md"))


def _verdict(case: Path):
    return diagnose(_inputs(case)), json.loads((case / "expected.json").read_text())


def _pending(want: dict) -> str | None:
    """A case whose verdict waits on recognisers being added elsewhere (``"needs":
    "<branch>"`` in expected.json): its miss is reported, not failed, until the
    lead merges that branch and drops the key."""
    return want.get("needs")


def test_corpus_is_there():
    assert MADE, f"no cases under {CORPUS}: the corpus is part of the repository"
    assert len(REAL) >= MIN_REAL, f"{len(REAL)} public cases under {PUBLIC}, want {MIN_REAL}"
    classes = {json.loads((c / "expected.json").read_text())["class"] for c in CASES}
    missing = set(CLASS_BY_ID) - classes - {"unknown"}
    assert not missing, f"no corpus case of class {sorted(missing)}"


def _want(case: Path) -> dict:
    return json.loads((case / "expected.json").read_text())


def test_public_corpus_spans_eras_and_healthy_logs():
    """Every torch era is represented, and logs without a failure keep ``none`` honest."""
    torch1 = [c.name for c in REAL if _want(c).get("log_format", "").startswith("torch 1.")]
    healthy = [c.name for c in REAL if _want(c)["class"] == "none"]
    assert len(torch1) >= MIN_TORCH1, f"{len(torch1)} public logs in torch 1.x formats: {torch1}"
    assert len(healthy) >= MIN_NONE, f"{len(healthy)} public logs expecting none: {healthy}"
    for c in REAL:
        assert _pending(_want(c)) in (None, "i21-diagnose"), f"{c.name}: unknown needs"


def test_case_names_do_not_decide_verdicts(tmp_path):
    """A case directory named like ``..._rank0_...`` reads as a per-rank file name
    (lineprefix.rank_of_path); the verdict must not come from the corpus's own naming."""
    named = [c for c in CASES if any(rank_of_path(f"{c.name}/{f.name}") is not None
                                     and rank_of_path(f"case/{f.name}") is None
                                     for f in _inputs(c) if f.parent == c)]
    for case in named:
        neutral = tmp_path / case.name.replace("rank", "r") / "case"
        shutil.copytree(case, neutral)
        a, b = diagnose(_inputs(case)), diagnose(_inputs(neutral))
        assert (a.cls, a.initiating, a.candidates, a.collateral) == \
            (b.cls, b.initiating, b.candidates, b.collateral), case.name


def test_issue28_additions_keep_pace():
    """Issue 28: 40+ failing real logs and 20+ healthy ones, more than half from projects
    the corpus did not hold before, 10+ deaths during a save, 5+ cut off mid-trace."""
    new = [c for c in REAL if _want(c).get("issue") == 28]
    failing = [c for c in new if _want(c)["class"] != "none"]
    healthy = [c for c in new if _want(c)["class"] == "none"]
    saves = [c for c in failing if "death_during_save" in _want(c).get("shapes", [])]
    cut = [c for c in failing if "cut_off" in _want(c).get("shapes", [])]
    assert len(failing) >= MIN_28_FAILING, len(failing)
    assert len(healthy) >= MIN_28_HEALTHY, len(healthy)
    assert len(saves) >= MIN_28_SAVE_DEATHS, [c.name for c in saves]
    assert len(cut) >= MIN_28_CUT, [c.name for c in cut]
    held = {_want(c)["source"]["repo"] for c in REAL if _want(c).get("issue") != 28}
    fresh = [c for c in new if _want(c)["source"]["repo"] not in held]
    assert 2 * len(fresh) > len(new), f"{len(fresh)} of {len(new)} from projects not held before"
    for c in saves:
        assert _want(c)["class"] in ("rank_crash", "gather_oom"), c.name


def test_public_cases_cite_their_source():
    readme = (DATA / "README.md").read_text()
    for case in REAL:
        src = json.loads((case / "expected.json").read_text())["source"]
        assert src["url"].startswith("https://github.com/"), case.name
        assert src["repo"] and src["number"] and src["comment"], case.name
        assert src["url"] in readme and case.name in readme, f"{case.name} not cited in README"


@pytest.mark.parametrize("case", CASES, ids=[f"{c.parent.name}/{c.name}" for c in CASES])
def test_case(case):
    d, want = _verdict(case)
    assert want["class"] in CLASS_BY_ID, f"{case.name}: unknown class {want['class']!r}"
    got = (d.cls, d.initiating, d.candidates)
    if _pending(want) and not right(d, want):
        pytest.xfail(f"{case.name}: needs {_pending(want)}: got {got}, expected "
                     f"{want['class']} {want.get('initiating_ranks')}")
    assert right(d, want), (
        f"{case.name}: got {got} collateral {d.collateral}, expected {want['class']} "
        f"{want.get('initiating_ranks')} among {want.get('initiator_among')} collateral "
        f"{want.get('collateral_ranks')}\nsummary: {d.summary}\nevidence: {d.evidence}")
    if d.cls not in ("none", "unknown"):
        assert d.evidence, f"{case.name}: a verdict without evidence lines"
        assert d.root_cause is not None and d.root_cause.fix
    if d.cls != "none" and not d.initiating:
        # A partial verdict says what is missing and what to collect next time.
        assert d.missing_evidence and d.collect_next_time, case.name
    for r in d.initiating:
        assert r not in d.collateral, f"{case.name}: rank {r} both initiating and collateral"


def _table(cases: list[Path]) -> tuple[list[str], list[str], list[str]]:
    """Rows, the wrong cases, and the pending ones (wrong, waiting on ``needs``)."""
    rows, wrong, pending = [], [], []
    for case in cases:
        d, want = _verdict(case)
        ok = right(d, want)
        if not ok:
            (pending if _pending(want) else wrong).append(case.name)
        exp = f"{want['class']} {want.get('initiating_ranks', [])}"
        got = f"{d.cls} {d.initiating}"
        if "initiator_among" in want or d.candidates:
            exp += f" among {want.get('initiator_among')}"
            got += f" among {d.candidates}"
        mark = "ok" if ok else f"pending ({_pending(want)})" if _pending(want) else "WRONG"
        if ok and _pending(want):
            mark = f"ok (drop needs: {_pending(want)})"
        rows.append(f"| {case.name} | {exp} | {got} | {mark} | "
                    f"{want.get('origin', '')[:70]} |")
    return rows, wrong, pending


def test_corpus_table(capsys):
    """Print the verdict of every case (the acceptance table), real logs apart, and check them."""
    head = "| case | expected | diagnosed | | origin |\n|---|---|---|---|---|"
    made_rows, made_wrong, made_pending = _table(MADE)
    real_rows, real_wrong, real_pending = _table(REAL)
    with capsys.disabled():
        bad = len(real_wrong) + len(real_pending)
        torch1 = sum(_want(c).get("log_format", "").startswith("torch 1.") for c in REAL)
        healthy = sum(_want(c)["class"] == "none" for c in REAL)
        new = [c for c in REAL if _want(c).get("issue") == 28]
        new_bad = sum(c.name in real_wrong + real_pending for c in new)
        print(f"\n\nReal logs from public issues: {len(REAL) - bad}/{len(REAL)} right"
              f" ({torch1} in torch 1.x formats, {healthy} without a failure; issue 28 added "
              f"{len(new)}: {len(new) - new_bad}/{len(new)} right, "
              f"{sum(_want(c)['class'] == 'none' for c in new)} healthy)"
              + (f", {len(real_pending)} pending on new recognisers: "
                 f"{' '.join(real_pending)}" if real_pending else ""))
        print(head)
        print("\n".join(real_rows))
        bad = len(made_wrong) + len(made_pending)
        print(f"\nCases made here: {len(MADE) - bad}/{len(MADE)} right")
        print(head)
        print("\n".join(made_rows))
    assert not made_wrong + real_wrong, f"wrong verdicts: {made_wrong + real_wrong}"


def test_every_sign_is_seen_in_the_corpus():
    """Each row of the sign table matches some line of the corpus (no dead rows)."""
    seen: set[str] = set()
    for case in CASES:
        r = scan(_inputs(case))
        seen |= {e.sign for e in r.evidence}
        if r.tracebacks:
            seen.add("traceback")
        if r.failures:
            seen |= {"summary_host", "summary_rank", "summary_exitcode"}
            if any(f.stamp for f in r.failures):
                seen.add("summary_time")
            if any(f.signame for f in r.failures):
                seen.add("summary_signal")
            if any(f.root for f in r.failures):
                seen.add("summary_root")
        if r.world_sizes:
            seen.add("world_size")
    dead = {s.id for s in SIGNS} - seen - set(UNCOVERED)
    assert not dead, f"signs no corpus line matches: {sorted(dead)}"
    stale = seen & set(UNCOVERED)
    assert not stale, f"UNCOVERED lists signs a corpus line now matches: {sorted(stale)}"
