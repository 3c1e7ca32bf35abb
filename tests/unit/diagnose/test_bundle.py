"""``ncclwatch diagnose`` on an evidence bundle says what the live verdict said.

The bundles are made the real way: a daemon fed the reports of a checkpoint
stall (rank 0 in torch.save, ranks 1-3 in broadcast), packed by the daemon's
own bundle writer (daemon/bundle.py), read back by the ``ncclwatch diagnose``
command. A stall still live when the bundle was taken has not outlasted the
timeout: the headline says it was live, with the budget left then. Beside a
public log whose waiters' watchdog fired (aioz-ai/GCD issue 6: ranks 1-3 time
out in BROADCAST, rank 0 silent), the live checkpoint verdict leads and the
log's generic hang supports it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ncclwatch.daemon import bundle as writer
from ncclwatch.daemon.core import Daemon, DaemonConfig
from ncclwatch.daemon.incidents import SETTLE
from ncclwatch.diagnose import verdict
from ncclwatch.model import CollectiveOp as Op
from ncclwatch.model import RankState as S
from tests.harness.corpus import DIAGNOSE
from tests.harness.reports import MB, SAVE, rank0_sample, report, sample, stack_pb

PUBLIC = DIAGNOSE / "public"
#: Ranks 1-3 "Watchdog caught collective operation timeout" in BROADCAST (1800 s).
WATCHDOG_LOG = PUBLIC / "gcd_6_v1_12_quoted_broadcast_r0_silent" / "console.log"
#: Rank 0 SIGKILLed (torchrun's root cause): a crash, as specific as a checkpoint stall.
CRASH_LOG = PUBLIC / "cppo_6_root_cause_sigkill_r0" / "console.log"


def _bundle(tmp_path: Path, *, timeout: float, rate: int, prev: int, seconds: int = 10,
            then: str | None = None) -> tuple[Path, dict]:
    """A bundle of a job whose rank 0 saves while 1-3 wait in broadcast, taken
    ``seconds`` into the stall (``then`` None: still live), or after the stall
    ended: ``"went_on"`` (every rank back at work: completed) or
    ``"waiters_killed"`` (the waiters' processes gone 25 s into their wait)."""
    d = Daemon(DaemonConfig(stall_threshold=5.0))

    def feed(i: int, waiters: S | None) -> float:
        now = 1000.0 + i
        r0 = (rank0_sample(S.SAVING, i, file_size=min((i + 1) * rate, prev), prev=prev,
                           seconds=i, timeout=timeout) if waiters is not S.COMPUTE
              else sample("job-1", 0, 4, S.COMPUTE, seconds=0.5, timeout=timeout))
        r0.stack_id = stack_pb(SAVE).id if waiters is not S.COMPUTE else ""
        op = Op.BROADCAST if waiters is S.COLLECTIVE else Op.NONE
        rest = [sample("job-1", r, 4, waiters, op, seconds=i if op is Op.BROADCAST else 0.5,
                       timeout=timeout) for r in (1, 2, 3)] if waiters else []
        req = report([r0, *rest], seq=i + 1, stacks=[stack_pb(SAVE)])
        req.report.agent_monotonic_seconds = now     # the agent's clock keeps the daemon's pace
        d.ingest(req, now=now)
        d.tick(now=now, wall=now)
        return now

    for i in range(seconds):
        now = feed(i, S.COLLECTIVE)
    if then is not None:
        now = feed(25, None) if then == "waiters_killed" else feed(seconds + 4, S.COMPUTE)
        now += SETTLE + 0.1                          # the outcome is decided once exits show
        d.tick(now=now, wall=now)
    docs = writer.collect(d, "job-1", now=now)
    stall = docs["verdict"]["stalls"][0]
    assert stall["kind"] == "checkpoint_gather" and stall["active"] is (then is None), stall
    name, body = writer.archive(docs)
    path = tmp_path / (then or "live") / name
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(body)
    return path, stall


def _diagnose(*paths: Path) -> tuple[dict, str]:
    """``ncclwatch diagnose --json`` and the text, as a user runs them."""
    run = [sys.executable, "-m", "ncclwatch", "diagnose"]
    j = subprocess.run([*run, "--json", *map(str, paths)], capture_output=True, text=True,
                       timeout=120)
    t = subprocess.run([*run, *map(str, paths)], capture_output=True, text=True, timeout=120)
    assert j.returncode == t.returncode == 1, (j.stderr, t.stderr)   # a failure found
    return json.loads(j.stdout), t.stdout


def test_a_bundle_taken_with_budget_left_reads_as_live_not_as_outlasted(tmp_path) -> None:
    # 150 MB at 10 MB/s against a 90 s timeout the job declared: forecast to fit.
    path, stall = _bundle(tmp_path, timeout=90.0, rate=10 * MB, prev=150 * MB)
    assert stall["diagnosis"]["root_cause"] == "save_within_budget", stall["diagnosis"]
    left = stall["watchdog"]["remaining_seconds"]
    assert 0 < left < 90
    v, text = _diagnose(path)

    assert (v["class"], v["initiating_ranks"], v["collateral_ranks"]) == \
        ("checkpoint_gather_timeout", [0], [1, 2, 3]), v
    assert "outlasted" not in v["title"]
    assert f"live when the bundle was taken, {left:.0f} s of the 90 s timeout left" in v["title"]
    live = v["live"]
    assert live["led"] and live["active"] and live["kind"] == "checkpoint_gather"
    assert live["culprits"][0]["rank"] == 0 and live["culprits"][0]["state"] == "saving"
    assert live["root_cause"] == v["root_cause"]["id"] == "save_within_budget"
    w = live["watchdog"]
    assert (w["timeout_seconds"], w["remaining_seconds"], w["timeout_source"],
            w["timeout_assumed"], w["as_of"]) == (90.0, left, "job", False, "taken"), w
    assert live["advice"]["action"] == stall["advice"]["action"]
    assert live["outcome"] is None and v["timeout_seconds"] == 90.0

    # The text: no "outlasted" beside "Nothing to do now"; the budget as it stood.
    assert "Nothing to do now" in text and "outlasted" not in text, text
    assert f"watchdog: {left:.0f} s of the 90 s timeout left when taken (timeout learned " \
           "from the job)" in text
    assert "collateral rank(s): 1-3  (waiting for them when the bundle was taken)" in text
    assert "only timed out" not in text
    assert f"advice when taken: {stall['advice']['headline']}" in text
    assert "root cause (save_within_budget): rank 0 is writing" in text
    assert "  outcome:" not in text                   # not known: nothing said


def test_a_bundle_under_the_default_timeout_says_the_timeout_was_assumed(tmp_path) -> None:
    path, stall = _bundle(tmp_path, timeout=0.0, rate=10 * MB, prev=150 * MB)
    v, text = _diagnose(path)
    w = v["live"]["watchdog"]
    assert (w["timeout_source"], w["timeout_assumed"], w["timeout_seconds"]) == \
        ("default", True, 600.0), w
    assert "of the 600 s timeout left when taken (timeout assumed:" in text, text
    assert "outlasted" not in text


def test_the_incidents_outcome_in_the_bundle_is_said_and_settles_the_headline(tmp_path) -> None:
    path, stall = _bundle(tmp_path, timeout=90.0, rate=10 * MB, prev=150 * MB, then="went_on")
    assert stall["outcome"]["outcome"] == "completed", stall["outcome"]
    v, text = _diagnose(path)
    assert v["live"]["outcome"] == "completed" and v["live"]["outcome_from"] == "bundle"
    assert v["title"].endswith("; it completed before the watchdog fired"), v["title"]
    assert "outcome: it completed before the watchdog fired (from the bundle: completed:" in text
    assert "collateral rank(s): 1-3  (waited for them)" in text
    assert "outlasted" not in text and "left when last seen live" in text

    # The waiters killed 25 s into a wait forecast to fit: the class's own title
    # holds, and the fix is the overrunning save's, not "nothing to do now".
    path, stall = _bundle(tmp_path, timeout=90.0, rate=10 * MB, prev=150 * MB,
                          then="waiters_killed")
    assert stall["outcome"]["outcome"] == "killed_by_watchdog", stall["outcome"]
    assert stall["diagnosis"]["root_cause"] == "save_within_budget"
    v, text = _diagnose(path)
    assert v["title"] == verdict.CLASS_BY_ID["checkpoint_gather_timeout"].title
    assert (v["root_cause"]["id"], v["live"]["root_cause"]) == \
        ("save_overruns_watchdog", "save_within_budget")
    assert "Nothing to do now" not in text and "outcome: the watchdog fired (from the bundle" \
        in text
    assert any("forecast save_within_budget, but the watchdog fired" in n for n in v["notes"])


def test_a_watchdog_log_with_a_checkpoint_bundle_leads_with_the_checkpoint(tmp_path) -> None:
    # The job's 1800 s timeout, and a save of 4000 MB at 1 MB/s: forecast to overrun.
    path, stall = _bundle(tmp_path, timeout=1800.0, rate=MB, prev=4000 * MB)
    assert stall["at_risk"] and stall["diagnosis"]["root_cause"] == "save_overruns_watchdog"
    alone, _ = _diagnose(WATCHDOG_LOG)
    assert alone["class"] == "collective_hang" and alone["initiating_ranks"] == []
    v, text = _diagnose(WATCHDOG_LOG, path)

    assert (v["class"], v["initiating_ranks"], v["collateral_ranks"], v["initiator_among"]) \
        == ("checkpoint_gather_timeout", [0], [1, 2, 3], []), v
    assert v["live"]["led"] and v["timed_out_ranks"] == [1, 2, 3]
    assert (v["live"]["outcome"], v["live"]["outcome_from"]) == ("killed_by_watchdog", "logs")
    assert v["notes"][0].startswith("the logs agree: the waiters' watchdog fired, as forecast "
                                    "(ranks 1-3 timed out)"), v["notes"]
    assert v["root_cause"]["id"] == "save_overruns_watchdog"
    assert v["evidence"][0]["where"] == str(path)                 # the live verdict first,
    assert any("Watchdog caught collective operation timeout" in e["why"]
               for e in v["evidence"][1:])                        # the log's lines support it
    assert v["timeout_seconds"] == 1800.0 and v["timeout_from"] == "the logs"
    head = text.splitlines()[0]
    assert head.startswith("Checkpoint gather/save outlasted the process-group timeout"), head
    assert "outcome: the watchdog fired (from the logs)" in text
    assert "the live verdict: checkpoint_gather" not in text    # no longer a footnote


def test_a_log_as_specific_as_the_bundle_keeps_its_headline(tmp_path) -> None:
    """A crash the log names (rank 0 SIGKILLed, say during the save) is as specific
    as the live checkpoint stall: the log, written later, leads; the live verdict
    is a note and its block says the logs lead."""
    path, _ = _bundle(tmp_path, timeout=90.0, rate=10 * MB, prev=150 * MB)
    v, text = _diagnose(CRASH_LOG, path)
    assert v["class"] == "rank_crash" and v["initiating_ranks"] == [0], v
    assert not v["live"]["led"] and v["live"]["kind"] == "checkpoint_gather"
    assert any(n.startswith("the daemon's live verdict: checkpoint_gather") for n in v["notes"])
    assert "; the logs lead):" in text


def test_the_headline_rule_is_a_ranking_of_the_classes() -> None:
    rank = {c.id: c.specificity for c in verdict.CLASSES}
    assert rank["none"] < rank["unknown"] < rank["collective_hang"] \
        < rank["checkpoint_gather_timeout"] < rank["gather_oom"]
    assert rank["checkpoint_gather_timeout"] == rank["rank_crash"] == rank["desync"]
    # Naming the initiator breaks a tie of classes; ranks it must be among do not.
    assert verdict.specificity("collective_hang", [0]) > verdict.specificity("collective_hang", [])
    assert verdict.specificity("collective_hang", [0]) < \
        verdict.specificity("checkpoint_gather_timeout", [])
