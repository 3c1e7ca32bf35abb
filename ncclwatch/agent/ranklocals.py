"""A rank's number from the locals of a frame that holds it, in a nonblocking dump.

py-spy ``--locals`` shows each frame's arguments and locals as text (an
int as its digits, an object as ``<Class at 0x...>``): only a plain
integer local of a known function of torch or a framework is taken, never
an attribute, never the training script's own variables (a ``rank`` there
may be anything). The frames are set-up frames (``init_process_group`` and
the frameworks' wrappers around it): the number is read when a dump the
agent takes anyway catches one, and only while the rank is unnumbered.
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
