"""A PostgreSQL server that stops answering holds no turn past the bounds the person set: a lease's call gives up
after the store's ``timeout_s``, and a turn's append is cut by Stop or the turn deadline; the turn then stops, says
so, and the session refuses to go on (reopening it reads what the store holds). The server is real; the stall is
its backend process for the lease's connection, frozen with SIGSTOP."""

from __future__ import annotations

import os
import secrets
import signal
import sqlite3
from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing, asynccontextmanager, contextmanager
from typing import Any

import pytest
import trio
import trio.testing
from pg_support import postgres_url  # noqa: F401 -- the session fixture, reached by name

from tests.lease_worker import NOTE
from trioloop import (
    CallStatus,
    MemoryJournalStore,
    ScriptedProvider,
    Session,
    SessionJournalError,
    ToolExecutionContext,
    ToolOutcome,
    TurnLimits,
    function_tool,
)
from trioloop.durable.postgres import PostgresJournalStore
from trioloop.durable.sqlite import SQLiteJournalStore
from trioloop.durable.store import JournalStoreError, StoredEntry
from trioloop.providers.scripted import ScriptedCall, ScriptStep


@contextmanager
def _frozen_backend(lease: Any) -> Iterator[None]:
    """The server process serving ``lease``'s connection, stopped: it hears nothing and answers nothing."""
    pid = lease._connection.info.backend_pid
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


@asynccontextmanager
async def _store(url: str, **options: Any) -> AsyncIterator[PostgresJournalStore]:
    store = PostgresJournalStore(url, **options)
    try:
        yield store
    finally:
        with trio.fail_after(10):  # closing is bounded too
            await store.close()


async def test_a_lease_call_gives_up_after_the_stores_timeout(request: pytest.FixtureRequest) -> None:
    async with _store(request.getfixturevalue("postgres_url"), timeout_s=1.0) as store:
        lease = await store.acquire(f"stall-{secrets.token_hex(4)}")
        await lease.append([StoredEntry(1, b"one")])
        with _frozen_backend(lease):
            with trio.fail_after(4):
                with pytest.raises(JournalStoreError, match="did not answer within 1 s"):
                    await lease.append([StoredEntry(2, b"two")])
            with pytest.raises(JournalStoreError, match="whether it took effect is unknown"):
                await lease.last_seq()  # the connection was given up: nothing more goes through it
            with trio.fail_after(4):
                await lease.release()


async def _stalled_turn(url: str, stop: bool) -> tuple[float, Session[str]]:
    """A turn whose first append meets a frozen server: how long ``send`` took, and the session."""
    limits = TurnLimits(turn_deadline_ms=1500)
    async with _store(url, timeout_s=60) as store, ScriptedProvider([ScriptStep(text="Hi.")]) as provider:
        session = await Session.open(
            store, f"stall-{secrets.token_hex(4)}", kind=NOTE, provider=provider, document="", model="m", limits=limits
        )
        async with session:
            assert session._journal.journal is not None
            with _frozen_backend(session._journal.journal.lease):
                began = trio.current_time()
                async with trio.open_nursery() as nursery:
                    if stop:

                        async def press_stop() -> None:
                            await trio.sleep(0.3)
                            assert session.stop()

                        nursery.start_soon(press_stop)
                    with trio.fail_after(5), pytest.raises(SessionJournalError, match="was written is unknown"):
                        await session.send("hello")  # raised once the turn has settled, stopped
                took = trio.current_time() - began
                assert session.state is not None and not session.state.is_settled  # the last state shown stands
                with pytest.raises(SessionJournalError, match="whether it was written is unknown"):
                    await session.send("again")
    return took, session


async def test_stop_ends_a_turn_whose_append_meets_a_stalled_server(request: pytest.FixtureRequest) -> None:
    took, _ = await _stalled_turn(request.getfixturevalue("postgres_url"), stop=True)
    assert took < 1.5  # Stop, not the deadline nor the store's own 60 s bound


async def test_the_deadline_ends_a_turn_whose_append_meets_a_stalled_server(request: pytest.FixtureRequest) -> None:
    took, _ = await _stalled_turn(request.getfixturevalue("postgres_url"), stop=False)
    assert took < 1.5 + 0.5  # the deadline itself, not a grace after it nor the store's 60 s bound


async def test_the_deadline_ends_a_turn_whose_sqlite_append_waits_for_another_writer(tmp_path: Any) -> None:
    # Another connection holds the database's write lock: the append waits in the store's worker thread for
    # SQLite's busy timeout (5 s). The turn does not: at its deadline it leaves the thread behind, stops, says
    # so, and the session refuses to go on; the store still serves a reopening once the lock is let go.
    path = tmp_path / "journal.db"
    store = SQLiteJournalStore(path)
    async with ScriptedProvider([ScriptStep(text="Hi.")]) as provider:
        session = await Session.open(
            store, "s", kind=NOTE, provider=provider, document="", model="m", limits=TurnLimits(turn_deadline_ms=1000)
        )
        async with session:
            other = sqlite3.connect(path, isolation_level=None)
            other.execute("BEGIN IMMEDIATE")
            try:
                began = trio.current_time()
                with trio.fail_after(10), pytest.raises(SessionJournalError, match="was written is unknown"):
                    await session.send("hello")
                took = trio.current_time() - began
            finally:
                other.execute("ROLLBACK")
                other.close()
    assert took < 1.0 + 0.5  # the deadline, not SQLite's 5 s busy timeout
    reopened = await Session.open(store, "s", kind=NOTE, provider=ScriptedProvider([]))
    async with reopened:
        assert reopened.document == ""
    await store.close()


class _SlowCommits:
    """A memory store whose appends holding a commit take ``delay_s`` (a disk or a server slowing down)."""

    def __init__(self, delay_s: float) -> None:
        self.inner = MemoryJournalStore()
        self.delay_s = delay_s
        self.outlives_process = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def acquire(self, session_id: str, *, wait_s: float = 0.0) -> Any:
        lease = await self.inner.acquire(session_id, wait_s=wait_s)
        slow = self

        class Lease:
            def __getattr__(self, name: str) -> Any:
                return getattr(lease, name)

            async def append(self, entries: Any) -> None:
                if any(b'"document_digest":"' in e.data for e in entries):
                    await trio.sleep(slow.delay_s)
                await lease.append(entries)

        return Lease()


async def test_a_commit_whose_append_is_cut_short_is_never_shown_and_the_document_goes_back() -> None:
    # The tool commits; its append outlasts the deadline and its grace, so the turn stops with the append's
    # outcome unknown. Nothing the journal may not hold was ever published, and the live document is the one
    # the journal confirmed: what a reopened session shows too.
    @function_tool(effect="mutate")
    def write(ctx: ToolExecutionContext[str]) -> ToolOutcome[str]:
        """Write hello."""
        return ToolOutcome.success("written", document="hello\n")

    store = _SlowCommits(delay_s=5.0)
    steps = [ScriptStep(tool_calls=(ScriptedCall(id="c1", name="write"),)), ScriptStep(text="Done.")]
    shown: list[str] = []
    async with ScriptedProvider(steps) as provider:
        session = await Session.open(
            store, "s", kind=NOTE, provider=provider, document="", model="m", tools=[write],
            limits=TurnLimits(turn_deadline_ms=1000),
        )  # fmt: skip
        async with session, trio.open_nursery() as nursery:

            async def watch() -> None:
                async with aclosing(session.states()) as states:
                    async for state in states:
                        call = state.call("c1")
                        if call is not None and call.status is CallStatus.SUCCEEDED:
                            shown.append(session.document)

            async def approve() -> None:
                async with aclosing(session.states()) as states:
                    async for state in states:
                        call = state.call("c1")
                        if call is not None and call.status is CallStatus.PENDING:
                            session.approve("c1")
                            return

            nursery.start_soon(watch)
            nursery.start_soon(approve)
            with trio.fail_after(4), pytest.raises(SessionJournalError, match="was written is unknown"):
                await session.send("write")
            nursery.cancel_scope.cancel()
        assert shown == [] and session.document == ""
    reopened = await Session.open(store, "s", kind=NOTE, provider=ScriptedProvider([]), tools=[write])
    assert reopened.document == session.document
    await reopened.aclose()
