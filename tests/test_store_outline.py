"""A lease's outline of its journal (each entry's number, length, and the bytes of a short one): what an open judges
the journal by before it reads it. A SQLite or PostgreSQL lease reads it with its claim (one hand-over to the store's
thread, or one round trip, for both); what it gives is the journal as it stands, before and after the holder's own
appends, on every store."""

from __future__ import annotations

import secrets
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from pg_support import postgres_url  # noqa: F401 -- the session fixture, reached by name (getfixturevalue)

from trioloop import JournalError
from trioloop.durable.postgres import PostgresJournalStore
from trioloop.durable.sqlite import SQLiteJournalStore
from trioloop.durable.store import MemoryJournalStore, StoredEntry, outline_of

FIRST = [StoredEntry(1, b'{"a":1}'), StoredEntry(2, b"x" * 10_000)]
MORE = [StoredEntry(3, b'{"b":2}')]


@pytest.mark.parametrize("backend", ["memory", "sqlite", "postgres"])
async def test_a_leases_outline_is_the_journal_as_it_stands_before_and_after_its_appends(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    store: Any = (
        MemoryJournalStore()
        if backend == "memory"
        else SQLiteJournalStore(tmp_path / "j.db")
        if backend == "sqlite"
        else PostgresJournalStore(request.getfixturevalue("postgres_url"))
    )
    session = f"s-{secrets.token_hex(4)}"
    try:
        lease = await store.acquire(session)
        assert list(await lease.outline()) == []
        await lease.append(FIRST)
        await lease.release()
        lease = await store.acquire(session)
        assert list(await lease.outline()) == list(outline_of(FIRST))
        assert list(await lease.outline()) == list(outline_of(FIRST))  # asked again: the same
        await lease.append(MORE)
        assert list(await lease.outline()) == list(outline_of(FIRST + MORE))
        assert list(await lease.outline(after=2)) == list(outline_of(MORE))
        await lease.release()
        lease = await store.acquire(session)
        assert list(await lease.outline(after=1)) == list(outline_of([FIRST[1], *MORE]))
        assert list(await lease.outline()) == list(outline_of(FIRST + MORE))
        await lease.release()
        lease = await store.acquire(session)
        await lease.erase()  # before the outline was asked for: what the claim read is no longer the journal
        assert list(await lease.outline()) == []
        await lease.release()
    finally:
        if backend != "memory":
            await store.close()


async def test_an_entry_stored_as_text_is_refused_by_the_outline_and_the_lease_is_still_released(
    tmp_path: Path,
) -> None:
    """The outline read with the claim is judged when asked for, as any: a row the claim's hand-over read but cannot
    be an outline (an entry stored as text) is refused there, and the claim it came with is a lease that releases."""
    store = SQLiteJournalStore(tmp_path / "j.db")
    try:
        lease = await store.acquire("s")
        await lease.append(FIRST)
        await lease.release()
        with sqlite3.connect(tmp_path / "j.db") as db:
            db.execute("UPDATE trioloop_journal SET data = CAST(data AS TEXT) WHERE seq = 1")
        lease = await store.acquire("s")
        with pytest.raises(JournalError, match="not stored as a numbered run of bytes"):
            await lease.outline()
        await lease.release()
        lease = await store.acquire("s")  # the session is free again
        await lease.release()
    finally:
        await store.close()
