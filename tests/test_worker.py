"""Workers carry approved turns on (trioloop.web.worker): a decided session nobody holds is taken up under its lease,
its decisions applied, its turn carried to the next review (suspended there) or to its end; a session held
elsewhere is left to its holder; a card still undecided leaves the session as it was; a fleet of processes sharing
PostgreSQL carries every session once and runs every approved call once, even when a worker is killed mid-tool.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest
import trio
from note_tools import open_note
from pg_support import postgres_url  # noqa: F401 -- the session fixture, reached by name (getfixturevalue)

from tests.worker_app import NOTE, TOOLS, make_app, runs
from trioloop import CallStatus, Outcome, Phase, ScriptedProvider, Session
from trioloop.durable.decisions import ReviewDecision, decision_slot, seal_decision
from trioloop.durable.journal import decode_entries
from trioloop.durable.review_view import ReviewView, waiting_review
from trioloop.durable.signing import JournalSigner
from trioloop.providers.scripted import ScriptedCall, ScriptStep
from trioloop.stores import open_store
from trioloop.web.worker import WorkerEvent, add_worker_arguments, run_worker
from trioloop.web.worker_app import AppLoadError, WorkerApp, load_app

ROOT = Path(__file__).resolve().parent.parent
APP_KEY = JournalSigner.generate()  # the app's and the fleet's journal key
SERVER = JournalSigner.generate()  # the inbox server's key, which the fleet accepts
APP = make_app(APP_KEY, SERVER.keys)


class Place:
    """A store (SQLite file or a PostgreSQL database of the test's own), opened as often as a process would."""

    def __init__(self, target: str, folder: Path) -> None:
        self.target = target
        self.folder = folder
        self.stores: list[Any] = []

    def store(self) -> Any:
        store = open_store(self.target)
        self.stores.append(store)
        return store


def _fresh_database(url: str) -> str:
    import psycopg

    name = f"worker_{secrets.token_hex(4)}"
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    return url.rsplit("/", 1)[0] + "/" + name


@pytest.fixture(params=["sqlite", "postgres"])
async def place(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Place]:
    monkeypatch.setenv("TRIOLOOP_TEST_RUNS", str(tmp_path))
    if request.param == "postgres":
        target = _fresh_database(request.getfixturevalue("postgres_url"))
    else:
        target = str(tmp_path / "journal.db")
    where = Place(target, tmp_path)
    yield where
    for store in where.stores:
        await store.close()


@pytest.fixture
async def pg_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, postgres_url: str) -> AsyncIterator[Place]:  # noqa: F811
    monkeypatch.setenv("TRIOLOOP_TEST_RUNS", str(tmp_path))
    where = Place(_fresh_database(postgres_url), tmp_path)
    yield where
    for store in where.stores:
        await store.close()


# -- the app's side: a turn suspended in review, and the inbox's side: decisions posted -------------------------


TWO_CARDS = (("c1", "append_line", {"line": "a"}), ("c2", "append_line", {"line": "b"}))


def _calls(*calls: tuple[str, str, dict[str, Any]]) -> ScriptStep:
    return ScriptStep(tool_calls=tuple(ScriptedCall(id=cid, name=name, input=args) for cid, name, args in calls))


async def _open(store: Any, session_id: str, steps: list[ScriptStep], provider: ScriptedProvider) -> Session[str]:
    return await open_note(
        store, provider, session_id, signer=APP_KEY, keys=SERVER.keys, kind=NOTE, tools=TOOLS, wait_s=5
    )


async def _suspend_in_review(store: Any, session_id: str, *cards: tuple[str, str, dict[str, Any]]) -> None:
    """The app: a turn whose model asks for ``cards`` (default: one line), suspended while they wait."""
    step = _calls(*(cards or (("c1", "append_line", {"line": f"{session_id} one"}),)))
    async with (
        ScriptedProvider([step]) as provider,
        await _open(store, session_id, [step], provider) as session,
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(session.send, "edit the note")
        await _until_review(session)
        await session.suspend()


async def _until_review(session: Session[str]) -> None:
    async with aclosing(session.states()) as states:  # type: ignore[type-var]
        async for state in states:
            if state.phase is Phase.AWAITING_APPROVAL:
                return


async def _view(store: Any, session_id: str) -> ReviewView:
    view = waiting_review(session_id, decode_entries(await store.read(session_id)))
    assert view is not None
    return view


async def _decide(store: Any, session_id: str, *card_ids: str, action: str = "approve") -> None:
    """The inbox: a signed decision posted for each card named (every waiting card when none is)."""
    view = await _view(store, session_id)
    for card in view.cards:
        if card.status != "waiting" or (card_ids and card.call_id not in card_ids):
            continue
        decision = ReviewDecision(
            session_id=session_id,
            turn_id=view.turn_id,
            call_id=card.call_id,
            digest=card.digest,
            action=action,  # type: ignore[arg-type]
            reviewer="ada",
            reviewer_name="Ada",
        )
        won, _ = await store.post_decision(
            session_id, decision_slot(view.turn_id, card.call_id), seal_decision(decision, SERVER)
        )
        assert won


def _kinds(store_entries: Any) -> list[str]:
    return [entry.kind for entry in decode_entries(store_entries)]


async def _work(
    store: Any, until: Callable[[list[WorkerEvent]], bool], app: WorkerApp = APP, **options: Any
) -> list[WorkerEvent]:
    """Run a worker in this process until ``until(events)`` holds (bounded), then stop it gracefully."""
    events: list[WorkerEvent] = []
    stop = trio.Event()

    def heard(event: WorkerEvent) -> None:
        events.append(event)
        if until(events):
            stop.set()

    options = {"poll_s": 0.01, "scan_s": 0.1, **options}
    with trio.fail_after(20):
        await run_worker(store, app, stop=stop, on_event=heard, **options)
    return events


def _done(session_id: str, *kinds: str) -> Callable[[list[WorkerEvent]], bool]:
    return lambda events: any(e.session_id == session_id and e.kind in kinds for e in events)


# -- in one process --------------------------------------------------------------------------------------------


async def test_a_decided_session_is_carried_to_its_next_review_and_suspended_there(place: Place) -> None:
    app_store, worker_store = place.store(), place.store()
    await _suspend_in_review(app_store, "again-1")
    await _decide(app_store, "again-1")
    events = await _work(worker_store, _done("again-1", "suspended", "settled", "error"))
    assert [e.kind for e in events if e.session_id == "again-1"] == ["carrying", "suspended"], events
    assert runs(place.folder) == ["again-1 one"]  # the approved call ran once; the next one waits for review
    kinds = _kinds(await app_store.read("again-1"))
    assert kinds.count("resume") == 1 and kinds.count("start") == 1 and kinds[-2:] == ["suspend", "seal"], kinds
    view = await _view(app_store, "again-1")
    assert view.suspended and [c.call_id for c in view.waiting] == ["c2"]
    (record,) = await app_store.decisions("again-1")
    assert record.status == "applied" and "approved by Ada (ada)" in record.note


async def test_a_decided_session_whose_turn_ends_is_settled(place: Place) -> None:
    app_store, worker_store = place.store(), place.store()
    await _suspend_in_review(
        app_store, "settle-1", ("c1", "append_line", {"line": "a"}), ("c2", "append_line", {"line": "b"})
    )
    await _decide(app_store, "settle-1", "c1")
    await _decide(app_store, "settle-1", "c2", action="deny")
    events = await _work(worker_store, _done("settle-1", "suspended", "settled", "error"))
    assert [(e.kind, e.detail) for e in events if e.session_id == "settle-1"][-1] == ("settled", "completed")
    assert runs(place.folder) == ["a"]
    assert [r.status for r in await app_store.decisions("settle-1")] == ["applied", "applied"]
    async with ScriptedProvider([]) as provider, await _open(app_store, "settle-1", [], provider) as session:
        assert not session.suspended and session.document == "a\n"
        assert session.state is not None and session.state.outcome is Outcome.COMPLETED
        assert session.state.call("c2").status is CallStatus.DENIED


async def test_a_card_still_undecided_leaves_the_session_as_it_was(place: Place) -> None:
    app_store, worker_store = place.store(), place.store()
    await _suspend_in_review(
        app_store, "settle-2", ("c1", "append_line", {"line": "a"}), ("c2", "append_line", {"line": "b"})
    )
    await _decide(app_store, "settle-2", "c1")
    before = await app_store.read("settle-2")
    events = await _work(worker_store, _done("settle-2", "waiting", "suspended", "settled", "error"))
    assert [e.kind for e in events if e.session_id == "settle-2"] == ["carrying", "waiting"]
    assert await app_store.read("settle-2") == before and runs(place.folder) == []  # nothing written, nothing run
    (record,) = await app_store.decisions("settle-2")
    assert record.status == "waiting"  # not taken: it applies once the other card is decided too
    # The lease was released: the second decision comes, and a worker carries the turn on.
    await _decide(app_store, "settle-2", "c2")
    events = await _work(worker_store, _done("settle-2", "suspended", "settled", "error"))
    assert events[-1].kind == "settled" and sorted(runs(place.folder)) == ["a", "b"]


async def test_a_session_held_by_its_app_is_left_to_it(place: Place) -> None:
    app_store, worker_store = place.store(), place.store()
    step = _calls(("c1", "append_line", {"line": "held"}))
    async with ScriptedProvider([step, ScriptStep(text="Done.")]) as provider:
        session = await _open(app_store, "settle-3", [step], provider)
        session.decision_poll_s = 0.3  # the app's own listener, slower than the worker's poll
        async with session, trio.open_nursery() as nursery:
            done: list[Any] = []

            async def drive() -> None:
                done.append(await session.send("add held"))

            nursery.start_soon(drive)
            await _until_review(session)
            await _decide(app_store, "settle-3")
            events = await _work(worker_store, _done("settle-3", "locked", "carrying"))
    assert [e.kind for e in events if e.session_id == "settle-3"][:1] == ["locked"]
    assert "carrying" not in [e.kind for e in events]
    (final,) = done
    assert final.outcome is Outcome.COMPLETED and runs(place.folder) == ["held"]
    assert final.call("c1").decided_by.reviewer == "ada"


async def test_the_app_hands_its_session_to_the_fleet_and_takes_it_back(place: Place) -> None:
    app_store, worker_store = place.store(), place.store()
    await _suspend_in_review(app_store, "again-2")  # the app suspends and closes
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: _work(worker_store, _done("again-2", "suspended", "error")))
        await _decide(app_store, "again-2")  # while the fleet is up
    # The app opens its session again: the turn the fleet carried on waits at its next card.
    async with (
        ScriptedProvider([ScriptStep(text="Done.")]) as provider,
        await _open(app_store, "again-2", [], provider) as session,
    ):
        assert session.suspended and session.document == "again-2 one\n"
        assert session.state is not None
        assert [c.id for c in session.state.current_calls if c.status is CallStatus.PENDING] == ["c2"]
        session.approve("c2")
        final = await session.continue_turn()
    assert final.outcome is Outcome.COMPLETED and session.document == "again-2 one\nagain-2 two\n"
    assert runs(place.folder) == ["again-2 one", "again-2 two"]


# -- the app, as the command loads it --------------------------------------------------------------------------


def test_the_app_is_loaded_from_module_and_factory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    key = tmp_path / "key"
    APP_KEY.save(key)
    monkeypatch.setenv("TRIOLOOP_TEST_APP_KEY", str(key))
    app = load_app("tests.worker_app:app")
    assert app.kind is NOTE and app.keys is None
    assert app.with_keys(SERVER.keys).keys is not None
    for spec, expected in [
        ("tests.worker_app", "module:factory"),
        ("tests.no_such_module:app", "no module named"),
        ("tests.worker_app:missing", "no attribute"),
        ("tests.worker_app:TOOLS", "not callable"),
        ("tests.worker_app:not_an_app", "not a WorkerApp"),
    ]:
        with pytest.raises(AppLoadError, match=expected):
            load_app(spec)


def test_the_command_takes_its_options() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    add_worker_arguments(parser)
    args = parser.parse_args(["--app", "m:f", "--store", "x.db", "--key", "K", "--once", "--max-sessions", "3"])
    assert (args.app, args.store, args.key, args.once, args.max_sessions) == ("m:f", "x.db", ["K"], True, 3)
    with pytest.raises(SystemExit):
        parser.parse_args(["--store", "x.db"])


# -- a fleet of processes --------------------------------------------------------------------------------------


def _spawn(place: Place, *more: str) -> subprocess.Popen[bytes]:
    key = place.folder / "app-key"
    if not key.exists():
        APP_KEY.save(key)
    command = [sys.executable, "-m", "trioloop.web.worker", "--app", "tests.worker_app:app", "--store", place.target]
    command += ["--key", SERVER.public_key_text, "--poll-s", "0.02", "--scan-s", "0.2", "-v", *more]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRIOLOOP_TEST_APP_KEY": str(key)}
    with (place.folder / f"worker-{secrets.token_hex(3)}.log").open("wb") as log:
        return subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)


async def _wait_for(condition: Callable[[], Any], timeout_s: float = 30) -> None:
    """Poll ``condition`` (what other processes did: a file, the database) until it holds, bounded."""
    with trio.fail_after(timeout_s):
        while not await condition():  # noqa: ASYNC110 -- reason: the condition is another process's; no event to wait on
            await trio.sleep(0.05)


async def test_three_workers_share_a_fleet_and_carry_every_session_once(pg_place: Place) -> None:
    store = pg_place.store()
    ids = [f"settle-{n}" for n in range(20)]
    for session_id in ids:
        await _suspend_in_review(store, session_id)
    workers = [_spawn(pg_place) for _ in range(3)]
    try:
        for session_id in ids:
            await _decide(store, session_id)

        async def all_settled() -> bool:
            for session_id in ids:
                kinds = _kinds(await store.read(session_id))
                if "suspend" in kinds[kinds.index("resume") :] if "resume" in kinds else True:
                    return False
                if kinds[-1] not in ("seal", "snapshot"):
                    return False
            for session_id in ids:
                if [r.status for r in await store.decisions(session_id)] != ["applied"]:
                    return False
            return sorted(runs(pg_place.folder)) == sorted(f"{sid} one" for sid in ids)

        await _wait_for(all_settled)
    finally:
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        codes = [worker.wait(timeout=30) for worker in workers]
    assert codes == [0, 0, 0]
    assert sorted(runs(pg_place.folder)) == sorted(f"{sid} one" for sid in ids)  # every approved call ran once
    for session_id in ids:
        kinds = _kinds(await store.read(session_id))
        assert kinds.count("resume") == 1 and kinds.count("start") == 1, (session_id, kinds)
        async with ScriptedProvider([]) as provider, await _open(store, session_id, [], provider) as session:
            assert session.state is not None and session.state.outcome is Outcome.COMPLETED
            assert session.document == f"{session_id} one\n"


async def test_a_worker_killed_mid_tool_is_taken_over_and_nothing_runs_twice(place: Place) -> None:
    store = place.store()
    await _suspend_in_review(store, "block-1", ("b1", "block", {"tag": "b1"}))
    worker = _spawn(place)
    try:
        await _decide(store, "block-1")

        async def started() -> bool:
            return runs(place.folder) == ["started b1"]

        await _wait_for(started)
    finally:
        worker.kill()  # SIGKILL, mid-tool
        worker.wait(timeout=30)
    # Another worker finds the turn in flight that nobody holds, and takes it up.
    events = await _work(place.store(), _done("block-1", "settled", "suspended", "error"))
    # Found by the orphan scan, or by its decision record: the worker was killed before the turn, going on, could
    # answer it applied (it is answered once a process sees the decision journaled).
    seen = [(e.kind, e.detail) for e in events if e.session_id == "block-1"]
    assert seen in (
        [("carrying", "orphan"), ("settled", "completed")],
        [("carrying", "decision"), ("settled", "completed")],
    ), events
    assert runs(place.folder) == ["started b1"]  # never a second time
    async with ScriptedProvider([]) as provider, await _open(store, "block-1", [], provider) as session:
        assert session.state is not None and session.state.outcome is Outcome.COMPLETED
        call = session.state.call("b1")
        assert call is not None and call.status is CallStatus.FAILED
        told = [
            block.content
            for message in session.history
            for block in message.content
            if getattr(block, "call_id", None) == "b1" and hasattr(block, "is_error")
        ]
        assert told and "interrupted" in str(told[0]).lower(), told
