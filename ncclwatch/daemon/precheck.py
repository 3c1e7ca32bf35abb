"""What of a report can be judged without the job table, judged where it arrives.

With ``--ingest-workers N`` each worker parses the reports it receives
anyway; ``clean`` runs there every check of admission that needs nothing
the core holds: the node's own fields (validate.check_node), each rank
sample, change, brief, exited entry and Flight Recorder summary on its own
(contract/checks.py), no rank twice, one world size per job, and no string
that the one escaper (sanitize.neutralise) would change. A clean report is
forwarded as such (ingestlink.CHECKED) and the core applies it with the
table's judgments alone (admission.admit and core.Daemon.ingest with
``prechecked``): the same answer, less of the core's CPU.

Anything at fault and the report goes to the core as it came, which runs
every check itself: a fault's status, message, counters and log line keep
their one home (admission.py, ingest.py), and a bug here can cost only
speed, never a verdict. Stacks are checked in the core either way: which
stacks it already holds as sent is the table's knowledge.
"""

from __future__ import annotations

from typing import Any, Callable

from ncclwatch import sanitize
from ncclwatch.contract import checks
from ncclwatch.contract.bounds import Bounds
from ncclwatch.contract.checks import Fault
from ncclwatch.daemon.validate import ReportError, check_node
from ncclwatch.v1 import collector_pb2 as pb


Header = tuple[str, str, str]


def header(req: pb.ReportRequest) -> Header:
    """All the text a report of briefs alone holds: its node, agent id and version."""
    r = req.report
    return r.node, r.agent_id, r.health.version


def clean(req: pb.ReportRequest, bounds: Bounds,
          check_job: Callable[[Any, Bounds], Fault | None] | None = None,
          known: Header | None = None) -> bool:
    """Whether admission, given ``req``, could find fault with nothing in it but
    what the table knows. May escape ``req``'s strings in place (a copy the
    caller does not forward: one that was changed is not clean). ``known``:
    the header of the stream's last clean report; a report of briefs alone
    with the same one holds no text to look at (core.Daemon._known_header)."""
    try:
        shape = check_node(req, bounds)
    except ReportError:
        return False
    if shape.briefs.slot and checks.bad_briefs(shape.briefs):
        return False
    if shape.samples and not _samples(shape.samples, bounds, check_job):
        return False
    for c in shape.changes:
        if checks.check_change(c, bounds) is not None:
            return False
    for e in shape.exited:
        if checks.check_exited(e) is not None:
            return False
    if not shape.parts and known is not None and header(req) == known:
        return True
    return sanitize.neutralise(req.report) == 0


def _samples(samples, bounds: Bounds,
             check_job: Callable[[Any, Bounds], Fault | None] | None) -> bool:
    """Each sample passes on its own, names a rank no other one does, and says the
    world size the others of its job say."""
    seen: set[tuple[str, int]] = set()
    worlds: dict[str, int] = {}
    for s in samples:
        if checks.check_sample(s, bounds, check_job) is not None:
            return False
        ident = s.identity
        key = checks.rank_key(ident)
        if key in seen:
            return False
        seen.add(key)
        if ident.world_size and worlds.setdefault(ident.job_id, ident.world_size) \
                != ident.world_size:
            return False
        if s.HasField("flight_recorder") and checks.check_flight_recorder(
                s.flight_recorder, ident.world_size, bounds) is not None:
            return False
    return True
