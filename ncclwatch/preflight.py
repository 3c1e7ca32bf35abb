"""``ncclwatch preflight``: will a full checkpoint on one rank fit the watchdog? Before the job.

The stall ncclwatch watches for at run time (rank 0 writes the whole state
while the others wait in the next collective) can be predicted before the
first checkpoint: the checkpoint's size over the directory's sustained
write rate, against the process-group timeout. This measures the rate
(fsync'd, bounded in bytes and seconds, the probe file removed after),
reads the timeout and the NCCL/torch settings from the environment or the
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
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ncclwatch import envlint, frameworks
from ncclwatch.agent.report import TIMEOUT_ENV, declared_timeout
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

_SUFFIX = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "b": 1e9,
           "ki": 1 << 10, "mi": 1 << 20, "gi": 1 << 30, "ti": 1 << 40}


def number(text: str) -> float:
    """``7e9``, ``7B`` (billions of parameters), ``140G``, ``2GiB``, ``1_000``."""
    m = re.fullmatch(r"\s*([0-9_.]+(?:e[0-9]+)?)\s*([kmgtb]i?)?b?\s*", text.lower())
    if not m:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}")
    return float(m.group(1).replace("_", "")) * _SUFFIX[m.group(2) or ""]


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
    """The directory's sustained write rate, measured with fsync."""

    bytes_written: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.bytes_written / self.seconds if self.seconds > 0 else 0.0


def measure(directory: Path, max_bytes: int, max_seconds: float,
            block: int = 4 << 20) -> Probe:
    """Write random blocks into a probe file until ``max_bytes`` or ``max_seconds``,
    fsync, remove it. The fsync counts: a save is not done while the page cache
    holds it (and the storage, not the cache, sets the pace of a large one)."""
    data = os.urandom(block)  # incompressible: no storage gets it for free
    path = directory / f".ncclwatch-preflight-{os.getpid()}.tmp"
    written = 0
    t0 = time.monotonic()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            while written < max_bytes and time.monotonic() - t0 < max_seconds:
                n = min(block, max_bytes - written)
                written += os.write(fd, data[:n])
            os.fsync(fd)
        finally:
            os.close(fd)
        return Probe(written, time.monotonic() - t0)
    finally:
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
        probe_seconds=round(probe.seconds, 3), timeout_seconds=timeout,
        timeout_from=timeout_from, save_seconds=round(fit.needs_seconds, 2),
        margin_seconds=round(fit.margin_seconds, 2), fits=fit.fits, tight=tight,
        words=f"a full save of {size(nbytes)} on one rank at {size(probe.rate)}/s "
              + fit.words(), framework=framework,
        env_warnings=[asdict(w) for w in envlint.lint(env)], fixes=fixes)


def render(v: Verdict) -> str:
    head = {EXIT_FITS: "FITS", EXIT_TIGHT: "FITS, BARELY", EXIT_OVERRUNS: "DOES NOT FIT"}
    out = [f"{head[v.exit_code]}: {v.words}.",
           f"  checkpoint: {size(v.checkpoint_bytes)} ({v.size_from})",
           f"  {v.directory}: {size(v.write_bytes_per_second)}/s sustained, fsync'd "
           f"({size(v.probe_bytes)} in {v.probe_seconds:.1f}s)",
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
    what.add_argument("--size", type=number, metavar="BYTES",
                      help="checkpoint size in bytes (suffixes: K M G T, Ki Mi Gi Ti)")
    what.add_argument("--checkpoint", type=Path, metavar="FILE",
                      help="an existing checkpoint: its size (a directory: all its files)")
    what.add_argument("--params", type=number, metavar="N",
                      help="parameter count (7e9, 7B) with --dtype")
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
    p.add_argument("--probe-bytes", type=number, default=1 << 30, metavar="BYTES",
                   help="most bytes to write when measuring (default 1GiB)")
    p.add_argument("--probe-seconds", type=float, default=10.0, metavar="SECONDS",
                   help="most seconds to write when measuring (default 10)")
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
    elif declared_timeout(dict(env)):
        timeout = declared_timeout(dict(env))
        timeout_from = next(n for n in TIMEOUT_ENV if env.get(n))
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


def as_dict(v: Verdict) -> dict[str, Any]:
    return {**asdict(v), "exit_code": v.exit_code}
