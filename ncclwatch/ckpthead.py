"""A checkpoint's total size, from the first bytes written (its header).

Checkpoint formats state what they hold before they hold it:

* torch.save (zip, torch >= 1.6) writes ``<archive>/data.pkl`` first. Its
  pickle names every storage through a persistent id
  ``('storage', torch.<Type>Storage, key, location, numel)``, so the payload
  is the sum of numel * itemsize over the distinct keys. The zip around it is
  known too (torch 2.13's writer, inline_container.cc + miniz, checked on
  real files): each record is a local header padded so its data starts on a
  64-byte boundary, a data descriptor, a central-directory entry, then the
  zip64 end records. The total is exact below 4 GiB; above it the zip64
  fields are modelled from the writer's source (not checked on a real file).
* safetensors writes an 8-byte header length, then a JSON header with every
  tensor's ``data_offsets``: total = 8 + header + the largest end offset.

The pickle is never unpickled (``safepickle.persistent_ids`` walks it
symbolically), the JSON is bounded, and every number is checked: a hostile
or torn header gives a ``HeaderError`` with what is wrong, never a size.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Callable

from ncclwatch.safepickle import Global, PickleRefused, PickleTruncated, brief, persistent_ids

__all__ = ["MAX_HEAD_BYTES", "HeaderError", "HeaderIncomplete", "HeaderSize", "ITEMSIZE",
           "expected_size", "torch_zip_size"]

#: Never read more than this of a file being written.
MAX_HEAD_BYTES = 384 * 1024
#: safetensors refuses headers over 100 MB; this reader stops at MAX_HEAD_BYTES.
_ZIP_MAGIC = b"PK\x03\x04"
_U32 = 0xFFFFFFFF

#: torch.<Name>Storage -> bytes per element (what ``_pickle_storage_type``
#: names for each dtype; tests check it against torch's own map).
ITEMSIZE: dict[str, int] = {
    "DoubleStorage": 8, "FloatStorage": 4, "HalfStorage": 2, "BFloat16Storage": 2,
    "LongStorage": 8, "IntStorage": 4, "ShortStorage": 2, "CharStorage": 1, "ByteStorage": 1,
    "BoolStorage": 1, "ComplexDoubleStorage": 16, "ComplexFloatStorage": 8,
    "ComplexHalfStorage": 4, "QInt8Storage": 1, "QUInt8Storage": 1, "QInt32Storage": 4,
    "QUInt4x2Storage": 1, "QUInt2x4Storage": 1, "UntypedStorage": 1,
    "Float8_e4m3fnStorage": 1, "Float8_e5m2Storage": 1, "Float8_e4m3fnuzStorage": 1,
    "Float8_e5m2fnuzStorage": 1, "Float8_e8m0fnuStorage": 1, "Float4_e2m1fn_x2Storage": 1,
    "UInt16Storage": 2, "UInt32Storage": 4, "UInt64Storage": 8,
    "Int1Storage": 1, "Int2Storage": 1, "Int3Storage": 1, "Int4Storage": 1, "Int5Storage": 1,
    "Int6Storage": 1, "Int7Storage": 1,
    "UInt1Storage": 1, "UInt2Storage": 1, "UInt3Storage": 1, "UInt4Storage": 1,
    "UInt5Storage": 1, "UInt6Storage": 1, "UInt7Storage": 1,
    "Bits1x8Storage": 1, "Bits2x4Storage": 1, "Bits4x2Storage": 1, "Bits8Storage": 1,
    "Bits16Storage": 2,
}
#: Records torch 2.13's writer adds around the storages: (name, bytes).
_BEFORE = ((".format_version", 1), (".storage_alignment", 2), ("byteorder", 6))
_AFTER = (("version", 2), (".data/serialization_id", 40))
_ALIGN = 64
#: Modules storage types are pickled from (torch.storage: UntypedStorage,
#: which the dtypes without a typed storage class use, numel in bytes).
_TORCH = frozenset({"torch", "torch.storage"})


class HeaderError(PickleRefused):
    """A header that gives no size: not a known format, malformed or hostile."""


class HeaderIncomplete(HeaderError, PickleTruncated):
    """The header is not all on disk yet: read again once the file has grown."""


@dataclass(frozen=True, slots=True)
class HeaderSize:
    format: str            # torch_zip | safetensors
    total_bytes: int       # the file's size once written
    payload_bytes: int     # tensor data alone
    tensors: int           # storages (torch) or tensors (safetensors)


def expected_size(head: bytes, where: str = "<file>") -> HeaderSize:
    """The finished file's size from its first bytes (up to MAX_HEAD_BYTES).

    Raises HeaderIncomplete while the header is still being written (call
    again with more bytes) and HeaderError when it will never give a size.
    """
    if len(head) < 9:
        raise HeaderIncomplete(f"{where}: {len(head)} bytes, too few to tell the format")
    for matches, parse in _FORMATS:
        if matches(head):
            return parse(head, where)
    raise HeaderError(f"{where}: neither a torch.save zip nor safetensors "
                      f"(starts {brief(bytes(head[:8]))})")


# -------------------------------------------------------------- torch.save


def _torch_zip(head: bytes, where: str) -> HeaderSize:
    if len(head) < 30:
        raise HeaderIncomplete(f"{where}: zip local header not written yet")
    method, = struct.unpack_from("<H", head, 8)
    name_len, extra_len = struct.unpack_from("<HH", head, 26)
    if len(head) < 30 + name_len:
        raise HeaderIncomplete(f"{where}: first record name not written yet")
    name = head[30:30 + name_len].decode("utf-8", "replace")
    if not name.endswith("/data.pkl"):
        raise HeaderError(f"{where}: a zip whose first record is {brief(name)}, "
                          "not <archive>/data.pkl (not a torch.save archive)")
    if method != 0:
        raise HeaderError(f"{where}: data.pkl is compressed (method {method}): not torch.save")
    start = 30 + name_len + extra_len
    try:
        pids, stop = persistent_ids(head, where, start=start, error=HeaderError,
                                    truncated=HeaderIncomplete)
    except HeaderIncomplete:
        if len(head) >= MAX_HEAD_BYTES:
            raise HeaderError(f"{where}: data.pkl is over {MAX_HEAD_BYTES} bytes: "
                              "not read further") from None
        raise
    storages = _storages(pids, where)
    prefix = name[:-len("data.pkl")]
    total = torch_zip_size(prefix, stop - start, storages.values())
    return HeaderSize("torch_zip", total, sum(storages.values()), len(storages))


def _storages(pids: list, where: str) -> dict[str, int]:
    """Storage key -> bytes, in first-seen order (torch writes them in that order)."""
    out: dict[str, int] = {}
    for pid in pids:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise HeaderError(f"{where}: persistent id {brief(pid)} is not a torch storage")
        _, stype, key, location, numel = pid
        if not (isinstance(stype, Global) and stype.module in _TORCH and stype.name in ITEMSIZE):
            raise HeaderError(f"{where}: unknown storage type {brief(stype)}")
        if not isinstance(key, str) or not isinstance(location, str):
            raise HeaderError(f"{where}: storage key/location {brief(key)}/{brief(location)}")
        if type(numel) is not int or not 0 <= numel < 1 << 50:
            raise HeaderError(f"{where}: storage {brief(key)} numel {brief(numel)}")
        nbytes = numel * ITEMSIZE[stype.name]
        out[key] = max(out.get(key, 0), nbytes)
    return out


def torch_zip_size(prefix: str, pickle_bytes: int, storage_bytes) -> int:
    """Bytes of the archive torch 2.13 writes (records in the writer's order)."""
    records = [("data.pkl", pickle_bytes), *_BEFORE,
               *((f"data/{i}", n) for i, n in enumerate(storage_bytes)), *_AFTER]
    cursor = central = 0
    for rec, size in records:
        n = len((prefix + rec).encode())
        big_size, big_ofs = size >= _U32, cursor >= _U32
        zip64 = (4 + 16 * big_size + 8 * big_ofs) if (big_size or big_ofs) else 0
        data_at = cursor + 30 + n + zip64 + 4          # the "FB" padding field's own 4 bytes
        data_at += -data_at % _ALIGN
        cursor = data_at + size + (24 if zip64 else 16)   # + data descriptor
        central += 46 + n + zip64
    return cursor + central + 56 + 20 + 22            # zip64 end record, locator, end record


# -------------------------------------------------------------- safetensors


def _is_safetensors(head: bytes) -> bool:
    n, = struct.unpack_from("<Q", head, 0)
    return 2 <= n < 100_000_000 and head[8:9] == b"{"


def _safetensors(head: bytes, where: str) -> HeaderSize:
    n, = struct.unpack_from("<Q", head, 0)
    if 8 + n > MAX_HEAD_BYTES:
        raise HeaderError(f"{where}: safetensors header of {n} bytes, over {MAX_HEAD_BYTES}: "
                          "not read")
    if len(head) < 8 + n:
        raise HeaderIncomplete(f"{where}: safetensors header not all written yet")
    try:
        header = json.loads(bytes(head[8:8 + n]).decode("utf-8"))
    except (ValueError, RecursionError) as e:
        raise HeaderError(f"{where}: safetensors header is not JSON ({type(e).__name__})") from None
    if not isinstance(header, dict):
        raise HeaderError(f"{where}: safetensors header is a {type(header).__name__}, not an object")
    end, count = 0, 0
    for key, info in header.items():
        if key == "__metadata__":
            continue
        offs = info.get("data_offsets") if isinstance(info, dict) else None
        if not (isinstance(offs, list) and len(offs) == 2
                and all(type(x) is int for x in offs) and 0 <= offs[0] <= offs[1] < 1 << 56):
            raise HeaderError(f"{where}: tensor {brief(key)} data_offsets {brief(offs)}")
        end = max(end, offs[1])
        count += 1
    return HeaderSize("safetensors", 8 + n + end, end, count)


_FORMATS: tuple[tuple[Callable[[bytes], bool], Callable[[bytes, str], HeaderSize]], ...] = (
    (lambda h: h[:4] == _ZIP_MAGIC, _torch_zip),
    (_is_safetensors, _safetensors),
)
