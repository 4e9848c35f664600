"""The journal stores: one conformance suite over the memory, SQLite and PostgreSQL stores, then what only a
real database shows (reopening, failures mapped to `JournalStoreError`, leases across processes and crashes)."""

from __future__ import annotations

import contextlib
import itertools
import json
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import closing
from functools import partial
from pathlib import Path

import attrs
import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pg_support import postgres_url  # noqa: F401 -- the session fixture, reached by name (getfixturevalue)

import trioloop.durable.sqlite
from trioloop.durable.store import (
    JournalConflict,
    JournalLease,
    JournalStore,
    JournalStoreError,
    MemoryJournalStore,
    SessionLocked,
    StoredEntry,
)
from trioloop.stores import PostgresJournalStore, SQLiteJournalStore, open_store

ROOT = Path(__file__).resolve().parent.parent
Store = MemoryJournalStore | SQLiteJournalStore | PostgresJournalStore


def batch(*seqs: int) -> tuple[StoredEntry, ...]:
    return tuple(StoredEntry(seq, f"entry {seq}".encode()) for seq in seqs)


async def close(store: Store) -> None:
    if isinstance(store, MemoryJournalStore):
        await trio.lowlevel.checkpoint()
    else:
        await store.close()


@attrs.frozen
class Backend:
    """A kind of store and a way to open it again on the same storage (memory: the same object)."""

    kind: str
    open: Callable[[], Store]
    target: str = ""  # what open_store takes to open it in another process


def _drop_table(url: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute("SET lock_timeout = '10s'")
        admin.execute("DROP TABLE IF EXISTS trioloop_journal")


def _backend(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if kind == "memory":
        shared = MemoryJournalStore()
        return Backend("memory", lambda: shared)
    if kind == "sqlite":
        path = tmp_path / "journal.db"
        return Backend("sqlite", lambda: SQLiteJournalStore(path), str(path))
    url: str = request.getfixturevalue("postgres_url")
    _drop_table(url)  # each test starts from no table at all, which also checks the store creates it
    if kind == "postgres_group":  # the same promises with the leases' appends committed together
        return Backend("postgres_group", lambda: PostgresJournalStore(url, group_commit=True), url)
    return Backend("postgres", lambda: PostgresJournalStore(url), url)


@pytest.fixture(params=["memory", "sqlite", "postgres", "postgres_group"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    return _backend(request.param, request, tmp_path)


@pytest.fixture(params=["sqlite", "postgres"])
def persistent_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    return _backend(request.param, request, tmp_path)


@pytest.fixture
async def store(backend: Backend) -> AsyncIterator[Store]:
    opened = backend.open()
    try:
        yield opened
    finally:
        await close(opened)


@pytest.fixture
def pg_url(request: pytest.FixtureRequest) -> Iterator[str]:
    url: str = request.getfixturevalue("postgres_url")
    _drop_table(url)
    yield url


# --- conformance: every store refuses and keeps exactly what the memory store does ---


async def test_stores_and_leases_meet_the_protocols(store: Store) -> None:
    assert isinstance(store, JournalStore)
    async with await store.acquire("s") as lease:
        assert isinstance(lease, JournalLease)
        assert lease.session_id == "s"
        with trio.testing.assert_checkpoints():
            await lease.last_seq()
        with trio.testing.assert_checkpoints():
            await store.session_ids()


async def test_the_first_append_is_numbered_one(store: Store) -> None:
    async with await store.acquire("s") as lease:
        for wrong in (0, 2, -1):
            with pytest.raises(JournalConflict):
                await lease.append(batch(wrong))
        assert tuple(await lease.entries()) == ()
        assert await lease.last_seq() == 0
        await lease.append(batch(1))
        assert tuple(await lease.entries()) == batch(1)
        assert await lease.last_seq() == 1


async def test_gaps_repeats_and_stale_numbers_are_refused_with_nothing_written(store: Store) -> None:
    async with await store.acquire("s") as lease:
        await lease.append(batch(1, 2, 3))
        for wrong in [(5,), (3,), (2,), (1,), (0,), (4, 6), (4, 4), (4, 5, 5), (4, 5, 7), (5, 6)]:
            with pytest.raises(JournalConflict):
                await lease.append(batch(*wrong))
        for odd in (4.0, "4", None):
            with pytest.raises(JournalConflict):
                await lease.append([StoredEntry(odd, b"x")])  # type: ignore[arg-type]
        assert issubclass(JournalConflict, JournalStoreError)
        assert tuple(await lease.entries()) == batch(1, 2, 3)
        assert await lease.last_seq() == 3


async def test_a_batch_is_all_or_nothing(store: Store) -> None:
    async with await store.acquire("s") as lease:
        await lease.append(batch(1))
        with pytest.raises(TypeError):
            await lease.append([StoredEntry(2, b"fine"), StoredEntry(3, "not bytes")])  # type: ignore[arg-type]
        with pytest.raises(JournalConflict):
            await lease.append(batch(2, 3, 5))
        assert tuple(await lease.entries()) == batch(1)
        await lease.append(())
        await lease.append(batch(2, 3, 4))
        assert tuple(await lease.entries()) == batch(1, 2, 3, 4)


async def test_entries_come_back_in_order_after_a_number(store: Store) -> None:
    payloads = [b"", b"\x00\xff binary \x00", "ünïcode".encode(), bytes(range(256)) * 40]
    async with await store.acquire("s") as lease:
        await lease.append([StoredEntry(1, payloads[0])])
        await lease.append([StoredEntry(2, payloads[1]), StoredEntry(3, payloads[2])])
        await lease.append([StoredEntry(4, payloads[3])])
        every = tuple(await lease.entries())
        assert every == tuple(StoredEntry(i + 1, p) for i, p in enumerate(payloads))
        assert all(type(e.data) is bytes and type(e.seq) is int for e in every)
        assert tuple(await lease.entries(after=2)) == every[2:]
        assert tuple(await lease.entries(after=-3)) == every
        assert tuple(await lease.entries(after=4)) == ()
        assert tuple(await lease.entries(after=99)) == ()
        assert await lease.last_seq() == 4


async def test_discard_before_drops_older_entries_and_keeps_the_numbering(store: Store) -> None:
    async with await store.acquire("s") as lease:
        await lease.append(batch(1, 2, 3, 4, 5))
        await lease.discard_before(1)
        assert tuple(await lease.entries()) == batch(1, 2, 3, 4, 5)
        await lease.discard_before(3)
        assert tuple(await lease.entries()) == batch(3, 4, 5)
        assert tuple(await lease.entries(after=3)) == batch(4, 5)
        assert await lease.last_seq() == 5
        with pytest.raises(JournalConflict):
            await lease.append(batch(3))
        await lease.append(batch(6))
        assert tuple(await lease.entries()) == batch(3, 4, 5, 6)
    async with await store.acquire("other") as other:
        await other.append(batch(1, 2))
        await other.discard_before(2)
        assert tuple(await other.entries()) == batch(2)
        # Past the end: the last entry stays, so the numbering cannot start over at 1.
        await other.discard_before(99)
        assert tuple(await other.entries()) == batch(2) and await other.last_seq() == 2
        with pytest.raises(JournalConflict):
            await other.append(batch(1))


async def test_session_ids_lists_sessions_with_entries_sorted(store: Store) -> None:
    assert list(await store.session_ids()) == []
    names = ["b", "a", "B", "é", "z z", "empty"]
    leases = [await store.acquire(name) for name in names]
    for lease in leases:
        if lease.session_id != "empty":
            await lease.append(batch(1))
    assert list(await store.session_ids()) == sorted(set(names) - {"empty"})
    for lease in leases:
        await lease.release()
    assert list(await store.session_ids()) == sorted(set(names) - {"empty"})


async def test_a_second_lease_on_a_session_is_refused(store: Store) -> None:
    first = await store.acquire("s")
    with pytest.raises(SessionLocked):
        await store.acquire("s")
    started = trio.current_time()
    with pytest.raises(SessionLocked):
        await store.acquire("s", wait_s=0.1)
    assert 0.1 <= trio.current_time() - started < 2
    other = await store.acquire("t")  # another session is free
    await other.release()
    with pytest.raises(ValueError):
        await store.acquire("s", wait_s=-1)
    await first.release()
    second = await store.acquire("s")
    await second.release()


async def test_a_waiting_acquire_gets_the_lease_once_it_is_released(store: Store) -> None:
    held = await store.acquire("s")
    await held.append(batch(1))

    async def release_later() -> None:
        await trio.sleep(0.15)
        await held.release()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(release_later)
        started = trio.current_time()
        async with await store.acquire("s", wait_s=5) as lease:
            waited = trio.current_time() - started
            assert tuple(await lease.entries()) == batch(1)
    assert 0.1 <= waited < 2


async def test_a_released_lease_refuses_to_be_used(store: Store) -> None:
    async with await store.acquire("s") as lease:
        await lease.append(batch(1))
    for use in (
        lambda: lease.entries(),
        lambda: lease.last_seq(),
        lambda: lease.append(batch(2)),
        lambda: lease.discard_before(1),
    ):
        with pytest.raises(JournalStoreError, match="released"):
            await use()
    await lease.release()  # twice is fine
    async with await store.acquire("s") as again:
        assert tuple(await again.entries()) == batch(1)


async def test_journals_survive_reopening_the_store(persistent_backend: Backend) -> None:
    backend = persistent_backend
    first = backend.open()
    async with await first.acquire("kept") as lease:
        await lease.append(batch(1, 2))
        await lease.append(batch(3))
    await close(first)
    second = backend.open()
    try:
        assert list(await second.session_ids()) == ["kept"]
        async with await second.acquire("kept") as lease:
            assert tuple(await lease.entries()) == batch(1, 2, 3)
            await lease.append(batch(4))
    finally:
        await close(second)


async def test_closing_a_store_ends_its_leases(persistent_backend: Backend) -> None:
    backend = persistent_backend
    first = backend.open()
    lease = await first.acquire("s")
    await close(first)
    with pytest.raises(JournalStoreError):
        await lease.last_seq()
    with pytest.raises(JournalStoreError, match="closed"):
        await first.session_ids()
    second = backend.open()
    try:
        again = await second.acquire("s")
        await again.release()
    finally:
        await close(second)


OPS = st.lists(
    st.tuples(st.sampled_from("AB"), st.sampled_from(["append", "append", "refresh"]), st.integers(1, 3)),
    max_size=14,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
def test_stale_writers_never_lose_or_duplicate_an_entry(backend: Backend, ops: list[tuple[str, str, int]]) -> None:
    # Two writers share one lease, each numbering from its own (possibly stale) view of the journal, in any
    # interleaving: the journal is exactly the appends that were accepted, in order, and an append is
    # accepted exactly when it continues the journal.
    trio.run(_interleave, backend, ops)


async def _interleave(backend: Backend, ops: list[tuple[str, str, int]]) -> None:
    store = backend.open()
    names = itertools.count()
    try:
        async with await store.acquire(f"prop-{uuid.uuid4().hex}") as lease:
            views = {"A": 0, "B": 0}
            accepted: list[StoredEntry] = []
            for writer, op, size in ops:
                if op == "refresh":
                    views[writer] = await lease.last_seq()
                    continue
                first = views[writer] + 1
                attempt = [StoredEntry(first + i, f"{writer}{next(names)}".encode()) for i in range(size)]
                continues = first == len(accepted) + 1
                try:
                    await lease.append(attempt)
                except JournalConflict:
                    assert not continues
                else:
                    assert continues
                    accepted += attempt
                    views[writer] = attempt[-1].seq
            assert tuple(await lease.entries()) == tuple(accepted)
            assert await lease.last_seq() == len(accepted)
    finally:
        await close(store)


async def test_concurrent_stale_writers_never_lose_or_duplicate_an_entry(store: Store) -> None:
    accepted: list[StoredEntry] = []
    async with await store.acquire("s") as lease:

        async def writer(name: str) -> None:
            view = 0
            for n in range(15):
                entry = StoredEntry(view + 1, f"{name}{n}".encode())
                try:
                    await lease.append([entry])
                except JournalConflict:
                    view = await lease.last_seq()
                else:
                    accepted.append(entry)
                    view = entry.seq

        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer, "A")
            nursery.start_soon(writer, "B")
        assert tuple(await lease.entries()) == tuple(sorted(accepted, key=lambda e: e.seq))
        assert [e.seq for e in await lease.entries()] == list(range(1, len(accepted) + 1))


# --- open_store and the optional extra ---


def test_open_store_picks_the_store_a_target_names() -> None:
    for target, path in [
        ("sqlite:///journal.db", "journal.db"),
        ("sqlite:///data/j.db", "data/j.db"),
        ("sqlite:////var/lib/app/j.db", "/var/lib/app/j.db"),
        ("journal.db", "journal.db"),
        ("/abs/journal.db", "/abs/journal.db"),
    ]:
        made = open_store(target)
        assert isinstance(made, SQLiteJournalStore) and made.path == path, target
    for url in ("postgresql://app@db.example/journal", "postgres://app@db.example/journal", "POSTGRESQL://h/d"):
        assert isinstance(open_store(url), PostgresJournalStore)  # nothing connects until first use
    for bad in ("mysql://h/d", "sqlite://", "sqlite:///", "sqlite://relative.db", ":memory:", ""):
        with pytest.raises(ValueError):
            open_store(bad)


def test_the_stores_public_surface() -> None:
    import trioloop.stores

    assert trioloop.stores.__all__ == ["PostgresJournalStore", "SQLiteJournalStore", "open_store"]
    for name in trioloop.stores.__all__:
        assert hasattr(trioloop.stores, name)
    for cls in (PostgresJournalStore, SQLiteJournalStore):
        assert getattr(cls, "__final__", False), cls


def test_a_missing_psycopg_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)
    with pytest.raises(ImportError, match=r'pip install "trioloop\[postgres\]"'):
        open_store("postgresql://h/d")
    assert isinstance(open_store("journal.db"), SQLiteJournalStore)


def test_the_stores_package_imports_psycopg_only_for_a_postgres_store() -> None:
    probe = "import sys, trioloop.stores; trioloop.stores.open_store('j.db'); print('psycopg' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60)
    assert done.stdout.strip() == "False"


# --- SQLite: the file, its settings, and its failures ---


async def test_sqlite_is_wal_and_synchronous_full_when_durable(tmp_path: Path) -> None:
    for durable, level in ((True, 2), (False, 1)):
        path = tmp_path / f"{durable}.db"
        async with SQLiteJournalStore(path, durable=durable) as store, await store.acquire("s") as lease:
            await lease.append(batch(1))
            # Private access, to read a per-connection setting no public call shows.
            assert await store._run("probe", lambda c: c.execute("PRAGMA synchronous").fetchone()[0]) == level
        with closing(sqlite3.connect(path)) as raw:
            assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


async def test_sqlite_never_runs_a_statement_on_the_event_loop(tmp_path: Path) -> None:
    threads: list[int] = []
    async with SQLiteJournalStore(tmp_path / "j.db") as store:
        await store._run("trace", lambda c: c.set_trace_callback(lambda sql: threads.append(threading.get_ident())))
        async with await store.acquire("s") as lease:
            await lease.append(batch(1, 2))
            await lease.entries()
            await lease.last_seq()
            await lease.discard_before(2)
        await store.session_ids()
    assert len(threads) > 5
    assert threading.get_ident() not in threads


async def test_sqlite_failures_are_journal_store_errors(tmp_path: Path) -> None:
    with pytest.raises(JournalStoreError, match="unable to open"):
        await SQLiteJournalStore(tmp_path).acquire("s")  # a directory
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not a database file " * 200)
    async with SQLiteJournalStore(garbage) as store:
        with pytest.raises(JournalStoreError, match="not a database"):
            await store.acquire("s")
        with pytest.raises(JournalStoreError, match="not a database"):
            await store.session_ids()
    (tmp_path / "locked.db.lock").mkdir()
    async with SQLiteJournalStore(tmp_path / "locked.db") as store:
        with pytest.raises(JournalStoreError, match=r"locked\.db\.lock"):
            await store.acquire("s")
    with pytest.raises(JournalStoreError, match="unable to open"):
        await SQLiteJournalStore(tmp_path / "missing" / "dir" / "j.db").session_ids()


async def test_sqlite_disk_full_mid_batch_writes_nothing(tmp_path: Path) -> None:
    async with SQLiteJournalStore(tmp_path / "j.db") as store, await store.acquire("s") as lease:
        await lease.append(batch(1))
        # Private access: cap the file at its current size, as a full disk would (SQLITE_FULL).
        pages = await store._run("probe", lambda c: c.execute("PRAGMA page_count").fetchone()[0])
        await store._run("cap", lambda c: c.execute(f"PRAGMA max_page_count = {pages + 2}"))
        big = [StoredEntry(seq, bytes(20_000)) for seq in range(2, 40)]
        with pytest.raises(JournalStoreError, match="full"):
            await lease.append(big)
        assert tuple(await lease.entries()) == batch(1)
        await store._run("uncap", lambda c: c.execute("PRAGMA max_page_count = 1073741823"))
        await lease.append(big)
        assert await lease.last_seq() == 39


async def test_sqlite_busy_database_is_a_journal_store_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trioloop.durable.sqlite, "BUSY_TIMEOUT_S", 0.2)
    path = tmp_path / "j.db"
    async with SQLiteJournalStore(path) as store, await store.acquire("s") as lease:
        await lease.append(batch(1))
        other = sqlite3.connect(path, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")  # another process's long write transaction
            other.execute("INSERT INTO trioloop_journal VALUES ('elsewhere', 1, x'00')")
            with pytest.raises(JournalStoreError, match="locked"):
                await lease.append(batch(2))
            other.execute("ROLLBACK")
        finally:
            other.close()
        await lease.append(batch(2))
        assert tuple(await lease.entries()) == batch(1, 2)


async def test_sqlite_stores_in_one_process_share_the_lease_lock(tmp_path: Path) -> None:
    # POSIX locks never exclude within one process, and closing any descriptor of the lock file drops them
    # all: two stores on one file must still exclude each other, and one closing must not free the other's.
    path = tmp_path / "j.db"
    async with SQLiteJournalStore(path) as one, SQLiteJournalStore(path) as two:
        held = await one.acquire("s")
        with pytest.raises(SessionLocked):
            await two.acquire("s")
        other = await two.acquire("t")
        await other.release()
        await two.close()
        await _expect_locked_elsewhere(path, "s")
        await held.release()
        async with await one.acquire("s"):
            pass


# --- across processes: a subprocess holds the lease, then is killed ---

HOLDER = """
import sys, trio
from trioloop.durable.store import StoredEntry
from trioloop.stores import open_store

async def main():
    store = open_store(sys.argv[1])
    lease = await store.acquire(sys.argv[2])
    await lease.append([StoredEntry(1, b"one"), StoredEntry(2, b"two")])
    print("held", flush=True)
    await trio.sleep_forever()

trio.run(main)
"""

PROBE = """
import sys, trio
from trioloop.durable.store import SessionLocked
from trioloop.stores import open_store

async def main():
    try:
        async with await open_store(sys.argv[1]).acquire(sys.argv[2]):
            print("acquired")
    except SessionLocked:
        print("locked")

trio.run(main)
"""


async def _expect_locked_elsewhere(path: Path, session_id: str) -> None:
    done = await trio.run_process(
        [sys.executable, "-c", PROBE, str(path), session_id], capture_stdout=True, capture_stderr=True, cwd=ROOT
    )
    assert done.stdout.decode().strip() == "locked", done.stderr.decode()


def _spawn(script: str, *args: str) -> subprocess.Popen[str]:
    """A Python subprocess running ``script`` with pipes (made in a worker thread: fork/exec blocks)."""
    command = [sys.executable, "-c", script, *args]
    pipe = subprocess.PIPE
    return subprocess.Popen(command, stdin=pipe, stdout=pipe, stderr=pipe, text=True, cwd=ROOT)


async def _lease_outlives_its_killed_holder(target: str, session_id: str, store: Store) -> float:
    """Seconds from the holder's SIGKILL (reaped) to this process holding its lease."""
    with await trio.to_thread.run_sync(_spawn, HOLDER, target, session_id) as holder:
        try:
            assert holder.stdout is not None and holder.stderr is not None
            with trio.fail_after(60):
                line = await trio.to_thread.run_sync(holder.stdout.readline)
            assert line == "held\n", holder.stderr.read() if holder.poll() is not None else line
            with pytest.raises(SessionLocked):
                await store.acquire(session_id)
            with pytest.raises(SessionLocked):
                await store.acquire(session_id, wait_s=0.1)
            holder.kill()
            await trio.to_thread.run_sync(holder.wait)
            killed = time.monotonic()
            lease = await store.acquire(session_id, wait_s=10)
            elapsed = time.monotonic() - killed
            try:
                assert tuple(await lease.entries()) == (StoredEntry(1, b"one"), StoredEntry(2, b"two"))
                await lease.append([StoredEntry(3, b"three")])
            finally:
                await lease.release()
            return elapsed
        finally:
            if holder.poll() is None:
                holder.kill()


async def test_sqlite_lease_excludes_another_process_and_ends_with_it(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    async with SQLiteJournalStore(path) as store:
        elapsed = await _lease_outlives_its_killed_holder(str(path), "crash", store)
        async with await store.acquire("crash") as lease:  # at once: the kernel dropped the lock
            assert await lease.last_seq() == 3
    print(f"\nSQLite: lease free {elapsed * 1000:.1f} ms after the holder was SIGKILLed and reaped")
    assert elapsed < 0.5


async def test_postgres_lease_excludes_another_process_and_ends_with_it(pg_url: str) -> None:
    async with PostgresJournalStore(pg_url) as store:
        await store.session_ids()  # the table exists before the holder starts
        elapsed = await _lease_outlives_its_killed_holder(pg_url, "crash", store)
    print(f"\nPostgreSQL: lease free {elapsed * 1000:.1f} ms after the holder was SIGKILLed and reaped")
    assert elapsed < 3


# --- PostgreSQL: racing writers, lost connections, unreachable servers ---

COMPETITOR = """
import json, sys, time, trio
from trioloop.durable.store import JournalConflict, StoredEntry
from trioloop.stores import open_store

async def main():
    target, session_id, name, stale_last = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    async with open_store(target) as store:
        await store.session_ids()
        print("ready", flush=True)
        await trio.to_thread.run_sync(sys.stdin.readline)
        started = time.monotonic()
        async with await store.acquire(session_id, wait_s=20) as lease:
            waited = time.monotonic() - started
            started = time.monotonic()
            try:
                await lease.append([StoredEntry(stale_last + 1, name.encode())])
                outcome = "appended"
            except JournalConflict:
                outcome = "conflict"
            append_s = time.monotonic() - started
            await trio.sleep(0.2)  # hold the lease a while: the other process waits for it
    print(json.dumps({"name": name, "outcome": outcome, "waited_s": waited, "append_s": append_s}), flush=True)

trio.run(main)
"""


async def test_two_processes_appending_with_stale_numbers_one_wins_nothing_lost(
    persistent_backend: Backend,
) -> None:
    backend = persistent_backend
    store = backend.open()
    async with await store.acquire("contested") as lease:
        await lease.append(batch(1, 2, 3))  # both competitors believe the journal ends at 3
    await close(store)
    procs = [
        await trio.to_thread.run_sync(_spawn, COMPETITOR, backend.target, "contested", name, "3") for name in ("L", "R")
    ]
    try:
        with trio.fail_after(60):
            for proc in procs:
                assert proc.stdout is not None
                assert await trio.to_thread.run_sync(proc.stdout.readline) == "ready\n"
            for proc in procs:
                assert proc.stdin is not None
                proc.stdin.write("go\n")
                proc.stdin.flush()
            outputs = [await trio.to_thread.run_sync(proc.communicate) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    results = sorted((json.loads(out) for out, _ in outputs), key=lambda r: r["waited_s"])
    assert [r["outcome"] for r in results] == ["appended", "conflict"], outputs
    timings = ", ".join(
        f"{r['name']} {r['outcome']} after waiting {r['waited_s'] * 1000:.1f} ms (append {r['append_s'] * 1000:.1f} ms)"
        for r in results
    )
    print(f"\n{backend.kind}, two competing processes: {timings}")
    assert results[1]["waited_s"] >= 0.15  # the loser waited for the winner's lease, then was refused
    store = backend.open()
    async with await store.acquire("contested") as lease:
        winner = results[0]["name"].encode()
        assert tuple(await lease.entries()) == (*batch(1, 2, 3), StoredEntry(4, winner))
    await close(store)


async def test_postgres_primary_key_stops_a_writer_that_ignores_the_lease(pg_url: str) -> None:
    import psycopg

    async with PostgresJournalStore(pg_url) as store, await store.acquire("raced") as lease:
        await lease.append(batch(1))
        rogue = await trio.to_thread.run_sync(lambda: psycopg.connect(pg_url))
        try:
            await trio.to_thread.run_sync(
                lambda: rogue.execute("INSERT INTO trioloop_journal VALUES ('raced', 2, 'rogue')")
            )  # not committed yet: the lease's append reads last = 1, then waits on the key

            async def commit_once_blocked() -> None:
                await _wait_for_a_lock_wait(pg_url)
                await trio.to_thread.run_sync(rogue.commit)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(commit_once_blocked)
                with pytest.raises(JournalConflict):
                    await lease.append(batch(2, 3))
        finally:
            rogue.close()
        assert tuple(await lease.entries()) == (*batch(1), StoredEntry(2, b"rogue"))


async def _wait_for_a_lock_wait(url: str) -> None:
    import psycopg

    def waiting() -> bool:
        with psycopg.connect(url) as probe:
            row = probe.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'").fetchone()
            return bool(row and row[0])

    with trio.fail_after(10):
        while True:
            if await trio.to_thread.run_sync(waiting):
                return
            await trio.sleep(0.02)


@pytest.mark.parametrize("group_commit", [False, True])
async def test_postgres_lease_whose_connection_dies_stops_writing(pg_url: str, group_commit: bool) -> None:
    import psycopg

    async with PostgresJournalStore(pg_url, group_commit=group_commit) as store:
        lease = await store.acquire("s")
        await lease.append(batch(1))

        def terminate() -> None:
            with psycopg.connect(pg_url, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted")
                admin.execute("SELECT pg_sleep(0.2)")  # the server has ended the backend and freed its locks

        await trio.to_thread.run_sync(terminate)
        with pytest.raises(JournalStoreError):
            await lease.append(batch(2))
        with pytest.raises(JournalStoreError, match="lost"):
            await lease.last_seq()
        async with await store.acquire("s", wait_s=5) as again:
            assert tuple(await again.entries()) == batch(1)
        await lease.release()


async def test_postgres_failures_are_journal_store_errors() -> None:
    store = PostgresJournalStore("postgresql://app:s3cret@127.0.0.1:1/journal?connect_timeout=2")
    for attempt in (lambda: store.acquire("s"), store.session_ids):
        with pytest.raises(JournalStoreError) as caught:
            await attempt()
        assert "s3cret" not in str(caught.value)
    await store.close()


async def test_postgres_refuses_session_ids_it_cannot_store(pg_url: str) -> None:
    async with PostgresJournalStore(pg_url) as store:
        for bad in ("nul\x00id", "lone \udc80 surrogate"):
            with pytest.raises(ValueError):
                await store.acquire(bad)


async def test_read_sees_every_entry_without_taking_the_lease(store: Store) -> None:
    async with await store.acquire("audited") as lease:
        await lease.append(batch(1, 2, 3))
        # Another lease drives the session; a reader still sees everything appended so far, in order.
        assert tuple(await store.read("audited")) == batch(1, 2, 3)
        await lease.append(batch(4))
        assert tuple(await store.read("audited")) == batch(1, 2, 3, 4)
    assert tuple(await store.read("never-written")) == ()


async def test_sqlite_appends_queued_together_commit_together_and_fail_alone(tmp_path: Path) -> None:
    # The store's thread is busy; meanwhile twenty sessions queue an append each (one of them numbered wrong).
    # When the thread comes to them they are one transaction, one sync to disk: nineteen are durable, and the
    # wrong one alone is refused, its savepoint rolled back.
    async with SQLiteJournalStore(tmp_path / "j.db") as store:
        leases = [await store.acquire(f"s{n}") for n in range(20)]
        gate = threading.Event()
        outcomes: dict[int, BaseException | None] = {}

        async def append(n: int) -> None:
            try:
                await leases[n].append(batch(2 if n == 7 else 1))  # session 7 skips entry 1
                outcomes[n] = None
            except JournalStoreError as exc:
                outcomes[n] = exc

        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(store._run, "busy", lambda _: gate.wait(10)))
            await trio.testing.wait_all_tasks_blocked()
            before = (store._thread.batches, store._thread.appends)
            for n in range(20):
                nursery.start_soon(append, n)
            await trio.testing.wait_all_tasks_blocked()
            gate.set()
        assert (store._thread.batches - before[0], store._thread.appends - before[1]) == (1, 19)
        assert [n for n, error in outcomes.items() if error is not None] == [7]
        for n, lease in enumerate(leases):
            assert [entry.seq for entry in await lease.entries()] == ([] if n == 7 else [1])
            await lease.release()


async def test_sqlite_work_cancelled_before_the_thread_begins_it_never_runs(tmp_path: Path) -> None:
    async with SQLiteJournalStore(tmp_path / "j.db") as store, await store.acquire("s") as lease:
        gate = threading.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(store._run, "busy", lambda _: gate.wait(10)))
            await trio.testing.wait_all_tasks_blocked()
            with trio.move_on_after(0.05) as cut:
                await lease.append(batch(1))  # queued behind the busy call, then cut: dropped, never begun
            assert cut.cancelled_caught
            gate.set()
        await lease.append(batch(1))  # entry 1 is still free: the dropped append never ran
        assert [entry.seq for entry in await lease.entries()] == [1]


# Appends queued together while the store's thread is busy: (session, how far its first number is from the next one:
# 0 is right, anything else a gap or a repeat).
GROUPED = st.lists(st.tuples(st.integers(0, 3), st.sampled_from([0, 0, 0, 1, -1])), min_size=1, max_size=12)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(appends=GROUPED)
def test_sqlite_appends_committed_together_are_each_what_it_would_be_alone(
    tmp_path_factory: pytest.TempPathFactory, appends: list[tuple[int, int]]
) -> None:
    # For all appends queued together, in any sessions: each is kept or refused exactly as if it had been the only
    # one in its transaction, in queue order (the model below), and the journals hold exactly the kept ones.
    path = tmp_path_factory.mktemp("grouped") / "j.db"

    async def run() -> tuple[dict[int, list[int]], list[bool]]:
        async with SQLiteJournalStore(path) as store:
            leases = [await store.acquire(f"s{n}") for n in range(4)]
            gate = threading.Event()
            kept: list[bool] = [False] * len(appends)
            planned: list[int] = [1] * 4  # the number each session's next append starts at, as queued

            async def append(index: int, session: int, first: int) -> None:
                with contextlib.suppress(JournalStoreError):
                    await leases[session].append(batch(first, first + 1))
                    kept[index] = True

            async with trio.open_nursery() as nursery:
                nursery.start_soon(partial(store._run, "busy", lambda _: gate.wait(10)))
                await trio.testing.wait_all_tasks_blocked()
                for index, (session, off) in enumerate(appends):
                    nursery.start_soon(append, index, session, planned[session] + off)
                    await trio.testing.wait_all_tasks_blocked()  # queued in this order
                    if off == 0:
                        planned[session] += 2
                gate.set()
            held = {n: [entry.seq for entry in await lease.entries()] for n, lease in enumerate(leases)}
            for lease in leases:
                await lease.release()
            return held, kept

    held, kept = trio.run(run)
    model: dict[int, list[int]] = {n: [] for n in range(4)}
    expected: list[bool] = []
    planned = [1] * 4
    for session, off in appends:
        first = planned[session] + off
        ok = first == len(model[session]) + 1
        expected.append(ok)
        if ok:
            model[session] += [first, first + 1]
        if off == 0:
            planned[session] += 2
    assert kept == expected
    assert held == model
