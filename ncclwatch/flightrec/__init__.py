"""PyTorch Flight Recorder dumps: load, normalise, summarise, analyse across ranks.

A Flight Recorder (FR) dump is what a rank's c10d backend writes when asked
(debug-info pipe, dump on timeout, ``torch._C._distributed_c10d._dump_fr_trace()``):
a pickle of a dict ``{version, pg_config, pg_status, entries, ...}``, one file
per global rank (``<prefix><rank>``). Its format moved over the torch releases;
the ``version`` key names it, and the header that defines it says "minor when
adding fields, major when changing existing fields". This module reads every
2.x layout (and the 1.x ``pg_config`` shapes) into one normalised model:

* ``FrDump``: one rank's dump; ``FrEntry``: one recorded collective / p2p op.
* ``summarize(dump)``: per process group, how far the rank got
  (``PgProgress``): that is what an agent ships, a few numbers per group.
* ``analyze(dumps)`` / ``analyze_progress(summaries)``: across ranks, the first
  collective of each group that did not complete everywhere, which members are
  blocked in it (waiting) and which never enqueued it (missing: the culprits),
  plus desyncs (same group and sequence number, different op or sizes).

What each version holds (from the torch sources; tests/data/flightrec/README.md
keeps the evidence, and which rows are read from a source file and which are
inferred):

=======  ==============================================================
version  change
=======  ==============================================================
1.x      ``pg_config`` a list (or dict) of rank lists indexed by pg id;
         no ``process_group`` / ``is_p2p`` keys (``seq_id`` in the first)
2.0      ``pg_config`` {name: {name, desc, ranks: "[0, 1]"}}, ``is_p2p``,
         ``process_group`` (name, desc); dtypes as ``"float"``
2.2      ``timeout_ms`` per entry (inferred)
2.3      ``pg_status`` {pg_id: last_enqueued/started/completed_collective},
         ``timeout_ms``; dtypes as ``"Float"``; no ``entries`` key when
         collectives are not included
2.7      ``nccl_version``
2.8      ``thread_id``, ``thread_name`` per entry (inferred)
2.9      ``comm_lib_version`` replaces ``nccl_version`` (inferred)
2.10     all of it (torch 2.13, checked live with gloo)
=======  ==============================================================

Every field past the core ones is optional here, and a 2.x minor this reader
has not seen is read the same way (minor bumps only add fields); another
major version is refused.

Completion, by the backend's semantics:

* NCCL (and the other event-tracking backends) set ``state`` from CUDA events:
  ``completed`` means done; ``retired`` without ``completed`` means the watchdog
  dropped it (timed out / aborted: "a retired but not completed event has timed
  out", FlightRecorder.hpp). ``pg_status.last_completed_collective`` can count
  such a timed-out work, so the status is lowered to the first entry that is
  not completed.
* gloo leaves every entry ``scheduled`` and ``last_started_collective`` at -1;
  finishing shows only as ``retired`` and in ``pg_status``. It retires a work
  that failed (timeout, peer gone) exactly like one that succeeded, so a gloo
  dump taken after the timeout fired no longer shows the hang: dump while the
  ranks are blocked (the debug-info pipe does).
* gloo's ``pg_config`` is not usable: it is recorded before the group has a
  name, under the key ``""``, and the last group constructed overwrites it
  (``{'': {'name': '', 'desc': '', 'ranks': '[]'}}`` after a ``new_group``).
  Group membership then comes from the dumps themselves (the ranks that report
  the group), and for the default group from ``world_size`` when given.

A dump is untrusted input (a file another user's process wrote): it is read
with ``ncclwatch.safepickle`` (no globals, no persistent ids), so only
dict/list/tuple/str/int/float/bool/None can come out of it, and nothing in it
is executed.

Modules, in the layout of torch's own ``torch/distributed/flight_recorder``
(components: loader, types, builder): ``load`` (bytes -> FrDump), ``model``
(the types), ``analyze`` (summaries and the cross-rank verdict).
"""

from __future__ import annotations

from ncclwatch.flightrec.analyze import analyze, analyze_progress, is_default_group, summarize
from ncclwatch.flightrec.load import (MAX_DUMP_BYTES, SUPPORTED_MAJORS, load_dump, loads_dump,
                                      normalize, parse_version, rank_from_path)
from ncclwatch.flightrec.model import (FlightRecorderError, FrAnalysis, FrDump, FrEntry, Mismatch,
                                       PgInfo, PgProgress, Stuck)

__all__ = [
    "MAX_DUMP_BYTES",
    "SUPPORTED_MAJORS",
    "FlightRecorderError",
    "FrAnalysis",
    "FrDump",
    "FrEntry",
    "Mismatch",
    "PgInfo",
    "PgProgress",
    "Stuck",
    "analyze",
    "analyze_progress",
    "is_default_group",
    "load_dump",
    "loads_dump",
    "normalize",
    "parse_version",
    "rank_from_path",
    "summarize",
]
