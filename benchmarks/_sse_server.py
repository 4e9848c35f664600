"""A loopback SSE server for ``benchmarks.stream_http``, run in its own process so only the client is measured.

``python -m benchmarks._sse_server`` prints its port on the first line of stdout and serves until
stdin closes. ``POST /<mode>/<events>/v1/messages`` answers an Anthropic-shaped text stream of
``events`` text deltas, delivered per ``mode``: ``paced`` writes one HTTP chunk per SSE event with a
short pause between them (how a live API sends), ``bulk`` writes the whole body at once. Connections
are kept alive; ``GET /stats`` answers ``{"connections": ..., "requests": ...}`` so the client can
report connects per request.
"""

from __future__ import annotations

import json
import sys
from functools import cache

import trio

from trioloop.providers._loopback import SSE_HEADERS, LoopbackRequest, LoopbackResponse, open_loopback_server
from trioloop.providers.anthropic import render_anthropic_stream
from trioloop.providers.base import WireResponse

PACE_S = 0.0005
WORDS = ("alpha ", "βetas ", "gamma ", "δelta ", "epsil ", "zetaς ", "ηtaaa ", "theta ")  # 6 code points each


@cache
def events_of(count: int) -> tuple[bytes, ...]:
    """The answer's SSE events, one byte string each (the wire module renders; split at blank lines)."""
    text = "".join(WORDS[i % len(WORDS)] for i in range(count))
    raw = render_anthropic_stream(
        WireResponse(model="bench-model", text=text, text_piece=6, input_tokens=5, output_tokens=count)
    )
    pieces = raw.split(b"\n\n")
    return tuple(piece + b"\n\n" for piece in pieces if piece)


async def main() -> None:
    stats = {"requests": 0}

    def answer(request: LoopbackRequest) -> LoopbackResponse:
        if request.target == "/stats":
            body = json.dumps({"connections": server.connections, "requests": stats["requests"]}).encode()
            return LoopbackResponse(headers=(("content-type", "application/json"),), body=body)
        stats["requests"] += 1
        mode, count, _ = request.target.lstrip("/").split("/", 2)  # /<mode>/<events>/v1/messages
        events = events_of(int(count))
        if mode == "paced":
            return LoopbackResponse(headers=SSE_HEADERS, chunks=events, delay_between_chunks=PACE_S)
        return LoopbackResponse(headers=SSE_HEADERS, body=b"".join(events))

    async with open_loopback_server(answer, keep_alive=True) as server:
        print(server.port, flush=True)
        await trio.to_thread.run_sync(sys.stdin.read, abandon_on_cancel=True)


if __name__ == "__main__":
    trio.run(main)
