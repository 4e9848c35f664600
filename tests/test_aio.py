"""trioloop.aio: a Trio run as a guest of asyncio, alone and driving a session, and examples/asyncio_chat.py served by
Hypercorn's asyncio worker and driven over real HTTP by an httpx client.

Every test is a plain function that runs its scenario with ``asyncio.run`` (pytest-trio runs only the async ones).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Coroutine
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import httpx
import pytest
import trio
import trio.testing
from hypercorn.asyncio import serve
from hypercorn.config import Config

from trioloop import CallStatus, Outcome, Phase, Session, TurnState
from trioloop.aio import NoAsyncioLoop, TrioHost, TrioHostClosed, TrioHostError, TrioIterator
from trioloop.providers.scripted import ScriptedCall, ScriptedProvider, ScriptStep

T = TypeVar("T")
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "asyncio_chat.py"


def _load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("asyncio_chat_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


chat_app = _load_example()


def run(scenario: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run ``scenario()`` on a fresh asyncio loop; a hang fails the test instead of stalling the suite."""

    async def bounded() -> T:
        async with asyncio.timeout(60):
            return await scenario()

    return asyncio.run(bounded())


# -- TrioHost alone ----------------------------------------------------------------------------------


async def add(a: int, b: int) -> int:
    await trio.lowlevel.checkpoint()
    return a + b


async def fail(message: str) -> None:
    await trio.lowlevel.checkpoint()
    raise ValueError(message)


def test_run_returns_the_value_or_raises_the_exception() -> None:
    async def scenario() -> None:
        async with TrioHost() as host:
            assert host.is_open
            assert await host.run(add, 2, 3) == 5
            with pytest.raises(ValueError, match="no such thing"):
                await host.run(fail, "no such thing")
            assert await asyncio.gather(*(host.run(add, n, n) for n in range(5))) == [0, 2, 4, 6, 8]
        assert not host.is_open

    run(scenario)


def test_run_sync_calls_in_trio_context() -> None:
    async def token() -> trio.lowlevel.TrioToken:
        await trio.lowlevel.checkpoint()
        return trio.lowlevel.current_trio_token()

    def explode() -> None:
        raise KeyError("k")

    async def scenario() -> None:
        async with TrioHost() as host:
            assert await host.run_sync(trio.lowlevel.current_trio_token) is await host.run(token)
            event = trio.Event()
            await host.run_sync(event.set)  # Event.set wakes Trio tasks: it needs Trio context
            assert event.is_set()
            with pytest.raises(KeyError):
                await host.run_sync(explode)

    run(scenario)


def test_cancelling_the_asyncio_task_cancels_the_trio_task_and_waits_for_it() -> None:
    started = trio.Event()
    ended: list[str] = []

    async def forever() -> None:
        started.set()
        try:
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                await trio.lowlevel.checkpoint()  # unwinding takes a checkpoint: the asyncio side waits for it
            ended.append("unwound")

    async def scenario() -> None:
        async with TrioHost() as host:
            task = asyncio.create_task(host.run(forever))
            await host.run(started.wait)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert ended == ["unwound"]  # the Trio task had ended before the cancellation reached asyncio
            assert await host.run(other_tasks) == []

    run(scenario)


async def other_tasks() -> list[str]:
    """The names of the host's Trio tasks besides the one asking."""
    await trio.lowlevel.checkpoint()
    me = trio.lowlevel.current_task()
    assert me.parent_nursery is not None
    return sorted(task.name for task in me.parent_nursery.child_tasks if task is not me)


def test_a_cancellation_landing_at_any_point_of_a_call_raises_cancelled_and_leaves_nothing_running() -> None:
    ran: list[int] = []

    async def record(n: int) -> None:
        await trio.lowlevel.checkpoint()
        ran.append(n)

    async def scenario() -> None:
        async with TrioHost() as host:
            for n in range(8):  # the cancellation lands before Trio starts the call, while it runs, or after
                task = asyncio.create_task(host.run(record, n))
                for _ in range(n):
                    await asyncio.sleep(0)
                if task.cancel():  # False: it had finished already
                    with pytest.raises(asyncio.CancelledError):
                        await task
                assert await host.run(other_tasks) == []
            assert set(ran) <= set(range(8))
            assert len(ran) == len(set(ran))

    run(scenario)


def test_an_exception_raised_while_unwinding_reaches_asyncio_in_place_of_the_cancellation() -> None:
    started = trio.Event()

    async def grumpy() -> None:
        started.set()
        try:
            await trio.sleep_forever()
        finally:
            raise RuntimeError("failed while unwinding")

    async def scenario() -> None:
        async with TrioHost() as host:
            task = asyncio.create_task(host.run(grumpy))
            await host.run(started.wait)
            task.cancel()
            with pytest.raises(RuntimeError, match="unwinding"):
                await task

    run(scenario)


def test_a_trio_side_cancellation_reaches_the_caller() -> None:
    async def gives_up() -> str:
        with trio.move_on_after(0):
            await trio.sleep_forever()
        return "moved on"

    async def scenario() -> None:
        async with TrioHost() as host:
            assert await host.run(gives_up) == "moved on"  # a scope of the call's own is the call's business
            blocked = asyncio.create_task(host.run(trio.sleep_forever))
            await host.run(trio.testing.wait_all_tasks_blocked)
        with pytest.raises(TrioHostClosed):  # the host closing cancels what it runs: the caller is told so
            await blocked

    run(scenario)


async def count_up(produced: list[int]) -> AsyncGenerator[int, None]:
    n = 0
    try:
        while True:
            produced.append(n)
            yield n
            n += 1
    finally:
        produced.append(-1)  # closed: the generator's own cleanup ran


def test_iterate_hands_items_over_in_order_with_bounded_buffering_and_closes_the_generator() -> None:
    async def scenario() -> None:
        async with TrioHost() as host:
            for buffer in (0, 2):
                produced: list[int] = []
                async with host.iterate(count_up, produced, buffer=buffer) as items:
                    assert isinstance(items, TrioIterator)
                    assert await anext(items) == 0
                    await host.run(trio.testing.wait_all_tasks_blocked)
                    # the item read, `buffer` items waiting, one more in the producer's hands: no further
                    assert produced == list(range(buffer + 2))
                    assert [await anext(items) for _ in range(3)] == [1, 2, 3]
                assert produced[-1] == -1
                assert await host.run(other_tasks) == []
                with pytest.raises(StopAsyncIteration):
                    await anext(items)

    run(scenario)


def test_iterate_ends_when_the_iterable_ends_and_raises_what_it_raised() -> None:
    async def three() -> AsyncIterator[int]:
        for n in range(3):
            await trio.lowlevel.checkpoint()
            yield n

    async def broken() -> AsyncIterator[int]:
        yield 1
        raise ValueError("broken stream")

    async def scenario() -> None:
        async with TrioHost() as host:
            assert [n async for n in host.iterate(three)] == [0, 1, 2]
            seen: list[int] = []
            with pytest.raises(ValueError, match="broken stream"):
                async for n in host.iterate(broken):
                    seen.append(n)
            assert seen == [1]
            with pytest.raises(ValueError, match="buffer"):
                host.iterate(three, buffer=-1)

    run(scenario)


def test_enter_holds_a_trio_context_manager_in_one_trio_task() -> None:
    events: list[str] = []

    @contextlib.asynccontextmanager
    async def holding_a_nursery(name: str) -> AsyncIterator[trio.Nursery]:
        async with trio.open_nursery() as nursery:  # entered and exited in the same task, as Trio requires
            events.append(f"enter {name}")
            yield nursery
            events.append(f"exit {name}")

    @contextlib.asynccontextmanager
    async def fails_on_exit() -> AsyncIterator[None]:
        yield
        raise OSError("exit failed")

    @contextlib.asynccontextmanager
    async def fails_on_enter() -> AsyncIterator[None]:
        raise LookupError("enter failed")
        yield  # pragma: no cover

    async def scenario() -> None:
        async with TrioHost() as host:
            async with host.enter(holding_a_nursery, "a") as nursery:
                assert isinstance(nursery, trio.Nursery)
                assert events == ["enter a"]
                assert await host.run(other_tasks) == ["_Holder.hold"]
            assert events == ["enter a", "exit a"]
            with pytest.raises(OSError, match="exit failed"):
                async with host.enter(fails_on_exit):
                    pass
            with pytest.raises(LookupError, match="enter failed"):
                async with host.enter(fails_on_enter):
                    pass  # pragma: no cover
            assert await host.run(other_tasks) == []

    run(scenario)


def test_leaving_the_host_cancels_everything_it_started_and_ends_the_run() -> None:
    unwound: list[str] = []

    async def forever(name: str) -> None:
        try:
            await trio.sleep_forever()
        finally:
            unwound.append(name)

    @contextlib.asynccontextmanager
    async def held() -> AsyncIterator[None]:
        try:
            yield
        finally:
            unwound.append("held")

    async def scenario() -> None:
        async with TrioHost() as host:
            calls = [asyncio.create_task(host.run(forever, f"call {n}")) for n in range(3)]
            holding = host.enter(held)
            await holding.__aenter__()
            items = host.iterate(count_up, [])
            await anext(items)
            await host.run(trio.testing.wait_all_tasks_blocked)
        assert sorted(unwound) == ["call 0", "call 1", "call 2", "held"]
        for call in calls:
            with pytest.raises(TrioHostClosed):
                await call
        with pytest.raises(TrioHostClosed):
            await anext(items)
        with pytest.raises(TrioHostClosed):
            await host.run(add, 1, 1)

    run(scenario)


def test_misuse_raises_typed_errors() -> None:
    async def scenario() -> None:
        host = TrioHost()
        with pytest.raises(TrioHostClosed, match="not open"):
            await host.run(add, 1, 1)
        async with host:
            with pytest.raises(TrioHostError, match="already active in this thread"):
                async with TrioHost():
                    pass  # pragma: no cover
            assert await host.run(add, 1, 1) == 2  # the refused second host left this one running

            failed: list[BaseException] = []

            def elsewhere() -> None:  # another thread, another loop
                try:
                    asyncio.run(host.run(add, 1, 1))
                except BaseException as exc:
                    failed.append(exc)

            thread = threading.Thread(target=elsewhere)
            thread.start()
            await asyncio.to_thread(thread.join)
            assert [type(exc) for exc in failed] == [TrioHostError]
        with pytest.raises(TrioHostError, match="runs once"):
            async with host:
                pass  # pragma: no cover

    run(scenario)


def test_a_host_needs_a_running_asyncio_loop() -> None:
    async def under_trio() -> None:
        async with TrioHost():
            pass  # pragma: no cover

    with pytest.raises(NoAsyncioLoop, match="running asyncio event loop"):
        trio.run(under_trio)
    assert issubclass(NoAsyncioLoop, TrioHostError) and issubclass(TrioHostClosed, TrioHostError)


# -- a session from asyncio --------------------------------------------------------------------------


def one_call_script() -> list[ScriptStep]:
    call = ScriptedCall(id="c1", name="append_line", input={"line": "- milk"})
    return [ScriptStep(text="Adding milk.", tool_calls=[call]), ScriptStep(text="Added milk."), ScriptStep(text="Hi.")]


@contextlib.asynccontextmanager
async def hosted_session(host: TrioHost, script: list[ScriptStep]) -> AsyncIterator[Session[str]]:
    def open_session(provider: ScriptedProvider) -> Session[str]:
        return Session(
            document="# Shopping\n", kind=chat_app.NOTE, provider=provider, model="scripted-1",
            tools=[chat_app.append_line],
        )  # fmt: skip

    async with host.enter(ScriptedProvider, script) as provider, host.enter(open_session, provider) as session:
        yield session


async def until_review(host: TrioHost, session: Session[str]) -> TurnState:
    async with host.iterate(session.states) as states:
        async for state in states:
            if state.phase is Phase.AWAITING_APPROVAL:
                return state
    raise AssertionError("the turn never asked for a review")  # pragma: no cover


def test_a_turn_runs_from_asyncio_with_its_review_answered_from_asyncio() -> None:
    async def scenario() -> None:
        async with TrioHost() as host, hosted_session(host, one_call_script()) as session:
            turn = asyncio.create_task(host.run(session.send, "Add milk"))
            review = await until_review(host, session)
            assert [c.status for c in review.current_calls] == [CallStatus.PENDING]
            assert await host.run_sync(session.approve, "c1")
            state = await turn
            assert state.outcome is Outcome.COMPLETED
            assert state.calls[0].status is CallStatus.SUCCEEDED
            assert session.document == "# Shopping\n- milk\n"

    run(scenario)


def test_cancelling_a_send_from_asyncio_stops_the_turn_as_stop_does() -> None:
    async def settle(how: str) -> tuple[TurnState, str, TurnState]:
        async with TrioHost() as host, hosted_session(host, one_call_script()) as session:
            turn = asyncio.create_task(host.run(session.send, "Add milk"))
            await until_review(host, session)
            if how == "stop":
                assert await host.run_sync(session.stop)
                state = await turn
            else:
                turn.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await turn
                settled = await host.run_sync(lambda: session.state)
                assert settled is not None
                state = settled
            assert not session.busy
            assert await host.run_sync(lambda: set(session.nursery.child_tasks)) == set()
            assert await host.run(other_tasks) == ["_Holder.hold", "_Holder.hold"]  # the provider and session
            after = await host.run(session.send, "hello")  # the session takes the next turn
            return state, session.document, after

    async def scenario() -> None:
        stopped, stopped_document, _ = await settle("stop")
        cancelled, cancelled_document, after = await settle("cancel")
        assert cancelled.outcome is stopped.outcome is Outcome.CANCELLED
        assert [(c.status, c.denial_reason) for c in cancelled.calls] == [
            (c.status, c.denial_reason) for c in stopped.calls
        ]
        assert cancelled.calls[0].status is CallStatus.DENIED
        assert cancelled.notices == stopped.notices
        assert cancelled_document == stopped_document == "# Shopping\n"
        assert after.outcome is Outcome.COMPLETED

    run(scenario)


def test_leaving_the_session_and_host_with_a_turn_in_review_settles_it_and_ends() -> None:
    async def scenario() -> TurnState:
        async with TrioHost() as host, hosted_session(host, one_call_script()) as session:
            turn = asyncio.create_task(host.run(session.send, "Add milk"))
            await until_review(host, session)
        assert not host.is_open
        return await turn  # leaving the session stopped the turn

    state = run(scenario)
    assert state.outcome is Outcome.CANCELLED and state.calls[0].status is CallStatus.DENIED


# -- the example app over HTTP ----------------------------------------------------------------------


@contextlib.asynccontextmanager
async def served(script: list[ScriptStep]) -> AsyncIterator[tuple[httpx.AsyncClient, Any]]:
    """examples/asyncio_chat.py on Hypercorn (asyncio) on an ephemeral loopback port: a client for it, and the app."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    config = Config()
    config.bind = [f"fd://{listener.detach()}"]  # Hypercorn takes the socket over (and closes it)
    config.accesslog = config.errorlog = None
    shutdown = asyncio.Event()
    app = chat_app.create_app(script)
    server = asyncio.create_task(serve(app, config, shutdown_trigger=shutdown.wait, mode="asgi"))
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", trust_env=False) as client:
            yield client, app
    finally:
        shutdown.set()
        await server


async def events(response: httpx.Response) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """The Server-Sent Events of a streamed response: (event name, decoded data)."""
    name, data = "", ""
    async for line in response.aiter_lines():
        if line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("data: "):
            data = line.removeprefix("data: ")
        elif not line and name:
            yield name, json.loads(data)
            name, data = "", ""


def pending(data: dict[str, Any]) -> list[str]:
    return [c["id"] for c in data["calls"] if data["phase"] == "awaiting_approval" and c["status"] == "pending"]


async def chat_turn(client: httpx.AsyncClient, decide: Callable[[str], Awaitable[None]]) -> list[tuple[str, Any]]:
    """POST /chat and read its events to the end, calling ``decide(call_id)`` for each card that waits."""
    seen: list[tuple[str, Any]] = []
    decided: set[str] = set()
    async with client.stream("POST", "/chat", json={"text": "Add milk"}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        async for name, data in events(response):
            seen.append((name, data))
            for call_id in set(pending(data)) - decided:
                decided.add(call_id)
                await decide(call_id)
    return seen


def test_a_turn_streams_its_states_and_an_approval_through_the_endpoint_runs_the_tool() -> None:
    async def scenario() -> None:
        async with served(one_call_script()) as (client, _app):

            async def approve(call_id: str) -> None:
                answer = await client.post(f"/calls/{call_id}/approve")
                assert answer.json() == {"ok": True}

            seen = await chat_turn(client, approve)
            names = [name for name, _ in seen]
            assert names[-1] == "settled" and set(names[:-1]) == {"state"}
            assert any(pending(data) == ["c1"] for _, data in seen)
            settled = seen[-1][1]
            assert (settled["outcome"], settled["text"]) == ("completed", "Added milk.")
            assert settled["calls"][0]["status"] == "succeeded"
            now = (await client.get("/state")).json()
            assert now["document"] == "# Shopping\n- milk\n" and now["state"] == settled
            late = await client.post("/calls/c1/approve")  # a late click on a card that is gone
            assert (late.status_code, late.json()) == (409, {"ok": False})

    run(scenario)


def test_a_denial_through_the_endpoint_reaches_the_model_and_runs_nothing() -> None:
    async def scenario() -> None:
        async with served(one_call_script()) as (client, _app):

            async def deny(call_id: str) -> None:
                answer = await client.post(f"/calls/{call_id}/deny", json={"reason": "no dairy"})
                assert answer.json() == {"ok": True}

            seen = await chat_turn(client, deny)
            settled = seen[-1][1]
            assert settled["outcome"] == "completed"
            assert settled["calls"][0]["status"] == "denied" and "no dairy" in settled["calls"][0]["result"]
            assert (await client.get("/state")).json()["document"] == "# Shopping\n"

    run(scenario)


def test_stop_through_the_endpoint_settles_the_streamed_turn_cancelled() -> None:
    async def scenario() -> None:
        async with served(one_call_script()) as (client, _app):

            async def stop(call_id: str) -> None:
                assert (await client.post("/stop")).json() == {"ok": True}

            seen = await chat_turn(client, stop)
            assert seen[-1][0] == "settled" and seen[-1][1]["outcome"] == "cancelled"
            assert (await client.post("/stop")).status_code == 409  # nothing left to stop

    run(scenario)


def test_a_client_that_disconnects_stops_the_turn_and_leaves_nothing_running() -> None:
    async def scenario() -> None:
        async with served(one_call_script()) as (client, app):
            async with client.stream("POST", "/chat", json={"text": "Add milk"}) as response:
                async for _, data in events(response):
                    if pending(data):
                        break  # leaving the block closes the connection mid-turn
            after = (await client.get("/state", params={"wait": "settled"})).json()
            assert after["state"]["outcome"] == "cancelled"
            assert after["state"]["calls"][0]["status"] == "denied"
            assert after["document"] == "# Shopping\n"
            chat = app.state.chat
            assert await chat.host.run_sync(lambda: set(chat.session.nursery.child_tasks)) == set()
            assert await chat.host.run(other_tasks) == ["_Holder.hold", "_Holder.hold"]  # the provider and session
            seen = await chat_turn(client, lambda call_id: asyncio.sleep(0))  # the next turn runs
            assert seen[-1][0] == "settled" and seen[-1][1]["outcome"] == "completed"

    run(scenario)


def test_one_turn_at_a_time_and_bad_requests_are_refused() -> None:
    async def scenario() -> None:
        async with served(one_call_script()) as (client, _app):
            async with client.stream("POST", "/chat", json={"text": "Add milk"}) as response:
                async for _, data in events(response):
                    if pending(data):
                        busy = await client.post("/chat", json={"text": "again"})
                        assert busy.status_code == 409
                        assert (await client.post("/calls/c1/approve")).json() == {"ok": True}
            assert (await client.post("/chat", json={"nothing": 1})).status_code == 400

    run(scenario)


def test_cancelled_while_entering_the_host_ends_the_run() -> None:
    async def scenario() -> None:
        for yields in range(4):  # the cancellation lands before the run's main task starts, or after
            host = TrioHost()
            entering = asyncio.create_task(host.__aenter__())
            for _ in range(yields):
                await asyncio.sleep(0)
            if entering.cancel():
                with pytest.raises(asyncio.CancelledError):
                    await entering
            else:
                await host.__aexit__(None, None, None)
            assert not host.is_open
            async with TrioHost() as again:  # the thread is free for the next run
                assert await again.run(add, 1, 2) == 3

    run(scenario)


def test_the_example_runs_as_a_program_and_stops_on_ctrl_c() -> None:
    command = [sys.executable, str(EXAMPLE), "--port", "0"]
    with subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True) as program:
        try:
            assert program.stderr is not None
            line = program.stderr.readline()
            found = re.search(r"Running on (http://127\.0\.0\.1:\d+)", line)
            assert found is not None, line

            async def scenario() -> list[tuple[str, Any]]:
                async with httpx.AsyncClient(base_url=found[1], trust_env=False) as client:

                    async def approve(call_id: str) -> None:
                        assert (await client.post(f"/calls/{call_id}/approve")).json() == {"ok": True}

                    return await chat_turn(client, approve)

            seen = run(scenario)
            assert seen[-1][0] == "settled" and seen[-1][1]["outcome"] == "completed"
            program.send_signal(signal.SIGINT)  # Ctrl-C: Hypercorn shuts down, the lifespan closes the session
            assert program.wait(timeout=60) == 0
            assert "Traceback" not in program.stderr.read()
        finally:
            if program.poll() is None:
                program.kill()
