"""A turn, a session and a provider request leave no reference cycle behind: once the app lets go of them,
reference counting frees their objects (the conversation, the calls, the request's buffers and sockets), and the
garbage collector's full walk of the process, which holds every session's deadline while it runs, has nothing of
theirs to find. Measured with ``gc.DEBUG_SAVEALL``: what a collection finds after the work is what died in cycles."""

from __future__ import annotations

import contextlib
import gc
import json
import sys
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from http_support import ProviderHandler, serving
from test_session import send_with_reviewer

from trioloop import Session
from trioloop.machine.reducer import CallStatus, Outcome
from trioloop.mcp import McpToolset, StdioServer
from trioloop.protocol import ToolCallBlock
from trioloop.protocol.events import StopReason
from trioloop.providers.anthropic import ANTHROPIC_WIRE, AnthropicProvider
from trioloop.providers.base import WireResponse
from trioloop.providers.scripted import ScriptedCall, ScriptedProvider, ScriptStep
from trioloop.stores import SQLiteJournalStore
from trioloop.threatmodel import THREAT_MODEL, ThreatModel, create_ai_tool_registry, load_thf, threat_model_session

PAYMENT = Path(__file__).resolve().parent.parent / "examples" / "payment.thf"
MCP_SERVER = str(Path(__file__).resolve().parent / "fixtures" / "mcp_server.py")
THREAT = {"title": "Forged callback", "category": "Spoofing", "severity": "medium", "element": "psp"}


def _steps() -> list[ScriptStep]:
    add = ScriptedCall(id="a1", name="add_threat", input={"threat": THREAT})
    return [ScriptStep(text="Adding one.", tool_calls=(add,)), ScriptStep(text="Added."), ScriptStep(text="Done.")]


async def _two_turns(session: Session[ThreatModel]) -> None:
    """A turn with a mutation the person approves, then a plain one."""
    first = await send_with_reviewer(session, "Add a threat.")
    assert first.outcome is Outcome.COMPLETED and [c.status for c in first.calls] == [CallStatus.SUCCEEDED]
    second = await session.send("Thanks.")
    assert second.outcome is Outcome.COMPLETED


def _left_in_cycles(
    work: Callable[[], Awaitable[None]], *, around: Callable[[], Any] = contextlib.nullcontext
) -> Counter[str]:
    """The trioloop objects that died in reference cycles while ``work`` ran, run twice in one Trio run inside
    ``around()`` (an async context manager: a store the app keeps open); the first run warms up imports, caches and
    compiled hooks, what lives for good."""
    found: Counter[str] = Counter()

    async def main() -> None:
        async with around():
            await work()
            gc.collect()
            gc.garbage.clear()
            gc.disable()
            gc.set_debug(gc.DEBUG_SAVEALL)
            try:
                await work()
                gc.collect()
                found.update(
                    f"{type(obj).__module__}.{type(obj).__qualname__}"
                    for obj in gc.garbage
                    if type(obj).__module__.startswith("trioloop")
                )
            finally:
                gc.set_debug(0)
                gc.garbage.clear()
                gc.enable()

    trio.run(main)
    return found


@pytest.fixture
def document() -> ThreatModel:
    return load_thf(PAYMENT)


def test_a_session_and_its_turns_leave_no_cycle(document: ThreatModel) -> None:
    async def work() -> None:
        async with (
            ScriptedProvider(_steps()) as provider,
            threat_model_session(document=document, provider=provider, model="scripted-1") as session,
        ):
            await _two_turns(session)

    assert _left_in_cycles(work) == {}


def test_a_journaled_session_and_its_turns_leave_no_cycle(document: ThreatModel, tmp_path: Path) -> None:
    store = SQLiteJournalStore(tmp_path / "journal.db")
    runs = iter(range(100))

    async def work() -> None:
        async with ScriptedProvider(_steps()) as provider:
            session = await Session.open(
                store,
                f"s{next(runs)}",
                kind=THREAT_MODEL,
                provider=provider,
                document=document,
                model="scripted-1",
                tools=create_ai_tool_registry(),
            )
            async with session:
                await _two_turns(session)
            assert session.journal_integrity is not None

    assert _left_in_cycles(work, around=lambda: store) == {}


def _answer(request_body: bytes) -> bytes:
    """The Anthropic stream for this request: the call while no tool result came back, then text."""
    messages = json.loads(request_body)["messages"]
    answered = any(
        isinstance(block, dict) and block.get("type") == "tool_result"
        for message in messages
        if isinstance(message.get("content"), list)
        for block in message["content"]
    )
    calls = () if answered else (ToolCallBlock(id="toolu_1", name="add_threat", input={"threat": THREAT}),)
    response = WireResponse(
        model="claude-sonnet-4-5",
        text="Done." if answered else "Adding one.",
        tool_calls=calls,
        stop_reason=StopReason.TOOL_USE if calls else StopReason.END_TURN,
        input_tokens=100,
        output_tokens=10,
    )
    return ANTHROPIC_WIRE.render_stream(response)


class _Messages(ProviderHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the real API: the connection goes back to the pool

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        self.send_body("text/event-stream", _answer(body))


@pytest.fixture
def anthropic_url() -> Iterator[str]:
    with serving(_Messages) as port:
        yield f"http://127.0.0.1:{port}"


def test_requests_over_http_leave_no_cycle(document: ThreatModel, anthropic_url: str) -> None:
    async def work() -> None:
        provider = AnthropicProvider("test-key", base_url=anthropic_url, retry=None)
        async with (
            provider,
            threat_model_session(document=document, provider=provider, model="claude-sonnet-4-5") as session,
        ):
            await _two_turns(session)

    assert _left_in_cycles(work) == {}


def test_an_mcp_connection_and_its_calls_leave_no_cycle(document: ThreatModel) -> None:
    """A session that connects to a real MCP server (the fixture's, over stdio), calls a tool, and closes."""
    server = StdioServer(name="fx", command=sys.executable, args=(MCP_SERVER, "stdio"), tools={"echo": "read"})
    steps = [
        ScriptStep(text="Echoing.", tool_calls=(ScriptedCall(id="e1", name="fx__echo", input={"text": "hi"}),)),
        ScriptStep(text="Echoed."),
    ]

    async def work() -> None:
        async with (
            ScriptedProvider(list(steps)) as provider,
            threat_model_session(document=document, provider=provider, model="scripted-1") as session,
        ):
            await session.add_toolset(McpToolset(server))
            state = await session.send("Echo hi.")
            assert [c.status for c in state.calls] == [CallStatus.SUCCEEDED]

    # The MCP SDK's own client keeps a cycle (its JSON-RPC dispatcher and its session refer to each other), and the
    # Trio exceptions a closed connection's tasks ended with hold their frames: what they reach of the connection
    # (its streams, which the SDK reads) goes with them. Nothing of the session, its turns or the toolset does.
    assert set(_left_in_cycles(work)) <= {
        "trioloop.mcp._connection.Connection",
        "trioloop.mcp._connection._WatchedReadStream",
        "trioloop.mcp._connection._NoticeWriteStream",
    }
