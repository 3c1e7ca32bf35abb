"""One reader of a log that arrives as a stream: plain or gzip, its head read ahead.

``ncclwatch diagnose`` (files, stdin) and the daemon's paste page (an upload)
both get bytes whose first few must be seen before the rest is read: gzip's
magic number decides whether to gunzip, and a scanner sniffs the start for a
Flight Recorder dump or binary. The bytes read ahead are put back in front
(``Prefixed``) and gzip is undone as it streams (``Gunzip``), never holding a
log whole: each read's output is bounded, so a gzip bomb costs no memory.
Here, not in diagnose/, because the daemon's page reads uploads with it and
must not load the diagnose package to start.
"""

from __future__ import annotations

import zlib
from typing import BinaryIO, NamedTuple

#: gzip's magic number: a stream that starts with it is gunzipped.
GZIP_MAGIC = b"\x1f\x8b"
#: Bytes of a log's start read ahead to judge what it is.
SNIFF = 8192


class Prefixed:
    """A stream with bytes already read put back in front of it."""

    def __init__(self, head: bytes, rest: BinaryIO) -> None:
        self.head, self.rest = head, rest

    def read(self, n: int) -> bytes:
        if self.head:
            out, self.head = self.head[:n], self.head[n:]
            return out
        return self.rest.read(n)

    def close(self) -> None:
        pass


class Gunzip:
    """gzip as a stream that keeps everything up to a truncation (gzip.open loses
    the last read's data when the stream ends early), members concatenated. A
    truncated stream raises EOFError after its last data, bad data zlib.error."""

    def __init__(self, raw: BinaryIO) -> None:
        self.raw = raw
        self.z = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self.buf = b""
        self.truncated = False

    def read(self, n: int) -> bytes:
        # Output is bounded by n (max_length): a gzip bomb costs no memory.
        while len(self.buf) < n:
            if self.z.eof and self.z.unused_data:  # the next member of the file
                data = self.z.unused_data
                self.z = zlib.decompressobj(16 + zlib.MAX_WBITS)
            else:
                data = self.z.unconsumed_tail or self.raw.read(1 << 18)
            if not data:
                if not self.z.eof and not self.truncated:
                    self.buf += self.z.flush()
                    self.truncated = True
                break
            self.buf += self.z.decompress(data, n - len(self.buf))
        out, self.buf = self.buf[:n], self.buf[n:]
        if not out and self.truncated:
            self.truncated = False
            raise EOFError("compressed file ended before the end-of-stream marker")
        return out

    def __enter__(self) -> "Gunzip":
        return self

    def __exit__(self, *exc: object) -> None:
        self.raw.close()

    def close(self) -> None:
        self.raw.close()


def read_head(f: BinaryIO, n: int = SNIFF) -> bytes:
    """Up to ``n`` bytes of ``f`` (fewer only at its end): a stream may answer a
    read with less."""
    got = b""
    while len(got) < n:
        b = f.read(n - len(got))
        if not b:
            break
        got += b
    return got


class Opened(NamedTuple):
    #: The log's text: the stream with its head put back, gunzipped where gzip.
    text: BinaryIO
    #: The bytes read ahead, as they came (compressed where gzip).
    head: bytes
    gzip: bool


def open_stream(stream: BinaryIO, gzip: bool = False, ahead: int = SNIFF) -> Opened:
    """``stream`` as log text: ``ahead`` bytes read to see whether it is gzip (its
    magic number; ``gzip``: the sender said so, a Content-Encoding), then read on."""
    head = read_head(stream, ahead)
    text: BinaryIO = Prefixed(head, stream)  # type: ignore[assignment]
    gz = gzip or head[:2] == GZIP_MAGIC
    if gz:
        text = Gunzip(text)  # type: ignore[assignment]
    return Opened(text, head, gz)

