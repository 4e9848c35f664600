"""Decisions made away from the session's process reach its turn only once proven (trioloop.runtime.remote_review).

A reviewer's signed record in the store's decision box is applied by the process that holds the session, as a
click naming its reviewer, only when: signed by a key the session accepts, for this session, turn and card, with
the card's current digest, and (for an edit) an input the tool accepts. Anything else is refused in the box with
the reason, and no tool runs.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from note_tools import NOTE, RUNS, TOOLS, fresh_runs, open_note  # noqa: F401 -- fresh_runs: autouse
from pg_support import postgres_url  # noqa: F401 -- the session fixture, reached by name (getfixturevalue)

from trioloop import (
    Outcome,
    Phase,
    ScriptedProvider,
    Session,
)
from trioloop.durable.decisions import ReviewDecision, decision_slot, seal_decision
from trioloop.durable.journal import decode_entries
from trioloop.durable.review_view import waiting_review
from trioloop.durable.signing import JournalSigner
from trioloop.durable.store import MemoryJournalStore
from trioloop.providers.scripted import ScriptedCall, ScriptStep
from trioloop.stores import PostgresJournalStore, SQLiteJournalStore

APP = JournalSigner.generate()  # the app's own journal key
SERVER = JournalSigner.generate()  # the inbox server's key, which the app accepts
STRANGER = JournalSigner.generate()  # a key nobody accepts


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], Any]:
    if request.param == "memory":
        shared = MemoryJournalStore()
        return lambda: shared
    if request.param == "sqlite":
        return lambda: SQLiteJournalStore(tmp_path / "j.db")
    url: str = request.getfixturevalue("postgres_url")
    import psycopg

    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute("DROP TABLE IF EXISTS trioloop_journal")
        admin.execute("DROP TABLE IF EXISTS trioloop_decisions")
    return lambda: PostgresJournalStore(url)


async def _open(store: Any, provider: ScriptedProvider, session_id: str = "s1", **kw: Any) -> Session[str]:
    return await open_note(store, provider, session_id, signer=APP, keys=kw.pop("keys", SERVER.keys), **kw)


async def _close(store: Any) -> None:
    close = getattr(store, "close", None)
    if close is not None:
        await close()


def _step(*calls: tuple[str, str, dict[str, Any]]) -> ScriptStep:
    return ScriptStep(tool_calls=tuple(ScriptedCall(id=cid, name=name, input=args) for cid, name, args in calls))


async def _waiting(store: Any, session_id: str = "s1") -> Any:
    view = waiting_review(session_id, decode_entries(await store.read(session_id)))
    assert view is not None
    return view


def _record(view: Any, card_id: str, signer: JournalSigner = SERVER, **changes: Any) -> bytes:
    card = next(c for c in view.cards if c.call_id == card_id)
    fields: dict[str, Any] = {
        "session_id": view.session_id,
        "turn_id": view.turn_id,
        "call_id": card_id,
        "digest": card.digest,
        "action": "approve",
        "reviewer": "ada",
        "reviewer_name": "Ada",
    }
    fields.update(changes)
    return seal_decision(ReviewDecision(**fields), signer)


async def _suspend_with_cards(store: Any, steps: list[ScriptStep], session_id: str = "s1") -> None:
    async with (
        ScriptedProvider(steps) as provider,
        await _open(store, provider, session_id) as session,
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(session.send, "edit the note")
        async with aclosing(session.states()) as states:
            async for state in states:
                if state.phase is Phase.AWAITING_APPROVAL:
                    break
        await session.suspend()


async def test_a_live_review_takes_a_decision_from_the_inbox_naming_its_reviewer(make_store: Any) -> None:
    store = make_store()
    steps = [_step(("c1", "append_line", {"line": "hello"})), ScriptStep(text="Done.")]
    try:
        async with ScriptedProvider(steps) as provider, await _open(store, provider) as session:
            session.decision_poll_s = 0.01
            async with trio.open_nursery() as nursery:
                done: list[Any] = []

                async def drive() -> None:
                    done.append(await session.send("add hello"))

                nursery.start_soon(drive)
                async with aclosing(session.states()) as states:
                    async for state in states:
                        if state.phase is Phase.AWAITING_APPROVAL:
                            break
                view = await _waiting(store)
                assert [c.summary for c in view.cards] == ["Append 'hello'"] and not view.suspended
                won, _ = await store.post_decision("s1", decision_slot(view.turn_id, "c1"), _record(view, "c1"))
                assert won
            (final,) = done
        assert final.outcome is Outcome.COMPLETED and RUNS == ["hello"]
        call = final.call("c1")
        assert call.decided_by.reviewer == "ada" and call.decided_by.describe() == "approved by ada"
        (record,) = await store.decisions("s1")
        assert record.status == "applied" and "approved by Ada (ada)" in record.note and SERVER.key_id in record.note
        approve = next(e for e in decode_entries(await store.read("s1")) if e.kind == "approve")
        assert approve.data["by"] == "ada" and approve.data["reviewer"] == "ada"
        assert approve.data["decision"] == json.loads(record.data)  # the signed record, kept for the audit
        assert await store.sessions_with_waiting_decisions() == []
    finally:
        await _close(store)


async def test_a_suspended_review_takes_decisions_when_a_process_takes_it_up(make_store: Any) -> None:
    store = make_store()
    steps = [
        _step(("c1", "append_line", {"line": "one"}), ("c2", "erase", {})),
        ScriptStep(text="Done."),
    ]
    try:
        await _suspend_with_cards(store, steps)
        view = await _waiting(store)
        assert view.suspended and [c.destructive for c in view.cards] == [False, True]
        raw_edit = _record(view, "c1", edited_input={"line": "ONE"})
        raw_deny = _record(view, "c2", action="deny", reason="keep it", reviewer="bob")
        await store.post_decision("s1", decision_slot(view.turn_id, "c1"), raw_edit)
        await store.post_decision("s1", decision_slot(view.turn_id, "c2"), raw_deny)
        assert await store.sessions_with_waiting_decisions() == ["s1"]
        async with ScriptedProvider(steps[1:]) as provider, await _open(store, provider) as session:
            taken = await session.take_decisions()
            assert [t.applied for t in taken] == [True, True], taken
            final = await session.continue_turn()
        assert final.outcome is Outcome.COMPLETED and RUNS == ["ONE"]
        assert final.call("c2").decided_by.describe() == "denied by bob"
        assert session.document == "ONE\n"
        assert [r.status for r in await store.decisions("s1")] == ["applied", "applied"]
    finally:
        await _close(store)


async def _refused_note(store: Any, raw: bytes, slot: str, *, session_id: str = "s1") -> str:
    await store.post_decision(session_id, slot, raw)
    opening = _open(store, provider := ScriptedProvider([ScriptStep(text="Done.")]), session_id)
    async with provider, await opening as session:
        taken = await session.take_decisions()
        assert [t.applied for t in taken] == [False]
        assert session.suspended and all(c.status.value == "pending" for c in session.state.current_calls)
    assert RUNS == []
    (record,) = [r for r in await store.decisions(session_id) if r.data == raw]
    assert record.status == "refused"
    return record.note


@pytest.mark.parametrize(
    ("build", "expected"),
    [
        (lambda v: _record(v, "c1", signer=STRANGER), "does not accept"),
        (lambda v: _record(v, "c1", digest="0" * 64), "input changed"),
        (lambda v: _record(v, "c1", turn_id="turn-9"), "turn it was made for is over"),
        (lambda v: _record(v, "c1", session_id="s2"), "another session"),
        (lambda v: _record(v, "c1", call_id="c9"), "no such card"),
        (lambda v: _record(v, "c1", edited_input={"line": 5}), "not valid"),
        (lambda v: _record(v, "c2", always="tool"), "never approves a destructive call"),
    ],
)
async def test_a_record_that_does_not_prove_its_decision_decides_nothing(
    build: Callable[[Any], bytes], expected: str
) -> None:
    store = MemoryJournalStore()
    await _suspend_with_cards(store, [_step(("c1", "append_line", {"line": "one"}), ("c2", "erase", {}))])
    view = await _waiting(store)
    raw = build(view)
    value = json.loads(raw)
    note = await _refused_note(store, raw, decision_slot(value["turn_id"], value["call_id"]))
    assert expected in note


async def test_a_record_moved_to_another_session_is_refused_there() -> None:
    store = MemoryJournalStore()
    steps = [_step(("c1", "append_line", {"line": "one"}))]
    await _suspend_with_cards(store, steps, "s1")
    await _suspend_with_cards(store, steps, "s2")
    raw = _record(await _waiting(store, "s1"), "c1")  # made for s1, posted under s2 (same turn and call ids)
    value = json.loads(raw)
    note = await _refused_note(store, raw, decision_slot(value["turn_id"], "c1"), session_id="s2")
    assert "another session" in note


async def test_a_session_that_accepts_no_other_key_refuses_the_inbox() -> None:
    store = MemoryJournalStore()
    await _suspend_with_cards(store, [_step(("c1", "append_line", {"line": "one"}))])
    view = await _waiting(store)
    await store.post_decision("s1", decision_slot(view.turn_id, "c1"), _record(view, "c1"))
    async with ScriptedProvider([]) as provider, await _open(store, provider, keys=None) as session:
        (taken,) = await session.take_decisions()
    assert not taken.applied and "does not accept" in taken.note and RUNS == []


async def test_a_record_applied_once_cannot_be_replayed() -> None:
    store = MemoryJournalStore()
    steps = [_step(("c1", "append_line", {"line": "one"})), ScriptStep(text="Done.")]
    await _suspend_with_cards(store, steps)
    view = await _waiting(store)
    raw = _record(view, "c1")
    await store.post_decision("s1", decision_slot(view.turn_id, "c1"), raw)
    async with ScriptedProvider(steps[1:]) as provider, await _open(store, provider) as session:
        await session.take_decisions()
        await session.continue_turn()
    assert RUNS == ["one"]
    # The same bytes again, straight into the box (as someone with access to the database could).
    box = store._box()
    (first,) = [r for r, _ in box.values()]
    box[99] = (type(first)(99, "s1", first.slot, raw), 99)
    async with ScriptedProvider([]) as provider, await _open(store, provider) as session:
        (taken,) = await session.take_decisions()  # no turn is live: refused, deciding nothing
        assert not taken.applied and taken.note == "no turn of this session waits for a decision"
    assert RUNS == ["one"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
async def test_for_all_byte_changes_a_record_runs_no_tool_it_did_not_prove(data: st.DataObject) -> None:
    RUNS.clear()
    store = MemoryJournalStore()
    await _suspend_with_cards(store, [_step(("c1", "append_line", {"line": "one"}))])
    view = await _waiting(store)
    raw = _record(view, "c1", action="deny")  # the genuine record denies; a forged approve must never run
    at = data.draw(st.integers(0, len(raw) - 1))
    byte = data.draw(st.integers(0, 255).filter(lambda b: b != raw[at]))
    forged = raw[:at] + bytes([byte]) + raw[at + 1 :]
    await store.post_decision("s1", decision_slot(view.turn_id, "c1"), forged)
    async with ScriptedProvider([ScriptStep(text="ok")]) as provider, await _open(store, provider) as session:
        taken = await session.take_decisions()
        assert not any(t.applied for t in taken)
        assert all(c.status.value == "pending" for c in session.state.current_calls)
    assert RUNS == []


async def test_the_audit_names_the_reviewer_and_proves_their_record() -> None:
    import attrs

    from trioloop.durable.audit import audit_lines, verify_decision_entries, verify_session
    from trioloop.durable.journal import JournalError

    store = MemoryJournalStore()
    steps = [_step(("c1", "append_line", {"line": "one"})), ScriptStep(text="Done.")]
    await _suspend_with_cards(store, steps)
    view = await _waiting(store)
    await store.post_decision("s1", decision_slot(view.turn_id, "c1"), _record(view, "c1", always="input"))
    async with ScriptedProvider(steps[1:]) as provider, await _open(store, provider) as session:
        await session.take_decisions()
        await session.continue_turn()
    stored = await store.read("s1")
    lines = list(audit_lines(stored))
    where = "away from the session (web inbox or decisions document)"
    said = f"decided {where} by reviewer Ada (ada), record signed by key {SERVER.key_id}"
    assert any(line.strip() == said for line in lines), lines
    _, verdict = await verify_session(store, "s1", keys=APP.keys | SERVER.keys, witness=None)
    assert verdict.verdict == "verified", verdict.describe()
    _, verdict = await verify_session(store, "s1", keys=APP.keys, witness=None)  # the server's key not accepted
    assert verdict.verdict == "refused" and "not proven" in verdict.error
    entries = decode_entries(stored)
    keys = APP.keys | SERVER.keys
    assert list(verify_decision_entries(entries, session_id="s1", keys=keys).values()) == [SERVER.key_id]
    at = next(i for i, e in enumerate(entries) if e.kind == "approve")
    for change in ({"by": "mallory", "reviewer": "mallory"}, {"call_id": "c2"}, {"always": None}, {"seen_digest": ""}):
        forged = [*entries]
        forged[at] = attrs.evolve(entries[at], data={**entries[at].data, **change})
        with pytest.raises(JournalError, match="says other than"):
            verify_decision_entries(forged, session_id="s1", keys=keys)
    with pytest.raises(JournalError, match="says other than"):
        verify_decision_entries(entries, session_id="s2", keys=keys)


async def test_postgres_announces_a_decision_so_a_live_review_takes_it_without_waiting_for_a_poll(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trioloop.runtime import remote_review

    monkeypatch.setattr(remote_review, "_NOTIFIED_POLL_S", 600.0)  # only the NOTIFY can wake the session in time
    url: str = request.getfixturevalue("postgres_url")
    steps = [_step(("c1", "append_line", {"line": "hi"})), ScriptStep(text="Done.")]
    async with PostgresJournalStore(url) as store, PostgresJournalStore(url) as server:
        session_id = "notified"
        async with (
            ScriptedProvider(steps) as provider,
            await _open(store, provider, session_id) as session,
            trio.open_nursery() as nursery,
        ):
            done: list[Any] = []
            settled = trio.Event()

            async def drive() -> None:
                done.append(await session.send("add hi"))
                settled.set()

            nursery.start_soon(drive)
            async with aclosing(session.states()) as states:
                async for state in states:
                    if state.phase is Phase.AWAITING_APPROVAL:
                        break
            reads = 0
            read_box = store.decisions

            async def counted(*args: Any, **kw: Any) -> Any:
                nonlocal reads
                reads += 1
                return await read_box(*args, **kw)

            monkeypatch.setattr(store, "decisions", counted)
            await trio.sleep(0.5)  # the session read its (empty) box and waits for a notice, not polling
            assert reads <= 1
            view = await _waiting(server, session_id)
            await server.post_decision(session_id, decision_slot(view.turn_id, "c1"), _record(view, "c1"))
            with trio.fail_after(30):
                await settled.wait()
            assert reads <= 2
        assert done[0].outcome is Outcome.COMPLETED and RUNS == ["hi"]


async def test_decisions_a_suspended_turn_took_are_not_lost_when_it_is_closed_without_going_on() -> None:
    store = MemoryJournalStore()
    steps = [_step(("c1", "append_line", {"line": "one"})), ScriptStep(text="Done.")]
    await _suspend_with_cards(store, steps)
    view = await _waiting(store)
    await store.post_decision("s1", decision_slot(view.turn_id, "c1"), _record(view, "c1"))
    async with ScriptedProvider([]) as provider, await _open(store, provider) as session:
        (taken,) = await session.take_decisions()
        assert taken.applied and taken.deferred  # taken by the suspended turn, not journaled yet
    (record,) = await store.decisions("s1")
    assert record.status == "waiting"  # closed without going on: the next process takes it again
    async with ScriptedProvider(steps[1:]) as provider, await _open(store, provider) as session:
        (taken,) = await session.take_decisions()
        assert taken.applied
        final = await session.continue_turn()
    assert final.outcome is Outcome.COMPLETED and RUNS == ["one"]
    (record,) = await store.decisions("s1")
    assert record.status == "applied" and record.note.endswith(f"applied (key {SERVER.key_id})")
