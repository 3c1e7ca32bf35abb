"""Where a rank states its process-group timeout, in the order they are read.

The watchdog budget is exact only with the job's real timeout; the agent reads
what the rank itself states, from its environment and its command line, and
never runs the job's code (``init_process_group(timeout=...)`` stays unread).
Pure: the tables and their parsers, no I/O.
"""

from __future__ import annotations

from typing import Mapping, Sequence

#: Variables of a rank's environment that state its process-group timeout,
#: first wins, with their unit in seconds. Only variables: the agent never runs
#: the job's code to read ``init_process_group(timeout=...)``. DEEPSPEED_TIMEOUT
#: (minutes) is the default of ``deepspeed.init_distributed``.
TIMEOUT_ENV_UNITS: tuple[tuple[str, float], ...] = (
    ("NCCLWATCH_PG_TIMEOUT_S", 1.0),
    ("NCCLWATCH_WATCHDOG_TIMEOUT_SECONDS", 1.0),
    ("DEEPSPEED_TIMEOUT", 60.0),
)
TIMEOUT_ENV = tuple(name for name, _ in TIMEOUT_ENV_UNITS)


def declared_timeout_from(env: Mapping[str, str]) -> tuple[float, str]:
    """(seconds, the variable) the environment states, else (0.0, "")."""
    for name, unit in TIMEOUT_ENV_UNITS:
        value = _seconds(env.get(name))
        if value:
            return value * unit, name
    return 0.0, ""


def declared_timeout(env: Mapping[str, str]) -> float:
    return declared_timeout_from(env)[0]


#: Command-line options that state the process-group timeout in seconds: Hugging
#: Face TrainingArguments' ddp_timeout (its Trainer and Accelerate pass it to
#: init_process_group). Read after the environment; only the number is kept.
TIMEOUT_ARGS: tuple[str, ...] = ("--ddp_timeout", "--ddp-timeout")


def args_timeout(argv: Sequence[str]) -> float:
    """The timeout a rank's command line states (``--ddp_timeout 3600`` or
    ``--ddp_timeout=3600``), else 0.0; the last one given wins, as in argparse."""
    found = 0.0
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if name in TIMEOUT_ARGS:
            found = _seconds(value if eq else (argv[i + 1] if i + 1 < len(argv) else None)) or found
    return found


def _seconds(v: str | None) -> float:
    """A positive number of seconds below 10^7, else 0.0."""
    try:
        x = float(v) if v else 0.0
    except ValueError:
        return 0.0
    return x if 0 < x < 1e7 else 0.0
