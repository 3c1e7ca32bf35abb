"""The wire between an ingest worker and the daemon's core: framed, batched.

One unix stream socket (a socketpair made by the core) per worker. Every
message is a frame: a header (body length, kind, stream id) and a body of
raw bytes; reports and responses travel as the serialized protobuf the
agent sent and the core built, never re-encoded. A ``Link`` queues frames
and writes everything queued during one turn of the event loop in one
``write``, so a busy side pays one syscall per batch, not per report.

A worker's stream ids are its own (a counter); the core keys streams by
(worker, id) and forgets them with the worker.
"""

from __future__ import annotations

import asyncio
import json
import struct
from typing import Any, Callable

#: body length, kind, stream id
HEADER = struct.Struct("<IBI")

# worker -> core
READY = 1    # body: JSON {"port": bound port (0: could not listen), "pid"}
OPEN = 2     # a Report stream began; body: JSON {"peer", "names": [..] or null}
REPORT = 3   # body: the raw ReportRequest
CLOSE = 4    # the stream ended (any way)
REJECT = 5   # the worker rejected a report itself (not protobuf); body: status code name
DUMP = 6     # a DumpStacks call; body: the raw DumpStacksRequest
STATS = 7    # body: JSON {"cpu": CPU seconds of the worker process so far}
CHECKED = 8  # a REPORT the worker found clean (precheck.py); body: the raw ReportRequest
# core -> worker
CONFIG = 10  # the first frame; body: JSON (see ingestpool.worker_config)
OK = 11      # the answer to REPORT or DUMP: serialized response
ERR = 12     # the answer to REPORT or DUMP: "CODE_NAME\nmessage"; abort the call with it


def encode_json(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def encode_error(code_name: str, message: str) -> bytes:
    return f"{code_name}\n{message}".encode()


def decode_error(body: bytes) -> tuple[str, str]:
    code, _, message = body.decode("utf-8", "replace").partition("\n")
    return code, message


class FrameReader:
    """Bytes in, whole frames out; a frame may span any number of reads."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, int, bytes]]:
        buf = self._buf
        buf += data
        out, pos, end, size = [], 0, len(buf), HEADER.size
        while end - pos >= size:
            n, kind, sid = HEADER.unpack_from(buf, pos)
            if end - pos - size < n:
                break
            start = pos + size
            out.append((kind, sid, bytes(buf[start:start + n])))
            pos = start + n
        if pos:
            del buf[:pos]
        return out


class Link(asyncio.Protocol):
    """One end of the socketpair: ``send`` queues a frame, frames arrive at ``on_frames``.

    ``on_frames(frames)`` gets every whole frame of one read at once, so the
    answers it sends go out together. ``on_lost()`` runs once, when the
    other end closes or dies.
    """

    def __init__(self, on_frames: Callable[[list[tuple[int, int, bytes]]], None],
                 on_lost: Callable[[], None]) -> None:
        self._on_frames = on_frames
        self._on_lost = on_lost
        self._reader = FrameReader()
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.writes = 0  # write calls (batches) made, for tests and benchmarks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        frames = self._reader.feed(data)
        if frames:
            self._on_frames(frames)

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed:
            self.closed = True
            self._out.clear()
            self._on_lost()

    def send(self, kind: int, sid: int, body: bytes = b"") -> None:
        if self.closed:
            return
        self._out.append(HEADER.pack(len(body), kind, sid))
        if body:
            self._out.append(body)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._out and not self.closed and self.transport is not None:
            data = b"".join(self._out)
            self._out.clear()
            self.transport.write(data)
            self.writes += 1

    def close(self) -> None:
        if self.transport is not None:
            self._flush()
            self.transport.close()
