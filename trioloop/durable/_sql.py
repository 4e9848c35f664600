"""What the SQL journal stores share: the queries that read without a lease, and ``async with`` closing.

Each store supplies its driver's placeholder (``?`` for sqlite3, ``%s`` for psycopg), ``_query`` (run
``work(connection)`` in a worker thread under the store's limiter, mapping driver errors) and ``close``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Sequence
from types import TracebackType
from typing import Any, ClassVar, Final, Self, TypeVar

import trio

from trioloop.durable.journal import MAX_ENTRY_BYTES, JournalError
from trioloop.durable.store import StoredEntry

__all__ = [
    "OUTLINE_BYTES",
    "SqlJournals",
    "entries_query",
    "outline_query",
    "outline_rows",
    "read_outline",
    "stored_entries",
]

_T = TypeVar("_T")


def entries_query(placeholder: str) -> str:
    """The entries of a session after a number, in order; an entry over `MAX_ENTRY_BYTES` stays in the database
    (its length is read instead), so a hostile row cannot fill memory before it is refused."""
    return (
        f"SELECT seq, CASE WHEN length(data) > {MAX_ENTRY_BYTES} THEN NULL ELSE data END, length(data) "
        f"FROM trioloop_journal WHERE session_id = {placeholder} AND seq > {placeholder} ORDER BY seq"
    )


#: The most sessions one ``heads(only=...)`` asks about (more: the caller asks for every head instead).
_HEADS_AT_ONCE: Final = 500
#: The entries that say where a session's last turn stands (`SqlJournals.turn_marks`).
TURN_MARKS: Final = ("submit", "resume", "suspend", "snapshot")
_KIND: Final = re.compile(r'^\{"seq":\d+,"kind":"(submit|resume|suspend|snapshot)"')

#: An entry at most this long comes whole in an outline (a seal is ~300 bytes): what is judged before the rest is read.
OUTLINE_BYTES: Final = 4096


def outline_query(placeholder: str) -> str:
    """Every entry of a session after a number, in order: its number, its length, and its bytes when it is short
    (`OUTLINE_BYTES`); a long entry's bytes stay in the database."""
    return (
        f"SELECT seq, length(data), CASE WHEN length(data) <= {OUTLINE_BYTES} THEN data ELSE NULL END "
        f"FROM trioloop_journal WHERE session_id = {placeholder} AND seq > {placeholder} ORDER BY seq"
    )


def read_outline(connection: Any, placeholder: str, session_id: str, after: int = 0) -> list[Any]:
    """The rows of `outline_query` for ``session_id`` after ``after`` (in the thread that owns ``connection``); what
    `outline_rows` reads and judges."""
    return list(connection.execute(outline_query(placeholder), (session_id, after)).fetchall())


def outline_rows(rows: Sequence[tuple[Any, Any, Any]]) -> tuple[tuple[int, int, bytes | None], ...]:
    """The rows `outline_query` read: (number, length, bytes or None)."""
    outline = []
    for seq, size, data in rows:
        if type(seq) is not int or type(size) is not int or not isinstance(data, bytes | bytearray | memoryview | None):
            number = seq if type(seq) is int else None
            raise JournalError(f"journal entry {seq!r} is not stored as a numbered run of bytes", seq=number)
        outline.append((seq, size, None if data is None else bytes(data)))
    return tuple(outline)


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

    async def heads(self, only: Collection[str] | None = None) -> dict[str, int]:
        """Every session with a journal (or those of ``only`` that have one) and the number of its last entry, in one
        query: what a face that lists sessions asks to learn which journals changed since it last read them."""
        ids = None if only is None or len(only) > _HEADS_AT_ONCE else sorted(only)  # too many: every head
        where = "" if ids is None else f" WHERE session_id IN ({', '.join([self._PLACEHOLDER] * len(ids))})"
        sql = f"SELECT session_id, max(seq) FROM trioloop_journal{where} GROUP BY session_id"
        if ids == []:
            return {}
        rows = await self._query(
            "listing journal heads", lambda connection: connection.execute(sql, tuple(ids or ())).fetchall()
        )
        return {str(session_id): int(seq) for session_id, seq in rows}

    async def turn_marks(self, only: Collection[str] | None = None) -> dict[str, tuple[int, str]]:
        """Each session's last entry that says where its last turn stands (``submit``, ``resume``, ``suspend`` or
        ``snapshot``): its number and kind, read from the entries' first bytes only, in one query. What a worker
        looks for turns in flight with (a hint: the journal itself is verified when the session is opened). ``only``:
        those sessions' (at most `_HEADS_AT_ONCE` named, else every session's)."""
        text = (
            "CAST(substr(data, 1, 48) AS TEXT)" if self._PLACEHOLDER == "?" else "encode(substr(data, 1, 48), 'escape')"
        )
        any_ = "%" if self._PLACEHOLDER == "?" else "%%"  # psycopg reads % as a placeholder: its literal is %%
        marks = " OR ".join(f'{text} LIKE \'{any_}"kind":"{kind}"{any_}\'' for kind in TURN_MARKS)
        ids = None if only is None or len(only) > _HEADS_AT_ONCE else sorted(only)
        if ids == []:
            return {}
        if ids is not None:
            marks = f"({marks}) AND session_id IN ({', '.join([self._PLACEHOLDER] * len(ids))})"
        sql = (
            f"SELECT j.session_id, j.seq, {text} FROM trioloop_journal j JOIN (SELECT session_id, max(seq) AS seq "
            f"FROM trioloop_journal WHERE {marks} GROUP BY session_id) m ON j.session_id = m.session_id "
            "AND j.seq = m.seq"
        )
        rows = await self._query(
            "reading where turns stand", lambda connection: connection.execute(sql, tuple(ids or ())).fetchall()
        )
        found = {}
        for session_id, seq, head in rows:
            kind = _KIND.search(str(head))
            if kind is not None:
                found[str(session_id)] = (int(seq), kind.group(1))
        return found

    async def read(self, session_id: str) -> Sequence[StoredEntry]:
        """Every entry of ``session_id`` in order, without a lease (for an auditor); `JournalError` naming an
        entry over the size cap, which is never read into memory."""
        sql = entries_query(self._PLACEHOLDER)
        rows = await self._query(
            f"reading session {session_id!r}", lambda connection: connection.execute(sql, (session_id, 0)).fetchall()
        )
        return stored_entries(rows)

    async def outline(self, session_id: str) -> Sequence[tuple[int, int, bytes | None]]:
        """Every entry of ``session_id``: (number, length, bytes when short), without a lease; what the rest of a
        journal is judged by before it is read (`trioloop.durable.journal.refuse_unsigned_tail`)."""
        placeholder = self._PLACEHOLDER
        rows = await self._query(
            f"reading session {session_id!r}", lambda connection: read_outline(connection, placeholder, session_id)
        )
        return outline_rows(rows)

    async def __aenter__(self) -> Self:
        await trio.lowlevel.checkpoint()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
