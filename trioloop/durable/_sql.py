"""What the SQL journal stores share: the queries that read without a lease, and ``async with`` closing.

Each store supplies its driver's placeholder (``?`` for sqlite3, ``%s`` for psycopg), ``_query`` (run
``work(connection)`` in a worker thread under the store's limiter, mapping driver errors) and ``close``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, ClassVar, Self, TypeVar

import trio

from trioloop.durable.journal import MAX_ENTRY_BYTES, JournalError
from trioloop.durable.store import StoredEntry

__all__ = ["SqlJournals", "entries_query", "stored_entries"]

_T = TypeVar("_T")


def entries_query(placeholder: str) -> str:
    """The entries of a session after a number, in order; an entry over `MAX_ENTRY_BYTES` stays in the database
    (its length is read instead), so a hostile row cannot fill memory before it is refused."""
    return (
        f"SELECT seq, CASE WHEN length(data) > {MAX_ENTRY_BYTES} THEN NULL ELSE data END, length(data) "
        f"FROM trioloop_journal WHERE session_id = {placeholder} AND seq > {placeholder} ORDER BY seq"
    )


def stored_entries(rows: Sequence[tuple[Any, Any, Any]]) -> tuple[StoredEntry, ...]:
    """The rows `entries_query` read; `JournalError` naming an entry over the size cap."""
    entries = []
    for seq, data, size in rows:
        if data is None:
            raise JournalError(
                f"journal entry {seq} is {size} bytes, over the {MAX_ENTRY_BYTES}-byte cap: it was not read", seq=seq
            )
        if type(seq) is not int or not isinstance(data, bytes | bytearray | memoryview):
            number = seq if type(seq) is int else None
            raise JournalError(f"journal entry {seq!r} is not stored as a numbered run of bytes", seq=number)
        entries.append(StoredEntry(seq, bytes(data)))
    return tuple(entries)


class SqlJournals:
    """The part of a SQL journal store that does not depend on its driver."""

    _PLACEHOLDER: ClassVar[str]

    async def _query(self, what: str, work: Callable[[Any], _T]) -> _T:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError

    async def session_ids(self) -> Sequence[str]:
        """The ids of every session with a journal, sorted."""
        rows = await self._query(
            "listing sessions",
            lambda connection: connection.execute("SELECT DISTINCT session_id FROM trioloop_journal").fetchall(),
        )
        return sorted(row[0] for row in rows)

    async def read(self, session_id: str) -> Sequence[StoredEntry]:
        """Every entry of ``session_id`` in order, without a lease (for an auditor); `JournalError` naming an
        entry over the size cap, which is never read into memory."""
        sql = entries_query(self._PLACEHOLDER)
        rows = await self._query(
            f"reading session {session_id!r}", lambda connection: connection.execute(sql, (session_id, 0)).fetchall()
        )
        return stored_entries(rows)

    async def __aenter__(self) -> Self:
        await trio.lowlevel.checkpoint()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
