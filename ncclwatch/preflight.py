"""``ncclwatch preflight``: will a full checkpoint on one rank fit the watchdog? Before the job.

The stall ncclwatch watches for at run time (rank 0 writes the whole state
while the others wait in the next collective) can be predicted before the
first checkpoint: the checkpoint's size over the directory's sustained
write rate, against the process-group timeout. This measures the rate as
torch.save meets it (large buffered writes, no fsync: torch's zip writer
hands each storage to one ``ofstream`` write and never syncs), then times the
fsync as a phase of its own, bounded like the writes (a probe sitting in the
page cache of slow storage can take minutes to sync; a child process waits
for it, so the bound holds even when the kernel does not return), removes
the probe file, reads the timeout and the NCCL/torch settings from the environment or the
flags, and says it in the live forecast's words (savefit.py). Rerun it in
CI on every dependency or storage change.

Exit status: 0 fits with at least ``--margin`` of the timeout to spare;
1 does not fit (the save outlasts the timeout); 3 fits, but with less than
``--margin`` to spare; 2 bad usage or the directory cannot be written.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Mapping

from ncclwatch import envlint, frameworks
from ncclwatch.agent.timeouts import TIMEOUT_ENV, declared_timeout_from
from ncclwatch.remediation import fixes_for
from ncclwatch.savefit import Fit, save_seconds, seconds, size

EXIT_FITS, EXIT_OVERRUNS, EXIT_USAGE, EXIT_TIGHT = 0, 1, 2, 3
#: NCCL's default process-group timeout (torch.distributed's for NCCL).
DEFAULT_TIMEOUT = 600.0

#: Bytes per parameter of each dtype.
DTYPE_BYTES: dict[str, int] = {
    "float32": 4, "fp32": 4, "float": 4, "tf32": 4, "bfloat16": 2, "bf16": 2,
    "float16": 2, "fp16": 2, "half": 2, "float8": 1, "fp8": 1, "int8": 1, "float64": 8,
}
#: Optimizer state saved with the model, bytes per parameter (fp32 states;
#: Adam: two moments, plus an fp32 master copy when the model is in 16 bits).
OPTIMIZER_STATES: dict[str, int] = {"none": 0, "sgd": 0, "sgd-momentum": 1, "adam": 2,
                                    "adamw": 2, "adafactor": 1}

#: Sizes in bytes (--size, --probe-bytes): SI and binary multiples; a trailing
#: ``B`` is bytes, never billions.
BYTE_UNITS: dict[str, float] = {
    "": 1, "B": 1, "K": 1e3, "KB": 1e3, "M": 1e6, "MB": 1e6, "G": 1e9, "GB": 1e9,
    "T": 1e12, "TB": 1e12, "KI": 1 << 10, "KIB": 1 << 10, "MI": 1 << 20, "MIB": 1 << 20,
    "GI": 1 << 30, "GIB": 1 << 30, "TI": 1 << 40, "TIB": 1 << 40,
}
#: Parameter counts (--params): a plain count; ``B`` is billions, as models are named.
COUNT_UNITS: dict[str, float] = {"": 1, "K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}
#: Units that mean something else in the other table, and what to write instead.
_NOT_A_SIZE = "a size in bytes: 500, 500B, 64MiB, 140GB (B is bytes, b would be bits)"
_NOT_A_COUNT = ("a count of parameters: 7e9, 7B (billions), 350M; a size in bytes goes "
                "to --size")


def _parse(text: str, units: dict[str, float], what: str) -> float:
    m = re.fullmatch(r"\s*([0-9][0-9_]*(?:\.[0-9_]*)?(?:[eE][0-9]+)?)\s*([A-Za-z]*)\s*", text)
    unit = m.group(2) if m else ""
    # Case matters only where it would mislead: b (bits) is not B (bytes).
    if m is None or unit.upper() not in units or (units is BYTE_UNITS and unit.endswith("b")):
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
    return float(m.group(1).replace("_", "")) * units[unit.upper()]


def size_bytes(text: str) -> float:
    """``--size``: ``500`` and ``500B`` are 500 bytes; ``140G``/``140GB`` decimal,
    ``2Gi``/``2GiB`` binary; ``500b`` (bits?) and parameter counts are refused."""
    return _parse(text, BYTE_UNITS, _NOT_A_SIZE)


def count(text: str) -> float:
    """``--params``: ``7e9``, ``7B`` (billions), ``350M``, ``1_000``; bytes are refused."""
    return _parse(text, COUNT_UNITS, _NOT_A_COUNT)


def checkpoint_bytes(params: float, dtype: str, optimizer: str) -> int:
    """A full checkpoint's size: the weights, plus the optimizer's fp32 states (and
    an fp32 master copy of 16-bit weights when there is an optimizer)."""
    per = DTYPE_BYTES[dtype]
    states = OPTIMIZER_STATES[optimizer]
    if states:
        per += 4 * states + (4 if DTYPE_BYTES[dtype] < 4 else 0)
    return int(params * per)


@dataclass
class Probe:
    """The directory's write rate as torch.save meets it, and the fsync after."""

    bytes_written: int
    seconds: float                 # the writes (no fsync): what torch.save waits for
    fsync_seconds: float = 0.0     # the fsync phase, as long as it was waited for
    fsync_done: bool = True        # False: still syncing when its bound ran out
    #: The child process still syncing (fsync_done False; it removes the probe
    #: file when done), for a caller that wants to reap it; 0 otherwise.
    fsync_pid: int = 0

    @property
    def rate(self) -> float:
        return self.bytes_written / self.seconds if self.seconds > 0 else 0.0

    @property
    def synced_rate(self) -> float:
        """Bytes over writes plus fsync: the storage's own pace (an upper bound
        when the fsync had not finished)."""
        t = self.seconds + self.fsync_seconds
        return self.bytes_written / t if t > 0 else 0.0


def _timed_fsync(fd: int, path: Path, bound: float) -> tuple[float, bool, int]:
    """fsync ``fd`` in a child process and wait at most ``bound`` seconds:
    (seconds waited, finished, pid of a child still syncing or 0). The child
    removes the probe file once synced: a removal by this process would wait
    on the file's lock behind the fsync. A thread would not do either: a
    process cannot exit while one of its threads sleeps in the kernel, and an
    fsync of slow storage can sleep for minutes."""
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:                                   # the child: sync, remove, nothing else
        code = 0
        try:
            os.fsync(fd)
        except BaseException:
            code = 1
        try:
            path.unlink()
        except BaseException:
            pass
        os._exit(code)
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        waited = time.monotonic() - t0
        if done:
            if os.waitstatus_to_exitcode(status) != 0:
                raise OSError(f"fsync failed after {waited:.1f}s")
            return waited, True, 0
        if waited >= bound:
            return waited, False, pid
        time.sleep(min(0.02, bound - waited + 0.001))


def measure(directory: Path, max_bytes: int, max_seconds: float,
            block: int = 4 << 20, fsync_seconds: float | None = None) -> Probe:
    """Write random blocks into a probe file until ``max_bytes`` or
    ``max_seconds`` (the rate torch.save sees: buffered writes, no fsync),
    then fsync it within ``fsync_seconds`` (default: ``max_seconds``) as a
    phase of its own; the file is removed (by the syncing child, when the
    bound ran out first)."""
    data = os.urandom(block)  # incompressible: no storage gets it for free
    # Unique per probe, not per process: an earlier probe's fsync, cut at its bound,
    # may still hold its file (its child removes it when the storage catches up).
    path = directory / f".ncclwatch-preflight-{os.getpid()}-{secrets.token_hex(4)}.tmp"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    synced = False
    try:
        written = 0
        t0 = time.monotonic()
        while written < max_bytes and time.monotonic() - t0 < max_seconds:
            n = min(block, max_bytes - written)
            written += os.write(fd, data[:n])
        wrote = time.monotonic() - t0
        waited, done, pid = _timed_fsync(
            fd, path, max_seconds if fsync_seconds is None else fsync_seconds)
        synced = True
        return Probe(written, wrote, waited, done, pid)
    finally:
        os.close(fd)
        if not synced:
            try:
                path.unlink()
            except FileNotFoundError:
                pass


@dataclass
class Verdict:
    directory: str
    checkpoint_bytes: int
    size_from: str
    write_bytes_per_second: float
    probe_bytes: int
    probe_seconds: float
    fsync_seconds: float
    fsync_finished: bool
    synced_bytes_per_second: float
    timeout_seconds: float
    timeout_from: str
    save_seconds: float
    margin_seconds: float
    fits: bool
    tight: bool
    words: str
    framework: str
    env_warnings: list[dict[str, str]] = field(default_factory=list)
    fixes: list[dict[str, str]] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        if not self.fits:
            return EXIT_OVERRUNS
        return EXIT_TIGHT if self.tight else EXIT_FITS


def judge(directory: Path, nbytes: int, size_from: str, probe: Probe, timeout: float,
          timeout_from: str, margin: float, framework: str,
          env: Mapping[str, str]) -> Verdict:
    """The same arithmetic as the live forecast: bytes over rate against the budget."""
    needs = save_seconds(nbytes, 0, probe.rate)
    fit = Fit(needs if needs is not None else float("inf"), timeout)
    tight = fit.fits and fit.margin_seconds < margin * timeout
    fixes = [] if fit.fits and not tight else [
        {"remedy": f.remedy, "framework": f.framework, "text": f.text, "lang": f.lang,
         "snippet": f.snippet} for f in fixes_for(framework, "save_overruns_watchdog")]
    return Verdict(
        directory=str(directory), checkpoint_bytes=nbytes, size_from=size_from,
        write_bytes_per_second=round(probe.rate, 1), probe_bytes=probe.bytes_written,
        probe_seconds=round(probe.seconds, 3), fsync_seconds=round(probe.fsync_seconds, 3),
        fsync_finished=probe.fsync_done, synced_bytes_per_second=round(probe.synced_rate, 1),
        timeout_seconds=timeout,
        timeout_from=timeout_from, save_seconds=round(fit.needs_seconds, 2),
        margin_seconds=round(fit.margin_seconds, 2), fits=fit.fits, tight=tight,
        words=f"a full save of {size(nbytes)} on one rank at {size(probe.rate)}/s "
              + fit.words(), framework=framework,
        env_warnings=[asdict(w) for w in envlint.lint(env)], fixes=fixes)


def render(v: Verdict) -> str:
    head = {EXIT_FITS: "FITS", EXIT_TIGHT: "FITS, BARELY", EXIT_OVERRUNS: "DOES NOT FIT"}
    out = [f"{head[v.exit_code]}: {v.words}.",
           f"  checkpoint: {size(v.checkpoint_bytes)} ({v.size_from})",
           f"  {v.directory}: {size(v.write_bytes_per_second)}/s as torch.save writes "
           f"({size(v.probe_bytes)} in {v.probe_seconds:.1f}s, no fsync)",
           f"  fsync: " + (f"{v.fsync_seconds:.1f}s, {size(v.synced_bytes_per_second)}/s "
                           f"with it" + ("" if v.synced_bytes_per_second * 2 >=
                                         v.write_bytes_per_second else
                                         ": the page cache took the probe; a save larger than "
                                         "it goes at the storage's pace")
                           if v.fsync_finished else
                           f"not done after {v.fsync_seconds:.1f}s (the bound): the storage "
                           f"takes under {size(v.synced_bytes_per_second)}/s; a save larger "
                           f"than the page cache goes at its pace"),
           f"  watchdog timeout: {seconds(v.timeout_seconds)} ({v.timeout_from})"]
    if v.tight:
        out.append(f"  under the margin asked for: storage slower by a third, or a model a "
                   f"third larger, and it will not fit.")
    for w in v.env_warnings:
        out.append(f"  {w['severity'].upper()} ({w['code']}): {w['message']}")
    if v.fixes:
        out.append(f"Fix for {frameworks.BY_ID[v.framework].name}:")
        for f in v.fixes:
            out.append(f"  - {f['text']}")
            out += [f"      {line}" for line in f["snippet"].splitlines()]
    return "\n".join(out)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dir", required=True, type=Path, metavar="DIR",
                   help="the checkpoint directory (its storage is measured)")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--size", type=size_bytes, metavar="BYTES",
                      help="checkpoint size in bytes: 500 or 500B, K M G T (decimal), "
                           "Ki Mi Gi Ti (binary), with or without a final B")
    what.add_argument("--checkpoint", type=Path, metavar="FILE",
                      help="an existing checkpoint: its size (a directory: all its files)")
    what.add_argument("--params", type=count, metavar="N",
                      help="parameter count with --dtype: 7e9, or 7B (billions), 350M, 2T")
    p.add_argument("--dtype", choices=sorted(DTYPE_BYTES), default=None,
                   help="dtype of the weights (with --params)")
    p.add_argument("--optimizer", choices=sorted(OPTIMIZER_STATES), default="none",
                   help="optimizer whose state is saved too (with --params; default none)")
    p.add_argument("--timeout", type=float, metavar="SECONDS", default=None,
                   help=f"process-group timeout (default: ${TIMEOUT_ENV[0]}, else NCCL's "
                        f"{DEFAULT_TIMEOUT:.0f})")
    p.add_argument("--framework", choices=[f.id for f in frameworks.FRAMEWORKS],
                   default="torch", help="the framework whose fix to print (default torch)")
    p.add_argument("--margin", type=float, default=0.25, metavar="SHARE",
                   help="share of the timeout to keep free (default 0.25; less: exit 3)")
    p.add_argument("--probe-bytes", type=size_bytes, default=1 << 30, metavar="BYTES",
                   help="most bytes to write when measuring (default 1GiB)")
    p.add_argument("--probe-seconds", type=float, default=10.0, metavar="SECONDS",
                   help="most seconds to write when measuring, and again to wait for the "
                        "fsync after (default 10)")
    p.add_argument("--json", action="store_true", help="the verdict as JSON")


def main(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    if args.params is not None and args.dtype is None:
        print("ncclwatch preflight: --params needs --dtype", file=sys.stderr)
        return EXIT_USAGE
    if args.size is not None:
        nbytes, size_from = int(args.size), "--size"
    elif args.checkpoint is not None:
        c = args.checkpoint
        if not c.exists():
            print(f"ncclwatch preflight: {c}: no such file", file=sys.stderr)
            return EXIT_USAGE
        nbytes = (sum(f.stat().st_size for f in c.rglob("*") if f.is_file())
                  if c.is_dir() else c.stat().st_size)
        size_from = f"the size of {c}"
    else:
        nbytes = checkpoint_bytes(args.params, args.dtype, args.optimizer)
        size_from = (f"{args.params:.3g} parameters in {args.dtype}"
                     + (f" with {args.optimizer} state" if args.optimizer != "none" else ""))
    if args.timeout is not None:
        timeout, timeout_from = args.timeout, "--timeout"
    elif declared_timeout_from(env)[0]:
        timeout, timeout_from = declared_timeout_from(env)
    else:
        timeout, timeout_from = DEFAULT_TIMEOUT, "NCCL's default"
    if not args.dir.is_dir():
        print(f"ncclwatch preflight: {args.dir}: not a directory", file=sys.stderr)
        return EXIT_USAGE
    try:
        probe = measure(args.dir, max(1 << 20, min(int(args.probe_bytes), nbytes or 1 << 20)),
                        args.probe_seconds)
    except OSError as e:
        print(f"ncclwatch preflight: cannot write to {args.dir}: {e}", file=sys.stderr)
        return EXIT_USAGE
    v = judge(args.dir, nbytes, size_from, probe, timeout, timeout_from, args.margin,
              args.framework, env)
    if args.json:
        print(json.dumps({**asdict(v), "exit_code": v.exit_code}, indent=2))
    else:
        print(render(v))
    return v.exit_code
