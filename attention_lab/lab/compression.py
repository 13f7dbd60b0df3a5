"""The lab's answers compressed as the client accepts: zstd where it says so, gzip otherwise, plain for the rest.

A 500-token analysis is about 2.7 MB of JSON, most of it base64 of the maps' uint8 levels. zstd at level 1 writes
it as small as zlib's fastest level, in a sixth of the time: 10 ms against 57 on a 2-core AMD EPYC
(docs/benchmarks.md, "The live lab's 500-token answer"). That time is spent on every pause in typing, while the
page waits. Chromium and Firefox ask for zstd (Accept-Encoding: gzip, deflate, br, zstd), on localhost too.
A client that does not gets gzip, as before, and one that accepts neither gets the plain bytes.

Starlette's GZipMiddleware does the rest of the work (small answers, excluded types and streams left alone,
Vary: Accept-Encoding). Only the encoder differs: a Starlette responder with zstd's compressor.
"""

from __future__ import annotations

import anyio.to_thread
import zstandard
from starlette.datastructures import Headers
from starlette.middleware.gzip import GZipMiddleware, IdentityResponder
from starlette.types import ASGIApp, Receive, Scope, Send

ZSTD_LEVEL = 1  # as small as gzip's level 1 on an answer, and much faster; level 3 is 4x slower for 5% fewer bytes


def accepts(header: str, coding: str) -> bool:
    """Whether an Accept-Encoding header names this content coding with a quality above 0 (RFC 9110 12.5.3)."""
    for item in header.split(","):
        name, _, params = item.strip().partition(";")
        if name.strip().lower() != coding:
            continue
        q = params.strip().lower()
        if q.startswith("q="):
            try:
                return float(q[2:]) > 0
            except ValueError:
                return False
        return True
    return False


class ZstdResponder(IdentityResponder):
    content_encoding = "zstd"

    def __init__(self, app: ASGIApp, minimum_size: int, *, level: int, thread_minimum_size: int,
                 exclude_content_types: tuple[str, ...]):
        super().__init__(app, minimum_size, exclude_content_types=exclude_content_types)
        self.stream = zstandard.ZstdCompressor(level=level).compressobj()
        self.thread_minimum_size = thread_minimum_size  # past it, off the event loop: GZipMiddleware's own bound

    async def apply_compression(self, body: bytes, *, more_body: bool) -> bytes:
        if len(body) >= self.thread_minimum_size:
            return await anyio.to_thread.run_sync(self._compress, body, more_body)
        return self._compress(body, more_body)

    def _compress(self, body: bytes, more_body: bool) -> bytes:
        flush = zstandard.COMPRESSOBJ_FLUSH_BLOCK if more_body else zstandard.COMPRESSOBJ_FLUSH_FINISH
        return self.stream.compress(body) + self.stream.flush(flush)


class Compression(GZipMiddleware):
    """GZipMiddleware that answers a client accepting zstd in zstd (ZSTD_LEVEL) instead."""

    def __init__(self, app: ASGIApp, *, zstd_level: int = ZSTD_LEVEL, **gzip_options):
        super().__init__(app, **gzip_options)
        self.zstd_level = zstd_level

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and accepts(Headers(scope=scope).get("accept-encoding", ""), "zstd"):
            responder = ZstdResponder(self.app, self.minimum_size, level=self.zstd_level,
                                      thread_minimum_size=self.thread_minimum_size,
                                      exclude_content_types=self.exclude_content_types)
            await responder(scope, receive, send)
        else:
            await super().__call__(scope, receive, send)
