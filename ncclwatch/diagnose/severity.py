"""The level a log line declares, read in the formats NCCL users' jobs write.

Whether a log holds a failure is a question of grammar before it is one of
signs: every logger says how bad a line is (glog's ``E``, c10d's ``[E ...]``,
Python's ``ERROR:``, slurmstepd's ``error:``), and the sign table (logsigns.py)
will always trail the messages. So a line at error or fatal level, or a
warning whose text is an error, is a failure unless BENIGN names that exact
shape with its reason. The formats, launcher tags, error words and benign
shapes are tables; ``failing()`` is the one reader, run by the scanner only on
lines the byte scan picked up (LEVEL_TRIGGERS, the level tokens of the error
levels and the error words), so a healthy log's bulk costs nothing.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass


class Level(enum.IntEnum):
    DEBUG = 10
    INFO = 20
    WARNING = 30
    ERROR = 40
    FATAL = 50


#: Level words as loggers spell them (Python logging, loguru, rich, DeepSpeed, Ray, NCCL).
WORDS: dict[str, Level] = {
    "TRACE": Level.DEBUG, "DEBUG": Level.DEBUG, "INFO": Level.INFO, "NOTICE": Level.INFO,
    "SUCCESS": Level.INFO, "WARN": Level.WARNING, "WARNING": Level.WARNING,
    "ERROR": Level.ERROR, "ERR": Level.ERROR, "CRITICAL": Level.FATAL, "FATAL": Level.FATAL,
    "EMERG": Level.FATAL, "ALERT": Level.FATAL, "CRIT": Level.FATAL,
}
#: glog/absl one-letter levels.
LETTERS: dict[str, Level] = {"I": Level.INFO, "W": Level.WARNING, "E": Level.ERROR,
                             "F": Level.FATAL}
#: syslog priorities (``<3>`` in front of a kernel or journald line).
PRIORITIES: dict[str, Level] = {"0": Level.FATAL, "1": Level.FATAL, "2": Level.FATAL,
                                "3": Level.ERROR, "4": Level.WARNING, "5": Level.INFO,
                                "6": Level.INFO, "7": Level.DEBUG}
_W = "|".join(sorted(WORDS, key=len, reverse=True))
_TIME = r"\d\d:\d\d:\d\d(?:[.,]\d{1,9})?"
_DATE = r"(?:\d{4}-\d\d-\d\d|\d\d/\d\d/\d{2,4})"


@dataclass(frozen=True)
class LevelFormat:
    """One logger's way of declaring a line's level."""

    name: str
    #: Matched at the line's start (launcher tags skipped); group ``level`` is the token.
    pattern: str
    #: The token -> level table the format uses.
    tokens: dict[str, Level]
    #: A line of this format, ``{level}`` standing for the token and ``{text}`` for the
    #: message (the property test writes every level of every format this way).
    template: str
    #: The token each level is written as in ``template``.
    spell: dict[Level, str]


_LETTER_SPELL = {Level.INFO: "I", Level.WARNING: "W", Level.ERROR: "E", Level.FATAL: "F"}
_WORD_SPELL = {Level.DEBUG: "DEBUG", Level.INFO: "INFO", Level.WARNING: "WARNING",
               Level.ERROR: "ERROR", Level.FATAL: "CRITICAL"}

FORMATS: tuple[LevelFormat, ...] = (
    # glog/absl C++ (torch's c10d and torchrun, XLA): "E1201 12:00:00.000000 123 file.cc:42]",
    # torch 2.x in brackets: "[E1201 12:00:00.553507662 ProcessGroupNCCL.cpp:757]".
    LevelFormat("glog", r"\[?(?P<level>[IWEF])\d{4} " + _TIME + r"(?: +\d+)? +[^\s\]]+:\d+\]",
                LETTERS, "{level}1201 12:00:00.000000 4211 train.cc:42] {text}", _LETTER_SPELL),
    # absl with a date, as JAX/XLA and TensorFlow print it:
    # "2023-09-01 10:20:11.257981: E external/xla/xla/pjrt/pjrt_stream_executor_client.cc:2593]",
    # and without one ("W external/xla/xla/service/gpu/runtime/support.cc:58]").
    LevelFormat("absl", r"(?:" + _DATE + " " + _TIME + r": )?(?P<level>[IWEF]) [^\s\]]+:\d+\]",
                LETTERS, "2023-09-01 10:20:11.257981: {level} external/xla/xla/service/gpu/"
                "nccl_utils.cc:305] {text}", _LETTER_SPELL),
    # c10d of torch 1.x: "[E socket.cpp:610] [c10d] ...", "[W ProcessGroupNCCL.cpp:1569]".
    LevelFormat("c10d", r"\[(?P<level>[IWEF]) [^\]]*?:\d+\]", LETTERS,
                "[{level} socket.cpp:610] [c10d] {text}", _LETTER_SPELL),
    # NCCL: "host:pid:tid [dev] file.cc:93 NCCL WARN ...", the host cut off in pastes.
    LevelFormat("nccl", r"(?:\S*:\d+:\d+ )?(?:\[\d+\] )?(?:[\w/.]+:\d+ )?NCCL (?P<level>WARN|INFO|"
                r"TRACE)\b", WORDS, "node7:41:211 [1] transport/net_ib.cc:93 NCCL {level} {text}",
                {Level.DEBUG: "TRACE", Level.INFO: "INFO", Level.WARNING: "WARN"}),
    # Python logging's default format: "ERROR:root:...", "WARNING:torch.distributed...:".
    LevelFormat("python", r"(?P<level>" + _W + r"):[\w.<>-]*:", WORDS, "{level}:trainer:{text}",
                _WORD_SPELL),
    # Loggers that put the level after a time stamp or in brackets: "2024-05-01 10:00:00,123
    # - ERROR - trainer - ...", "[2023-07-10 04:26:35,999] [ERROR] [launch.py:324:...]",
    # "[INFO|trainer.py:3984]", Ray's "2022-02-15 16:53:52,096\tWARNING worker.py:1462 --",
    # HF's "12/03/2026 12:32:43 - ERROR - ...", Megatron's "[ERROR | ...]".
    LevelFormat("stamped", r"(?:\[?" + _DATE + r"[ T]" + _TIME + r"\]?[ \t]*(?:-[ \t]*)?)?"
                r"(?:\[(?P<level>" + _W + r")[\]|]|(?P<level2>" + _W + r")\b(?! *[:=]\w))",
                WORDS, "2024-05-01 10:00:07,123 - {level} - trainer - {text}", _WORD_SPELL),
    # loguru: "2024-01-01 12:00:00.000 | ERROR    | module:func:12 - ...".
    LevelFormat("loguru", _DATE + " " + _TIME + r" \| (?P<level>" + _W + r") *\|", WORDS,
                "2024-01-01 12:00:00.000 | {level:<8} | train:main:12 - {text}", _WORD_SPELL),
    # rich's handler: "[12/03/26 12:00:00] ERROR    message    file.py:12".
    LevelFormat("rich", r"(?:\[[\d/]+ " + _TIME + r"\] +)?(?P<level>" + _W + r") {2,}", WORDS,
                "[12/03/26 12:00:00] {level:<8} {text}   train.py:12", _WORD_SPELL),
    # Ray's C++ components: "[2024-11-08 14:22:31,043 E 612 612] (raylet) node_manager.cc:3069".
    LevelFormat("ray_cpp", r"\[" + _DATE + " " + _TIME + r" (?P<level>[IWEF]) \d+ \d+\]", LETTERS,
                "[2024-11-08 14:22:31,043 {level} 612 612] (raylet) node_manager.cc:3069: {text}",
                _LETTER_SPELL),
    # Slurm: "slurmstepd: error: ...", "srun: error: node-12: task 3: ...", "srun: warning".
    LevelFormat("slurm", r"(?:slurmstepd|srun|salloc|sbatch|slurmd)(?:-[\w.-]+)?: (?P<level>"
                r"error|fatal|warning|info|debug)\b", {k.lower(): v for k, v in WORDS.items()},
                "slurmstepd: {level}: {text}", {lv: w.lower() for lv, w in
                                                {Level.DEBUG: "debug", Level.INFO: "info",
                                                 Level.WARNING: "warning", Level.ERROR: "error",
                                                 Level.FATAL: "fatal"}.items()}),
    # syslog / journald / kmsg priority in front: "<3>NVRM: Xid ...".
    LevelFormat("syslog_priority", r"<(?P<level>[0-7])>", PRIORITIES, "<{level}>{text}",
                {Level.FATAL: "2", Level.ERROR: "3", Level.WARNING: "4", Level.INFO: "6",
                 Level.DEBUG: "7"}),
)

#: Messages whose words are the level: the kernel says an error by what it says.
#: (regex, why) -- searched anywhere in the line.
KERNEL_ERRORS: tuple[tuple[str, str], ...] = (
    (r"\boom-kill:|Out of memory: Killed process|invoked oom-killer", "the kernel's OOM killer"),
    (r"\bsegfault at [0-9a-f]+ ip ", "the kernel reports a process's segmentation fault"),
    (r"NVRM: Xid \(", "the NVIDIA driver reports a GPU error (Xid)"),
    (r"\btraps: \S+\[\d+\] (?:general protection|trap)", "the kernel reports a fatal trap"),
)

#: Tags launchers and platforms put in front of a line, skipped before the level is read
#: (name, regex, example). paste.py removes the ones that carry ranks for everyone else.
TAGS: tuple[tuple[str, str, str], ...] = (
    ("kubernetes CRI", r"\d{4}-\d\d-\d\dT\S+ (?:stdout|stderr) [FP] ",
     "2026-12-03T10:00:06.123456789Z stderr F "),
    ("iso time", r"\d{4}-\d\d-\d\dT" + _TIME + r"(?:Z|[+-]\d\d:?\d\d)?:? ",
     "2019-06-02T16:13:44.884Z: "),
    ("openmpi", r"\[\d+,\d+\]<std(?:out|err|diag)>: ?", "[1,12]<stdout>:"),
    ("torchrun", r"\[(?:rank|default)\d+\]: ?", "[default3]:"),
    ("srun --label", r"\s*\d{1,6}: ", "3: "),
    ("torchx role", r"[\w-]+/\d+ \[\d+\]: ?", "trainer/0 [1]:"),
    ("ray actor", r"\((?:\w+ )?pid=\d+(?:, ip=[\d.]+)?\) ?", "(RayTrainWorker pid=4009, ip=10.0.0.7) "),
    ("pdsh host", r"[A-Za-z][\w.-]*\d: ", "worker-3: "),
    ("syslog host", r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) [ \d]\d " + _TIME
     + r" [\w.-]+ (?:[\w./-]+(?:\[\d+\])?: )?", "Dec  3 12:33:03 node7 kernel: "),
    ("dmesg", r"\[ *\d+\.\d+\] ", "[1482015.999488] "),
)

#: Words that make a warning an error ("NCCL WARN NET/IB : Got async event : port error").
ERROR_WORDS = re.compile(r"\b(?:error|errors?:|failed|failure|catastrophic|abort(?:ed|ing)?|fatal)\b",
                         re.IGNORECASE)


@dataclass(frozen=True)
class Benign:
    """A line at error level, or a warning in error words, that real healthy jobs print."""

    name: str
    #: Searched in the line, its tags skipped (``^`` is the message's start).
    pattern: str
    why: str
    example: str
    #: The highest level the row spares: a warning's shape never excuses an error line.
    up_to: Level = Level.WARNING


BENIGN: tuple[Benign, ...] = (
    Benign("c10d_connect_retry",
           r"\[W[^\]]*\] \[c10d\] The client socket has failed to connect to (?!any network)",
           "c10d retries the store's address until its timeout; a job that then connects "
           "goes on (only '[E ...] ... any network address' or a timeout says it never did)",
           "[W socket.cpp:558] [c10d] The client socket has failed to connect to "
           "[localhost]:29500 (errno: 99 - Cannot assign requested address)."),
    Benign("c10d_ipv6_fallback", r"\[c10d\] The client socket cannot be initialized to connect to",
           "c10d tries each address family of the host name; one that is not supported is "
           "skipped",
           "[W1226 15:35:11.626067741 socket.cpp:752] [c10d] The client socket cannot be "
           "initialized to connect to [node-05]:8000 (errno: 97 - Address family not supported "
           "by protocol)."),
    Benign("nccl_net_plugin_absent", r"NCCL (?:WARN|INFO) NET/Plugin\s*:",
           "NCCL looks for an optional network plugin and uses its own transport without it",
           "node7:41:211 [0] NCCL WARN NET/Plugin : Plugin load returned 2 : libnccl-net.so: "
           "cannot open shared object file: No such file or directory."),
    Benign("nccl_ib_absent", r"NCCL (?:WARN|INFO) (?:Failed to open libibverbs|NET/IB : No device)",
           "a node without InfiniBand: NCCL falls back to sockets",
           "node7:41:211 [0] NCCL WARN Failed to open libibverbs.so[.1]"),
    Benign("nccl_cuda_library_probe", r"NCCL WARN Failed to find CUDA library",
           "NCCL probes NCCL_CUDA_PATH for libcuda first and then finds it through the "
           "dynamic loader; a job that fails to load it stops with a CUDA error of its own",
           "gpu-node-7:48211:48290 [1] misc/cudawrap.cc:179 NCCL WARN Failed to find CUDA "
           "library libcuda.so (NCCL_CUDA_PATH='') :"),
    Benign("python_warning_class", r"^(?:\S+ )?\S+\.py:\d+: \w*Warning: ",
           "a Python warnings-module line (deprecations, API notices) of a job that goes on",
           "/venv/torch/distributed/fsdp/_state_dict_utils.py:773: UserWarning: When using "
           "``NO_SHARD`` for ``ShardingStrategy``, full_state_dict will be returned."),
    Benign("slurm_step_memory_swapped", r"Exceeded (?:step|job) memory limit at some point",
           "Slurm's accounting saw the step over its memory limit once (pages swapped out) "
           "and let it run; a kill says 'exceeded memory limit (N > M), being killed'",
           "slurmstepd: error: Exceeded step memory limit at some point.", Level.ERROR),
    Benign("error_count_zero", r"\b0 errors?\b|\berrors?: 0\b|\bno errors?\b",
           "a count of errors that is zero", "WARNING: check finished, 0 errors", Level.ERROR),
)

_FORMATS = [(f, re.compile(f.pattern)) for f in FORMATS]
_TAGS = re.compile("|".join(f"(?:{rx})" for _n, rx, _e in TAGS))
_KERNEL = re.compile("|".join(f"(?:{rx})" for rx, _w in KERNEL_ERRORS))
_BENIGN = [(b, re.compile(b.pattern)) for b in BENIGN]
#: How many tags may stand in front of a line.
MAX_TAGS = 5

#: Substrings the byte scan picks a line up by for this reader (logsigns.py's
#: ``level_line``): the error and fatal levels' tokens of every format, and the error
#: words (a warning is read only when it says one). Short tokens are matched whole
#: only (no hard-wrap pieces): a cut level token is no level any more.
LEVEL_TRIGGERS: tuple[str, ...] = tuple(
    [c + f"{m:02d}" for c in "EF" for m in range(1, 13)]  # glog's level and month
    + [f" {c} {d}" for c in "EF" for d in "123456789"]  # Ray's C++ "[<time> E <pid> <tid>]"
    + ["[E ", "[F ", ": E ", ": F ", "<0>", "<1>", "<2>", "<3>", "NVRM: Xid", "segfault at",
       "traps: ", "CRITICAL", "error", "failed", "Failed", "FAILED", "failure",
       "Failure", "FAILURE", "catastrophic", "abort", "Abort", "ABORT", "fatal"])


def strip_tags(line: str) -> str:
    """The line after the launchers' and platforms' tags in front of it."""
    for _ in range(MAX_TAGS):
        m = _TAGS.match(line)
        if m is None or m.end() == 0:
            break
        line = line[m.end():]
    return line


def level_of(line: str) -> tuple[Level, str] | None:
    """(level, format name) the line declares at its start, tags skipped; None if none."""
    core = strip_tags(line.lstrip())
    for fmt, rx in _FORMATS:
        m = rx.match(core)
        if m is None:
            continue
        token = m.group("level") or (m.groupdict().get("level2") or "")
        level = fmt.tokens.get(token) or fmt.tokens.get(token.upper())
        if level is not None:
            return level, fmt.name
    if _KERNEL.search(core):
        return Level.ERROR, "kernel"
    return None


def benign(line: str, level: Level = Level.WARNING) -> Benign | None:
    """The BENIGN row that spares this line at ``level``, if any."""
    for b, rx in _BENIGN:
        if level <= b.up_to and rx.search(strip_tags(line.lstrip())):
            return b
    return None


def failing(line: str) -> tuple[Level, str] | None:
    """(level, format) when the line is a failure by the grammar: error or fatal level,
    or a warning in error words, and no BENIGN row; else None."""
    got = level_of(line)
    if got is None:
        return None
    level, _fmt = got
    if level < Level.WARNING or (level == Level.WARNING and not ERROR_WORDS.search(line)):
        return None
    if benign(line, level) is not None:
        return None
    return got
