"""The decision box: where a reviewer's signed decisions wait, per session, for the process that holds the session.

A store that has one (`DecisionBox`: the memory, SQLite and PostgreSQL stores) keeps each posted record with its
session id, its *slot* (the card: `decision_slot`), a status and a note. The rules:

- **One decision per card.** `post_decision` adds a record only while its slot holds no record that is waiting or
  applied (checked and written in one transaction); otherwise it adds nothing and returns the record that holds the
  slot, so of two reviewers deciding one card exactly one wins, and both learn which.
- **The holder judges.** The store proves nothing: the process that holds the session reads the waiting records
  (`decisions`), proves each (`trioloop.durable.decisions.open_decision`) and checks it against its card, then
  marks it ``applied`` or ``refused`` with the reason (`answer_decision`, only from ``waiting``). A refused record
  frees its slot. A record nobody could sign (written by anyone with access to the database) is refused there.
- **Changes are numbered.** Every post and answer takes the next ``change`` number of the store, so a page that
  shows decisions asks for what changed since the number it saw (`decision_changes`), in one indexed query.

Sizes are judged before bytes are read: a record over `MAX_DECISION_BYTES` stays in the database and is
reported as refused, never read.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar, Literal, Protocol, TypeVar, runtime_checkable

import trio

from trioloop.durable.decisions import MAX_DECISION_BYTES, DecisionError, PostedDecision

__all__ = ["DecisionBox", "MemoryDecisions", "PostgresDecisions", "SqlDecisions", "SqliteDecisions", "has_decision_box"]

_T = TypeVar("_T")
Status = Literal["waiting", "applied", "refused"]


@runtime_checkable
class DecisionBox(Protocol):
    """A store's decision box (see the module docstring)."""

    async def post_decision(self, session_id: str, slot: str, data: bytes) -> tuple[bool, PostedDecision]:
        """Add ``data`` for the card ``slot`` of ``session_id`` unless a waiting or applied record holds the slot:
        (True, the new record), or (False, the record that holds it)."""
        ...

    async def decisions(self, session_id: str, *, waiting_only: bool = False) -> Sequence[PostedDecision]:
        """The records of ``session_id`` in the order they were posted (only the waiting ones, if asked)."""
        ...

    async def answer_decision(self, decision_id: int, status: Literal["applied", "refused"], note: str = "") -> bool:
        """Mark a waiting record applied or refused (``note``: why); False if it was not waiting."""
        ...

    async def sessions_with_waiting_decisions(self) -> Sequence[str]:
        """The ids of the sessions with at least one waiting record, sorted: what a worker takes up."""
        ...

    async def decision_changes(self, after: int = 0) -> tuple[int, Sequence[PostedDecision]]:
        """The store's latest change number and the records posted or answered after change ``after``."""
        ...


def has_decision_box(store: object) -> bool:
    """Whether ``store`` keeps a decision box (a store of an earlier version, or a test's own, may not)."""
    return isinstance(store, DecisionBox)


def _note(text: str) -> str:
    return text[:2000]


class MemoryDecisions:
    """The decision box of a store in memory."""

    _decision_box: dict[int, tuple[PostedDecision, int]] | None = None
    _decision_change: int = 0

    def _box(self) -> dict[int, tuple[PostedDecision, int]]:
        if self._decision_box is None:
            self._decision_box = {}
        return self._decision_box

    def _changed(self) -> int:
        self._decision_change += 1
        return self._decision_change

    async def post_decision(self, session_id: str, slot: str, data: bytes) -> tuple[bool, PostedDecision]:
        await trio.lowlevel.checkpoint()
        if len(data) > MAX_DECISION_BYTES:
            raise DecisionError(f"a decision of {len(data)} bytes is over the {MAX_DECISION_BYTES}-byte cap")
        box = self._box()
        for record, _ in box.values():
            if record.session_id == session_id and record.slot == slot and record.status != "refused":
                return False, record
        record = PostedDecision(len(box) + 1, session_id, slot, bytes(data))
        box[record.id] = (record, self._changed())
        return True, record

    async def decisions(self, session_id: str, *, waiting_only: bool = False) -> Sequence[PostedDecision]:
        await trio.lowlevel.checkpoint()
        return [
            record
            for record, _ in self._box().values()
            if record.session_id == session_id and (record.status == "waiting" or not waiting_only)
        ]

    async def answer_decision(self, decision_id: int, status: Literal["applied", "refused"], note: str = "") -> bool:
        await trio.lowlevel.checkpoint()
        box = self._box()
        found = box.get(decision_id)
        if found is None or found[0].status != "waiting":
            return False
        record = found[0]
        answered = PostedDecision(record.id, record.session_id, record.slot, record.data, status, _note(note))
        box[decision_id] = (answered, self._changed())
        return True

    async def sessions_with_waiting_decisions(self) -> Sequence[str]:
        await trio.lowlevel.checkpoint()
        return sorted({r.session_id for r, _ in self._box().values() if r.status == "waiting"})

    async def decision_changes(self, after: int = 0) -> tuple[int, Sequence[PostedDecision]]:
        await trio.lowlevel.checkpoint()
        box = self._box()
        return self._decision_change, [record for record, change in box.values() if change > after]


_COLUMNS = f"id, session_id, slot, CASE WHEN length(data) > {MAX_DECISION_BYTES} THEN NULL ELSE data END, status, note"


def _records(rows: Sequence[tuple[Any, ...]]) -> list[PostedDecision]:
    records = []
    for number, session_id, slot, data, status, note in rows:
        if data is None:  # over the cap: never read; shown as refused so nothing waits on it
            records.append(PostedDecision(number, session_id, slot, b"", "refused", "the record is over the size cap"))
        else:
            records.append(PostedDecision(number, session_id, slot, bytes(data), status, note))
    return records


class SqlDecisions:
    """The decision box of a SQL store, over its driver's ``_query`` (a worker thread, errors mapped); the dialect's
    parts (`_create_decisions`, `_decisions_transaction`) are the driver's."""

    _PLACEHOLDER: ClassVar[str]
    _decisions_ready: object = None

    async def _query(self, what: str, work: Callable[[Any], _T]) -> _T:
        raise NotImplementedError

    def _create_decisions(self, connection: Any) -> None:
        raise NotImplementedError

    def _decisions_transaction(self, connection: Any) -> contextlib.AbstractContextManager[None]:
        """One transaction that no other writer of the box interleaves with (so change numbers follow commits)."""
        raise NotImplementedError

    def _exists(self, connection: Any) -> bool:
        """Whether the box's table exists (a read of a store that never had a decision posted makes nothing: no
        write, no lock, for the many processes that only look)."""
        if self._decisions_ready is connection:
            return True
        if self._PLACEHOLDER == "?":
            sql = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'trioloop_decisions'"
        else:
            sql = "SELECT 1 WHERE to_regclass('trioloop_decisions') IS NOT NULL"
        if connection.execute(sql).fetchone() is None:
            return False
        self._decisions_ready = connection
        return True

    def _ready(self, connection: Any) -> None:
        if self._decisions_ready is not connection:  # once per connection (a new one after a break asks again)
            self._create_decisions(connection)
            self._decisions_ready = connection

    def _notify(self, connection: Any, session_id: str) -> None:
        """After a post (in its transaction): a store that can tell listeners does (PostgreSQL: ``NOTIFY``)."""

    async def post_decision(self, session_id: str, slot: str, data: bytes) -> tuple[bool, PostedDecision]:
        if len(data) > MAX_DECISION_BYTES:
            await trio.lowlevel.checkpoint()
            raise DecisionError(f"a decision of {len(data)} bytes is over the {MAX_DECISION_BYTES}-byte cap")
        p = self._PLACEHOLDER
        held = (
            f"SELECT {_COLUMNS} FROM trioloop_decisions WHERE session_id = {p} AND slot = {p} "
            "AND status <> 'refused' ORDER BY id LIMIT 1"
        )
        insert = (
            "INSERT INTO trioloop_decisions (session_id, slot, data, status, note, change) "
            f"VALUES ({p}, {p}, {p}, 'waiting', '', "
            "(SELECT coalesce(max(change), 0) + 1 FROM trioloop_decisions)) RETURNING id"
        )

        def post(connection: Any) -> tuple[bool, PostedDecision]:
            self._ready(connection)
            with self._decisions_transaction(connection):
                row = connection.execute(held, (session_id, slot)).fetchone()
                if row is not None:
                    return False, _records([row])[0]
                (number,) = connection.execute(insert, (session_id, slot, data)).fetchone()
                self._notify(connection, session_id)
            return True, PostedDecision(number, session_id, slot, bytes(data))

        return await self._query(f"posting a decision for session {session_id!r}", post)

    async def decisions(self, session_id: str, *, waiting_only: bool = False) -> Sequence[PostedDecision]:
        p = self._PLACEHOLDER
        where = " AND status = 'waiting'" if waiting_only else ""
        sql = f"SELECT {_COLUMNS} FROM trioloop_decisions WHERE session_id = {p}{where} ORDER BY id"

        def read(connection: Any) -> list[PostedDecision]:
            if not self._exists(connection):
                return []
            return _records(connection.execute(sql, (session_id,)).fetchall())

        return await self._query(f"reading the decisions of session {session_id!r}", read)

    async def answer_decision(self, decision_id: int, status: Literal["applied", "refused"], note: str = "") -> bool:
        if status not in ("applied", "refused"):
            raise ValueError(f"a decision is answered applied or refused, not {status!r}")
        p = self._PLACEHOLDER
        sql = (
            f"UPDATE trioloop_decisions SET status = {p}, note = {p}, "
            "change = (SELECT coalesce(max(change), 0) + 1 FROM trioloop_decisions) "
            f"WHERE id = {p} AND status = 'waiting'"
        )

        def answer(connection: Any) -> bool:
            self._ready(connection)
            with self._decisions_transaction(connection):
                return int(connection.execute(sql, (status, _note(note), decision_id)).rowcount) == 1

        return await self._query(f"answering decision {decision_id}", answer)

    async def sessions_with_waiting_decisions(self) -> Sequence[str]:
        sql = "SELECT DISTINCT session_id FROM trioloop_decisions WHERE status = 'waiting'"

        def read(connection: Any) -> list[str]:
            if not self._exists(connection):
                return []
            return sorted(row[0] for row in connection.execute(sql).fetchall())

        return await self._query("listing sessions with waiting decisions", read)

    async def decision_changes(self, after: int = 0) -> tuple[int, Sequence[PostedDecision]]:
        p = self._PLACEHOLDER
        sql = f"SELECT {_COLUMNS} FROM trioloop_decisions WHERE change > {p} ORDER BY change"

        def read(connection: Any) -> tuple[int, list[PostedDecision]]:
            if not self._exists(connection):
                return 0, []
            (latest,) = connection.execute("SELECT coalesce(max(change), 0) FROM trioloop_decisions").fetchone()
            return int(latest), _records(connection.execute(sql, (after,)).fetchall())

        return await self._query("reading changed decisions", read)


def _table(blob: str, serial: str) -> tuple[str, ...]:
    return (
        "CREATE TABLE IF NOT EXISTS trioloop_decisions (id "
        + serial
        + ", session_id TEXT NOT NULL, slot TEXT NOT NULL, data "
        + blob
        + " NOT NULL, status TEXT NOT NULL, note TEXT NOT NULL, change BIGINT NOT NULL)",
        "CREATE INDEX IF NOT EXISTS trioloop_decisions_slot ON trioloop_decisions (session_id, slot)",
        "CREATE INDEX IF NOT EXISTS trioloop_decisions_change ON trioloop_decisions (change)",
        "CREATE INDEX IF NOT EXISTS trioloop_decisions_waiting ON trioloop_decisions (session_id) "
        "WHERE status = 'waiting'",
    )


class SqliteDecisions(SqlDecisions):
    """The decision box in a SQLite file: a transaction begun ``IMMEDIATE`` holds the file's one write lock."""

    def _create_decisions(self, connection: Any) -> None:
        for statement in _table("BLOB", "INTEGER PRIMARY KEY AUTOINCREMENT"):
            connection.execute(statement)

    @contextlib.contextmanager
    def _decisions_transaction(self, connection: Any) -> Iterator[None]:
        connection.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            connection.execute("ROLLBACK")
            raise
        connection.execute("COMMIT")


#: The advisory lock that serializes the box's writers (and its creation) across a PostgreSQL fleet.
_PG_BOX_KEY = 0x74726C6F6F706463  # "trloopdc"


class PostgresDecisions(SqlDecisions):
    """The decision box in PostgreSQL: writers serialized by a transaction-scoped advisory lock, and every post
    announced with ``NOTIFY trioloop_decisions`` (payload: the session id), which `arm_decisions` hears of."""

    _decision_listener: _Listener | None = None

    def _connect(self) -> Any:
        raise NotImplementedError

    def _listening(self) -> _Listener:
        """The store's listener for notices, started on first use (and again after it stopped)."""
        listener = self._decision_listener
        if listener is None or listener.stopped:
            listener = self._decision_listener = _Listener(self._connect)
        return listener

    def arm_decisions(self, session_id: str) -> trio.Event | None:
        """An event set when the next decision for ``session_id`` is announced (take it before reading the box, so
        a notice that comes while reading is not missed); None when the listener cannot run."""
        return self._listening().arm(session_id)

    def arm_any_journal(self) -> trio.Event | None:
        """An event set when the next append to any journal of the store is announced (``NOTIFY trioloop_journal``,
        which PostgreSQL 14 and later send); None when the listener cannot run. `journals_announced` says which."""
        return self._listening().arm_any(journal=True)

    def journals_announced(self) -> set[str] | None:
        """The sessions whose journals were announced since the last call (None: not known, a notice may have been
        lost, ask every head)."""
        listener = self._decision_listener
        return None if listener is None or listener.stopped else listener.take_journals()

    def arm_any_decision(self) -> trio.Event | None:
        """An event set when the next decision for any session is announced (a worker's wake-up); None when the
        listener cannot run."""
        return self._listening().arm_any()

    async def _stop_listening(self) -> None:
        listener, self._decision_listener = self._decision_listener, None
        if listener is not None:
            await listener.stop()

    def _create_decisions(self, connection: Any) -> None:
        with connection.transaction():
            connection.execute("SELECT pg_advisory_xact_lock(%s)", (_PG_BOX_KEY,))
            for statement in _table("BYTEA", "BIGSERIAL PRIMARY KEY"):
                connection.execute(statement)

    @contextlib.contextmanager
    def _decisions_transaction(self, connection: Any) -> Iterator[None]:
        with connection.transaction():
            connection.execute("SELECT pg_advisory_xact_lock(%s)", (_PG_BOX_KEY,))
            yield

    def _notify(self, connection: Any, session_id: str) -> None:
        connection.execute("SELECT pg_notify('trioloop_decisions', %s)", (session_id[:7000],))


class _Listener:
    """One connection that ``LISTEN``s for the box's notices, in a thread of its own; it sets the armed events of the
    sessions named (from the Trio run that armed them). Started on first use; a lost connection is made again."""

    def __init__(self, connect: Callable[[], Any]) -> None:
        self._connect = connect
        self._token = trio.lowlevel.current_trio_token()
        self._armed: dict[str, trio.Event] = {}
        self._any: trio.Event | None = None
        self._journal: trio.Event | None = None
        self._journals: set[str] = set()  # announced since last taken
        self._complete = False  # whether that set is all that changed (LISTEN was on since the last take)
        self._listening = False
        self._lock = threading.Lock()
        self.stopped = False
        self._thread = threading.Thread(target=self._run, name="trioloop decision notices", daemon=True)
        self._thread.start()

    def arm(self, session_id: str) -> trio.Event:
        with self._lock:
            event = self._armed.get(session_id)
            if event is None:
                event = self._armed[session_id] = trio.Event()
            return event

    def arm_any(self, *, journal: bool = False) -> trio.Event:
        with self._lock:
            if journal:
                if self._journal is None:
                    self._journal = trio.Event()
                return self._journal
            if self._any is None:
                self._any = trio.Event()
            return self._any

    def _announce(self, channel: str, session_id: str) -> None:
        with self._lock:
            if channel == "trioloop_journal":
                events = [self._journal]
                self._journal = None
                self._journals.add(session_id)
            else:
                events = [self._armed.pop(session_id, None), self._any]
                self._any = None
        for armed in events:
            if armed is not None:
                armed.set()

    def take_journals(self) -> set[str] | None:
        """The sessions announced since the last call; None (not known) until the listener listens, for the first call
        after that, and after its connection was lost (notices may have been missed meanwhile)."""
        with self._lock:
            taken = self._journals if self._complete else None
            self._journals = set()
            self._complete = self._listening
            return taken

    def _lost(self) -> None:
        with self._lock:
            self._listening = self._complete = False

    def _run(self) -> None:
        while not self.stopped:
            try:
                connection = self._connect()
            except Exception:
                time.sleep(1.0)
                continue
            try:
                connection.execute("LISTEN trioloop_decisions")
                connection.execute("LISTEN trioloop_journal")
                with self._lock:  # from now on every append is heard; the next take is still a whole one
                    self._listening, self._complete = True, False
                while not self.stopped:
                    for notice in connection.notifies(timeout=0.5):
                        with contextlib.suppress(trio.RunFinishedError):
                            self._token.run_sync_soon(self._announce, notice.channel, notice.payload)
            except Exception:
                self._lost()
                time.sleep(0.2)  # the connection broke: make it again (the box is polled meanwhile)
            finally:
                with contextlib.suppress(Exception):
                    connection.close()

    async def stop(self) -> None:
        self.stopped = True
        await trio.to_thread.run_sync(self._thread.join, 2.0)
