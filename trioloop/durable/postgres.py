"""Journals in PostgreSQL (psycopg 3): one database shared by a fleet of processes.

Theory of operation: psycopg's sync API (its async API needs asyncio, which a Trio app lacks), every call
in a worker thread under the store's own limiter. Each lease owns one connection and is a row of
``trioloop_lease`` with a time to live and a fencing epoch (`trioloop.durable.leases`), checked (the row locked
``FOR SHARE``) in the transaction of every append; times are the server's clock. On its connection the lease
also holds the advisory lock of its session and epoch (the first 64 bits of their sha256), so a killed
process's lease ends as soon as the server sees its connection close (at once when the kernel closes the
socket; for a machine that vanished, after the server's TCP keepalive), and a frozen one's when its time to
live runs out. The store keeps one more connection for `session_ids` and for creating the tables.

An append is one statement (`_pg_appends.OneAppend`; with group commit, one of many in a shared transaction): it
checks the lease and the last number and inserts only if both hold; a second writer reading the same number (a bug,
not a race) meets the primary key: `JournalConflict`.
psycopg is imported only when a store is made: ``pip install "trioloop[postgres]"``.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable, Sequence
from functools import partial
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar, final

import trio

from trioloop.durable._pg_appends import OneAppend, PostgresAppends
from trioloop.durable._pg_locks import JOURNAL_NOTICE, LOCK_WAIT_MS, claim, epoch_key, lease_held
from trioloop.durable._pg_locks import LEASES as _LEASES
from trioloop.durable._pg_locks import SCHEMA_KEY as _SCHEMA_KEY
from trioloop.durable._pg_pool import LeaseConnections
from trioloop.durable._sql import SqlJournals, entries_query, outline_rows, read_outline, stored_entries
from trioloop.durable._waiting import check_session_id, wait_for_lease
from trioloop.durable.decision_box import PostgresDecisions
from trioloop.durable.leases import (
    DEFAULT_LEASE_TTL_S,
    LEASE_SCHEMA,
    ExpiringLease,
    LeaseClock,
    LeaseLost,
    check_ttl,
)
from trioloop.durable.store import (
    JournalConflict,
    JournalLease,
    JournalStoreError,
    SessionLocked,
    StoredEntry,
)

if TYPE_CHECKING:
    import psycopg

__all__ = ["PostgresJournalStore"]

#: Worker threads one store runs at once: one per lease at most (each lease's calls also take its own lock).
MAX_THREADS = 8
#: Seconds a connection attempt may take when the conninfo does not say (``connect_timeout``).
CONNECT_TIMEOUT_S = 10
#: How long one call of a lease waits for the server unless the store is told otherwise.
DEFAULT_TIMEOUT_S = 10.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS trioloop_journal (
    session_id text NOT NULL,
    seq bigint NOT NULL,
    data bytea NOT NULL,
    PRIMARY KEY (session_id, seq)
)
"""

_T = TypeVar("_T")


def _require_psycopg() -> None:
    try:
        import psycopg  # noqa: F401 -- only to turn a missing extra into a message that says what to install
    except ImportError as exc:
        raise ImportError('PostgresJournalStore needs psycopg 3: pip install "trioloop[postgres]"') from exc


def _guarded(what: str, work: Callable[[], _T]) -> _T:
    """Run ``work`` (a worker thread), turning psycopg's errors into the store's."""
    import psycopg

    try:
        return work()
    except psycopg.errors.UniqueViolation as exc:
        raise JournalConflict(f"PostgreSQL journal: {what}: another writer appended first") from exc
    except psycopg.Error as exc:
        raise JournalStoreError(f"PostgreSQL journal: {what} failed: {exc}") from exc


@final
class PostgresJournalStore(PostgresDecisions, SqlJournals):
    """Journals of any number of sessions in the table ``trioloop_journal`` of the database ``conninfo`` names.

    ``conninfo`` is a libpq connection string or ``postgresql://`` URL. Leases exclude each other across
    processes and machines; a killed process's leases end when the server notices its connection closed.
    ``close()`` (or the end of ``async with``) releases the leases this store granted. ``lease_ttl_s`` is a lease's
    time to live (`trioloop.durable.leases`); ``timeout_s`` bounds each call of a lease (an append, a read, a
    renewal): past it the connection is given up and the call raises `JournalStoreError`. With ``group_commit`` the
    appends of all its leases go through one more connection, and those queued together commit in one transaction
    (`trioloop.durable._pg_appends`): a process holding many sessions (a worker) pays one flush for them.
    ``reuse_connections``: keep up to that many connections whose leases ended cleanly, for the next leases
    (`trioloop.durable._pg_pool`; a worker taking up session after session), instead of closing them.
    """

    _PLACEHOLDER = "%s"

    def __init__(
        self,
        conninfo: str,
        *,
        read_only: bool = False,
        lease_ttl_s: float = DEFAULT_LEASE_TTL_S,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        group_commit: bool = False,
        reuse_connections: int = 0,
    ) -> None:
        _require_psycopg()
        self.lease_ttl_s = check_ttl(lease_ttl_s)
        if not isinstance(timeout_s, int | float) or not 0 < timeout_s <= 3600:
            raise ValueError(f"timeout_s must be a number of seconds above 0 and at most 3600, not {timeout_s!r}")
        #: How long one call of a lease (an append, a read, a renewal) waits for the server before it gives up.
        self.timeout_s = float(timeout_s)
        self._conninfo = conninfo
        self._read_only = read_only
        self._limiter = trio.CapacityLimiter(MAX_THREADS)
        self._admin: psycopg.Connection[tuple[Any, ...]] | None = None
        self._admin_lock = trio.Lock()
        self._closed = False
        self._leases: dict[int, _PostgresLease] = {}
        self._idle = LeaseConnections(keep=reuse_connections)  # connections leases ended on, for the next ones
        #: The appends of every lease of this store, committed together (`trioloop.durable._pg_appends`); None: each
        #: lease appends on its own connection, one transaction per append.
        self._appends = PostgresAppends(self._append_connection, self.timeout_s) if group_commit else None

    @property
    def identity(self) -> str:
        """Which store this is, for a witness (`witness_name`): the server and database the connection names
        (never its password)."""
        from psycopg.conninfo import conninfo_to_dict

        try:
            info = conninfo_to_dict(self._conninfo)
        except Exception:  # a conninfo psycopg cannot parse fails at connect; name the store by its kind then
            return "postgresql:"
        host = info.get("host") or info.get("hostaddr") or "localhost"
        return f"postgresql://{host}:{info.get('port') or 5432}/{info.get('dbname') or info.get('user') or ''}"

    async def acquire(self, session_id: str, *, wait_s: float = 0.0) -> JournalLease:
        """A lease on ``session_id``; `SessionLocked` if another lease holds it past ``wait_s`` seconds."""
        check_session_id(session_id)
        if self._read_only:
            await trio.lowlevel.checkpoint()
            raise JournalStoreError("the PostgreSQL journal store is open read-only: it grants no lease")
        held = partial(lease_held, session_id=session_id, now=_LEASES.now, key_of=partial(epoch_key, session_id))
        asked = held if wait_s == 0 else lambda connection: False  # on the store's connection (its tables made)
        if await self._on_admin(f"asking who holds session {session_id!r}", asked):
            raise SessionLocked(f"session {session_id!r} is driven by another lease")  # no connection made for it
        connection = await self._in_thread(
            f"connecting to lease session {session_id!r}", self._idle.take_or(self._connect)
        )
        try:

            async def try_once() -> _PostgresLease | None:
                asked_at = trio.current_time()
                claimed = await self._in_thread(
                    f"leasing session {session_id!r}", lambda: _claim(connection, session_id, self.lease_ttl_s)
                )
                if claimed is None:
                    return None
                epoch, found = claimed
                lease = _PostgresLease(
                    session_id, connection, epoch, self.lease_ttl_s, timeout_s=self.timeout_s, limiter=self._limiter,
                    closed=self._is_closed, forget=self._forget, appends=self._appends, give_back=self._idle.give_back,
                )  # fmt: skip
                lease.clock.granted(asked_at)
                lease.found = found
                self._leases[id(lease)] = lease
                return lease

            return await wait_for_lease(session_id, wait_s, try_once)
        except BaseException:
            with trio.CancelScope(shield=True):  # not leased (held elsewhere, or a failure): kept if it is clean
                await trio.to_thread.run_sync(self._idle.give_back, connection, limiter=self._limiter)
            raise

    async def close(self) -> None:
        """Release every lease this store granted and close its connections; later calls raise `JournalStoreError`."""
        with trio.CancelScope(shield=True):
            for lease in list(self._leases.values()):
                await lease.release()
            self._closed = True
            await trio.to_thread.run_sync(self._idle.close_all, limiter=self._limiter)
            await self._stop_listening()  # the notices (`arm_decisions` and the like), if anyone listened
            if self._appends is not None:
                await self._appends.close()
            async with self._admin_lock:
                admin, self._admin = self._admin, None
                if admin is not None:
                    await trio.to_thread.run_sync(admin.close, limiter=self._limiter)
        await trio.lowlevel.checkpoint()

    def _is_closed(self) -> bool:
        return self._closed

    def _forget(self, lease: _PostgresLease) -> None:
        """A lease this store granted was released: ``close`` has no more to release for it."""
        self._leases.pop(id(lease), None)

    async def _in_thread(self, what: str, work: Callable[[], _T]) -> _T:
        if self._closed:
            await trio.lowlevel.checkpoint()
            raise JournalStoreError("the PostgreSQL journal store is closed")
        return await trio.to_thread.run_sync(_guarded, what, work, limiter=self._limiter)

    async def _query(self, what: str, work: Callable[[Any], _T]) -> _T:
        return await self._on_admin(what, work)

    async def _on_admin(self, what: str, work: Callable[[psycopg.Connection[tuple[Any, ...]]], _T]) -> _T:
        async with self._admin_lock:
            return await self._in_thread(what, lambda: work(self._admin_connection()))

    def _admin_connection(self) -> psycopg.Connection[tuple[Any, ...]]:
        """The store's own connection, made (and the table created) on first use or after it broke."""
        if self._admin is not None and not self._admin.closed:
            return self._admin
        connection = self._connect()
        try:
            if self._read_only:  # an auditor's: it writes nothing, and a database without journals is not one
                connection.execute("SET default_transaction_read_only = on")
                row = connection.execute("SELECT to_regclass('trioloop_journal')").fetchone()
                if row is None or row[0] is None:
                    raise JournalStoreError("this PostgreSQL database holds no trioloop journal")
            else:
                with connection.transaction():
                    connection.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_KEY,))
                    connection.execute(_SCHEMA)
                    connection.execute(LEASE_SCHEMA)
                    if connection.info.server_version >= 140000:  # CREATE OR REPLACE TRIGGER: PostgreSQL 14
                        connection.execute(JOURNAL_NOTICE)
        except BaseException:
            connection.close()
            raise
        self._admin = connection
        return connection

    def _append_connection(self) -> psycopg.Connection[tuple[Any, ...]]:
        """The connection appends share: like a lease's, it never keeps rows locked past a lease's time to live."""
        connection = self._connect()
        idle_ms = str(max(int(self.lease_ttl_s * 1000), 1))
        connection.execute("SELECT set_config('idle_in_transaction_session_timeout', %s, false)", (idle_ms,))
        connection.execute("SELECT set_config('lock_timeout', %s, false)", (str(LOCK_WAIT_MS),))
        return connection

    def _connect(self) -> psycopg.Connection[tuple[Any, ...]]:
        import psycopg
        from psycopg.conninfo import conninfo_to_dict

        given = conninfo_to_dict(self._conninfo)
        defaults: dict[str, Any] = {}
        if "connect_timeout" not in given:
            defaults["connect_timeout"] = CONNECT_TIMEOUT_S
        if "application_name" not in given:
            defaults["application_name"] = "trioloop journal"
        connection = psycopg.connect(self._conninfo, autocommit=True, **defaults)
        try:
            (commit_mode,) = connection.execute("SHOW synchronous_commit").fetchone() or ("on",)
            if commit_mode == "off":  # an append must be durable when it returns
                connection.execute("SET synchronous_commit = on")
        except BaseException:
            connection.close()
            raise
        return connection


@final
class _PostgresLease(ExpiringLease):
    """A lease on one session of a `PostgresJournalStore`, on a connection of its own: given the bound on each call
    (``timeout_s``), the store's thread limiter, whether the store is ``closed``, and ``forget``, which tells the
    store it was released."""

    def __init__(
        self,
        session_id: str,
        connection: psycopg.Connection[tuple[Any, ...]],
        epoch: int,
        ttl_s: float,
        *,
        timeout_s: float,
        limiter: trio.CapacityLimiter,
        closed: Callable[[], bool],
        forget: Callable[[_PostgresLease], None],
        appends: PostgresAppends | None = None,
        give_back: Callable[[psycopg.Connection[tuple[Any, ...]]], None] | None = None,
    ) -> None:
        self._appends = appends
        self._give_back = give_back
        self._backend = connection.info.backend_pid
        self._session_id = session_id
        self._connection = connection
        self._epoch = epoch
        self._timeout_s = timeout_s
        self._limiter = limiter
        self._store_closed = closed
        self._forget = forget
        self._lock = trio.Lock()  # one call at a time on the lease's connection
        self._released = False
        self._broken: str | None = None  # why the connection was given up mid-call
        self.clock = LeaseClock(ttl_s)

    @property
    def session_id(self) -> str:
        return self._session_id

    async def renew(self) -> None:
        """Push the lease's end on by its time to live; `LeaseLost` if it is no longer this holder's (at once, with no
        I/O, once the holder's own clock says it may have run out: a holder woken from a freeze never waits on the
        server to learn it)."""
        self.check_held()
        asked_at = trio.current_time()
        renewed = await self._run(
            "renewing the lease on", lambda c: _LEASES.renew(c, self._session_id, self._epoch, self.clock.ttl_s)
        )
        self._renewed(asked_at, renewed)

    async def _run(self, what: str, work: Callable[[psycopg.Connection[tuple[Any, ...]]], _T]) -> _T:
        if self._released:
            await trio.lowlevel.checkpoint()
            raise JournalStoreError("this lease was released")
        async with self._lock:
            if self._released:
                raise JournalStoreError("this lease was released")
            if self._broken is not None:
                raise JournalStoreError(self._broken)
            if self._connection.closed:
                raise JournalStoreError(
                    f"the connection holding the lease on session {self._session_id!r} was lost,"
                    " and the lease with it: acquire the session again"
                )
            label = f"{what} session {self._session_id!r}"
            timeout_s = self._timeout_s
            if self._store_closed():
                raise JournalStoreError("the PostgreSQL journal store is closed")
            try:
                # Abandonable: a server that stops answering (a stalled connection, dropped packets) holds the
                # caller no longer than the bound, Stop or the turn's deadline, whatever the thread still waits on.
                with trio.move_on_after(timeout_s):
                    return await trio.to_thread.run_sync(
                        _guarded, label, lambda: work(self._connection), limiter=self._limiter,
                        abandon_on_cancel=True,
                    )  # fmt: skip
            except trio.Cancelled:
                self._abandon(f"PostgreSQL journal: {label} was cut short; whether it took effect is unknown")
                raise
            self._abandon(
                f"PostgreSQL journal: {label}: the server did not answer within {timeout_s:g} s; whether it took "
                "effect is unknown"
            )
            raise JournalStoreError(self._broken)

    def _abandon(self, why: str) -> None:
        """Give up on the lease's connection mid-call: every later call raises ``why``, and the socket is shut so
        the abandoned thread returns and the server ends the session (its transaction, its locks) once it hears."""
        self._broken = why
        with contextlib.suppress(Exception):
            duplicate = socket.socket(fileno=os.dup(self._connection.pgconn.socket))
            with duplicate:
                duplicate.shutdown(socket.SHUT_RDWR)

    async def entries(self, *, after: int = 0) -> Sequence[StoredEntry]:
        rows = await self._run(
            "reading", lambda connection: connection.execute(entries_query("%s"), (self._session_id, after)).fetchall()
        )
        return stored_entries(rows)

    async def outline(self, *, after: int = 0) -> Sequence[tuple[int, int, bytes | None]]:
        if (found := self.take_found(after)) is not None:
            await trio.lowlevel.checkpoint()
            return outline_rows(found)
        read = partial(read_outline, placeholder="%s", session_id=self._session_id, after=after)
        return outline_rows(await self._run("reading", read))

    async def last_seq(self) -> int:
        return await self._run("reading", lambda connection: _last_seq(connection, self._session_id))

    async def append(self, entries: Sequence[StoredEntry]) -> None:
        self.check_held()  # lost by the holder's own clock: `LeaseLost` at once, before any I/O
        self.found = None  # no longer the journal's outline
        if self._appends is not None:  # in a transaction shared with the store's other appends (group commit)
            # The shared connection: the lease's own must still hold its lock.
            alive = (epoch_key(self._session_id, self._epoch), self._backend)
            write = OneAppend(self._session_id, self._epoch, entries, alive)
            if self._released or self._store_closed():
                await trio.lowlevel.checkpoint()
                raise JournalStoreError("this lease was released" if self._released else "the store is closed")
            try:
                await self._appends.append(f"appending to session {self._session_id!r}", write)
            except LeaseLost as exc:  # no longer this holder's: nothing more goes through this lease
                self._broken = str(exc)
                raise
            return
        await self._run("appending to", OneAppend(self._session_id, self._epoch, entries, None))

    async def discard_before(self, seq: int) -> None:
        self.found = None
        await self._run(
            "compacting",
            lambda connection: connection.execute(
                "DELETE FROM trioloop_journal WHERE session_id = %s AND seq < %s AND seq < "
                "(SELECT max(seq) FROM trioloop_journal WHERE session_id = %s)",
                (self._session_id, seq, self._session_id),
            ),
        )

    async def erase(self) -> None:
        """Delete every entry of the session (`Session.retire`, once its head is witnessed as retired)."""
        self.found = None
        sql = "DELETE FROM trioloop_journal WHERE session_id = %s"
        await self._run("erasing", lambda connection: connection.execute(sql, (self._session_id,)))

    async def release(self) -> None:
        self.found = None
        if not self._released:
            self._released = True
            self._forget(self)
            with trio.CancelScope(shield=True):
                async with self._lock:  # closing the connection ends the advisory lock with the session
                    await trio.to_thread.run_sync(self._close, limiter=self._limiter)
        await trio.lowlevel.checkpoint()

    def _close(self) -> None:
        try:
            if not self._connection.closed:  # the row's time would run out by itself; ending it frees it now
                _LEASES.end(self._connection, self._session_id, self._epoch)
            if self._give_back is not None and self._broken is None:  # its locks given back, kept for another lease
                return self._give_back(self._connection)
        except Exception:
            pass
        with contextlib.suppress(Exception):
            self._connection.close()

    async def __aenter__(self) -> _PostgresLease:
        await trio.lowlevel.checkpoint()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        with trio.CancelScope(shield=True):
            await self.release()


def _last_seq(connection: psycopg.Connection[tuple[Any, ...]], session_id: str) -> int:
    row = connection.execute("SELECT max(seq) FROM trioloop_journal WHERE session_id = %s", (session_id,)).fetchone()
    return int(row[0]) if row is not None and row[0] is not None else 0


def _claim(connection: Any, session_id: str, ttl_s: float) -> tuple[int, Any] | None:
    """`claim`, and the journal's outline as the new holder finds it (what an open reads next: the same hand-over;
    None if that read failed, read again when asked), or None while a live holder has the session."""
    epoch = claim(connection, session_id, ttl_s)
    if epoch is None:
        return None
    import psycopg

    try:
        return epoch, read_outline(connection, "%s", session_id)
    except psycopg.Error:
        return epoch, None
