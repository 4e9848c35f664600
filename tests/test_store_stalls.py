"""A PostgreSQL server that stops answering holds no turn past the bounds the person set: a lease's call gives up
after the store's ``timeout_s``, and a turn's append is cut by Stop or the turn deadline; the turn then stops, says
so, and the session refuses to go on (reopening it reads what the store holds). The server is real; the stall is
its backend process for the lease's connection, frozen with SIGSTOP."""

from __future__ import annotations

import os
import secrets
import signal
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import pytest
import trio
import trio.testing
from pg_support import postgres_url  # noqa: F401 -- the session fixture, reached by name

from tests.lease_worker import NOTE
from trioloop import ScriptedProvider, Session, SessionJournalError, TurnLimits
from trioloop.durable.postgres import PostgresJournalStore
from trioloop.durable.store import JournalStoreError, StoredEntry
from trioloop.providers.scripted import ScriptStep


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
            assert session._journal is not None
            with _frozen_backend(session._journal.lease):
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
                assert session.state is not None and session.state.is_settled
                with pytest.raises(SessionJournalError, match="whether it was written is unknown"):
                    await session.send("again")
    return took, session


async def test_stop_ends_a_turn_whose_append_meets_a_stalled_server(request: pytest.FixtureRequest) -> None:
    took, _ = await _stalled_turn(request.getfixturevalue("postgres_url"), stop=True)
    assert took < 1.5  # Stop, not the deadline nor the store's own 60 s bound


async def test_the_deadline_ends_a_turn_whose_append_meets_a_stalled_server(request: pytest.FixtureRequest) -> None:
    took, _ = await _stalled_turn(request.getfixturevalue("postgres_url"), stop=False)
    assert took < 1.5 + 1.0 + 1.0  # the deadline and the journal's grace, not the store's 60 s bound
