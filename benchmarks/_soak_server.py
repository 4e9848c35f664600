"""The soak's model: a loopback server speaking Anthropic's Messages stream, run in a process of its own.

``python -m benchmarks._soak_server --seed N`` prints its port on the first line of stdout, serves until stdin
closes, then prints its counters as one JSON line. It answers ``POST /v1/messages`` one request per connection
(``Connection: close``, so the fault proxy in front of it draws a fault per request).

Each answer is decided by the request alone, so a retry, or a request asked again after a crash, gets the same
calls with the same ids: the turn's prompt carries a nonce (``nonce=HEX``), the iteration is the number of
assistant messages after it, and a ``random.Random`` seeded with both picks the answer. A turn makes 0 to 3
iterations of tool calls (1 to 4 calls each, among the tools the request offers), then a text answer. Every
call's id is ``toolu_<nonce>_<iteration>_<n>`` and its input repeats it as ``call``, so a tool can count its
runs by call id; ``append_line`` writes a line starting with a token unique to the call (``T-<nonce>-<i>-<n>``),
and ``archive_line`` marks a line that an earlier ``read_note`` result showed. Apart from that, and whatever
the request, a seeded generator of the server's own answers a share of requests with 429 (rate limited) or 529
(overloaded), both with a ``retry-after`` of 0.05 to 0.3 s, and paces some answers (a few ms between chunks).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from collections import Counter
from collections.abc import Sequence
from typing import Any, Final

import trio

from benchmarks._common import wire_iteration_of
from benchmarks._sse_server import MODEL
from trioloop.protocol.events import StopReason
from trioloop.protocol.messages import ToolCallBlock
from trioloop.providers._loopback import SSE_HEADERS, LoopbackRequest, LoopbackResponse, open_loopback_server
from trioloop.providers.anthropic import render_anthropic_stream
from trioloop.providers.base import WireResponse

NONCE: Final = re.compile(r"nonce=([0-9a-f]+)")
TOKEN: Final = re.compile(r"(?<![~\w-])(T-[0-9a-f]+-\d+-\d+)")
#: Tools the model may ask for, with their weights (only those the request offers are drawn).
WEIGHTS: Final = {
    "read_note": 3.0,
    "count_lines": 1.0,
    "append_line": 5.0,
    "archive_line": 1.5,
    "ask_person": 1.0,
    "slow_read": 0.7,
    "notes__count_words": 1.0,
    "notes__stamp": 1.0,
}
RATE_LIMITED: Final = 0.04
OVERLOADED: Final = 0.03


def _prompt(body: dict[str, Any]) -> str:
    """The text of the turn's prompt: the last user message that is not tool results."""
    for message in reversed(body.get("messages", ())):
        content = message.get("content")
        if message.get("role") != "user":
            continue
        if isinstance(content, str):
            return content
        if isinstance(content, list) and content and content[0].get("type") != "tool_result":
            return " ".join(str(block.get("text", "")) for block in content if isinstance(block, dict))
    return ""


def _results_text(body: dict[str, Any]) -> str:
    """Every tool result's text in the request (what the model has read)."""
    parts: list[str] = []
    for message in body.get("messages", ()):
        content = message.get("content")
        if isinstance(content, list):
            for block in content:
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    value = block.get("content")
                    parts.append(value if isinstance(value, str) else json.dumps(value))
    return "\n".join(parts)


def _call(rng: random.Random, name: str, call_id: str, token: str, body: dict[str, Any]) -> ToolCallBlock | None:
    match name:
        case "append_line":
            words = " ".join(rng.choice(("alpha", "beta", "gamma", "delta", "βeta", "ζeta")) for _ in range(3))
            return ToolCallBlock(id=call_id, name=name, input={"call": call_id, "line": f"{token} {words}"})
        case "archive_line":
            seen = sorted(set(TOKEN.findall(_results_text(body))))
            if not seen:
                return None
            return ToolCallBlock(id=call_id, name=name, input={"call": call_id, "token": rng.choice(seen)})
        case "slow_read":
            seconds = rng.choice((0.02, 0.1, 0.4, 5.0))  # the last is past any turn deadline of the soak
            return ToolCallBlock(id=call_id, name=name, input={"call": call_id, "seconds": seconds})
        case "notes__count_words" | "notes__stamp":
            return ToolCallBlock(id=call_id, name=name, input={"call": call_id, "text": f"{token} a b c"})
        case _:
            return ToolCallBlock(id=call_id, name=name, input={"call": call_id})


def answer_body(body: dict[str, Any]) -> tuple[bytes, int]:
    """The stream that answers ``body`` and how many tool calls it holds (decided by the request alone)."""
    found = NONCE.search(_prompt(body))
    nonce = found.group(1) if found else "0"
    iteration = wire_iteration_of(body)
    tool_iterations = random.Random(nonce).choice((0, 1, 1, 2, 2, 3))
    rng = random.Random(f"{nonce}/{iteration}")
    offered = [tool["name"] for tool in body.get("tools", ()) if tool.get("name") in WEIGHTS]
    calls: list[ToolCallBlock] = []
    if iteration < tool_iterations and offered:
        for n in range(rng.randint(1, 4)):
            name = rng.choices(offered, weights=[WEIGHTS[o] for o in offered])[0]
            call = _call(rng, name, f"toolu_{nonce}_{iteration}_{n}", f"T-{nonce}-{iteration}-{n}", body)
            if call is not None:
                calls.append(call)
    text = "Looking at the note. " if calls else "Done: " + " ".join(["the note is in order."] * rng.randint(1, 12))
    response = WireResponse(
        model=MODEL,
        text=text,
        text_piece=12,
        tool_calls=tuple(calls),
        stop_reason=StopReason.TOOL_USE if calls else StopReason.END_TURN,
        input_tokens=100,
        output_tokens=20,
    )
    return render_anthropic_stream(response), len(calls)


def _error(status: int, kind: str, retry_after: float) -> LoopbackResponse:
    body = json.dumps({"type": "error", "error": {"type": kind, "message": "soak: try again shortly"}}).encode()
    headers = (("content-type", "application/json"), ("retry-after", f"{retry_after:.2f}"))
    return LoopbackResponse(status=status, headers=headers, body=body, content_length=True)


async def main(seed: int) -> None:
    rng = random.Random(seed)
    counts: Counter[str] = Counter()

    def handle(request: LoopbackRequest) -> LoopbackResponse:
        if request.method != "POST" or not request.target.endswith("/v1/messages"):
            counts["not_found"] += 1
            return LoopbackResponse(status=404, headers=(("content-type", "text/plain"),), body=b"no such path")
        counts["requests"] += 1
        server.requests.clear()  # the loopback server keeps every request; a soak would hold them all
        draw = rng.random()
        if draw < RATE_LIMITED:
            counts["http_429"] += 1
            return _error(429, "rate_limit_error", rng.uniform(0.05, 0.3))
        if draw < RATE_LIMITED + OVERLOADED:
            counts["http_529"] += 1
            return _error(529, "overloaded_error", rng.uniform(0.05, 0.3))
        payload = request.json()
        assert isinstance(payload, dict)
        raw, calls = answer_body(payload)
        counts["tool_calls"] += calls
        events = [piece + b"\n\n" for piece in raw.split(b"\n\n") if piece]
        if rng.random() < 0.3:  # paced: a few ms between events, as a live API streams
            counts["paced"] += 1
            return LoopbackResponse(headers=SSE_HEADERS, chunks=tuple(events), delay_between_chunks=0.003)
        return LoopbackResponse(headers=SSE_HEADERS, chunks=(raw,))

    async with open_loopback_server(handle) as server:
        print(server.port, flush=True)
        await trio.to_thread.run_sync(sys.stdin.read, abandon_on_cancel=True)
        print(json.dumps({**counts, "connections": server.connections}), flush=True)


def cli(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    trio.run(main, args.seed)


if __name__ == "__main__":
    cli()
