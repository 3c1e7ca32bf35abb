"""A rank sample's readings into its record: process, memory limits, GPU, files.

Pure translation of wire values (the hot loop of ingest, bench/daemon_ingest.py):
each protobuf field read once, strings every rank shares kept as one object.
"""

from __future__ import annotations

from typing import Any

from ncclwatch import syscalls
from ncclwatch.daemon.learn import smooth_cpu
from ncclwatch.daemon.records import RankRecord
from ncclwatch.v1 import collector_pb2 as pb

#: Where an agent may say a file's expected size came from (anything else is dropped).
_SIZE_SOURCES = {s: s for s in ("torch_zip_header", "safetensors_header", "copy_source")}
LIMIT_NAMES = {
    pb.MEMORY_LIMIT_KIND_HOST: "host",
    pb.MEMORY_LIMIT_KIND_CGROUP: "cgroup",
    pb.MEMORY_LIMIT_KIND_ADDRESS_SPACE: "address_space",
}
_GPU_NAMES = {i: f"gpu{i}" for i in range(64)}


def _activity(g) -> tuple[int, int, float, float]:
    """(device, utilisation % or -1, power W or -1, power limit W or 0): absent fields are unknown."""
    return (g.device_index,
            g.device_util_percent if g.HasField("device_util_percent") else -1,
            g.device_power_watts if g.HasField("device_power_watts") else -1.0,
            g.device_power_limit_watts if g.HasField("device_power_limit_watts") else 0.0)


def _gpu_name(index: int) -> str:
    """``gpu<index>``, one shared string per common index."""
    return _GPU_NAMES.get(index) or f"gpu{index}"


def container_of(ident: Any) -> tuple | None:
    """(container pid, hostname, container id, runtime, pod uid, namespace, pod,
    declared namespace, declared pod) of a RankIdentity; None on the host."""
    if not ident.HasField("container"):
        return None
    c = ident.container
    return (c.container_pid, c.hostname, c.container_id, c.runtime, c.pod_uid, c.namespace,
            c.pod, c.declared_namespace, c.declared_pod)


def take_process(rec: RankRecord, s: Any, recv: float) -> None:
    """A RankSample's process, GPU and file readings, received at ``recv``."""
    p = s.process
    written = p.io_write_bytes
    if rec.seen and written >= rec.io_write_bytes and recv > rec.seen:
        rate = (written - rec.io_write_bytes) / (recv - rec.seen)
        rec.write_rate = 0.5 * rec.write_rate + 0.5 * rate
    rec.io_write_bytes = written
    rec.cpu_recent = smooth_cpu(rec.cpu_recent, p.cpu_utilization, recv - rec.seen)
    rec.seen = recv
    rec.cpu_util = p.cpu_utilization
    rec.cpu_seconds = p.cpu_seconds
    rec.rss_bytes = p.rss_bytes
    files = p.files_writing
    rec.files = tuple([(f.path, f.size_bytes, f.previous_path, f.previous_size_bytes,
                        f.expected_size_bytes, _SIZE_SOURCES.get(f.expected_source, ""))
                       for f in files]) if files else ()
    if files and files[0].path != rec.file_first[0]:
        rec.file_first = (files[0].path, written, files[0].size_bytes)
    rec.vms_bytes = p.vms_bytes
    blocked = s.blocked_in
    if blocked != rec.blocked_in:
        # Only a reading in syscalls' grammar is kept: anything else is unknown.
        rec.blocked_in = blocked if syscalls.parse(blocked)[0] else ""
    limits = [(LIMIT_NAMES.get(m.kind, "host"), m.used_bytes, lim)
              for m in p.memory_limits if (lim := m.limit_bytes) > 0]
    gpus = s.gpu
    if gpus:
        rec.gpu = tuple([(g.device_index, g.used_bytes, g.device_total_bytes)
                         for g in gpus])
        rec.gpu_uuids = tuple([(g.device_index, g.device_uuid) for g in gpus if g.device_uuid])
        rec.gpu_activity = tuple([_activity(g) for g in gpus]) if any(
            g.HasField("device_util_percent") or g.HasField("device_power_watts")
            for g in gpus) else ()
        limits += [(_gpu_name(g.device_index), g.device_used_bytes, total)
                   for g in gpus if (total := g.device_total_bytes) > 0]
    else:
        rec.gpu = rec.gpu_uuids = rec.gpu_activity = ()
    rec.limits = tuple(limits)
    rec.curve.add(recv, rec.rss_bytes, written, rec.files, rec.limits)  # downsampled
