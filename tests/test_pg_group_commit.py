"""PostgreSQL group commit: a store's leases' appends queued together commit in one transaction, each still fenced
by its own lease, and one that fails (a conflict, a lost lease, a locked row) takes none of the others with it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import trio
from pg_support import postgres_url  # noqa: F401 -- the session fixture, reached by name (getfixturevalue)

from trioloop.durable.leases import LeaseLost
from trioloop.durable.store import JournalConflict, JournalStoreError, SessionLocked, StoredEntry
from trioloop.stores import PostgresJournalStore


@pytest.fixture
def pg_url(request: pytest.FixtureRequest) -> Iterator[str]:
    import psycopg

    url: str = request.getfixturevalue("postgres_url")
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute("DROP TABLE IF EXISTS trioloop_journal")
        admin.execute("DROP TABLE IF EXISTS trioloop_lease")
    yield url


def _entries(first: int, count: int, tag: str) -> list[StoredEntry]:
    return [StoredEntry(n, f"{tag}-{n}".encode()) for n in range(first, first + count)]


async def _append_all(appends: dict[str, tuple[object, list[StoredEntry]]]) -> dict[str, BaseException | None]:
    results: dict[str, BaseException | None] = {}

    async def append(name: str, lease: object, entries: list[StoredEntry]) -> None:
        try:
            await lease.append(entries)  # type: ignore[attr-defined]
            results[name] = None
        except JournalStoreError as exc:
            results[name] = exc

    async with trio.open_nursery() as nursery:
        for name, (lease, entries) in appends.items():
            nursery.start_soon(append, name, lease, entries)
    return results


async def test_appends_of_many_sessions_share_transactions_and_all_land(pg_url: str) -> None:
    async with PostgresJournalStore(pg_url, group_commit=True) as store:
        leases = [await store.acquire(f"s{n}") for n in range(24)]

        async def write(lease: object, tag: str) -> None:
            for seq in range(1, 6):
                await lease.append(_entries(seq, 1, tag))  # type: ignore[attr-defined]

        async with trio.open_nursery() as nursery:
            for n, lease in enumerate(leases):
                nursery.start_soon(write, lease, f"s{n}")
        assert store._appends is not None
        batches, appends = store._appends.batches
        assert appends == 24 * 5 and batches < appends  # shared transactions happened
        for n in range(24):
            assert [e.data for e in await store.read(f"s{n}")] == [f"s{n}-{k}".encode() for k in range(1, 6)]
        assert await store.heads() == {f"s{n}": 5 for n in range(24)}
        for lease in leases:
            await lease.release()


async def test_one_failing_append_leaves_the_others_of_its_batch(pg_url: str) -> None:
    async with PostgresJournalStore(pg_url, group_commit=True) as store:
        good = [await store.acquire(f"g{n}") for n in range(6)]
        bad = await store.acquire("bad")
        appends = {f"g{n}": (lease, _entries(1, 2, f"g{n}")) for n, lease in enumerate(good)}
        # The bad one is not one past the last: a conflict.
        results = await _append_all({"bad": (bad, _entries(5, 1, "gap")), **appends})
        assert isinstance(results.pop("bad"), JournalConflict)
        assert set(results.values()) == {None}
        assert await store.read("bad") == ()
        assert [len(await store.read(f"g{n}")) for n in range(6)] == [2] * 6


async def test_a_lease_taken_over_cannot_append_through_the_shared_connection(pg_url: str) -> None:
    async with (
        PostgresJournalStore(pg_url, group_commit=True, lease_ttl_s=0.5) as first,
        PostgresJournalStore(pg_url, group_commit=True) as second,
    ):
        old = await first.acquire("s")
        await old.append(_entries(1, 1, "old"))
        # The holder's clock says it still holds (so the store, not the clock, must refuse); another process takes
        # the session over once the time to live ran out by the server's clock.
        old.clock.ttl_s = 3600.0
        await trio.sleep(0.7)
        new = await second.acquire("s", wait_s=5)
        with pytest.raises(LeaseLost):
            await old.append(_entries(2, 1, "old"))
        await new.append(_entries(2, 1, "new"))
        assert [e.data for e in await second.read("s")] == [b"old-1", b"new-2"]
        await new.release()
        await old.release()


async def test_an_append_blocked_on_a_locked_lease_row_fails_alone_and_in_bounded_time(pg_url: str) -> None:
    import psycopg

    async with PostgresJournalStore(pg_url, group_commit=True) as store:
        blocked, free = await store.acquire("blocked"), await store.acquire("free")
        with psycopg.connect(pg_url, autocommit=True) as other:
            other.execute("BEGIN")
            other.execute("SELECT 1 FROM trioloop_lease WHERE session_id = 'blocked' FOR UPDATE")
            started = trio.current_time()
            with pytest.raises(JournalStoreError):
                await blocked.append(_entries(1, 1, "b"))
            assert trio.current_time() - started < 5  # the lock wait gives up (1 s), never the store's timeout
            await free.append(_entries(1, 1, "f"))
            other.execute("ROLLBACK")
        assert await store.read("blocked") == () and len(await store.read("free")) == 1


async def test_a_session_held_elsewhere_is_refused_before_any_connection_is_made_for_it(pg_url: str) -> None:
    import psycopg

    def connections() -> int:
        with psycopg.connect(pg_url, autocommit=True) as admin:
            row = admin.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()").fetchone()
        return int(row[0]) - 1 if row else 0

    async with PostgresJournalStore(pg_url) as holder, PostgresJournalStore(pg_url) as other:
        lease = await holder.acquire("s")
        await other.heads()  # its own connection, made
        before = await trio.to_thread.run_sync(connections)
        for _ in range(5):
            with pytest.raises(SessionLocked):
                await other.acquire("s")
        assert await trio.to_thread.run_sync(connections) == before  # no lease connection was made (and left)
        # A holder whose connection is gone (its process killed) holds nothing: the session is taken at once.
        await trio.to_thread.run_sync(lambda: lease._connection.close())
        with trio.fail_after(10):
            while True:
                try:
                    taken = await other.acquire("s")
                    break
                except SessionLocked:
                    await trio.sleep(0.05)
        assert taken.epoch == lease.epoch + 1
        await taken.release()


async def test_a_first_acquire_that_may_wait_makes_the_tables_too(pg_url: str) -> None:
    async with PostgresJournalStore(pg_url) as store:  # the tables were dropped: nothing has made them yet
        lease = await store.acquire("s", wait_s=5)
        await lease.append(_entries(1, 1, "s"))
        await lease.release()
        assert len(await store.read("s")) == 1


async def test_a_connection_whose_lease_ended_cleanly_serves_the_next_lease_and_holds_nothing(pg_url: str) -> None:
    import psycopg

    def advisory_locks() -> int:
        with psycopg.connect(pg_url, autocommit=True) as admin:
            row = admin.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted").fetchone()
        return int(row[0]) if row else 0

    async with PostgresJournalStore(pg_url, reuse_connections=1) as store:
        first = await store.acquire("a")
        backend = first._connection.info.backend_pid
        await first.append(_entries(1, 1, "a"))
        await first.release()
        assert await trio.to_thread.run_sync(advisory_locks) == 0  # the kept connection holds no lock
        second = await store.acquire("b")
        assert second._connection.info.backend_pid == backend  # reused, not a new server process
        third = await store.acquire("c")  # none idle: a new one
        assert third._connection.info.backend_pid != backend
        # A connection that broke is never kept.
        await trio.to_thread.run_sync(lambda: second._connection.close())
        await second.release()
        await third.release()
        fourth = await store.acquire("a")
        assert fourth._connection.info.backend_pid == third._connection.info.backend_pid
        assert fourth.epoch == first.epoch + 1
        await fourth.append(_entries(2, 1, "a"))
        await fourth.release()
    async with PostgresJournalStore(pg_url) as store:  # by default nothing is kept
        lease = await store.acquire("d")
        backend = lease._connection.info.backend_pid
        await lease.release()
        again = await store.acquire("d")
        assert again._connection.info.backend_pid != backend
        await again.release()


async def test_every_append_is_announced_to_those_who_listen(pg_url: str) -> None:
    async with PostgresJournalStore(pg_url) as store, PostgresJournalStore(pg_url) as face:
        await face.heads()  # the tables (and the notice's trigger) exist
        lease = await store.acquire("s")
        for seq in (1, 2):
            armed = face.arm_any_journal()
            assert armed is not None and not armed.is_set()
            with trio.fail_after(10):  # the listener's connection says LISTEN (a notice before that is not heard)
                while not face._listening()._listening:  # noqa: ASYNC110 -- set by the listener's own thread
                    await trio.sleep(0.01)
            await lease.append(_entries(seq, 1, "s"))
            with trio.fail_after(10):
                await armed.wait()
        await lease.release()


async def test_a_key_taken_behind_the_leases_back_fails_its_append_alone_and_the_group_is_written_again(
    pg_url: str,
) -> None:
    """A writer outside the leases (a bug, an operator) takes the number one append is about to write: the group's
    pipeline meets the primary key, is rolled back whole, and written again one by one; only that append fails."""
    import psycopg

    async with PostgresJournalStore(pg_url, group_commit=True) as store:
        victim = await store.acquire("victim")
        await victim.append(_entries(1, 1, "v"))
        good = {f"g{n}": await store.acquire(f"g{n}") for n in range(5)}
        with psycopg.connect(pg_url, autocommit=True) as other:
            other.execute("BEGIN")
            other.execute("INSERT INTO trioloop_journal (session_id, seq, data) VALUES ('victim', 2, 'x')")

            async def commit_soon() -> None:
                await trio.sleep(0.3)  # the victim's insert now waits on this row's transaction
                await trio.to_thread.run_sync(other.execute, "COMMIT")

            async with trio.open_nursery() as nursery:
                nursery.start_soon(commit_soon)
                appends = {name: (lease, _entries(1, 2, name)) for name, lease in good.items()}
                results = await _append_all({"victim": (victim, _entries(2, 1, "v")), **appends})
        assert isinstance(results.pop("victim"), JournalConflict)
        assert set(results.values()) == {None}
        assert [e.data for e in await store.read("victim")] == [b"v-1", b"x"]
        for name in good:
            assert [e.data for e in await store.read(name)] == [f"{name}-1".encode(), f"{name}-2".encode()]


async def test_an_append_whose_lease_connection_died_fails_alone_in_its_group(pg_url: str) -> None:
    import psycopg

    async with PostgresJournalStore(pg_url, group_commit=True) as store:
        dead = await store.acquire("dead")
        good = {f"g{n}": await store.acquire(f"g{n}") for n in range(5)}
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (dead._backend,))  # type: ignore[attr-defined]
            for _ in range(100):  # the server lets the advisory lock go once the backend has exited
                if admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (dead._backend,)).fetchone() is None:  # type: ignore[attr-defined]
                    break
                await trio.sleep(0.02)
        appends = {name: (lease, _entries(1, 1, name)) for name, lease in good.items()}
        # Queued after the first (which the thread takes alone, at once): in a group with the others.
        results = await _append_all({"g0": appends.pop("g0"), "dead": (dead, _entries(1, 1, "d")), **appends})
        lost = results.pop("dead")
        assert isinstance(lost, LeaseLost) and "was lost" in str(lost)
        assert set(results.values()) == {None}
        assert await store.read("dead") == ()
        assert store._appends is not None
        transactions, written = store._appends.batches
        assert written == 5 and transactions < 5


async def test_the_append_whose_statement_fails_fails_alone_and_the_others_go_again_together(pg_url: str) -> None:
    """A database error in one append of a pipelined group (here a primary key taken behind the leases' back, seen
    after a wait): that append gets the error, and the rest are written again in one pipeline without it, not one
    by one (where the failing one would wait again)."""
    import psycopg

    from trioloop.durable import _pg_appends

    calls: list[int] = []
    together = _pg_appends.write_together

    def counting(connection: Any, appends: Any) -> Any:
        calls.append(len(appends))
        return together(connection, appends)

    async with PostgresJournalStore(pg_url) as store:
        leases = [await store.acquire(name) for name in ("a", "victim", "c")]
        appends = [
            _pg_appends.OneAppend(lease.session_id, lease.epoch, _entries(1, 1, lease.session_id), None)
            for lease in leases
        ]
        with psycopg.connect(pg_url, autocommit=True) as other, psycopg.connect(pg_url, autocommit=True) as shared:
            other.execute("BEGIN")
            other.execute("INSERT INTO trioloop_journal (session_id, seq, data) VALUES ('victim', 1, 'x')")

            def write() -> Any:
                with pytest.MonkeyPatch.context() as patch:
                    patch.setattr(_pg_appends, "write_together", counting)
                    return _pg_appends.write_together(shared, appends)

            found: list[Any] = []

            async def run_write() -> None:
                found.append(await trio.to_thread.run_sync(write))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(run_write)
                await trio.sleep(0.3)  # the victim's insert waits on the other transaction's row
                await trio.to_thread.run_sync(other.execute, "COMMIT")
        results = found[0]
        assert results[0] is None and results[2] is None
        assert isinstance(results[1], psycopg.errors.UniqueViolation)
        assert calls == [3, 2]  # the group, then the two others together: never one by one
        assert [e.data for e in await store.read("a")] == [b"a-1"]
        assert [e.data for e in await store.read("c")] == [b"c-1"]
        assert [e.data for e in await store.read("victim")] == [b"x"]
        for lease in leases:
            await lease.release()
