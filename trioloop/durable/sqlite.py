"""Journals in one SQLite file (stdlib ``sqlite3``): the embedded default store.

Theory of operation: the store owns one connection and one thread that lives as long as the store
(`trioloop.durable._store_thread`): the connection is opened on first use in that thread and used nowhere else, so
no SQLite call runs on the event loop and they run one at a time, in order. Appends queued together (several
sessions of one store) commit in one transaction, each in a savepoint of its own. The file is in WAL mode; with
``durable=True`` also ``synchronous=FULL``, so a commit is on disk when `append` returns (``durable=False`` keeps
``NORMAL``: a commit survives the process dying, not the machine losing power). An append reads the last number,
applies `check_batch` and inserts the batch inside a ``BEGIN IMMEDIATE`` transaction, so it is all or nothing even
against another process.

A lease is a row of ``trioloop_lease`` with a time to live and a fencing epoch (`trioloop.durable.leases`), checked
in the transaction of every append. Its holder also holds a one-byte POSIX lock on the sidecar file
``<database>.lock`` (`trioloop.durable._sqlite_locks`): the kernel drops it when its process dies, so a killed driver
leaves its session free at once; a frozen one (SIGSTOP) keeps its lock, and loses its lease when the time to live runs
out. Do not delete the ``.lock`` file while a store uses the database. POSIX systems only.

Entries live in a table with rowids, found through the index of its primary key (session id, number), so a
session's entries are found, measured and judged without reading one (`outline`); an earlier version's table,
WITHOUT ROWID, is moved to it when the file is opened to be written.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import urllib.parse
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import Any, Final, Protocol, TypeVar, final

import trio

from trioloop.durable._sql import SqlJournals, entries_query, outline_rows, read_outline, stored_entries
from trioloop.durable._sqlite_locks import lease_row, lock_offset, try_lock, unlock
from trioloop.durable._store_thread import AppendsThen, StoreThread
from trioloop.durable._waiting import check_session_id, wait_for_lease
from trioloop.durable.decision_box import SqliteDecisions
from trioloop.durable.leases import (
    DEFAULT_LEASE_TTL_S,
    LEASE_SCHEMA,
    ExpiringLease,
    LeaseClock,
    LeaseSql,
    check_ttl,
)
from trioloop.durable.store import (
    JournalConflict,
    JournalLease,
    JournalStoreError,
    StoredEntry,
    check_batch,
)

__all__ = ["SQLiteJournalStore"]

#: How long a write waits for another process's write transaction on the same file before it fails.
BUSY_TIMEOUT_S = 5.0

#: Entries in a table with rowids, found through its primary key's index: the index holds (session id, number,
#: rowid) alone, so finding a session's entries never reads one (a table WITHOUT ROWID keeps whole entries in its
#: index, and SQLite reads an entry whole to compare it while it searches: a 300 MB entry was read to be refused).
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS trioloop_journal "
    "(session_id TEXT NOT NULL, seq INTEGER NOT NULL, data BLOB NOT NULL, PRIMARY KEY (session_id, seq))"
)
#: A file an earlier version made (its journal WITHOUT ROWID) is moved to the table above when it is opened to be
#: written, in one transaction (its entries copied once; the file's readers see the old table or the new).
_MIGRATION = (
    "CREATE TABLE trioloop_journal_rowid (session_id TEXT NOT NULL, seq INTEGER NOT NULL, data BLOB NOT NULL, "
    "PRIMARY KEY (session_id, seq))",
    "INSERT INTO trioloop_journal_rowid (session_id, seq, data) SELECT session_id, seq, data FROM trioloop_journal",
    "DROP TABLE trioloop_journal",
    "ALTER TABLE trioloop_journal_rowid RENAME TO trioloop_journal",
)

_T = TypeVar("_T")
#: The lease statements in SQLite's spelling; its clock is the machine's (every process on it agrees).
_LEASES: Final = LeaseSql(p="?", now="((julianday('now') - 2440587.5) * 86400.0)")


@final
class SQLiteJournalStore(SqliteDecisions, SqlJournals):
    """Journals of any number of sessions in one SQLite file at ``path`` (created if missing).

    Leases exclude each other across processes through ``<path>.lock``; a killed process's leases end with it.
    ``close()`` (or the end of ``async with``) releases the leases this store granted and closes the file.
    ``read_only=True`` (an auditor) opens an existing file and never writes: no table is made, no lease taken,
    and a file that is not a trioloop journal raises `JournalStoreError` and is left byte for byte as it was.
    """

    _PLACEHOLDER = "?"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durable: bool = True,
        read_only: bool = False,
        lease_ttl_s: float = DEFAULT_LEASE_TTL_S,
    ) -> None:
        self._path = os.fspath(path)
        self.lease_ttl_s = check_ttl(lease_ttl_s)
        self._read_only = read_only
        if not self._path or self._path == ":memory:" or self._path.startswith("file:"):
            raise ValueError(f"SQLiteJournalStore needs a file path, not {self._path!r} (MemoryJournalStore?)")
        self._file = os.path.abspath(self._path)  # a later chdir must not move the journal or its lock
        self._lock_path = self._file + ".lock"
        self._durable = durable
        self._thread = StoreThread(
            f"trioloop SQLite {os.path.basename(self._file)}", self._connect, _begin, _commit, self._translate
        )
        self._connection: sqlite3.Connection | None = None
        self._closed = False
        self._leases: dict[int, _SQLiteLease] = {}

    @property
    def path(self) -> str:
        """The database file this store uses."""
        return self._path

    @property
    def identity(self) -> str:
        """Which store this is, for a witness (`witness_name`): the database file's real path."""
        return "sqlite:" + os.path.realpath(self._file)

    async def acquire(self, session_id: str, *, wait_s: float = 0.0) -> JournalLease:
        """A lease on ``session_id``; `SessionLocked` if another lease holds it past ``wait_s`` seconds."""
        check_session_id(session_id)
        if self._read_only:
            await trio.lowlevel.checkpoint()
            raise JournalStoreError(f"the SQLite journal store {self._path} is open read-only: it grants no lease")
        if self._connection is None:  # opened apart, so the first lease's wait does not count the opening
            await self._run("opening the database", lambda connection: None)

        async def try_once() -> _SQLiteLease | None:
            asked_at = trio.current_time()
            taken = await self._run(f"leasing session {session_id!r}", lambda c: self._claim(c, session_id))
            if taken is None:
                return None
            key, epoch, outline = taken
            lease = _SQLiteLease(
                session_id,
                key,
                epoch,
                self.lease_ttl_s,
                run=self._run,
                append=self._append,
                forget=self._forget,
                durable=self._durable,
            )
            lease.found = outline
            lease.clock.granted(asked_at)
            self._leases[id(lease)] = lease
            return lease

        return await wait_for_lease(session_id, wait_s, try_once)

    async def close(self) -> None:
        """Release every lease this store granted and close the database; later calls raise `JournalStoreError`."""
        with trio.CancelScope(shield=True):
            for lease in list(self._leases.values()):
                await lease.release()
            if not self._closed:
                self._closed = True
                await self._thread.call("closing", lambda _: self._close_connection(), connected=False)
                await self._thread.stop()
        await trio.lowlevel.checkpoint()

    async def _query(self, what: str, work: Callable[[Any], _T]) -> _T:
        return await self._run(what, work)

    async def _run(self, what: str, work: Callable[[sqlite3.Connection], _T], *, abandon: bool = False) -> _T:
        """``work`` on the store's thread. ``abandon``: a cancelled caller goes on at once and the work finishes on
        its own; only for work whose outcome the caller may lose (a read, a renewal), never for a claim or a
        release, whose locks must be known."""
        if self._closed:
            await trio.lowlevel.checkpoint()
            raise JournalStoreError(f"the SQLite journal store {self._path} is closed")
        return await self._thread.call(what, work, abandon=abandon)

    async def _append(
        self, what: str, write: Callable[[sqlite3.Connection], None], after: Callable[[], None] | None
    ) -> None:
        """``write`` in a transaction of appends on the store's thread, then ``after()`` once it committed."""
        if self._closed:
            await trio.lowlevel.checkpoint()
            raise JournalStoreError(f"the SQLite journal store {self._path} is closed")
        await self._thread.append(what, write, after=after)

    def _forget(self, lease: _SQLiteLease) -> None:
        """A lease this store granted was released: ``close`` has no more to release for it."""
        self._leases.pop(id(lease), None)

    def _connect(self) -> sqlite3.Connection:
        """The connection (the store's thread), opened on first use."""
        if self._connection is not None:
            return self._connection
        if self._closed:
            raise JournalStoreError(f"the SQLite journal store {self._path} is closed")
        return self._open()

    def _translate(self, error: BaseException, what: str) -> BaseException:
        """A database error as the store's own (naming what failed); any other error as it is."""
        if isinstance(error, sqlite3.IntegrityError):
            translated: BaseException = JournalConflict(
                f"SQLite journal {self._path}: {what}: another writer appended first"
            )
        elif isinstance(error, sqlite3.Error | OSError):
            translated = JournalStoreError(f"SQLite journal {self._path}: {what} failed: {error}")
        else:
            return error
        translated.__cause__ = error
        return translated

    def _open(self) -> sqlite3.Connection:
        if self._read_only:
            return self._open_read_only()
        connection = sqlite3.connect(self._file, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
        try:
            (mode,) = connection.execute("PRAGMA journal_mode=WAL").fetchone()
            if str(mode).lower() != "wal":
                raise JournalStoreError(f"SQLite journal {self._path}: WAL mode refused (journal mode {mode!r})")
            connection.execute(f"PRAGMA synchronous={'FULL' if self._durable else 'NORMAL'}")
            connection.execute(_SCHEMA)
            connection.execute(LEASE_SCHEMA)
            _migrate(connection)
            if self._durable:
                _sync_directory(os.path.dirname(self._file))
        except BaseException:
            connection.close()
            raise
        self._connection = connection
        return connection

    def _open_read_only(self) -> sqlite3.Connection:
        if not os.path.isfile(self._file):
            raise JournalStoreError(f"no journal at {self._path}")
        uri = "file:" + urllib.parse.quote(self._file) + "?mode=ro"
        connection = sqlite3.connect(
            uri, uri=True, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
        )
        try:
            query = "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'trioloop_journal'"
            (tables,) = connection.execute(query).fetchone()
            if not tables:
                raise JournalStoreError(f"{self._path} is not a trioloop journal (it has no trioloop_journal table)")
        except BaseException:
            connection.close()
            raise
        self._connection = connection
        return connection

    def _claim(self, connection: sqlite3.Connection, session_id: str) -> tuple[tuple[int, int], int, Any] | None:
        """The lease's lock-file key and epoch and the outline its holder finds (what an open reads next, in the same
        hand-over; None if that read failed), or None while a live holder has it (a worker thread)."""
        keys: dict[int, tuple[int, int]] = {}

        def hold(epoch: int) -> bool:
            key = try_lock(self._lock_path, session_id, lock_offset(session_id, epoch))
            if key is not None:
                keys[epoch] = key
            return key is not None

        def unhold(epoch: int) -> None:
            unlock(keys.pop(epoch), lock_offset(session_id, epoch))

        try:
            with lease_row(connection, self._durable):
                epoch = _LEASES.claim(connection, session_id, self.lease_ttl_s, hold, unhold)
        except BaseException as exc:
            for held in list(keys):
                unhold(held)
            if isinstance(exc, sqlite3.OperationalError) and ("locked" in str(exc) or "busy" in str(exc)):
                return None  # another process's write holds the file (past the busy timeout): held, for now
            if isinstance(exc, OSError):
                detail = f"SQLite journal {self._path}: locking {self._lock_path} failed: {exc}"
                raise JournalStoreError(detail) from exc
            raise
        if epoch is None:
            return None
        with contextlib.suppress(sqlite3.Error):
            return keys[epoch], epoch, read_outline(connection, "?", session_id)
        return keys[epoch], epoch, None

    def _close_connection(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            with contextlib.suppress(sqlite3.Error):
                connection.close()


def _migrate(connection: sqlite3.Connection) -> None:
    """Move an earlier version's journal table (WITHOUT ROWID) to one with rowids, once, in one transaction."""
    query = "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'trioloop_journal'"
    (sql,) = connection.execute(query).fetchone()
    if "WITHOUT ROWID" not in str(sql).upper():
        return
    connection.execute("BEGIN IMMEDIATE")
    try:
        (sql,) = connection.execute(query).fetchone()  # another process may have moved it meanwhile
        if "WITHOUT ROWID" in str(sql).upper():
            for statement in _MIGRATION:
                connection.execute(statement)
    except BaseException:
        connection.rollback()
        raise
    connection.commit()


def _sync_directory(directory: str) -> None:
    """Make the database file's name itself durable (SQLite syncs the directory only for its WAL)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _Run(Protocol):
    """`SQLiteJournalStore._run`: ``work(connection)`` on the store's thread (refused once the store is closed)."""

    def __call__(
        self, what: str, work: Callable[[sqlite3.Connection], _T], *, abandon: bool = False
    ) -> Awaitable[_T]: ...


@final
class _SQLiteLease(ExpiringLease, AppendsThen):
    """A lease on one session of a `SQLiteJournalStore`: given the store's calls on its thread (``run``; ``append``,
    which may share a transaction with other appends), and ``forget``, which tells the store it was released."""

    def __init__(
        self,
        session_id: str,
        key: tuple[int, int],
        epoch: int,
        ttl_s: float,
        *,
        run: _Run,
        append: Callable[[str, Callable[[sqlite3.Connection], None], Callable[[], None] | None], Awaitable[None]],
        forget: Callable[[_SQLiteLease], None],
        durable: bool = True,
    ) -> None:
        self._durable = durable
        self._session_id = session_id
        self._key = key
        self._epoch = epoch
        self._offset = lock_offset(session_id, epoch)
        self._run = run
        self._append = append
        self._forget = forget
        self._released = False
        self.clock = LeaseClock(ttl_s)

    @property
    def session_id(self) -> str:
        return self._session_id

    async def renew(self) -> None:
        """Push the lease's end on by its time to live; `LeaseLost` if it is no longer this holder's."""
        self._held()
        self.check_held()  # lost by the holder's own clock (woken from a freeze, say): at once, no I/O
        asked_at = trio.current_time()
        renewed = await self._run(
            f"renewing the lease on session {self._session_id!r}",
            lambda c: _LEASES.renew(c, self._session_id, self._epoch, self.clock.ttl_s),
            abandon=True,
        )
        self._renewed(asked_at, renewed)

    def _held(self) -> None:
        if self._released:
            raise JournalStoreError("this lease was released")

    async def entries(self, *, after: int = 0) -> Sequence[StoredEntry]:
        self._held()

        def read(connection: sqlite3.Connection) -> list[tuple[int, bytes, int]]:
            self._held()
            return connection.execute(entries_query("?"), (self._session_id, after)).fetchall()

        return stored_entries(await self._run(f"reading session {self._session_id!r}", read, abandon=True))

    async def outline(self, *, after: int = 0) -> Sequence[tuple[int, int, bytes | None]]:
        self._held()
        if (found := self.take_found(after)) is not None:
            await trio.lowlevel.checkpoint()
            return outline_rows(found)
        rows = await self._run(
            f"reading session {self._session_id!r}", lambda c: read_outline(c, "?", self._session_id, after)
        )
        return outline_rows(rows)

    async def last_seq(self) -> int:
        self._held()

        def read(connection: sqlite3.Connection) -> int:
            self._held()
            return _last_seq(connection, self._session_id)

        return await self._run(f"reading session {self._session_id!r}", read, abandon=True)

    async def append(self, entries: Sequence[StoredEntry]) -> None:
        await self.append_then(entries, None)

    async def append_then(self, entries: Sequence[StoredEntry], after: Callable[[], None] | None) -> None:
        """`append`, then ``after()`` in the store's thread once the append is durable (a session's witness write:
        one hand-over for both). Cut by a cancellation, the append goes on alone and its outcome is unknown."""
        self._held()
        self.check_held()
        batch = tuple(entries)
        self.found = None  # no longer the journal's outline

        def write(connection: sqlite3.Connection) -> None:
            self._held()
            _LEASES.check(connection, self._session_id, self._epoch)
            check_batch(_last_seq(connection, self._session_id), batch)
            connection.executemany(
                "INSERT INTO trioloop_journal (session_id, seq, data) VALUES (?, ?, ?)",
                [(self._session_id, entry.seq, entry.data) for entry in batch],
            )

        await self._append(f"appending to session {self._session_id!r}", write, after)

    async def discard_before(self, seq: int) -> None:
        self.found = None
        self._held()

        def delete(connection: sqlite3.Connection) -> None:
            self._held()
            connection.execute(
                "DELETE FROM trioloop_journal WHERE session_id = ? AND seq < ? AND seq < "
                "(SELECT max(seq) FROM trioloop_journal WHERE session_id = ?)",
                (self._session_id, seq, self._session_id),
            )

        await self._run(f"compacting session {self._session_id!r}", delete, abandon=True)

    async def erase(self) -> None:
        """Delete every entry of the session (`Session.retire`, once its head is witnessed as retired)."""
        self.found = None
        self._held()
        sql = "DELETE FROM trioloop_journal WHERE session_id = ?"
        await self._run(f"erasing session {self._session_id!r}", lambda c: c.execute(sql, (self._session_id,)))

    async def release(self) -> None:
        self.found = None
        if not self._released:
            self._released = True
            self._forget(self)
            unlocked = False

            def end(connection: sqlite3.Connection) -> None:
                nonlocal unlocked
                try:
                    with lease_row(connection, self._durable):
                        _LEASES.end(connection, self._session_id, self._epoch)
                finally:
                    unlock(self._key, self._offset)  # the registry has its own lock: any thread may
                    unlocked = True

            with trio.CancelScope(shield=True):
                with contextlib.suppress(JournalStoreError):  # the row's time runs out by itself anyway
                    await self._run("ending a lease", end)
                if not unlocked:  # the store was closed, or its thread could not run it
                    await trio.to_thread.run_sync(unlock, self._key, self._offset)
        await trio.lowlevel.checkpoint()

    async def __aenter__(self) -> _SQLiteLease:
        await trio.lowlevel.checkpoint()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        with trio.CancelScope(shield=True):
            await self.release()


def _begin(connection: sqlite3.Connection) -> None:
    connection.execute("BEGIN IMMEDIATE")


def _commit(connection: sqlite3.Connection, keep: bool) -> None:
    try:
        connection.execute("COMMIT" if keep else "ROLLBACK")
    except BaseException:
        if connection.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                connection.execute("ROLLBACK")
        raise


def _last_seq(connection: sqlite3.Connection, session_id: str) -> int:
    (last,) = connection.execute("SELECT MAX(seq) FROM trioloop_journal WHERE session_id = ?", (session_id,)).fetchone()
    return int(last) if last is not None else 0
