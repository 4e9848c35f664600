"""Every MCP wait has the bound the person set, whatever the server does: a frozen server (SIGSTOP) holds a turn no
longer than ``call_timeout``, Stop ends the listing of its tools, a call that fills the pipe of a frozen server
returns at its timeout, and an HTTP session's close still POSTs a pending cancellation and DELETEs the session.
Real servers (tests/fixtures/mcp_faulty_server.py) in processes of their own."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import trio
import trio.testing

from tests.test_mcp_toolset import (
    SDK_ITERATORS_LEFT,
    by_name,
    call,
    faulty_server,
    fenced_payload,
    requests_of_a_close_during_a_call,
)
from trioloop.machine.reducer import Outcome
from trioloop.mcp import McpToolset
from trioloop.providers.scripted import ScriptedCall, ScriptedProvider, ScriptStep
from trioloop.threatmodel import load_thf, threat_model_session

PAYMENT = Path(__file__).resolve().parent.parent / "examples" / "payment.thf"
GROW = [ScriptStep(tool_calls=(ScriptedCall(id="g", name="ff__grow"),)), ScriptStep(text="Grown.")]


async def _server_pid(toolset: McpToolset) -> int:
    answer = await call(by_name(toolset.tools)["ff__pid"], {})
    return int(fenced_payload(answer.result)["content"][0]["text"])


@contextmanager
def _frozen(pid: int) -> Iterator[None]:
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


async def test_a_frozen_servers_tool_list_holds_the_next_turn_no_longer_than_call_timeout() -> None:
    async with trio.open_nursery() as nursery, ScriptedProvider([*GROW, ScriptStep(text="Still here.")]) as provider:
        session = threat_model_session(
            document=load_thf(PAYMENT), provider=provider, model="scripted-1", tools=(), nursery=nursery
        )
        toolset = McpToolset(faulty_server(tools={"grow": "read", "pid": "read"}), call_timeout=1.0, connect_timeout=6)
        await session.add_toolset(toolset)
        pid = await _server_pid(toolset)
        assert (await session.send("grow a tool")).outcome is Outcome.COMPLETED and toolset.tools_changed
        with _frozen(pid):
            with trio.fail_after(4):  # not the 6 s connect timeout, and not for ever
                second = await session.send("go on")
            assert second.outcome is Outcome.COMPLETED  # with the old tools
            assert "ff__grown" not in second.tool_set and "ff__grow" in second.tool_set
            assert not toolset.connected and toolset.tools_changed  # dropped, and listed again next turn
        nursery.cancel_scope.cancel()


async def test_stop_ends_the_listing_of_a_frozen_servers_tools() -> None:
    async with trio.open_nursery() as nursery, ScriptedProvider(GROW) as provider:
        session = threat_model_session(
            document=load_thf(PAYMENT), provider=provider, model="scripted-1", tools=(), nursery=nursery
        )
        toolset = McpToolset(faulty_server(tools={"grow": "read", "pid": "read"}), call_timeout=60)
        await session.add_toolset(toolset)
        pid = await _server_pid(toolset)
        await session.send("grow a tool")
        with _frozen(pid):
            ended: list[Outcome | None] = []

            async def send() -> None:
                ended.append((await session.send("go on")).outcome)

            nursery.start_soon(send)
            await trio.testing.wait_all_tasks_blocked()  # waiting on the frozen server's answer
            assert session.busy
            with trio.fail_after(2):
                assert session.stop()
                while not ended:  # noqa: ASYNC110 -- the turn ends in its own task
                    await trio.sleep(0.01)
            assert ended == [Outcome.CANCELLED]
            assert toolset.tools_changed  # not listed: listed again next turn
        nursery.cancel_scope.cancel()


async def test_a_call_that_fills_a_frozen_servers_pipe_returns_at_its_timeout() -> None:
    toolset = McpToolset(faulty_server(tools={"pid": "read"}), call_timeout=1.0)
    async with trio.open_nursery() as nursery:
        tools = by_name(await nursery.start(toolset.run))
        with _frozen(await _server_pid(toolset)):
            with trio.fail_after(3):  # the call's own bound, not the SDK's shielded notice behind a full pipe
                outcome = await call(tools["ff__echo"], {"text": "x" * 1_000_000})
            assert not outcome.ok and "did not answer within 1 s" in outcome.result
            assert not toolset.connected
        nursery.cancel_scope.cancel()


@SDK_ITERATORS_LEFT  # (its 2025 GET stream's too)
async def test_closing_a_2025_http_session_posts_the_pending_cancellation_and_deletes_it(tmp_path: Path) -> None:
    requests = await requests_of_a_close_during_a_call(tmp_path, "--2025")
    assert "POST notifications/cancelled" in requests and "DELETE" in requests  # the session is ended too
