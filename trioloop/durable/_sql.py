"""What the SQL journal stores share: the queries that read without a lease, and ``async with`` closing.

Each store supplies its driver's placeholder (``?`` for sqlite3, ``%s`` for psycopg), ``_query`` (run
``work(connection)`` in a worker thread under the store's limiter, mapping driver errors) and ``close``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, ClassVar, Self, TypeVar

import trio

from trioloop.durable.store import StoredEntry

__all__ = ["SqlJournals"]

_T = TypeVar("_T")


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
        """Every entry of ``session_id`` in order, without a lease (for an auditor)."""
        sql = f"SELECT seq, data FROM trioloop_journal WHERE session_id = {self._PLACEHOLDER} ORDER BY seq"
        rows = await self._query(
            f"reading session {session_id!r}", lambda connection: connection.execute(sql, (session_id,)).fetchall()
        )
        return tuple(StoredEntry(seq, bytes(data)) for seq, data in rows)

    async def __aenter__(self) -> Self:
        await trio.lowlevel.checkpoint()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
