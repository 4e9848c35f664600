"""A PostgreSQL store's appends, committed together: one connection, one thread, one transaction for the appends of
every session of the store that are queued at the same moment (group commit).

A worker that holds many sessions appends for each of them about once per tool start; committed one by one, every
append waits for its own WAL flush. Here appends queued behind one another share one transaction, each in a savepoint
of its own (`StoreThread`): a conflict or a lost lease rolls back that append alone; the commit, and its one flush,
serve them all. Each append still checks its own lease (epoch and time, the row locked ``FOR SHARE``) inside that
transaction, so fencing is what it was with a connection per append.

Every wait is bounded: an append that does not return within the store's ``timeout_s`` gives up the shared
connection (its socket shut, so the thread returns and the server rolls back), and every append of that batch
raises `JournalStoreError` with an unknown outcome; the next append opens a new connection.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

from trioloop.durable._store_thread import StoreThread
from trioloop.durable.store import JournalConflict, JournalStoreError

if TYPE_CHECKING:
    import psycopg

__all__ = ["PostgresAppends"]


def _begin(connection: psycopg.Connection[tuple[Any, ...]]) -> None:
    connection.execute("BEGIN")


def _commit(connection: psycopg.Connection[tuple[Any, ...]], keep: bool) -> None:
    connection.execute("COMMIT" if keep else "ROLLBACK")


def _translate(error: BaseException, what: str) -> BaseException:
    import psycopg

    if isinstance(error, psycopg.errors.UniqueViolation):
        translated: BaseException = JournalConflict(f"PostgreSQL journal: {what}: another writer appended first")
    elif isinstance(error, psycopg.Error):
        translated = JournalStoreError(f"PostgreSQL journal: {what} failed: {error}")
    else:
        return error
    translated.__cause__ = error
    return translated


class PostgresAppends:
    """The store's appending connection and its thread. ``connect()`` opens a connection (autocommit, as the
    store's others); ``timeout_s`` bounds each append."""

    def __init__(self, connect: Callable[[], psycopg.Connection[tuple[Any, ...]]], timeout_s: float) -> None:
        self._open = connect
        self._timeout_s = timeout_s
        self._connection: psycopg.Connection[tuple[Any, ...]] | None = None
        self._thread = StoreThread("trioloop postgres appends", self._connect, _begin, _commit, _translate)

    @property
    def batches(self) -> tuple[int, int]:
        """How many transactions of appends committed, and how many appends they held."""
        return self._thread.batches, self._thread.appends

    def _connect(self) -> psycopg.Connection[tuple[Any, ...]]:
        connection = self._connection
        if connection is not None and not connection.closed and not connection.broken:
            return connection
        connection = self._open()
        self._connection = connection
        return connection

    async def append(self, what: str, write: Callable[[psycopg.Connection[tuple[Any, ...]]], None]) -> None:
        """``write(connection)`` inside a transaction shared with the appends queued beside it; returns once that
        transaction committed. `JournalStoreError` (outcome unknown) past ``timeout_s`` or when cancelled mid-way."""
        # A caller cancelled from outside (Stop, its deadline) goes on at once and its append finishes alone (its
        # outcome unknown to it); the others of its batch are not touched.
        with trio.move_on_after(self._timeout_s) as waited:
            await self._thread.append(what, write)
            return
        if waited.cancelled_caught:
            self._give_up()
            raise JournalStoreError(
                f"PostgreSQL journal: {what}: the server did not answer within {self._timeout_s:g} s; whether it "
                "took effect is unknown"
            )

    def _give_up(self) -> None:
        """Shut the shared connection's socket: the thread's statement fails at once (the batch's appends with it)
        and the server rolls its transaction back; the next append connects again."""
        connection = self._connection
        if connection is None:
            return
        with contextlib.suppress(Exception):
            duplicate = socket.socket(fileno=os.dup(connection.pgconn.socket))
            with duplicate:
                duplicate.shutdown(socket.SHUT_RDWR)

    async def close(self) -> None:
        """End the thread (what is queued runs first) and close the connection."""
        await self._thread.stop()
        connection, self._connection = self._connection, None
        if connection is not None:
            with contextlib.suppress(Exception):
                await trio.to_thread.run_sync(connection.close)
