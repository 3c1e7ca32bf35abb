"""Which environment variables of a training process may leave the node.

Only allowlisted names are ever read into a sample, and their values are
redacted where they carry data or look like credentials: query-string values
and URL fragments always (structural), token formats, URLs with user info,
``key=value`` / ``key: value`` / ``--key value`` pairs whose key says secret,
authorization schemes, a path component that names a password
(``password-hunter2/``), any embedded run of token characters with no word
structure, and (envsplit) keys split across two variables. The agent redacts paths and
stack frames with the same ``redact_value`` (ncclwatch.sanitize applies it:
this module is rules only and imports none of the agent). The rules are data.

Every rule is linear in the value: a pattern starts only where its run
starts and never backtracks into it (possessive quantifiers), and spans of
a run are judged from prefix sums (a 4.5 KB path-like value once took
minutes; tests/unit/test_envpolicy_redaction.py checks the growth up to 1 MB).
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
    SLURM_JOB_NODELIST SLURM_STEP_NODELIST SLURM_NODELIST
    OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE OMPI_COMM_WORLD_LOCAL_RANK
    PMI_RANK PMI_SIZE MPI_LOCALRANKID PMIX_RANK PMIX_NAMESPACE CUDA_VISIBLE_DEVICES CUDA_LAUNCH_BLOCKING
    PYTORCH_CUDA_ALLOC_CONF GLOO_SOCKET_IFNAME
    NCCLWATCH_JOB_ID NCCLWATCH_WATCHDOG_TIMEOUT_SECONDS NCCLWATCH_PG_TIMEOUT_S DEEPSPEED_TIMEOUT
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

#: Names that are never read, even under an allowed prefix: any that holds one
#: of these (``NCCL_IB_SECRET_THING``) ...
SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE|SESSION|PRIVATE"
                         r"|SIGNATURE)", re.I)
#: ... or one of these as a whole word between ``_``, ``.`` or ``-``
#: (``NCCL_CRED``, ``TORCH_NCCL_PWD``; not ``NCCL_IB_PCI_RELAXED_ORDERING``).
SECRET_NAME_WORDS: frozenset[str] = frozenset(
    "PASS PWD PW PASSPHRASE CRED CREDS SIG JWT BEARER APIKEY PAT".split())
_NAME_WORD = re.compile(r"[_.-]")

REDACTED = "<redacted>"

#: Key names (of ``key=value``, ``key: value``, ``--key value``) whose value is a
#: secret: the key's last word is one of these (``client_secret``, ``access_key``,
#: ``pass``, ``X-Goog-Signature``) or it holds one of the strong words anywhere.
_SECRET_KEY_LAST = re.compile(
    r"(?i)(?:^|[_.-])(?:pass|passwd|password|pwd|pw|passphrase|secret|token|api_?key|apikey"
    r"|access_?key|private_?key|key|cred|creds|credentials?|auth|authorization|sig"
    r"|signature|session|cookie|jwt)$")
_SECRET_KEY_ANY = re.compile(r"(?i)passw|secret|credential|api_?key|private_?key|auth_?token")


def secret_key(key: str) -> bool:
    """A key (of a pair or an option) that says its value is a secret."""
    return bool(_SECRET_KEY_LAST.search(key) or _SECRET_KEY_ANY.search(key))


def _pair(m: re.Match[str]) -> str:
    return m.group(1) + m.group(2) + REDACTED if secret_key(m.group(1)) else m.group(0)


def _flag(m: re.Match[str]) -> str:
    return m.group(1) + m.group(2) + m.group(3) + REDACTED if secret_key(m.group(2)) \
        else m.group(0)


def _userinfo(m: re.Match[str]) -> str:
    """``user:password@host`` without a scheme, inside a run free of ``\\s/@<>``
    that an ``@host`` follows: the credential starts at the run or after one
    of ``,;=`` and is a user name, ``:``, and a password up to the ``@``."""
    run, start = m.group(0), m.start()
    text = m.string
    begin = 0 if start == 0 or text[start - 1].isspace() else None
    for c in _USER_START.finditer(run):
        if c.start() == 0 and begin is None:
            continue                      # after '/', '@', '<' or '>': not a start
        if c.end() < len(run):            # a password of at least one character
            return run[:c.start()] + REDACTED
    return run


def _jwt(m: re.Match[str]) -> str:
    """``a.b.c`` runs: a JWT is ``eyJ`` at a word start of ``a`` with 8+ after it."""
    head = m.group(1)
    for e in _EYJ.finditer(head):
        if len(head) - e.end() >= 8:
            return m.group(0)[:e.start()] + REDACTED
    return m.group(0)


#: After ``scheme://``, what is a port and a path, not a password: ``host:8080/x@y``.
_PORT_PATH = re.compile(r"[0-9]++(?:/|$)")


def _url_userinfo(m: re.Match[str]) -> str:
    """The user info of the last URL in a run up to an ``@`` goes: all of it
    where it holds no '/' (as ever); with a '/', where a user name (no '/')
    and ':' come before it and what follows is no port (``pa/ss``)."""
    run, at = m.group(1), m.group(2)
    if not at:
        return m.group(0)                  # no '@': the run is consumed, judged once
    head, sep, info = run.rpartition("://")
    if "/" in info:
        user, colon, password = info.partition(":")
        if not colon or "/" in user or not password or _PORT_PATH.match(password):
            return m.group(0)
    return head + sep + REDACTED + at if info else m.group(0)


_USER_START = re.compile(r"(?:^|(?<=[,;=]))[^:,;=]++:")
_EYJ = re.compile(r"\beyJ")

def _scheme(m: re.Match[str]) -> str:
    """The credential after an authorization scheme, unless it is a plain word:
    "Basic dXM6cA" goes, "basic auth" and "token for rank 3" (prose in a log
    line) stay. A credential has a digit, a capital or a symbol, or is long."""
    cred = m.group(3)
    if len(cred) < 16 and cred.isalpha() and cred.islower():
        return m.group(0)
    return m.group(1) + m.group(2) + REDACTED


def _quoted_pair(m: re.Match[str]) -> str:
    if not secret_key(m.group(2)):
        return m.group(0)
    value = m.group(0)[m.end(3) - m.start():]
    q = value[0] if value[0] in "\"'" else ""
    return m.group(0)[:m.end(3) - m.start()] + q + REDACTED + q


def _spaced(m: re.Match[str]) -> str:
    """``password x``: x goes when it looks like a credential (as _scheme), or
    whatever it is after a ``login`` (a netrc line); "password for rank 0" stays."""
    cred = m.group(3)
    plain = len(cred) < 16 and cred.isalpha() and cred.islower()
    if plain and "login" not in m.string[max(0, m.start() - 256):m.start()].lower():
        return m.group(0)
    return m.group(1) + m.group(2) + REDACTED


#: What may follow a password word after '.' and still name a file, not hold a secret.
_EXTENSION = re.compile(r"[a-z0-9]{1,4}")


def _word_then_secret(m: re.Match[str]) -> str:
    word, sep, rest = m.group(1), m.group(2), m.group(3)
    if sep == "." and _EXTENSION.fullmatch(rest):
        return m.group(0)                        # password.txt, secret.yaml
    if sep == "/" and word.lower() in ("pwd", "pw"):
        return m.group(0)                        # the working directory, not a secret's
    return word + sep + REDACTED


#: (pattern, replacement) for value parts that look like credentials. Each
#: pattern starts only where its run starts and never backtracks into a run
#: (possessive quantifiers), so every rule is linear in the value.
SECRET_VALUE_PATTERNS: tuple[tuple[re.Pattern[str], object], ...] = (
    # scheme://user:password@host -> scheme://<redacted>@host, also a password
    # holding '/' (postgres://user:pa/ss@db), not host:port/path@x (see _url_userinfo)
    (re.compile(r"(?<=://)([^@\s]++)(@?)"), _url_userinfo),
    # user:password@host without a scheme (MASTER_ADDR, host lists)
    (re.compile(r"(?<![^\s/@<>])[^\s/@<>]++(?=@[\w.\[-])"), _userinfo),
    # Authorization schemes, any case: "Bearer x", "basic dXNlcjpw", "token ghp_.."
    (re.compile(r"(?i)\b(bearer|basic|token|digest)([ \t]++)([A-Za-z0-9._~+/=-]++)"),
     _scheme),
    # --password x, --api-key=x, -token x; a flag starts a run of [\w.-] (not
    # after '.': starts inside a run made "J.-J.-..." quadratic)
    (re.compile(r"(?<![\w.-])(--?)([A-Za-z][\w.-]*+)(=|[ \t]++)[^\s]++"), _flag),
    # JSON and Python literals with quoted keys: "api_key": "x", 'password': 'x'
    (re.compile(r"""(?<![\w"'])(["'])([A-Za-z_][\w.-]*+)\1([ \t]*+[:=][ \t]*+)"""
                r"""(?:"[^"]*+"|'[^']*+'|[^\s,;&}\]]++)"""), _quoted_pair),
    # netrc and prose-free lists: "login bob password hunter2" (a plain word
    # too after "login"; elsewhere only a credential-like one: see _spaced)
    (re.compile(r"(?i)(?<![\w.-])(password|passwd|passphrase)([ \t]++)([^\s]++)"), _spaced),
    # A short flag that takes a password (sshpass -p x, mysql -p x); not a port
    # (-p 8080) or a path (mkdir -p /x)
    (re.compile(r"(?<![\w.-])(-p)([ \t]++)(?![0-9]++(?!\S)|[/.~-])([^\s]++)"),
     lambda m: m.group(1) + m.group(2) + REDACTED),
    # key=value, key: value, key = value whose key says secret (query strings,
    # option lists, YAML-ish "token: x"); the key stays, so the value says what it was
    (re.compile(r"(?<![\w.-])([A-Za-z_][\w.-]*+)([ \t]*+[=:][ \t]*+)[^\s&;,]++"), _pair),
    # Token formats, wherever they sit (a token inside a path: /tmp/fr_ghp_...).
    (re.compile(r"(?:AKIA|ASIA)[0-9A-Z]{16}"), REDACTED),              # AWS access key id
    (re.compile(r"hf_[A-Za-z0-9]{20,}"), REDACTED),                    # Hugging Face token
    (re.compile(r"gh[pousr]_[A-Za-z0-9]{20,}"), REDACTED),             # GitHub token
    (re.compile(r"github_pat_[A-Za-z0-9_]{20,}"), REDACTED),           # GitHub fine-grained
    (re.compile(r"glpat-[A-Za-z0-9_-]{20,}"), REDACTED),               # GitLab token
    (re.compile(r"npm_[A-Za-z0-9]{30,}"), REDACTED),                   # npm token
    (re.compile(r"xox[abposr]-[A-Za-z0-9-]{10,}"), REDACTED),          # Slack token
    (re.compile(r"(?<![A-Za-z])sk-[A-Za-z0-9_-]{20,}"), REDACTED),     # sk- API keys
    (re.compile(r"(?<![A-Za-z])[rsp]k_(?:live|test)_[A-Za-z0-9]{16,}"), REDACTED),  # Stripe
    (re.compile(r"AIza[0-9A-Za-z_-]{35}"), REDACTED),                  # Google API key
    # JWT: three dot-separated runs, the first holding "eyJ" at a word start
    (re.compile(r"(?<![A-Za-z0-9_-])([A-Za-z0-9_-]++)\.[A-Za-z0-9_-]{8,}+\.[A-Za-z0-9_-]*+"),
     _jwt),
    # Opaque tokens with a vendor-neutral prefix, any case (``tok_3f9a...``, ``TOK_9F8E...``)
    (re.compile(r"(?<![A-Za-z0-9])(?i:tok_)[A-Za-z0-9]{16,}"), REDACTED),
    # A path component or word that names a password and then holds it:
    # /home/alice/password-hunter2/nccl.log -> /home/alice/password-<redacted>/nccl.log;
    # PASSWORD.x (not password.txt), pw_x as a path component, and a directory
    # named for a secret: /home/alice/secret/<redacted>/x
    (re.compile(r"(?i)(?<![A-Za-z0-9])(passw(?:or)?d|passphrase|passwort|pwd|secret|(?<=/)pw)"
                r"([-_+./])([^/\\\s,;&]++)"), _word_then_secret),
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
    ``max_structure`` of their characters), change character kind at least
    ``min_switches`` of the time and hold a segment (between ``/_+.-``) of at
    least ``min_segment`` characters, are tokens."""

    name: str
    min_len: int
    needs: str
    max_structure: float = 1.0
    min_switches: float = 0.0
    min_segment: int = 0


RANDOM_RUN_RULES: tuple[RandomRunRule, ...] = (
    # API keys, SAS signatures, base64 secrets: mixed case; names like
    # ``Llama/model-00001`` and ``TrainingRunV2`` are words and numbers.
    RandomRunRule("base64", 20, "UL", max_structure=0.5),
    # Lower-case opaque tokens (``tok_a1b2c3...``): one long segment whose
    # letters and digits alternate far more than in names (``model00001of00004``,
    # ``checkpoint2024``); ``layer4_block12_conv3x3`` has no long segment.
    RandomRunRule("lower_opaque", 20, "LD", max_structure=0.5, min_switches=0.35,
                  min_segment=16),
)

@dataclass(frozen=True, slots=True)
class OpaqueSegmentRule:
    """A segment (between ``/_+.-``) at least ``min_len`` long, of one case
    (``upper`` or ``lower``) and digits, at least ``min_digits`` of them,
    whose words hold at most ``max_structure`` of it once lower-cased (base32
    ``JBSWY3DPEHPK3PXP``, ``kq8zmxwprtvb3nhyfdjl``: no vowels to speak of;
    ``RESNET50V1BIMAGENET1K``, ``checkpoint2024120512``: words and numbers)."""

    name: str
    min_len: int
    case: str
    min_digits: int = 1
    max_structure: float = 0.25
    #: Where set, a segment with more structure is a token all the same unless
    #: it also changes letter/digit kind at most this often and a share of at
    #: least ``min_name_vowels`` of its letters are vowels (as names are).
    max_name_switches: float | None = None
    min_name_vowels: float = 0.0


OPAQUE_SEGMENT_RULES: tuple[OpaqueSegmentRule, ...] = (
    OpaqueSegmentRule("upper_or_base32", 16, "upper"),
    OpaqueSegmentRule("lower_opaque_words", 20, "lower"),
    # 32+ lower-case letters and digits in one segment (an API key, a session
    # or a 32-character hex/base36 token): a token unless it reads as names
    # (words with vowels and few letter/digit changes: ``llama2chathf7b...``,
    # ``resnet50v1bimagenet1kfinetuned2024``). Random ones have vowels in
    # ~23% of their letters and change kind ~40% of the time.
    OpaqueSegmentRule("lower_token_32", 32, "lower", min_digits=2, max_structure=0.75,
                      max_name_switches=0.25, min_name_vowels=0.25),
)


def _opaque_segment(segment: str) -> bool:
    digits = sum(c.isdigit() for c in segment)
    letters = len(segment) - digits
    if not letters or not segment.isalnum() or not segment.isascii():
        return False
    case = "upper" if segment.isupper() else "lower" if segment.islower() else ""
    return any(r.case == case and len(segment) >= r.min_len and digits >= r.min_digits
               and (_structure_lower(segment) <= r.max_structure * len(segment)
                    or (r.max_name_switches is not None
                        and not _reads_as_names(segment, letters, r)))
               for r in OPAQUE_SEGMENT_RULES)


def _reads_as_names(segment: str, letters: int, r: OpaqueSegmentRule) -> bool:
    """Few letter/digit changes and a name's share of vowels (r's bounds)."""
    _, _, _, changes = _letters(segment)
    vowels = sum(c in _VOWELS for c in segment)
    return (changes <= (r.max_name_switches or 0) * (len(segment) - 1)
            and vowels >= r.min_name_vowels * letters)


def _structure_lower(segment: str) -> int:
    return sum(len(w) for w in _STRUCTURE.findall(segment.lower()) if _name_piece(w))


#: Hex keys and digests, wherever they sit (``run-<40 hex>``): 32+ hex digits
#: with both digits and letters (a plain long number is not a key).
_HEX_KEY = re.compile(r"(?<![0-9a-fA-F])(?=[0-9a-fA-F]*[a-fA-F])(?=[0-9a-fA-F]*[0-9])[0-9a-fA-F]{32,}(?![0-9a-fA-F])")


#: str.translate tables that drop one character kind (counts at C speed).
_DROP_KIND = {
    "U": str.maketrans("", "", "ABCDEFGHIJKLMNOPQRSTUVWXYZ"),
    "L": str.maketrans("", "", "abcdefghijklmnopqrstuvwxyz"),
    "D": str.maketrans("", "", "0123456789"),
}


def _kind(c: str) -> str:
    return "U" if c.isupper() else "L" if c.islower() else "D" if c.isdigit() else "O"


def is_allowed(name: str) -> bool:
    if SECRET_NAME.search(name) or not SECRET_NAME_WORDS.isdisjoint(
            _NAME_WORD.split(name.upper())):
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


#: Folders under which a hex run names a container, a pod or a cgroup (the
#: kernel's and the runtimes' own paths: ``/sys/fs/cgroup/.../docker-<64 hex>
#: .scope``): a path under one loses token formats and credentials only, never a
#: component by its shape.
CONTAINER_ID_PLACES: tuple[str, ...] = (
    "/sys/fs/cgroup/", "/var/lib/docker/containers/", "/run/docker/",
    "/var/lib/containerd/", "/run/containerd/", "/var/lib/kubelet/pods/",
)
_PLACE = re.compile(r"(?<![^\s,;=:])(?:" + "|".join(map(re.escape, CONTAINER_ID_PLACES))
                    + r")[^\s,;]*+")


def redact_value(value: str) -> str:
    """Replace credential-looking parts of a value; keep the rest readable."""
    value = redact_patterns(value)
    if not _PLACE.search(value):
        return _by_shape(value)
    out, at = [], 0
    for m in _PLACE.finditer(value):
        out += [_by_shape(value[at:m.start()]) if m.start() > at else "", m.group(0)]
        at = m.end()
    return "".join(out) + (_by_shape(value[at:]) if at < len(value) else "")


def _by_shape(value: str) -> str:
    """The shape rules: hex keys, random runs and their neighbours."""
    value = _HEX_KEY.sub(REDACTED, value)
    value = _COMPONENT.sub(_redact_if_random, value)
    value = _RUN.sub(_redact_random_spans, value)
    return _redact_neighbours(value) if REDACTED + "/" in value or "/" + REDACTED in value \
        else value


#: A path component beside a redacted one that is the rest of the same secret
#: (a base64 key cut at a '/': ``/x/<redacted>/bPxRfiCYEXAMPLEKEY``): token
#: characters only (no '.': ``m.pt`` is a file), an upper-case letter, and
#: little word structure (``Llama-2-7b``, ``Model`` stay).
_NEIGHBOUR = re.compile(r"[A-Za-z0-9+=_-]{4,}")


def _redact_neighbours(value: str) -> str:
    parts = value.split("/")
    for _ in range(MAX_SPAN):
        changed = False
        for i, p in enumerate(parts):
            if p == REDACTED or not _NEIGHBOUR.fullmatch(p) or p.lower() == p:
                continue
            near = (i and parts[i - 1] == REDACTED) or (i + 1 < len(parts)
                                                        and parts[i + 1] == REDACTED)
            alnum = sum(c.isalnum() for c in p)
            if near and sum(_structure(seg) for seg in _SEGMENT.split(p)) <= 0.5 * alnum:
                parts[i], changed = REDACTED, True
        if not changed:
            break
    out = [p for i, p in enumerate(parts) if not (i and p == parts[i - 1] == REDACTED)]
    return "/".join(out)


def _redact_if_random(m: re.Match[str]) -> str:
    return REDACTED if looks_random(m.group(0)) else m.group(0)


#: A secret with '/' in it (base64) is judged over at most this many adjacent
#: path components: a 64-byte base64 key holds one or two '/', one of 300
#: bytes a handful. Bounding the span keeps the judgement linear in the run.
MAX_SPAN = 6


@dataclass(frozen=True, slots=True)
class _Shape:
    """What RANDOM_RUN_RULES look at in a run (``looks_random``'s inputs)."""

    length: int
    kinds: frozenset[str]       # of U, L, D present
    alnum: int
    structure: int
    switches: float
    longest: int = 0            # the longest segment between separators


def _judge(shape: _Shape) -> bool:
    return any(shape.length >= r.min_len and all(k in shape.kinds for k in r.needs)
               and shape.structure <= r.max_structure * shape.alnum
               and shape.switches >= r.min_switches and shape.longest >= r.min_segment
               for r in RANDOM_RUN_RULES)


def _letters(core: str) -> tuple[int, str, str, int]:
    """(count, first kind, last kind, kind changes) of the non-separator characters."""
    n, first, last, changes = 0, "", "", 0
    for c in core:
        k = _kind(c)
        if k == "O":
            continue
        if n and k != last:
            changes += 1
        if not n:
            first = k
        n, last = n + 1, k
    return n, first, last, changes


def _redact_random_spans(m: re.Match[str]) -> str:
    """Within a run that holds '/', the spans of whole components that look
    random (a base64 secret with '/' in it, inside a path of names) go.

    The smallest random spans (up to MAX_SPAN components) are found first; a
    hit then takes its neighbours along while they are not plain names
    (lower-case letters or digits only), so a secret's short pieces go with it
    and ``/ckpt/`` or ``/x.pt`` stay. Linear: each component's shape is read
    once, a span's shape is summed from prefix sums.
    """
    run = m.group(0)
    parts = run.split("/")
    if len(parts) == 1:
        return REDACTED if looks_random(parts[0]) else parts[0]
    n = len(parts)
    judged = run.rstrip("=").split("/")       # '=' padding ends only the last part
    kinds_run = {k for k, table in _DROP_KIND.items() if len(run.translate(table)) < len(run)}
    if not any(all(k in kinds_run for k in r.needs) for r in RANDOM_RUN_RULES):
        return run                             # no span can hold what any rule needs
    # prefix sums over components: chars, alnum, structure, components with U/L/D
    switches = any(r.min_switches > 0 for r in RANDOM_RUN_RULES)
    length = [0] * (n + 1)
    alnum = [0] * (n + 1)
    struct = [0] * (n + 1)
    has = {k: [0] * (n + 1) for k in "ULD"}
    letters = []
    longest = [max(map(len, _SEGMENT.split(p))) for p in judged]
    for i, p in enumerate(judged):
        counts = {k: len(p) - len(p.translate(table)) for k, table in _DROP_KIND.items()}
        length[i + 1] = length[i] + len(p)
        alnum[i + 1] = alnum[i] + sum(counts.values())
        struct[i + 1] = struct[i] + (sum(_structure(seg) for seg in _SEGMENT.split(p))
                                     if p else 0)
        for k in "ULD":
            has[k][i + 1] = has[k][i] + (counts[k] > 0)
        if switches:
            letters.append(_letters(p))

    def shape(i: int, j: int) -> _Shape | None:
        """The shape of parts[i..j] joined, stripped of outer '/' (None: empty)."""
        while i <= j and not judged[i]:
            i += 1
        while j >= i and not judged[j]:
            j -= 1
        if i > j:
            return None
        if i == j and _UUID.fullmatch(judged[i]):
            return _Shape(0, frozenset(), 0, 0, 0.0)
        chars = length[j + 1] - length[i] + (j - i)
        kinds = frozenset(k for k in "ULD" if has[k][j + 1] - has[k][i])
        sw = 0.0
        if switches:
            count, changes, last = 0, 0, ""
            for k in range(i, j + 1):
                c, first, lst, ch = letters[k]
                if not c:
                    continue
                changes += ch + (1 if last and first != last else 0)
                count, last = count + c, lst
            sw = changes / max(1, count - 1)
        return _Shape(chars, kinds, alnum[j + 1] - alnum[i], struct[j + 1] - struct[i], sw,
                      max(longest[i:j + 1]))

    hit = [False] * n
    min_len = min(r.min_len for r in RANDOM_RUN_RULES)
    for span in range(1, min(n, MAX_SPAN) + 1):
        hits = [0] * (n + 1)                 # hits before this pass, as prefix sums
        for k in range(n):
            hits[k + 1] = hits[k] + hit[k]
        marked_to = -1                       # the last part marked in this pass
        for i in range(n - span + 1):
            j = i + span - 1
            if span > 1 and (i <= marked_to or hits[j + 1] - hits[i]
                             or length[j + 1] - length[i] + span - 1 < min_len):
                continue
            sh = shape(i, j)
            if sh is not None and _judge(sh):
                for k in range(i, j + 1):
                    hit[k] = True
                marked_to = j
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
    count, _, _, changes = _letters(core)
    kinds = frozenset(_kind(c) for c in core) - {"O"}
    segments = _SEGMENT.split(core)
    if any(_opaque_segment(segment) for segment in segments):
        return True
    return _judge(_Shape(len(core), kinds, count,
                         sum(_structure(segment) for segment in segments),
                         changes / max(1, count - 1), max(map(len, segments))))


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


#: Allowlisted variables kept per process (by name order): a process with
#: thousands of NCCL_* variables costs the agent no more than this.
MAX_VARIABLES = 256
