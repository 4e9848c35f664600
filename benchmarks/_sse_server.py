"""A loopback SSE server for the HTTP benchmarks, run in its own process so only the client is measured.

``python -m benchmarks._sse_server`` prints its port on the first line of stdout and serves until
stdin closes (`spawned_server` does both). ``POST /<mode>/<events>/v1/messages`` answers an
Anthropic-shaped text stream of ``events`` text deltas, delivered per ``mode``: ``paced`` writes one HTTP
chunk per SSE event with a short pause between them (how a live API sends), ``bulk`` writes the whole
body at once, ``stall`` sends the first ``STALL_AFTER_BYTES`` bytes and then nothing until the client
hangs up. ``POST /loop/<K>/v1/messages`` answers one iteration of ``benchmarks.loop``'s K-iteration turn
(a ``read_note`` call, or the final text once K results came back), read from the request's messages and
sent as one body. Connections are kept alive; ``GET /stats`` answers ``{"connections": ..., "requests": ...}``
so the client can report connects per request.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache

import httpx
import trio

from benchmarks._common import wire_iteration_of
from trioloop.protocol.preflight import MODEL_TABLE, ModelCapabilities, model_table
from trioloop.providers._loopback import SSE_HEADERS, LoopbackRequest, LoopbackResponse, open_loopback_server
from trioloop.providers.anthropic import render_anthropic_stream
from trioloop.providers.base import WireResponse

PACE_S = 0.0005
STALL_AFTER_BYTES = 200
#: The model the clients ask for, and a model table that knows it (pass it to the provider).
MODEL = "bench-model"
TABLE = model_table(
    [
        *MODEL_TABLE.values(),
        ModelCapabilities(
            id=MODEL,
            provider="anthropic",
            tool_calling=True,
            parallel_tool_calls=True,
            max_input_tokens=200_000,
            max_output_tokens=8192,
        ),
    ]
)
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
        mode, count, _ = request.target.lstrip("/").split("/", 2)  # /<mode>/<events or K>/v1/messages
        if mode == "loop":
            from benchmarks.loop import loop_answer_body  # the loop benchmark's script (this process only)

            answer_body = loop_answer_body(wire_iteration_of(request.json()), int(count))
            return LoopbackResponse(headers=SSE_HEADERS, body=answer_body)
        events = events_of(int(count))
        if mode == "paced":
            return LoopbackResponse(headers=SSE_HEADERS, chunks=events, delay_between_chunks=PACE_S)
        if mode == "stall":
            return LoopbackResponse(headers=SSE_HEADERS, chunks=events, stall_after_bytes=STALL_AFTER_BYTES)
        return LoopbackResponse(headers=SSE_HEADERS, body=b"".join(events))

    async with open_loopback_server(answer, keep_alive=True) as server:
        print(server.port, flush=True)
        await trio.to_thread.run_sync(sys.stdin.read, abandon_on_cancel=True)


@contextmanager
def spawned_server(module: str = "benchmarks._sse_server") -> Iterator[str]:
    """Run this server (or another ``module`` that prints its port and serves until stdin closes) in a child
    process for the block; yields its base URL (``http://127.0.0.1:PORT``)."""
    process = subprocess.Popen([sys.executable, "-m", module], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None and process.stdin is not None
        port = int(process.stdout.readline())
        yield f"http://127.0.0.1:{port}"
    finally:
        if process.stdin is not None:
            process.stdin.close()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()


def server_stats(url: str) -> dict[str, int]:
    """The server's connection and request counts so far."""
    with httpx.Client(trust_env=False) as client:
        counts: dict[str, int] = client.get(url + "/stats").json()
    return counts


if __name__ == "__main__":
    trio.run(main)
