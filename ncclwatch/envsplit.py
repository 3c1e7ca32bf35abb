"""Keys split across two environment variables (``NCCL_X_A=hf_abcd``,
``NCCL_X_B=efgh...``): each pair of a process's allowlisted values is joined
end to start and judged by envpolicy's rules (envpolicy.redact_value alone
judges one value)."""

from __future__ import annotations

import re

from ncclwatch.envpolicy import REDACTED, redact_patterns, redact_value

#: A value's tail and head as a token could continue them across variables.
_TAIL = re.compile(r"[A-Za-z0-9+/_=-]{1,128}$")
_HEAD = re.compile(r"^[A-Za-z0-9+/_-]{1,128}")
#: Joined pieces shorter than this cannot make a token any rule knows; a piece
#: shorter than _PIECE_MIN is a word (``INFO``, ``eth0``), not half a key,
#: unless the join is a token format (``AKIA`` + ``IOSFODNN7EXAMPLE``): short
#: pieces are judged by the format patterns only, never by shape.
_SPLIT_MIN = 16
_PIECE_MIN = 6
_SHORT_PIECE_MIN = 2
#: Values looked at for split keys (the allowlist keeps a process's count small).
_SPLIT_MAX_VALUES = 64


def split_secrets(raw: dict[str, str], redacted: dict[str, str] | None = None) -> dict[str, str]:
    """Redact a key split across two variables (``NCCL_X_A=hf_abcd``,
    ``NCCL_X_B=efgh...``), judged on the ``raw`` values and cut in their
    ``redacted`` forms (each value already redacted alone; default: the raw
    ones). For every ordered pair, the tail of one value and the head of the
    other are joined and redacted; where the joined redaction differs from
    the halves redacted apart, both halves go (also when one half alone was
    redacted already: the other half is the rest of the same key). Bounded:
    128 characters a piece, at most ``_SPLIT_MAX_VALUES`` values."""
    out = dict(raw if redacted is None else redacted)
    names = sorted(raw)[:_SPLIT_MAX_VALUES]
    tails = {k: m.group(0) for k in names
             if (m := _TAIL.search(raw[k])) and len(m.group(0)) >= _SHORT_PIECE_MIN}
    heads = {k: m.group(0) for k in names
             if (m := _HEAD.match(raw[k])) and len(m.group(0)) >= _SHORT_PIECE_MIN}
    alone = {p: redact_value(p) for p in {*tails.values(), *heads.values()}}
    cut_tail: set[str] = set()
    cut_head: set[str] = set()
    for a, tail in tails.items():
        for b, head in heads.items():
            if a == b or len(tail) + len(head) < _SPLIT_MIN:
                continue
            if min(len(tail), len(head)) < _PIECE_MIN:
                # a short piece: a token format across the join, or nothing
                split = REDACTED in redact_patterns(tail + head) and \
                    REDACTED not in redact_patterns(tail) + redact_patterns(head)
            elif alone[tail] != tail or alone[head] != head:
                # one half is a token alone: the other is its rest only if it
                # has a token's mixed case (``mlx5_0``, ``INFO`` beside a token stay)
                rest = head if alone[tail] != tail else tail
                split = alone[rest] == rest and _mixed_case(rest) and \
                    redact_value(tail + head) != alone[tail] + alone[head]
            else:           # an upper-case word beside a lower-case one is no key
                split = _may_join(tail, head, raw[a] == tail, raw[b] == head) and \
                    redact_value(tail + head) != alone[tail] + alone[head]
            if split:
                cut_tail.add(a)
                cut_head.add(b)
    for k in cut_tail | cut_head:
        v = out[k]
        if k in cut_tail:
            v = _cut_end(v, tails[k])
        if k in cut_head:
            v = _cut_start(v, heads[k])
        out[k] = v.replace(REDACTED + REDACTED, REDACTED)
    return out


def _mixed_case(piece: str) -> bool:
    return piece.lower() != piece and piece.upper() != piece


def _may_join(a: str, b: str, a_whole: bool, b_whole: bool) -> bool:
    """Pieces that could be one token's: both of one case (or caseless:
    digits), or one of mixed case and the other a whole value. ``IOSFODNN7EXAMPLE``
    + ``mlx5_0`` are two words, and so are a mixed-case piece and the start
    of ``mlx5_0:1,mlx5_1:1``."""
    def case(p: str) -> str:
        return "M" if _mixed_case(p) else "U" if p.lower() != p else \
            "L" if p.upper() != p else ""
    ca, cb = case(a), case(b)
    if ca == cb or "" in (ca, cb):
        return True
    return (ca == "M" and b_whole) or (cb == "M" and a_whole)


def _cut_end(value: str, piece: str) -> str:
    """``value`` (a redacted form) without its last token piece: the raw
    ``piece`` if it is still there, else whatever token run ends it."""
    if value.endswith(piece):
        return value[:len(value) - len(piece)] + REDACTED
    if value.endswith(REDACTED):
        return value
    m = _TAIL.search(value)
    return value[:m.start()] + REDACTED if m else value


def _cut_start(value: str, piece: str) -> str:
    if value.startswith(piece):
        return REDACTED + value[len(piece):]
    if value.startswith(REDACTED):
        return value
    m = _HEAD.match(value)
    return REDACTED + value[m.end():] if m else value
