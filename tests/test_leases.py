"""Leases that expire and fence, on a real SQLite file and a real PostgreSQL server: a frozen holder loses its
lease after its time to live, every grant has a larger epoch, and a holder whose lease was taken over writes and
runs nothing more, even a call whose ``start`` it had appended before it froze (a real process, SIGSTOP)."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest
import trio
from pg_support import postgres_url  # noqa: F401 -- the session fixture, reached by name (getfixturevalue)

from tests.lease_worker import NOTE, SCRIPT, effect_tool, make_store, touch_tool
from trioloop import CallStatus, ScriptedProvider, Session, SessionLocked
from trioloop.durable.leases import LeaseLost
from trioloop.durable.store import JournalStoreError, StoredEntry
from trioloop.providers.scripted import ScriptStep

WORKER = Path(__file__).resolve().parent / "lease_worker.py"
TTL_S = 0.6


class Place:
    """A store location (a SQLite file or a PostgreSQL URL) and fresh session ids on it."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.stores: list[Any] = []

    def store(self, ttl_s: float = TTL_S) -> Any:
        store = make_store(self.target, ttl_s)
        self.stores.append(store)
        return store

    @staticmethod
    def sid() -> str:
        return f"lease-{secrets.token_hex(4)}"


@pytest.fixture(params=["sqlite", "postgres"])
async def place(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Place]:
    target = request.getfixturevalue("postgres_url") if request.param == "postgres" else str(tmp_path / "j.db")
    where = Place(target)
    yield where
    for store in where.stores:
        await store.close()


async def test_every_grant_has_a_larger_epoch_and_a_held_lease_excludes(place: Place) -> None:
    sid = place.sid()
    first, second = place.store(), place.store()
    lease = await first.acquire(sid)
    assert lease.epoch == 1
    with pytest.raises(SessionLocked):
        await second.acquire(sid)
    await lease.release()
    again = await second.acquire(sid)  # released: taken at once, no time to live to wait out
    assert again.epoch == 2
    await again.release()
    assert (await first.acquire(sid)).epoch == 3


async def test_a_holder_that_stops_renewing_loses_its_lease_and_writes_nothing_more(place: Place) -> None:
    # The first holder is alive (its process lock held) but renews nothing, as a frozen process would.
    sid = place.sid()
    frozen = await place.store().acquire(sid)
    await frozen.append([StoredEntry(1, b"one")])
    started = trio.current_time()
    taker = await place.store().acquire(sid, wait_s=10)
    waited = trio.current_time() - started
    assert taker.epoch == frozen.epoch + 1 and waited >= TTL_S * 0.5
    with pytest.raises(LeaseLost, match="may have run out"):
        await frozen.append([StoredEntry(2, b"stale")])  # its own clock says so: at once, no I/O
    with pytest.raises(LeaseLost):
        await frozen.renew()
    with pytest.raises(LeaseLost):
        frozen.check_held()
    frozen.clock.granted(trio.current_time())  # a holder whose clock is wrong: the append's transaction still sees
    with pytest.raises(LeaseLost, match="taken over"):
        await frozen.append([StoredEntry(2, b"stale")])
    await taker.append([StoredEntry(2, b"two")])
    assert [e.data for e in await taker.entries()] == [b"one", b"two"]


async def test_a_renewed_lease_outlives_its_time_to_live(place: Place) -> None:
    sid = place.sid()
    lease = await place.store().acquire(sid)
    for _ in range(4):
        await trio.sleep(TTL_S / 2)
        await lease.renew()
    lease.check_held()
    with pytest.raises(SessionLocked):
        await place.store().acquire(sid, wait_s=TTL_S / 3)
    await lease.append([StoredEntry(1, b"still mine")])


async def test_an_open_session_keeps_its_lease_and_its_tools_see_the_epoch(place: Place, tmp_path: Path) -> None:
    sid = place.sid()
    async with ScriptedProvider(SCRIPT) as provider:
        session = await Session.open(
            place.store(), sid, kind=NOTE, provider=provider, document="", model="m", tools=[effect_tool(tmp_path)]
        )
        async with session:
            await trio.sleep(TTL_S * 2.5)  # renewed meanwhile by the session
            with pytest.raises(SessionLocked):
                await place.store().acquire(sid)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(session.send, "do it")
                await _approve_when_pending(session, "e1")
    assert (tmp_path / "effect").read_text() == "1"  # the tool saw the lease's fencing epoch
    async with ScriptedProvider([ScriptStep(text="Hi.")]) as provider:
        reopened = await Session.open(place.store(), sid, kind=NOTE, provider=provider, tools=[effect_tool(tmp_path)])
        async with reopened:
            assert reopened.document == "effect\n"
            assert reopened._journal.journal is not None and reopened._journal.journal.turns.epoch == 2


async def _approve_when_pending(session: Session[str], call_id: str) -> None:
    async with aclosing(session.states()) as states:
        async for state in states:
            call = state.call(call_id)
            if call is not None and call.status is CallStatus.PENDING:
                session.approve(call_id)
                return


def _spawn(place: Place, sid: str, mode: str, folder: Path, *more: str) -> subprocess.Popen[bytes]:
    folder.mkdir(exist_ok=True)
    return subprocess.Popen(
        [sys.executable, str(WORKER), place.target, sid, str(TTL_S), mode, str(folder), *more],
        env={**os.environ, "PYTHONPATH": str(WORKER.parent.parent)},
    )


async def _until(check: Callable[[], bool], what: str, timeout_s: float = 30) -> None:
    with trio.move_on_after(timeout_s):
        while not check():  # noqa: ASYNC110 -- another process makes the file: nothing to wait on but polling
            await trio.sleep(0.01)
        return
    pytest.fail(f"timed out waiting for {what}")


async def test_a_killed_holders_session_is_taken_at_once(place: Place, tmp_path: Path) -> None:
    sid = place.sid()
    worker = _spawn(place, sid, "hold", tmp_path / "w")
    try:
        await _until(lambda: (tmp_path / "w" / "holding").exists(), "the worker's lease")
        with pytest.raises(SessionLocked):
            await place.store(ttl_s=60).acquire(sid)
        worker.kill()
        await trio.to_thread.run_sync(worker.wait)
        started = trio.current_time()
        lease = await place.store(ttl_s=60).acquire(sid, wait_s=10)
        assert lease.epoch == 2 and trio.current_time() - started < TTL_S  # no time to live waited out
    finally:
        worker.kill()
        worker.wait()


async def test_a_frozen_holder_is_fenced_and_never_runs_the_call_it_had_started(place: Place, tmp_path: Path) -> None:
    sid = place.sid()
    folder = tmp_path / "w"
    worker = _spawn(place, sid, "tool", folder)
    try:
        await _until(lambda: (folder / "started").exists(), "the worker's start append")
        await _until(lambda: _stopped(worker.pid), "the worker to stop itself")  # between its start append and tool
        frozen_at = time.monotonic()
        async with ScriptedProvider([ScriptStep(text="Noted.")]) as provider:
            store = place.store(ttl_s=60)
            taken = await Session.open(store, sid, kind=NOTE, provider=provider, tools=[effect_tool(folder)], wait_s=30)
            took_s = time.monotonic() - frozen_at
            async with taken:
                state = await taken.continue_turn()
            call = state.call("e1")
            assert call is not None and call.status is CallStatus.FAILED  # reported interrupted, never run again
            assert took_s >= TTL_S * 0.5  # the frozen holder's lease ran out first
        os.kill(worker.pid, signal.SIGCONT)
        code = await trio.to_thread.run_sync(worker.wait, 30)
        ended = (folder / "ended").read_text()
        assert not (folder / "effect").exists()  # the woken holder ran nothing
        assert code == 0 and ended.startswith("SessionJournalError") and "LeaseLost" in ended, ended
    finally:
        if worker.poll() is None:
            os.kill(worker.pid, signal.SIGCONT)
            worker.kill()
            worker.wait()


#: Rounds of the spawn race per store: ``_WORKERS`` processes at once, each running ``_ROUNDS_EACH`` rounds.
_WORKERS = 10
_ROUNDS_EACH = 5


async def _spawn_rounds(place: Place, folder: Path, woken_s: list[float]) -> None:
    """A worker that, round after round, freezes itself between a tool task's spawn and its first step; each time
    the session is taken over meanwhile (its calls reported interrupted), then the worker is woken: no ``touch``
    may ever run, and the woken holder fails at once (`LeaseLost`)."""
    sid = place.sid()
    worker = _spawn(place, sid, "spawn", folder, str(_ROUNDS_EACH))
    try:
        for n in range(_ROUNDS_EACH):
            here = folder / str(n)
            await _until(lambda: (here / "spawned").exists(), "the first tool task's spawn", timeout_s=60)  # noqa: B023
            await _until(lambda: _stopped(worker.pid), "the worker to stop itself")
            async with ScriptedProvider([ScriptStep(text="Noted.")]) as provider:
                store = place.store(ttl_s=60)
                tools = [touch_tool(here)]
                taken = await Session.open(store, f"{sid}-{n}", kind=NOTE, provider=provider, tools=tools, wait_s=30)
                async with taken:
                    state = await taken.continue_turn()
                assert all(call.status is CallStatus.FAILED for call in state.calls)  # interrupted, never run again
            os.kill(worker.pid, signal.SIGCONT)
            woken = time.monotonic()
            await _until(lambda: (here / "ended").exists(), "the woken worker's end of the turn")  # noqa: B023
            woken_s.append(time.monotonic() - woken)
            ended = (here / "ended").read_text()
            assert not any(path.name.startswith("effect-") for path in here.iterdir())  # no tool ran after it
            assert ended.startswith("SessionJournalError") and "LeaseLost" in ended, ended
        assert await trio.to_thread.run_sync(worker.wait, 30) == 0
    finally:
        if worker.poll() is None:
            os.kill(worker.pid, signal.SIGCONT)
            worker.kill()
            worker.wait()


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "T"


async def test_a_tool_never_starts_after_its_holder_lost_the_lease_between_spawn_and_first_step(
    place: Place, tmp_path: Path
) -> None:
    # A holder frozen (SIGSTOP) while the four tasks of a batch of tools were being spawned woke after a takeover
    # and ran one or two of them: the fence was checked in the loop that spawns them, not where each task takes its
    # first step. Each round freezes the holder right after the first task's spawn: 50 rounds per store.
    woken_s: list[float] = []
    async with trio.open_nursery() as nursery:
        for n in range(_WORKERS):
            nursery.start_soon(_spawn_rounds, place, tmp_path / f"w{n}", woken_s)
    assert len(woken_s) == _WORKERS * _ROUNDS_EACH
    assert max(woken_s) < 9  # a woken holder fails at once (LeaseLost), never waiting out a store's 10 s timeout


async def test_a_holder_frozen_inside_an_append_is_cut_off_by_the_server(request: pytest.FixtureRequest) -> None:
    # PostgreSQL: what a holder frozen in the middle of an append leaves is an open transaction holding the lease
    # row's lock (its process lock held too). The server ends that session once it has idled in the transaction
    # for the time to live, so the next holder waits that long, not for ever. (SQLite has no server to do this: a
    # holder frozen inside its write transaction blocks the file's writers until it runs again.)
    place = Place(request.getfixturevalue("postgres_url"))
    sid = place.sid()
    frozen = await place.store().acquire(sid)
    row = "SELECT epoch FROM trioloop_lease WHERE session_id = %s FOR SHARE"
    connection = frozen._connection

    def begin_and_freeze() -> None:
        connection.execute("BEGIN")
        connection.execute(row, (sid,))

    await trio.to_thread.run_sync(begin_and_freeze)
    started = trio.current_time()
    taker = await place.store(ttl_s=60).acquire(sid, wait_s=10)
    assert taker.epoch == frozen.epoch + 1 and trio.current_time() - started < 5
    with pytest.raises(JournalStoreError):
        await frozen.append([StoredEntry(1, b"late")])
    await taker.append([StoredEntry(1, b"mine")])
    for store in place.stores:
        await store.close()
