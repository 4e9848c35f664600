"""The floor under a durable journal: the same signatures and synced transactions of the same bytes, bare.

**Recording** (`RecordingStore`). For the benchmark only, a trioloop store is wrapped so that one journaled session
says what its journal did: every append (one store transaction) with its phase (``open``, ``send``, ``close``: the
benchmark sets `Workload.phase`), the exact ``(seq, bytes)`` of each entry, how many of them are seals (one Ed25519
signature each), and the store's other round trips, counted as they are looked up (the lease's claim, reads,
renewals, its release). The wrapper forwards everything; a lease that takes its witness write with the append
(``AppendsThen``, SQLite's) stays one, so the session hands both over in one go as it does unwrapped.

**The floor** (`replay`). What the cheapest program could do for the same durability: no trioloop, in the calling
thread, per recorded append one hash of the entry a seal signs and one ``Ed25519PrivateKey.sign`` (``cryptography``)
per seal, then one transaction that inserts the batch's rows: bare ``sqlite3`` (`SqliteFloor`: WAL,
``synchronous=FULL``, ``BEGIN IMMEDIATE``, ``executemany``, ``COMMIT``) or bare ``psycopg`` (`PostgresFloor`: one
connection, ``synchronous_commit=on``, the same inserts in one transaction). The rows go into a table of the
journal's shape (session id, number, bytes; its primary key), under a new session id per replay. Nothing else: no
lease, no number check, no witness, no hand-over to another thread. Those are what the benchmark's ``--parts``
measures apart.
"""

from __future__ import annotations

import collections
import hashlib
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import attrs

from trioloop.durable._store_thread import AppendsThen
from trioloop.durable.store import StoredEntry

__all__ = [
    "PHASES",
    "Batch",
    "PostgresFloor",
    "RecordingStore",
    "SqliteFloor",
    "Workload",
    "is_seal",
    "replay",
]

PHASES: Final = ("open", "send", "close")
#: The store calls other than appends that a session makes, counted (each one a round trip, most a transaction).
_COUNTED: Final = frozenset({"entries", "outline", "last_seq", "renew", "release", "discard_before", "erase"})
_TABLE: Final = "floor_journal"
_SCHEMA: Final = (
    f"CREATE TABLE IF NOT EXISTS {_TABLE} (session_id TEXT NOT NULL, seq INTEGER NOT NULL, data BYTEA NOT NULL, "
    "PRIMARY KEY (session_id, seq))"
)


def is_seal(entry: StoredEntry) -> bool:
    """Whether ``entry`` is a seal (its bytes start with its number and kind: ``{"seq":N,"kind":"seal"``)."""
    return entry.data.startswith(b'{"seq":%d,"kind":"seal"' % entry.seq)


@attrs.frozen
class Batch:
    """One recorded append: its phase, its rows, and for each seal in it its number and the bytes of the entry it
    seals (the one before it)."""

    phase: str
    rows: tuple[tuple[int, bytes], ...]
    seals: tuple[tuple[int, bytes], ...]


@attrs.define
class Workload:
    """What the last recorded session's journal did (see the module docstring)."""

    phase: str = "open"
    batches: list[Batch] = attrs.field(factory=list)
    calls: collections.Counter[str] = attrs.field(factory=collections.Counter)
    sessions: int = 0

    def new_session(self) -> None:
        self.phase, self.batches, self.calls = "open", [], collections.Counter()
        self.sessions += 1

    def record(self, entries: Sequence[StoredEntry]) -> None:
        rows = tuple((entry.seq, entry.data) for entry in entries)
        seals = tuple((e.seq, rows[i - 1][1] if i else e.data) for i, e in enumerate(entries) if is_seal(e))
        self.batches.append(Batch(self.phase, rows, seals))

    def summary(self) -> dict[str, Any]:
        """Appends, entries, bytes and seals per phase of one session, and its other store calls."""
        phases = {}
        for phase in PHASES:
            batches = [batch for batch in self.batches if batch.phase == phase]
            phases[phase] = {
                "appends": len(batches),
                "entries": sum(len(batch.rows) for batch in batches),
                "bytes": sum(len(data) for batch in batches for _, data in batch.rows),
                "seals": sum(len(batch.seals) for batch in batches),
            }
        total = {key: sum(phase[key] for phase in phases.values()) for key in ("appends", "entries", "bytes", "seals")}
        return {"per_session": total, "per_phase": phases, "other_store_calls": dict(sorted(self.calls.items()))}


class _RecordingLease:
    """A lease that records each append in a `Workload` and forwards everything to the real one."""

    def __init__(self, inner: Any, workload: Workload) -> None:
        self._inner = inner
        self._workload = workload

    def __getattr__(self, name: str) -> Any:
        if name in _COUNTED:
            self._workload.calls[name] += 1
        return getattr(self._inner, name)

    async def append(self, entries: Sequence[StoredEntry]) -> None:
        self._workload.record(entries)
        await self._inner.append(entries)

    async def __aenter__(self) -> _RecordingLease:
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self._inner.__aexit__(*exc)


class _RecordingLeaseThen(_RecordingLease, AppendsThen):
    """The same for a lease that takes an ``after`` (the witness write) with its append: it stays one."""

    async def append_then(self, entries: Any, after: Any) -> None:
        self._workload.record(entries)
        await self._inner.append_then(entries, after)


class RecordingStore:
    """``store`` with each lease it grants recording into ``workload`` (the benchmark's only: see the docstring)."""

    def __init__(self, store: Any, workload: Workload) -> None:
        self._store = store
        self._workload = workload

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def acquire(self, session_id: str, *, wait_s: float = 0.0) -> Any:
        self._workload.calls["acquire"] += 1
        lease = await self._store.acquire(session_id, wait_s=wait_s)
        kind = _RecordingLeaseThen if isinstance(lease, AppendsThen) else _RecordingLease
        return kind(lease, self._workload)


# -- the floor ---------------------------------------------------------------------------------------


class SqliteFloor:
    """A bare ``sqlite3`` connection in this thread: WAL, ``synchronous=FULL`` (or NORMAL), a journal-shaped table."""

    label = "bare sqlite3 (WAL, synchronous=FULL, BEGIN IMMEDIATE, in the calling thread)"

    def __init__(self, path: Path, *, durable: bool = True) -> None:
        self._connection = sqlite3.connect(path, isolation_level=None)
        self._connection.execute("PRAGMA journal_mode=WAL")
        self._connection.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
        self._connection.execute(_SCHEMA.replace("BYTEA", "BLOB"))

    def append(self, session_id: str, rows: Sequence[tuple[int, bytes]]) -> None:
        connection = self._connection
        connection.execute("BEGIN IMMEDIATE")
        connection.executemany(
            f"INSERT INTO {_TABLE} (session_id, seq, data) VALUES (?, ?, ?)",
            [(session_id, seq, data) for seq, data in rows],
        )
        connection.execute("COMMIT")

    def close(self) -> None:
        self._connection.close()


class PostgresFloor:
    """A bare ``psycopg`` connection in this thread, ``synchronous_commit=on``, a journal-shaped table."""

    label = "bare psycopg (one connection, synchronous_commit=on, one transaction per append)"

    def __init__(self, url: str) -> None:
        import psycopg

        self._connection = psycopg.connect(url, autocommit=True)
        self._connection.execute("SET synchronous_commit = on")
        self._connection.execute(_SCHEMA)

    def append(self, session_id: str, rows: Sequence[tuple[int, bytes]]) -> None:
        with self._connection.transaction(), self._connection.cursor() as cursor:
            cursor.executemany(
                f"INSERT INTO {_TABLE} (session_id, seq, data) VALUES (%s, %s, %s)",
                [(session_id, seq, data) for seq, data in rows],
            )

    def close(self) -> None:
        self._connection.close()


def signing_key() -> Any:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    return Ed25519PrivateKey.generate()


def replay(workload: Workload, writer: SqliteFloor | PostgresFloor, key: Any, session_id: str) -> list[float]:
    """One session's recorded appends through ``writer`` and ``key``: wall and CPU seconds of each phase in
    `PHASES` order (six figures), then the CPU of the signing and of the transactions alone (two more)."""
    clock, cpu_clock = time.perf_counter, time.process_time
    figures: list[float] = []
    signing = writing = 0.0
    batches = workload.batches
    for phase in PHASES:
        wall, cpu = clock(), cpu_clock()
        for batch in batches:
            if batch.phase != phase:
                continue
            started = cpu_clock()
            for seq, sealed in batch.seals:
                head = hashlib.sha256(sealed).hexdigest().encode()
                key.sign(b"%s\n%d\n%s" % (session_id.encode(), seq, head))
            between = cpu_clock()
            writer.append(session_id, batch.rows)
            ended = cpu_clock()
            signing += between - started
            writing += ended - between
        figures += [clock() - wall, cpu_clock() - cpu]
    return [*figures, signing, writing]
