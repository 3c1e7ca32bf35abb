"""A job's facts as its ranks send them (JobInfo), read once per distinct value.

Every rank of a job sends the same JobInfo (environment, timeout, packages,
scheduler names), on its first report and every few rounds after: a 100k-rank
job starting is 100k copies of one message. Reading a protobuf map entry by
entry costs microseconds, so the environment as a dict, the node list it
states (schednodes.node_list) and the contract's verdict on it
(checks.check_job_info) are kept by the message's wire bytes: each copy after
the first costs one serialization and a lookup. The dict is shared by every
job and rank that sent those bytes: read-only.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Any

from ncclwatch.contract import checks
from ncclwatch.contract.bounds import Bounds
from ncclwatch.contract.checks import Fault
from ncclwatch.daemon.schednodes import node_list

#: Distinct JobInfo values kept (least recently seen forgotten first): a few
#: per job; a fleet of daemon-bounded jobs holds a few hundred.
KEEP = 1024


@dataclass(frozen=True, slots=True)
class Facts:
    env: dict[str, str]                 # read-only: shared by all who sent it
    nodes: frozenset[str] | None        # the node list it states (None: none)


class JobInfos:
    """JobInfo values by wire bytes: their facts, and their verdict per bounds."""

    def __init__(self, keep: int = KEEP) -> None:
        self.keep = keep
        self._facts: collections.OrderedDict[bytes, Facts] = collections.OrderedDict()
        self._verdicts: collections.OrderedDict[tuple[bytes, Bounds], Fault | None] = \
            collections.OrderedDict()

    @staticmethod
    def _key(info: Any) -> bytes:
        return info.SerializeToString(deterministic=True)

    def facts(self, info: Any) -> Facts:
        key = self._key(info)
        got = self._facts.get(key)
        if got is None:
            env = dict(info.env)
            got = self._facts[key] = Facts(env, node_list(env))
            if len(self._facts) > self.keep:
                self._facts.popitem(last=False)
        else:
            self._facts.move_to_end(key)
        return got

    def check(self, info: Any, bounds: Bounds) -> Fault | None:
        """checks.check_job_info of ``info``, remembered (a check_sample hook)."""
        key = (self._key(info), bounds)
        if key in self._verdicts:
            self._verdicts.move_to_end(key)
            return self._verdicts[key]
        got = self._verdicts[key] = checks.check_job_info(info, bounds)
        if len(self._verdicts) > self.keep:
            self._verdicts.popitem(last=False)
        return got
