"""A PostgreSQL store's appends: each one statement (`OneAppend`), and, with group commit, committed together: one
connection, one thread, one transaction for the appends of every session of the store that are queued at the same
moment.

**One statement.** An append's checks and its rows are one ``INSERT ... SELECT``: the lease's row (locked ``FOR
SHARE``: a takeover waits for the append, or the append sees the takeover), its epoch and time, the lease
connection's advisory lock (when the append runs on another connection), the journal's last number, and the rows,
inserted only when every check holds. The statement answers with what it found, and the client turns a failed check
into the same `LeaseLost` or `JournalConflict` a check of its own would raise. A failed check inserts nothing and
is no database error, so it leaves the transaction usable.

**Group commit.** A worker that holds many sessions appends for each of them about once per tool start; committed
one by one, every append waits for its own WAL flush. Here appends queued behind one another share one transaction
(`StoreThread`): ``BEGIN``, every append's statement and ``COMMIT`` go to the server in one pipeline (one round
trip, one flush for all). A database error in one append's statement (a unique key violated by a writer outside the
leases, a lock wait past ``lock_timeout``) rolls the pipeline back: that append fails with it, and the others go
again in a pipeline of their own. Any other database error there has them all written again one by one, each in a
savepoint of its own, so that the one at fault fails alone.

Every wait is bounded: an append that does not return within the store's ``timeout_s`` gives up the shared
connection (its socket shut, so the thread returns and the server rolls back), and every append of that batch
raises `JournalStoreError` with an unknown outcome; the next append opens a new connection.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final

import trio

from trioloop.durable._pg_locks import LEASES, halves
from trioloop.durable._store_thread import StoreThread
from trioloop.durable.leases import LeaseLost
from trioloop.durable.store import JournalConflict, JournalStoreError, StoredEntry, check_batch

if TYPE_CHECKING:
    import psycopg

__all__ = ["OneAppend", "PostgresAppends", "write_together"]

_NOW: Final = LEASES.now
#: The advisory lock of the lease's own connection, on the server's lock table (as `_pg_locks.lease_held` reads it).
_ALIVE: Final = (
    "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted AND classid = %s::bigint::oid "
    "AND objid = %s::bigint::oid AND objsubid = 1 AND pid = %s) AS ok"
)
_APPEND: Final = f"""
WITH alive AS ({{alive}}),
lease AS (SELECT epoch, expires_at > {_NOW} AS live FROM trioloop_lease WHERE session_id = %s FOR SHARE),
last AS (SELECT coalesce(max(seq), 0) AS seq FROM trioloop_journal WHERE session_id = %s),
written AS (
    INSERT INTO trioloop_journal (session_id, seq, data)
    SELECT %s, row.seq, row.data FROM unnest(%s::bigint[], %s::bytea[]) AS row(seq, data)
    WHERE (SELECT ok FROM alive) AND (SELECT live FROM lease WHERE epoch = %s) AND (SELECT seq FROM last) = %s
    RETURNING 1
)
SELECT (SELECT ok FROM alive), (SELECT epoch FROM lease), (SELECT live FROM lease), (SELECT seq FROM last),
    (SELECT count(*) FROM written)
"""
_ON_SHARED: Final = _APPEND.format(alive=_ALIVE)
_ON_OWN: Final = _APPEND.format(alive="SELECT true AS ok")


class OneAppend:
    """One lease's append as one statement (see the module docstring); calling it runs the statement and raises what
    a failed check means. ``alive``: the lease connection's advisory key and server process, when the append runs
    on another connection (group commit)."""

    __slots__ = ("_batch", "_epoch", "_session_id", "params", "sql")

    def __init__(
        self, session_id: str, epoch: int, entries: Sequence[StoredEntry], alive: tuple[int, int] | None
    ) -> None:
        batch = tuple(entries)
        if batch:
            first = batch[0].seq
            check_batch(first - 1 if type(first) is int else 0, batch)  # consecutive, numbered, bytes
        self._session_id, self._epoch, self._batch = session_id, epoch, batch
        after = batch[0].seq - 1 if batch else None  # an empty batch checks the lease alone
        rows = ([entry.seq for entry in batch], [entry.data for entry in batch])
        head: tuple[int, ...] = ()
        if alive is None:
            self.sql = _ON_OWN
        else:
            key, backend = alive
            self.sql, head = _ON_SHARED, (*halves(key), backend)
        self.params = (*head, session_id, session_id, session_id, *rows, epoch, after)

    def judge(self, row: Sequence[Any] | None) -> None:
        """Raise what the statement's answer means: `LeaseLost`, `JournalConflict`, or nothing (the rows are in)."""
        session_id, epoch = self._session_id, self._epoch
        if row is None:
            raise JournalStoreError(f"PostgreSQL journal: appending to session {session_id!r}: no answer")
        alive, held, live, last, written = row
        if not alive:
            raise LeaseLost(
                f"the connection holding the lease on session {session_id!r} was lost, and the lease with it"
            )
        if held is None or int(held) != epoch:
            newer = "" if held is None else f" (now epoch {int(held)})"
            raise LeaseLost(f"the lease on session {session_id!r} (epoch {epoch}) was taken over{newer}")
        if not live:
            raise LeaseLost(f"the lease on session {session_id!r} (epoch {epoch}) ran out of time")
        check_batch(int(last), self._batch)
        if int(written) != len(self._batch):
            raise JournalStoreError(
                f"PostgreSQL journal: appending to session {session_id!r}: {written} of {len(self._batch)} rows written"
            )

    def __call__(self, connection: psycopg.Connection[tuple[Any, ...]]) -> None:
        self.judge(connection.execute(self.sql, self.params).fetchone())


def write_together(
    connection: psycopg.Connection[tuple[Any, ...]], appends: Sequence[Any]
) -> list[BaseException | None] | None:
    """Every append of ``appends`` (`OneAppend`) and the transaction around them in one pipeline: what each one's
    check found (None: written and committed; the database's own error for an append whose statement failed, whose
    group is then rolled back and the others written again together). None, with the transaction rolled back, when
    something else failed as a database error: the caller writes them again one by one. Raises when the connection
    broke (the outcome is then unknown)."""
    import psycopg

    if not all(isinstance(append, OneAppend) for append in appends) or not psycopg.Pipeline.is_supported():
        return None
    begun: Any = None
    cursors: list[Any] = []
    try:
        with connection.pipeline():
            begun = connection.execute("BEGIN")
            for append in appends:
                cursors.append(connection.execute(append.sql, append.params))
            connection.execute("COMMIT")
    except psycopg.Error as exc:
        if connection.closed or connection.broken:
            raise
        if connection.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            connection.execute("ROLLBACK")
        # The statement that failed is the first without an answer, after a BEGIN that had one (those after it were
        # skipped): it fails alone, and the others, rolled back with it, go again without it.
        answered = [cursor.pgresult is not None for cursor in cursors]
        if begun is None or begun.pgresult is None or len(cursors) != len(appends) or all(answered):
            return None
        failed = answered.index(False)
        rest = write_together(connection, [append for n, append in enumerate(appends) if n != failed])
        if rest is None:
            return None
        rest.insert(failed, exc)
        return rest
    found: list[BaseException | None] = []
    for append, cursor in zip(appends, cursors, strict=True):
        try:
            append.judge(cursor.fetchone())
        except (JournalStoreError, TypeError) as exc:
            found.append(exc)
        else:
            found.append(None)
    return found


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
        self._thread = StoreThread(
            "trioloop postgres appends", self._connect, _begin, _commit, _translate, together=write_together
        )

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
