"""A rank's number (and its process-group timeout) from the locals of a frame
that holds it, in a nonblocking dump.

py-spy ``--locals`` shows each frame's arguments and locals as text (an
int as its digits, an object as ``<Class at 0x...>``): only a plain
integer local of a known function of torch or a framework is taken, never
an attribute, never the training script's own variables (a ``rank`` there
may be anything). The frames are set-up frames (``init_process_group`` and
the frameworks' wrappers around it): the number is read when a dump the
agent takes anyway catches one, and only while the rank is unnumbered.

The timeout the same way (``TIMEOUT_FRAMES``): only where a frame holds it
as a plain number. ``init_process_group``'s own ``timeout`` is a
``datetime.timedelta``, which py-spy shows as ``<datetime.timedelta at
0x...>`` (checked with py-spy 0.4): torch's frames, Lightning's
``_init_dist_connection`` (a ``**kwargs`` dict) and DeepSpeed's
``init_distributed`` (a timedelta) hold none.
"""

from __future__ import annotations

#: (function name, file path suffix, local holding the global rank, world size
#: local or ""). A negative value (``rank=-1``: "from the environment") is no
#: number.
FRAMES: tuple[tuple[str, str, str, str], ...] = (
    ("init_process_group", "torch/distributed/distributed_c10d.py", "rank", "world_size"),
    ("_store_based_barrier", "torch/distributed/distributed_c10d.py", "rank", ""),
    ("_setup_torch_process_group", "ray/train/torch/config.py", "world_rank", "world_size"),
    ("_init_dist_connection", "lightning/fabric/utilities/distributed.py", "global_rank",
     "world_size"),
    ("_init_dist_connection", "lightning_fabric/utilities/distributed.py", "global_rank",
     "world_size"),
    ("init_distributed", "deepspeed/comm/comm.py", "rank", "world_size"),
)

#: (function name, file path suffix, local holding the process-group timeout as
#: a plain number, its unit in seconds). Ray Train's ``_setup_torch_process_group``
#: takes ``timeout_s: int`` and calls ``init_process_group(timeout=
#: timedelta(seconds=timeout_s))`` below itself (ray/train/torch/config.py).
TIMEOUT_FRAMES: tuple[tuple[str, str, str, float], ...] = (
    ("_setup_torch_process_group", "ray/train/torch/config.py", "timeout_s", 1.0),
)

#: rank_source of a number read there: ``locals:<function>``.
SOURCE_PREFIX = "locals:"
#: At most this many digits are parsed.
MAX_DIGITS = 9


def _int(text: object) -> int | None:
    if not isinstance(text, str) or not text.isascii() or not text.isdigit() \
            or len(text) > MAX_DIGITS:
        return None
    return int(text)


def claims(threads: list) -> list[tuple[str, int, int]]:
    """(source, rank, world size or 0) for each table frame in a py-spy
    ``--json --locals`` dump (threads as py-spy prints them). Pure."""
    out = []
    for t in threads if isinstance(threads, list) else ():
        frames = t.get("frames") if isinstance(t, dict) else None
        for fr in frames if isinstance(frames, list) else ():
            if not isinstance(fr, dict):
                continue
            name = fr.get("name", "")
            short = name.rsplit(".", 1)[-1] if isinstance(name, str) else ""
            path = fr.get("filename", "")
            for func, suffix, rank_var, world_var in FRAMES:
                if short != func or not isinstance(path, str) or not path.endswith(suffix):
                    continue
                values = {}
                for var in fr.get("locals") or ():
                    if isinstance(var, dict) and var.get("name") in (rank_var, world_var):
                        values[var["name"]] = _int(var.get("repr"))
                rank = values.get(rank_var)
                if rank is not None:
                    out.append((SOURCE_PREFIX + func, rank, values.get(world_var) or 0))
    return out


def _frames(threads: list):
    for t in threads if isinstance(threads, list) else ():
        frames = t.get("frames") if isinstance(t, dict) else None
        for fr in frames if isinstance(frames, list) else ():
            if isinstance(fr, dict):
                name, path = fr.get("name", ""), fr.get("filename", "")
                if isinstance(name, str) and isinstance(path, str):
                    yield name.rsplit(".", 1)[-1], path, fr


def timeout_claim(threads: list) -> tuple[float, str]:
    """(seconds, ``locals:<function>``) of the first ``TIMEOUT_FRAMES`` frame
    in a py-spy ``--json --locals`` dump that holds its timeout as a plain
    positive number, else (0.0, ""). Pure."""
    for short, path, fr in _frames(threads):
        for func, suffix, var, unit in TIMEOUT_FRAMES:
            if short != func or not path.endswith(suffix):
                continue
            for v in fr.get("locals") or ():
                if isinstance(v, dict) and v.get("name") == var:
                    n = _int(v.get("repr"))
                    if n:
                        return n * unit, SOURCE_PREFIX + func
    return 0.0, ""
