"""Which environment variables of a training process may leave the node.

Only allowlisted names are ever read into a sample, and their values are
redacted where they carry data or look like credentials: query-string values
and URL fragments always (structural), token formats, URLs with user info,
``password=`` pairs, and any embedded run of token characters with no word
structure. The rules are data.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
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
    PET_NNODES PET_NPROC_PER_NODE PET_NODE_RANK PET_MASTER_ADDR PET_MASTER_PORT
    JOBSET_NAME JOB_COMPLETION_INDEX POD_NAME POD_NAMESPACE
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

#: Variables whose raw values the agent itself uses on the node (to find a rank's
#: Flight Recorder pipe and dump files). Kept unredacted in the agent's memory,
#: never sent: redaction may take a path component that only looks random.
LOCAL_USE_NAMES: frozenset[str] = frozenset(
    """
    TORCH_NCCL_DEBUG_INFO_PIPE_FILE TORCH_NCCL_DEBUG_INFO_TEMP_FILE TORCH_FR_DUMP_TEMP_FILE
    HOME XDG_CACHE_HOME
    """.split()
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

#: Structural rules, whatever the names say: every value of a query string
#: (``?sig=...&se=...``: Azure SAS, presigned S3 URLs) and every URL fragment is
#: data, not configuration, and is dropped; the keys stay, so the value still
#: says what it was.
_QUERY = re.compile(r"\?([^\s#,]*)")
_QUERY_PAIR = re.compile(r"(^|[&;])([^=&;]*)=([^&;]*)")
_FRAGMENT = re.compile(r"#[^\s,]*")
_URLISH = re.compile(r"://|\?")

#: An embedded run that may be a credential: base64/base64url/hex characters.
#: Runs are judged per path component first, then whole (a base64 secret may
#: hold '/'), so a token inside a path takes only its component with it.
_RUN = re.compile(r"[A-Za-z0-9+_-][A-Za-z0-9+/_-]{15,}={0,2}")
_COMPONENT = re.compile(r"[A-Za-z0-9+_-]{16,}={0,2}")
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
#: Structure that names are made of: a word (an optional capital, then lower
#: case, a quarter of it vowels: ``Image``, ``checkpoints``) or a number of 3+
#: digits (``00001``, ``2024``). Random tokens have little of either.
_STRUCTURE = re.compile(r"[A-Z]?[a-z]{2,}|[0-9]{3,}")
_VOWELS = frozenset("aeiouyAEIOUY")
_SEGMENT = re.compile(r"[/_+.-]")


@dataclass(frozen=True, slots=True)
class RandomRunRule:
    """Runs at least ``min_len`` long, of the character kinds ``needs`` (``U`` upper,
    ``L`` lower, ``D`` digit), that are not made of words and numbers (at most
    ``max_structure`` of their characters) or change character kind at least
    ``min_switches`` of the time, are tokens."""

    name: str
    min_len: int
    needs: str
    max_structure: float = 1.0
    min_switches: float = 0.0


RANDOM_RUN_RULES: tuple[RandomRunRule, ...] = (
    # API keys, SAS signatures, base64 secrets: mixed case; names like
    # ``Llama/model-00001`` and ``TrainingRunV2`` are words and numbers.
    RandomRunRule("base64", 20, "UL", max_structure=0.5),
)

#: Hex keys and digests, wherever they sit (``run-<40 hex>``): 32+ hex digits
#: with both digits and letters (a plain long number is not a key).
_HEX_KEY = re.compile(r"(?<![0-9a-fA-F])(?=[0-9a-fA-F]*[a-fA-F])(?=[0-9a-fA-F]*[0-9])[0-9a-fA-F]{32,}(?![0-9a-fA-F])")


def _kind(c: str) -> str:
    return "U" if c.isupper() else "L" if c.islower() else "D" if c.isdigit() else "O"


def is_allowed(name: str) -> bool:
    if SECRET_NAME.search(name):
        return False
    return name in ALLOWED_NAMES or name.startswith(ALLOWED_PREFIXES)


def drop_url_data(value: str) -> str:
    """Every query-string value and URL fragment in ``value`` becomes REDACTED."""
    if not _URLISH.search(value):
        return value

    def query(m: re.Match[str]) -> str:
        q = m.group(1)
        if not q:
            return m.group(0)
        if "=" not in q:
            return "?" + REDACTED           # a bare query (``?AbC123``) is all data
        return "?" + _QUERY_PAIR.sub(
            lambda p: f"{p.group(1)}{p.group(2)}={REDACTED}" if p.group(3) else p.group(0), q)

    value = _QUERY.sub(query, value)
    if "#" in value:
        value = _FRAGMENT.sub("#" + REDACTED, value)
    return value


def redact_patterns(value: str) -> str:
    """Drop URL data and replace the parts of a value that match a credential pattern.

    For identifiers built from the environment (job ids): a run id that only
    looks random must stay distinct, so the random-run heuristic is not applied.
    """
    value = drop_url_data(value)
    for pattern, replacement in SECRET_VALUE_PATTERNS:
        value = pattern.sub(replacement, value)
    return value


def redact_value(value: str) -> str:
    """Replace credential-looking parts of a value; keep the rest readable."""
    value = redact_patterns(value)
    value = _HEX_KEY.sub(REDACTED, value)
    value = _COMPONENT.sub(_redact_if_random, value)
    return _RUN.sub(_redact_random_spans, value)


def _redact_if_random(m: re.Match[str]) -> str:
    return REDACTED if looks_random(m.group(0)) else m.group(0)


def _redact_random_spans(m: re.Match[str]) -> str:
    """Within a run that holds '/', the spans of whole components that look
    random (a base64 secret with '/' in it, inside a path of names) go.

    The smallest random spans are found first; a hit then takes its neighbours
    along while they are not plain names (lower-case letters or digits only), so
    a secret's short pieces go with it and ``/ckpt/`` or ``/x.pt`` stay.
    """
    parts = m.group(0).split("/")
    if len(parts) == 1:
        return REDACTED if looks_random(parts[0]) else parts[0]
    n = len(parts)
    hit = [False] * n
    for length in range(1, n + 1):
        for i in range(n - length + 1):
            span = range(i, i + length)
            if any(hit[k] for k in span) and length > 1:
                continue
            if looks_random("/".join(parts[i:i + length])):
                for k in span:
                    hit[k] = True
    plain = [p == "" or p.isdigit() or (p.isalpha() and p.islower()) for p in parts]
    for k in list(range(n)) + list(reversed(range(n))):       # grow hits both ways
        if hit[k]:
            for nb in (k - 1, k + 1):
                if 0 <= nb < n and not plain[nb]:
                    hit[nb] = True
    out: list[str] = []
    for part, h in zip(parts, hit):
        if not h:
            out.append(part)
        elif not out or out[-1] is not REDACTED:
            out.append(REDACTED)
    return "/".join(out)


def looks_random(run: str) -> bool:
    """A run of token characters with no word structure (not a UUID)."""
    core = run.rstrip("=").strip("/")
    if _UUID.fullmatch(core):
        return False
    kinds = [_kind(c) for c in core]
    alnum = len(kinds) - kinds.count("O")
    structure = sum(_structure(segment) for segment in _SEGMENT.split(core))
    letters = [k for k in kinds if k != "O"]          # separators are not switches
    switches = sum(a != b for a, b in zip(letters, letters[1:])) / max(1, len(letters) - 1)
    return any(len(core) >= r.min_len and all(k in kinds for k in r.needs)
               and structure <= r.max_structure * alnum and switches >= r.min_switches
               for r in RANDOM_RUN_RULES)


def _structure(segment: str) -> int:
    """Characters of a separator-delimited segment that are names: all of a
    plain lower-case or numeric segment (``nccl``, ``ckpt``, ``2024``), else its
    name pieces."""
    if segment.isdigit() or (segment.isalpha() and segment.islower()):
        return len(segment)
    return sum(len(w) for w in _STRUCTURE.findall(segment) if _name_piece(w))


def _name_piece(w: str) -> bool:
    """A number, or a word with a quarter of it vowels."""
    return w.isdigit() or 4 * sum(c in _VOWELS for c in w) >= len(w)


def local_env(env: Mapping[str, str]) -> dict[str, str]:
    """The raw values of LOCAL_USE_NAMES: for the agent's own use, never reported."""
    return {k: env[k] for k in LOCAL_USE_NAMES if k in env}


def filter_env(env: Mapping[str, str]) -> dict[str, str]:
    """The allowlisted, redacted subset of a process environment."""
    return {k: redact_value(v) for k, v in env.items() if is_allowed(k)}
