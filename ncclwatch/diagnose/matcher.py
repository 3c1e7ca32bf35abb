"""Every trigger of the sign table (logsigns.py) in one automaton, built once.

The scanner looks for triggers over whole chunks of bytes and decodes only
the lines that hold one; the automaton also finds a trigger that a terminal
cut in two at a line's end. Built once per process (``matcher()``): it is the
costly part of starting a scan.
"""

from __future__ import annotations

from typing import Iterable

import ahocorasick_rs

from ncclwatch.diagnose import logsigns
from ncclwatch.diagnose.logsigns import SIGNS
from ncclwatch.diagnose.signtypes import LogSign


class Matcher:
    """All triggers of all signs in one automaton; patterns compiled once.

    ``ac`` finds whole triggers (used per line, overlapping). ``scan_ac`` (used over
    whole chunks, leftmost-longest) also holds every prefix and suffix of every
    trigger of at least FRAGMENT characters: a terminal that hard-wraps a line
    inside a trigger leaves a prefix at the end of one line and the suffix at the
    start of the next, one of them at least that long (logsigns.MAX_TRIGGER)."""

    def __init__(self, signs: Iterable[LogSign] = SIGNS) -> None:
        self.signs = tuple(signs)
        triggers: list[str] = []
        self.by_trigger: list[list[int]] = []
        index: dict[str, int] = {}
        for i, sign in enumerate(self.signs):
            for t in sign.triggers:
                if t not in index:
                    index[t] = len(triggers)
                    triggers.append(t)
                    self.by_trigger.append([])
                self.by_trigger[index[t]].append(i)
        self.triggers = [t.encode() for t in triggers]
        self.ac = ahocorasick_rs.BytesAhoCorasick(self.triggers)
        self.patterns = [s.compile() for s in self.signs]
        #: Signs read by a function (the severity grammar), not by a pattern of their own.
        self.readers = frozenset(s.id for s in self.signs if s.reader is not None)
        # Pattern index of scan_ac -> (whole trigger?, a trigger's start at a line's end?,
        # a trigger's end at a line's start?). The pieces carry their newline, so they
        # match only where a wrap could have cut (a word inside a line costs nothing).
        roles: dict[bytes, list[bool]] = {t: [True, False, False] for t in self.triggers}
        cut = {t.encode() for s in self.signs for t in s.triggers
               if not (s.whole_only and len(t) < logsigns.MIN_TRIGGER)}
        for t in self.triggers:
            if t not in cut:
                continue
            for n in range(logsigns.FRAGMENT, len(t)):
                for eol in (b"\n", b"\r\n"):
                    roles.setdefault(t[:n] + eol, [False, False, False])[1] = True
                # After a newline, a markdown quote, or a log viewer's "[88716] ".
                for bol in (b"\n", b"\n> ", b"] "):
                    roles.setdefault(bol + t[len(t) - n:], [False, False, False])[2] = True
        self.scan_patterns = list(roles)
        self.roles = [tuple(roles[p]) for p in self.scan_patterns]
        self.scan_ac = ahocorasick_rs.BytesAhoCorasick(
            self.scan_patterns, matchkind=ahocorasick_rs.MatchKind.LeftmostLongest)

    def signs_in(self, line: bytes) -> list[int]:
        """Indexes of the signs whose triggers occur in ``line``, in table order."""
        hit: set[int] = set()
        for t, _s, _e in self.ac.find_matches_as_indexes(line, overlapping=True):
            hit.update(self.by_trigger[t])
        return sorted(hit)


_MATCHER: Matcher | None = None


def matcher() -> Matcher:
    global _MATCHER
    if _MATCHER is None:
        _MATCHER = Matcher()
    return _MATCHER
