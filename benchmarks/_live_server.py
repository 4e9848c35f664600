"""The loopback SSE server of ``benchmarks.live``, run in its own process so only the clients are measured.

``python -m benchmarks._live_server`` prints its port on the first line of stdout and serves until stdin
closes (`spawned_live_server` does both). It is a bare asyncio ``Protocol`` with a hand-written HTTP/1.1
reader (keep-alive, ``Content-Length`` or chunked request bodies): the cheapest server this Python can
run, so that at N = 500 paced streams it leaves most of a 2-core machine to the client it serves.
Every response is an Anthropic Messages stream (``transfer-encoding: chunked``), one HTTP chunk per SSE
event, each written with its own ``transport.write``:

- ``POST /burst/<E>/v1/messages``: the ``E`` text deltas of ``benchmarks._sse_server.events_of(E)``, one
  chunk each, back to back with no pause: a fast stream, so several chunks arrive per socket read.
- ``POST /paced/<E>/<R>/v1/messages``: ``E`` text deltas at ``R`` per second (on an absolute schedule from
  the request's arrival, so a late write does not push the later ones back). Each delta's text is
  `stamp_text` of ``time.monotonic_ns()`` taken just before its write: CLOCK_MONOTONIC is one clock for
  every process on Linux, so a client subtracts it from its own ``monotonic_ns()`` for the latency from
  the server's write to what the client shows.

``GET /stats`` answers ``{"connections", "requests", "open", "max_open", "cpu_s", "late_ms_p99",
"late_ms_max"}``: TCP connections accepted and streamed requests answered so far, connections open now and
at most (reset by each ``/stats``), the server's process CPU seconds so far, and how late the paced writes
were against their schedule since the previous ``/stats`` (the server keeping up, or not). A ``/stats``
request is not counted in ``requests``, but its connection is counted in ``connections``.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import math
import sys
import time
from contextlib import AbstractContextManager
from functools import cache
from typing import Any, Final

from benchmarks._sse_server import MODEL, events_of, spawned_server
from trioloop.providers.anthropic import render_anthropic_stream
from trioloop.providers.base import WireResponse

#: Each paced delta's text: the write time in nanoseconds, 19 digits, then a space (fixed width, so a client
#: can cut a joined text back into stamps without a separator search).
STAMP_DIGITS: Final = 19
STAMP_WIDTH: Final = STAMP_DIGITS + 1
_SSE_HEAD: Final = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
    b"transfer-encoding: chunked\r\n\r\n"
)
_DELTA_PREFIX: Final = (
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"'
)
_DELTA_SUFFIX: Final = b'"}}\n\n'
_DELTA_SIZE: Final = b"%x\r\n" % (len(_DELTA_PREFIX) + STAMP_WIDTH + len(_DELTA_SUFFIX))
_LAST_CHUNK: Final = b"0\r\n\r\n"


def stamp_text(ns: int) -> str:
    """The text of one paced delta written at ``ns`` (``time.monotonic_ns()``)."""
    return f"{ns:0{STAMP_DIGITS}d} "


def stamps_in(text: str, start: int = 0) -> list[int]:
    """The write times of the whole stamps in ``text`` from character ``start`` (a multiple of the width)."""
    return [int(text[i : i + STAMP_DIGITS]) for i in range(start, len(text) - STAMP_WIDTH + 1, STAMP_WIDTH)]


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


@cache
def _frames(events: int) -> tuple[tuple[bytes, ...], tuple[bytes, ...]]:
    """The chunks before the first delta (message_start, ping, block start) and after the last one."""
    raw = render_anthropic_stream(
        WireResponse(model=MODEL, text="x", text_piece=1, input_tokens=5, output_tokens=max(events, 1))
    )
    frames = [piece + b"\n\n" for piece in raw.split(b"\n\n") if piece]
    assert len(frames) == 7 and b"content_block_delta" in frames[3], frames
    return tuple(_chunk(f) for f in frames[:3]), tuple(_chunk(f) for f in frames[4:])


class _Stats:
    def __init__(self) -> None:
        self.connections = 0
        self.requests = 0
        self.open = 0
        self.max_open = 0
        self.late: list[float] = []

    def report(self) -> bytes:
        late = sorted(self.late)
        p99 = late[max(0, math.ceil(0.99 * len(late)) - 1)] if late else 0.0
        body = {
            "connections": self.connections,
            "requests": self.requests,
            "open": self.open,
            "max_open": self.max_open,
            "cpu_s": time.process_time(),
            "late_ms_p99": round(p99 * 1e3, 2),
            "late_ms_max": round(late[-1] * 1e3, 2) if late else 0.0,
        }
        self.late = []
        self.max_open = self.open
        return json.dumps(body).encode()


STATS = _Stats()


class _Connection(asyncio.Protocol):
    """One keep-alive connection: read a request, stream its answer, then read the next."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.busy = False
        self.timer: asyncio.TimerHandle | None = None
        # the paced stream being written
        self.total = 0
        self.sent = 0
        self.interval = 0.0
        self.started = 0.0
        self.tail: tuple[bytes, ...] = ()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        STATS.connections += 1
        STATS.open += 1
        STATS.max_open = max(STATS.max_open, STATS.open)

    def connection_lost(self, exc: Exception | None) -> None:
        STATS.open -= 1
        self.transport = None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if not self.busy:
            self._next_request()

    # -- requests ------------------------------------------------------------------------------

    def _next_request(self) -> None:
        parsed = _parse_request(self.buffer)
        if parsed is None:
            return
        method, target, consumed = parsed
        del self.buffer[:consumed]
        self.busy = True
        path = target.split("?", 1)[0]
        if path == "/stats":
            self._simple(200, STATS.report(), "application/json")
            return
        parts = path.strip("/").split("/")
        if method == "POST" and parts[-2:] == ["v1", "messages"]:
            if parts[0] == "burst" and len(parts) == 4:
                STATS.requests += 1
                self._burst(int(parts[1]))
                return
            if parts[0] == "paced" and len(parts) == 5:
                STATS.requests += 1
                self._paced(int(parts[1]), float(parts[2]))
                return
        self._simple(404, b'{"type":"error","error":{"type":"not_found_error","message":"no such path"}}')

    def _done(self) -> None:
        self.busy = False
        if self.buffer:
            self._next_request()

    def _simple(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        assert self.transport is not None
        reason = "OK" if status == 200 else "Not Found"
        head = f"HTTP/1.1 {status} {reason}\r\ncontent-type: {content_type}\r\ncontent-length: {len(body)}\r\n\r\n"
        self.transport.write(head.encode() + body)
        self._done()

    def _burst(self, events: int) -> None:
        transport = self.transport
        assert transport is not None
        transport.write(_SSE_HEAD)
        for event in events_of(events):
            transport.write(_chunk(event))
        transport.write(_LAST_CHUNK)
        self._done()

    def _paced(self, events: int, rate: float) -> None:
        transport = self.transport
        assert transport is not None
        head, self.tail = _frames(events)
        transport.write(_SSE_HEAD)
        for chunk in head:
            transport.write(chunk)
        self.total, self.sent, self.interval = events, 0, 1.0 / rate
        self.started = self.loop.time()
        self.timer = self.loop.call_at(self.started + self.interval, self._tick)

    def _tick(self) -> None:
        transport = self.transport
        if transport is None:
            return
        self.sent += 1
        due = self.started + self.sent * self.interval
        STATS.late.append(self.loop.time() - due)
        ns = time.monotonic_ns()
        transport.write(b"%b%b%019d %b\r\n" % (_DELTA_SIZE, _DELTA_PREFIX, ns, _DELTA_SUFFIX))
        if self.sent < self.total:
            self.timer = self.loop.call_at(due + self.interval, self._tick)
            return
        self.timer = None
        for chunk in self.tail:
            transport.write(chunk)
        transport.write(_LAST_CHUNK)
        self._done()


def _parse_request(buffer: bytearray) -> tuple[str, str, int] | None:
    """(method, target, bytes consumed) of the first whole request in ``buffer``, or None for more data."""
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        return None
    lines = bytes(buffer[:end]).decode("latin-1").split("\r\n")
    method, target, _ = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    at = end + 4
    if "content-length" in headers:
        at += int(headers["content-length"])
        return (method, target, at) if len(buffer) >= at else None
    if "chunked" in headers.get("transfer-encoding", "").lower():
        while True:  # skip the body's chunks; only the end of the body matters here
            line_end = buffer.find(b"\r\n", at)
            if line_end < 0:
                return None
            size = int(bytes(buffer[at:line_end]).split(b";", 1)[0], 16)
            at = line_end + 2 + size + 2
            if len(buffer) < at:
                return None
            if size == 0:
                return method, target, at
    return method, target, at


async def main() -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_Connection, "127.0.0.1", 0, backlog=4096)
    port = server.sockets[0].getsockname()[1]
    print(port, flush=True)
    await loop.run_in_executor(None, sys.stdin.read)
    server.close()


def spawned_live_server() -> AbstractContextManager[str]:
    """Run this server in a child process for the block; yields its base URL (``http://127.0.0.1:PORT``)."""
    return spawned_server("benchmarks._live_server")


def live_stats(url: str) -> dict[str, Any]:
    """The server's counters now (one short connection of its own, counted in ``connections``)."""
    host, _, port = url.removeprefix("http://").partition(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        connection.request("GET", "/stats")
        stats: dict[str, Any] = json.loads(connection.getresponse().read())
    finally:
        connection.close()
    return stats


if __name__ == "__main__":
    asyncio.run(main())
