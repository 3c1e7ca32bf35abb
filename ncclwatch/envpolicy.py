"""Which environment variables of a training process may leave the node.

Only allowlisted names are ever read into a sample, and their values are
redacted where they look like credentials (token formats, URLs with user
info, ``password=`` pairs, long random strings). Both rules are data.
"""

from __future__ import annotations

import re
from typing import Mapping

#: Exact names: rank/launcher identity and ncclwatch's own hints.
ALLOWED_NAMES: frozenset[str] = frozenset(
    """
    RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE GROUP_RANK GROUP_WORLD_SIZE ROLE_RANK
    ROLE_WORLD_SIZE ROLE_NAME MASTER_ADDR MASTER_PORT
    TORCHELASTIC_RUN_ID TORCHELASTIC_RESTART_COUNT TORCHELASTIC_MAX_RESTARTS
    TORCHELASTIC_USE_AGENT_STORE TORCHELASTIC_ERROR_FILE
    SLURM_JOB_ID SLURM_STEP_ID SLURM_PROCID SLURM_LOCALID SLURM_NODEID SLURM_NTASKS
    SLURM_JOB_NUM_NODES SLURM_JOB_NAME SLURM_JOB_USER SLURM_STEP_NUM_TASKS
    OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE OMPI_COMM_WORLD_LOCAL_RANK
    PMI_RANK PMI_SIZE MPI_LOCALRANKID PMIX_RANK PMIX_NAMESPACE CUDA_VISIBLE_DEVICES CUDA_LAUNCH_BLOCKING
    PYTORCH_CUDA_ALLOC_CONF GLOO_SOCKET_IFNAME
    NCCLWATCH_JOB_ID NCCLWATCH_WATCHDOG_TIMEOUT_SECONDS NCCLWATCH_PG_TIMEOUT_S
    """.split()
)

#: Name prefixes: NCCL and torch.distributed knobs that explain a hang.
ALLOWED_PREFIXES: tuple[str, ...] = (
    "NCCL_",
    "TORCH_NCCL_",
    "TORCH_DISTRIBUTED_",
    "TORCH_FR_",
    "TORCH_GLOO_",
)

#: Names that are never read, even under an allowed prefix.
SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE|SESSION)", re.I)

REDACTED = "<redacted>"

#: (pattern, replacement) for value parts that look like credentials.
SECRET_VALUE_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # scheme://user:password@host -> scheme://<redacted>@host
    (re.compile(r"(?<=://)[^/@\s]+(?=@)"), REDACTED),
    # user:password@host without a scheme (MASTER_ADDR, host lists)
    (re.compile(r"(?:^|(?<=[\s,;=]))[^\s/@:,;=<>]+:[^\s/@<>]+(?=@[\w.\[-])"), REDACTED),
    # key=value pairs whose key says secret (query strings, option lists)
    (re.compile(r"(?i)\b(password|passwd|pwd|token|secret|api_?key|key)=[^&;,\s]+"),
     r"\1=" + REDACTED),
    # Token formats, wherever they sit (a token inside a path: /tmp/fr_ghp_...).
    (re.compile(r"(?:AKIA|ASIA)[0-9A-Z]{16}"), REDACTED),              # AWS access key id
    (re.compile(r"hf_[A-Za-z0-9]{20,}"), REDACTED),                    # Hugging Face token
    (re.compile(r"gh[pousr]_[A-Za-z0-9]{20,}"), REDACTED),             # GitHub token
    (re.compile(r"xox[abposr]-[A-Za-z0-9-]{10,}"), REDACTED),          # Slack token
    (re.compile(r"(?<![A-Za-z])sk-[A-Za-z0-9_-]{20,}"), REDACTED),     # sk- API keys
    (re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*"), REDACTED),  # JWT
)

_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
_RANDOMISH = re.compile(r"^[A-Za-z0-9_+/=.-]{32,}$")


def is_allowed(name: str) -> bool:
    if SECRET_NAME.search(name):
        return False
    return name in ALLOWED_NAMES or name.startswith(ALLOWED_PREFIXES)


def redact_patterns(value: str) -> str:
    """Replace the parts of a value that match a credential pattern.

    For identifiers built from the environment (job ids): a run id that only
    looks random must stay distinct, so the whole-value heuristic is not applied.
    """
    for pattern, replacement in SECRET_VALUE_PATTERNS:
        value = pattern.sub(replacement, value)
    return value


def redact_value(value: str) -> str:
    """Replace credential-looking parts of a value; keep the rest readable."""
    value = redact_patterns(value)
    if _looks_random(value):
        return REDACTED
    return value


def _looks_random(value: str) -> bool:
    """A long token of mixed case and digits with no structure (not a UUID)."""
    if not _RANDOMISH.match(value) or _UUID.match(value):
        return False
    return (any(c.islower() for c in value) and any(c.isupper() for c in value)
            and any(c.isdigit() for c in value))


def filter_env(env: Mapping[str, str]) -> dict[str, str]:
    """The allowlisted, redacted subset of a process environment."""
    return {k: redact_value(v) for k, v in env.items() if is_allowed(k)}
