"""Where a rank states its process-group timeout, in the order they are read.

The watchdog budget is exact only with the job's real timeout; the agent reads
what the rank itself states, each value marked with its source: its
environment, its command line in the syntax of the frameworks that take it
there, the config file that command line names, and (``agent.ranklocals``)
a plain number in a set-up frame's locals. It never runs the job's code:
``init_process_group(timeout=timedelta(...))`` shows py-spy only
``<datetime.timedelta at 0x...>``. Pure: the tables and their parsers; the
one file read goes through the reader the caller hands in.
"""

from __future__ import annotations

import sys
from typing import Callable, Mapping, Sequence

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - 3.10: the lock installs tomli there
    import tomli as tomllib

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
#: Variables that only set a framework's default: an explicit value on the
#: command line or in a config file is what the job passes, so those win.
DEFAULT_ONLY_ENV = frozenset({"DEEPSPEED_TIMEOUT"})

#: (option, unit in seconds): command-line options that state the timeout the
#: job passes to ``init_process_group`` (the steady-state one), verified in
#: each framework's source:
#: - Hugging Face ``TrainingArguments.ddp_timeout`` (seconds, default 1800;
#:   Trainer and Accelerate pass ``timedelta(seconds=ddp_timeout)``);
#: - Megatron-LM ``--distributed-timeout-minutes`` (int minutes, default 10,
#:   ``timedelta(minutes=args.distributed_timeout_minutes)``);
#: - torchtitan ``--comm.train_timeout_seconds`` (default 100): the timeout it
#:   sets on every group after the first step (``set_pg_timeouts``); its
#:   ``init_timeout_seconds`` holds only until then. tyro spells it with dashes.
TIMEOUT_ARGS: tuple[tuple[str, float], ...] = (
    ("--ddp_timeout", 1.0),
    ("--ddp-timeout", 1.0),
    ("--distributed-timeout-minutes", 60.0),
    ("--comm.train_timeout_seconds", 1.0),
    ("--comm.train-timeout-seconds", 1.0),
)
_ARG_UNIT = dict(TIMEOUT_ARGS)

#: (option naming a config file, its format): torchtitan's TOML job config.
CONFIG_FILE_ARGS: tuple[tuple[str, str], ...] = (
    ("--job.config_file", "toml"),
    ("--job.config-file", "toml"),
)
_CONFIG_FORMAT = dict(CONFIG_FILE_ARGS)
#: (format, dotted key, unit in seconds): where such a file states the timeout.
CONFIG_KEYS: tuple[tuple[str, str, float], ...] = (
    ("toml", "comm.train_timeout_seconds", 1.0),
)
#: A config file larger than this is not read (bytes).
MAX_CONFIG_BYTES = 256 * 1024

#: (option whose presence names the framework for certain, its timeout when
#: nothing states one, framework): torchtitan sets ``train_timeout_seconds``
#: (100 s by default) after the first step, not torch's 600 s.
FRAMEWORK_DEFAULTS: tuple[tuple[str, float, str], ...] = (
    ("--job.config_file", 100.0, "torchtitan"),
    ("--job.config-file", 100.0, "torchtitan"),
)

#: Source prefixes: what the daemon shows as ``timeout_source``.
ENV, ARGS, CONFIG, FRAMEWORK = "env:", "args:", "config:", "framework_default:"

Stated = tuple[float, str]
NONE: Stated = (0.0, "")
#: Reads a file as the rank sees it (its path as the rank gave it), at most
#: ``limit`` bytes; None when it cannot be read or is larger.
Reader = Callable[[str, int], "bytes | None"]


def declared_timeout_from(env: Mapping[str, str]) -> tuple[float, str]:
    """(seconds, the variable) the environment states, else (0.0, "")."""
    for name, unit in TIMEOUT_ENV_UNITS:
        value = _seconds(env.get(name))
        if value:
            return value * unit, name
    return 0.0, ""


def declared_timeout(env: Mapping[str, str]) -> float:
    return declared_timeout_from(env)[0]


def _option_values(argv: Sequence[str], table: Mapping[str, object]):
    """(option, its text) for each table option in argv, ``--opt v`` or ``--opt=v``."""
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if name in table:
            yield name, (value if eq else (argv[i + 1] if i + 1 < len(argv) else None))


def args_timeout_from(argv: Sequence[str]) -> Stated:
    """(seconds, ``args:<option>``) the command line states, else NONE; the
    last one given wins, as in argparse."""
    found = NONE
    for name, text in _option_values(argv, _ARG_UNIT):
        value = _seconds(text)
        if value:
            found = (value * _ARG_UNIT[name], ARGS + name)
    return found


def args_timeout(argv: Sequence[str]) -> float:
    """The timeout a rank's command line states (``--ddp_timeout 3600`` or
    ``--ddp_timeout=3600``), else 0.0."""
    return args_timeout_from(argv)[0]


def config_file_of(argv: Sequence[str]) -> tuple[str, str]:
    """(path as the rank gave it, format) of the config file its command line
    names (the last one), else ("", "")."""
    found = ("", "")
    for name, text in _option_values(argv, _CONFIG_FORMAT):
        if text:
            found = (text, _CONFIG_FORMAT[name])
    return found


def config_timeout_from(text: bytes, fmt: str) -> Stated:
    """(seconds, ``config:<key>``) a config file's bytes state, else NONE.
    Parsed as data only (``tomllib``); a malformed file states nothing."""
    if fmt != "toml":
        return NONE
    try:
        doc = tomllib.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError):
        return NONE
    for f, key, unit in CONFIG_KEYS:
        if f != fmt:
            continue
        node: object = doc
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, bool) or not isinstance(node, (int, float)):
            continue
        value = _seconds(str(node))
        if value:
            return value * unit, CONFIG + key
    return NONE


def framework_default_from(argv: Sequence[str]) -> Stated:
    """(seconds, ``framework_default:<name>``) of a framework its command line
    names for certain, else NONE."""
    for option, seconds, name in FRAMEWORK_DEFAULTS:
        if any(a == option or a.startswith(option + "=") for a in argv):
            return seconds, FRAMEWORK + name
    return NONE


def stated_timeout(env: Mapping[str, str], argv: Sequence[str],
                   read: Reader | None = None) -> Stated:
    """(seconds, source) of the timeout the rank states, most explicit first:
    ncclwatch's own variables, the command line, its config file (``read``:
    None reads none), DEEPSPEED_TIMEOUT, a framework's known default."""
    explicit = {k: v for k, v in env.items() if k not in DEFAULT_ONLY_ENV}
    seconds, name = declared_timeout_from(explicit)
    if seconds:
        return seconds, ENV + name
    got = args_timeout_from(argv)
    if got[0]:
        return got
    path, fmt = config_file_of(argv)
    if path and read is not None:
        text = read(path, MAX_CONFIG_BYTES)
        got = config_timeout_from(text, fmt) if text is not None else NONE
        if got[0]:
            return got
    seconds, name = declared_timeout_from({k: v for k, v in env.items() if k in DEFAULT_ONLY_ENV})
    if seconds:
        return seconds, ENV + name
    return framework_default_from(argv)


def _seconds(v: str | None) -> float:
    """A positive number of seconds below 10^7, else 0.0."""
    try:
        x = float(v) if v else 0.0
    except ValueError:
        return 0.0
    return x if 0 < x < 1e7 else 0.0
