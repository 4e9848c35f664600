"""A lease's outline of its journal (each entry's number, length, and the bytes of a short one): what an open judges
the journal by before it reads it. A SQLite or PostgreSQL lease reads it with its claim (one hand-over to the store's
thread, or one round trip, for both); what it gives is the journal as it stands, before and after the holder's own
appends, on every store."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import pytest
from pg_support import postgres_url  # noqa: F401 -- the session fixture, reached by name (getfixturevalue)

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
