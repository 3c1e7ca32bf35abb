"""``make bench``: run the benchmarks and write BENCHMARKS.md.

Each section keeps the command that produced it and the machine it ran on;
numbers are ratios within one run where the machine's noise matters.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "BENCHMARKS.md"
GPU_HEADING = "## Agent overhead on GPU-shaped jobs"


def splice(text: str, heading: str, section: str) -> str:
    """``text`` with the section under ``heading`` replaced by ``section`` (up to the
    next ``## ``), or, when it has none, ``section`` put after "## Agent overhead"'s."""
    lines = text.splitlines()
    new = section.rstrip("\n").splitlines() + [""]

    def end_of(i: int) -> int:
        j = i + 1
        while j < len(lines) and not lines[j].startswith("## "):
            j += 1
        return j

    if heading in lines:
        i = lines.index(heading)
        return "\n".join(lines[:i] + new + lines[end_of(i):]).rstrip("\n") + "\n"
    at = next((end_of(i) for i, x in enumerate(lines) if x == "## Agent overhead"), len(lines))
    return "\n".join(lines[:at] + new + lines[at:]).rstrip("\n") + "\n"


def gpu_section(quick: bool) -> str:
    """The GPU-shaped rows of the agent overhead, with their command."""
    from bench import agent_overhead
    from bench import targets
    r = agent_overhead.measure_gpu(quick=quick)
    cmd = "python -m bench.agent_overhead --gpu-shaped" + (" --quick" if quick else "")
    targets.record("agent_gpu", r, cmd)
    return "\n".join([GPU_HEADING, "", f"Command: `{cmd}` ({datetime.date.today().isoformat()})",
                      "", agent_overhead.render_gpu(r), ""])


def write_targets(records: dict | None = None) -> str:
    """The Targets table (bench/targets.py) spliced into BENCHMARKS.md; returned."""
    from bench import targets

    section = targets.table(records)
    text = OUT.read_text() if OUT.exists() else "# Benchmarks\n"
    lines = text.splitlines()
    if targets.HEADING in lines:
        OUT.write_text(splice(text, targets.HEADING, section))
    else:   # first thing after the file's header paragraph
        at = next((i for i, x in enumerate(lines) if i and x.startswith("## ")), len(lines))
        OUT.write_text("\n".join(lines[:at] + section.splitlines() + [""] + lines[at:])
                       .rstrip("\n") + "\n")
    return section


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="smaller runs (minutes, not tens)")
    ap.add_argument("--only", choices=("agent", "gpu", "daemon", "diagnose", "discovery"),
                    default=None, help="one section, printed; BENCHMARKS.md is left as it "
                    "is, except its Targets table, and --only gpu rewrites its own section")
    ap.add_argument("--targets", action="store_true",
                    help="only write the Targets table from the recorded runs "
                         "(bench/targets.json), running nothing")
    a = ap.parse_args()
    if a.targets:
        print(write_targets())
        return 0
    from bench import targets
    cmd = "make bench" + (" BENCH_ARGS=--quick" if a.quick else "")
    head = [
        "# Benchmarks", "",
        f"Written by `{cmd}` (`python -m bench.run{' --quick' if a.quick else ''}`) on "
        f"{datetime.date.today().isoformat()}: {os.cpu_count()} cores, "
        f"{platform.machine()}, Python {platform.python_version()}, {platform.platform()}.",
        "The machine is small and shared: compare the ratios, not the absolute numbers.", "",
    ]
    sections: list[str] = []
    verdicts = ""
    if a.only in (None, "agent"):
        from bench import agent_overhead
        r = agent_overhead.measure(seconds=20 if a.quick else 60, warmup=8 if a.quick else 10,
                                   repeats=1 if a.quick else 2)
        agent_cmd = ("python -m bench.agent_overhead"
                     + (" --seconds 20 --warmup 8 --repeats 1" if a.quick else ""))
        targets.record("agent", r, agent_cmd)
        sections += ["## Agent overhead", "", f"Command: `{agent_cmd}`", "",
                     agent_overhead.render(r), ""]
    if a.only in (None, "gpu"):
        sections += [gpu_section(a.quick)]
    if a.only in (None, "daemon"):
        try:
            from bench import daemon_ingest
        except ImportError as e:
            sections += ["## Daemon ingest", "", f"not run: {e}", ""]
        else:
            flag = "--quick" if a.quick else "--full"
            r = daemon_ingest.measure(daemon_ingest.QUICK if a.quick else daemon_ingest.FULL)
            targets.record("daemon", r, f"python -m bench.daemon_ingest {flag}")
            targets.record("replay", r["core_replay"], f"python -m bench.daemon_ingest {flag}")
            sections += ["## Daemon targets", "",
                         "Judged in the Targets table above, from the run below. What the "
                         "figures are:", "", *[f"- {x}" for x in targets.MEANING], "",
                         "## Daemon ingest and API at scale", "",
                         f"Command: `python -m bench.daemon_ingest {flag}`", "",
                         daemon_ingest.render(r), ""]
            verdicts = targets.plain("daemon", r) + "\n" + targets.plain("replay",
                                                                           r["core_replay"])
    if a.only in (None, "diagnose"):
        from bench import diagnose_log
        size = 0.25 if a.quick else 1.0
        r = diagnose_log.measure(int(size * 1e9))
        targets.record("diagnose", r, f"python -m bench.diagnose_log --size {size:g}")
        sections += ["## ncclwatch diagnose on a big log", "",
                     f"Command: `python -m bench.diagnose_log --size {size:g}`", "",
                     diagnose_log.render(r), ""]
    if a.only in (None, "discovery"):
        from bench import discovery
        r = discovery.measure()
        sections += ["## Discovery per round", "", "Command: `python -m bench.discovery`", "",
                     discovery.render(r), ""]
    text = "\n".join(head + [targets.table(), ""] + sections).rstrip() + "\n"
    if a.only == "gpu" and OUT.exists():
        OUT.write_text(splice(OUT.read_text(), GPU_HEADING, sections[-1]))
        write_targets()
        print(sections[-1])
        return 0
    if a.only and OUT.exists():
        write_targets()
        print(text)
        if verdicts:
            print("\ndaemon targets (this run):\n" + verdicts)
        print(f"(--only: {OUT.name} left as it is, but for its Targets table)", file=sys.stderr)
        return 0
    OUT.write_text(text)
    print(text)
    if verdicts:
        print("\ndaemon targets (this run):\n" + verdicts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
