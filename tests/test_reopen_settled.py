"""Reopening a signed, verified journal whose last turn settled before its newest snapshot does not replay that turn:
the session comes back from the snapshot, and its last state (`Session.state`) is replayed when first read. For any
session (turns that append, are denied, allowed for good, only talk; undone, redone), the deferred reading is the
full replay field for field, and the state read later is the state the full replay gives. A snapshot does not hold
what could be redone: a last turn with an undo or redo between its submit and the snapshot is replayed whole. An
unsigned journal (or one opened without a key that verifies it) is replayed whole at open, as before.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_forks import NOTE, TOOLS, appending, send
from test_journal_integrity import resealed_with

from trioloop import JournalError, MemoryJournalStore, Outcome, ScriptedProvider, Session
from trioloop.durable import replay
from trioloop.durable.document_form import DocumentCodec
from trioloop.durable.journal import JournalEntry, decode_entries, decode_entry, encode_entry
from trioloop.durable.replay import Replayed, replay_journal
from trioloop.durable.signing import JournalSigner, head_message
from trioloop.durable.store import StoredEntry
from trioloop.machine.tools import create_tool_registry
from trioloop.machine.transaction import turn_undo_availability
from trioloop.providers.scripted import ScriptStep

#: The fields a deferred reading shares with the full replay: all but the state, ``replayed``, the fold, the
#: machine time a live turn had reached at its last iteration (``advanced_machine_ms``: there is no live turn), and
#: of the undo history, which turns left it before the snapshot (``retired``: a snapshot does not record them, and a
#: full replay forgets them too for every turn before the snapshot it starts from; they answer only for a turn
#: before the last, and the session asks only about its last turn, `Session.undo_availability`).
SHARED = ("messages", "document", "last_turn_id", "turn_count", "model", "live", "last_seq", "last_hash")
UNDO = ("entries", "redo", "max_entries", "undone_last")
SHARED_TOO = ("kind", "source", "usage", "rules", "card_digests", "suspended_machine_ms", "suspended_review_ms")

#: One turn of a plan: what the model and the person do (append, approved; append, allowed for good; append,
#: denied; talk only) and what the person does after it (nothing, undo, undo then redo).
TURN = st.tuples(st.sampled_from(["append", "always", "deny", "talk"]), st.sampled_from(["", "undo", "redo"]))


def _registry() -> Any:
    return create_tool_registry(TOOLS)


def _both(entries: list[Any]) -> tuple[Replayed[Any], Replayed[Any]]:
    codec = DocumentCodec.of(NOTE)
    kw: dict[str, Any] = {"load_document": NOTE.load, "registry": _registry(), "load_data": codec.from_data}
    return replay_journal(entries, **kw), replay_journal(entries, defer_settled=True, **kw)


async def _run(store: Any, signer: JournalSigner | None, plan: list[tuple[str, str]]) -> None:
    script: list[ScriptStep] = []
    for number, (action, _) in enumerate(plan, 1):
        script += appending(f"c{number}", f"line {number}") if action != "talk" else [ScriptStep(text="Hello.")]
    deny = frozenset(f"c{n}" for n, (action, _) in enumerate(plan, 1) if action == "deny")
    always = frozenset(f"c{n}" for n, (action, _) in enumerate(plan, 1) if action == "always")
    async with ScriptedProvider(script) as provider:
        session = await Session.open(
            store, "s", kind=NOTE, provider=provider, tools=TOOLS, model="m", document="", signer=signer
        )
        async with session:
            for number, (action, after) in enumerate(plan, 1):
                assert await send(session, f"turn {number}", deny, always) is Outcome.COMPLETED
                if after and action in ("append", "always"):  # (a turn that changed nothing has nothing to undo)
                    assert await session.undo()
                if after == "redo" and action in ("append", "always"):
                    assert session.redo_last_undo() is not None


async def _reopen(store: Any, signer: JournalSigner | None) -> Session[str]:
    async with ScriptedProvider([]) as provider:
        return await Session.open(store, "s", kind=NOTE, provider=provider, tools=TOOLS, signer=signer)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=st.lists(TURN, min_size=1, max_size=4))
def test_for_any_session_the_deferred_reading_is_the_full_replay(plan: list[tuple[str, str]]) -> None:
    async def scenario() -> None:
        store, signer = MemoryJournalStore(), JournalSigner.generate()
        await _run(store, signer, plan)
        entries = decode_entries(await store.read("s"))
        full, deferred = _both(entries)
        for name in (*SHARED, *SHARED_TOO):
            assert getattr(deferred, name) == getattr(full, name), name
        for name in UNDO:
            assert getattr(deferred.undo, name) == getattr(full.undo, name), name
        assert full.settled_state is None and full.state is not None
        if deferred.settled_state is None:  # no snapshot after the last turn: replayed whole, as before
            assert deferred.state == full.state and deferred.replayed == full.replayed
        else:
            assert deferred.state is None and deferred.replayed < full.replayed
            assert deferred.settled_state() == full.state
        session = await _reopen(store, signer)
        async with session:
            assert session.state == full.state
            assert (session.document, session.history, session.rules) == (full.document, full.messages, full.rules)
            assert session.undo_availability() is turn_undo_availability(full.undo, full.last_turn_id or "")

    trio.run(scenario)


@pytest.fixture
def folds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many times a settled last turn was folded (``trioloop.durable.replay._fold_state``, counted)."""
    seen: list[int] = []
    real = replay._fold_state

    def counting(*args: Any) -> Any:
        seen.append(1)
        return real(*args)

    monkeypatch.setattr(replay, "_fold_state", counting)
    return seen


async def test_a_reopened_session_replays_its_settled_turn_only_when_its_state_is_read(folds: list[int]) -> None:
    store, signer = MemoryJournalStore(), JournalSigner.generate()
    await _run(store, signer, [("append", "")])
    assert decode_entry((await store.read("s"))[-2].data).kind == "snapshot"  # the turn's closing snapshot
    session = await _reopen(store, signer)
    async with session:
        assert folds == [] and session.document == "line 1\n"
        state = session.state
        assert folds == [1] and state is not None and state.outcome is Outcome.COMPLETED
        assert session.state is state and folds == [1]  # once
    # A session that goes on without looking back never replays it.
    async with ScriptedProvider(appending("c2", "line 2")) as provider:
        session = await Session.open(store, "s", kind=NOTE, provider=provider, tools=TOOLS, signer=signer)
        async with session:
            assert await send(session, "again") is Outcome.COMPLETED
            assert session.document == "line 1\nline 2\n" and session.state is not None
            assert session.state.turn_id == "turn-2"
    assert folds == [1]


async def test_an_unsigned_journal_is_replayed_whole_at_open(folds: list[int]) -> None:
    store = MemoryJournalStore()
    await _run(store, None, [("append", "")])
    session = await _reopen(store, None)
    async with session:
        assert session.journal_integrity is not None and not session.journal_integrity.verified
        assert folds == [] and session.state is not None and session.state.outcome is Outcome.COMPLETED
    # So a malformed entry of its last turn is refused at open.
    rows = list(await store.read("s"))
    index = next(i for i, row in enumerate(rows) if decode_entry(row.data).kind == "start")
    entry = decode_entry(rows[index].data)
    rows[index] = StoredEntry(entry.seq, encode_entry(entry.seq, "start", entry.prev, entry.at_ms, {"call_id": 7}))
    other = await _stored(_rechained(rows, None))
    with pytest.raises(JournalError, match="lacks a valid 'call_id'"):
        await _reopen(other, None)


async def test_a_settled_turn_its_signer_wrote_unreadable_opens_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    """Only the key's holder can sign a last turn the fold cannot read (trioloop's writer never does): the session
    opens from its snapshot, shows no last state, and the log says why."""
    store, signer = MemoryJournalStore(), JournalSigner.generate()
    await _run(store, signer, [("append", "")])
    rows = list(await store.read("s"))
    index = next(i for i, row in enumerate(rows) if decode_entry(row.data).kind == "start")
    entry = decode_entry(rows[index].data)
    rows[index] = StoredEntry(entry.seq, encode_entry(entry.seq, "start", entry.prev, entry.at_ms, {"call_id": 7}))
    other = await _stored(_rechained(rows, signer))
    session = await _reopen(other, signer)
    async with session:
        assert session.document == "line 1\n"
        with caplog.at_level(logging.ERROR, logger="trioloop.journal"):
            assert session.state is None
        assert "could not be replayed" in caplog.text and "lacks a valid 'call_id'" in caplog.text


async def _stored(entries: list[StoredEntry]) -> MemoryJournalStore:
    store = MemoryJournalStore()
    lease = await store.acquire("s", wait_s=0)
    await lease.append(entries)
    await lease.release()
    return store


def _rechained(rows: list[StoredEntry], signer: JournalSigner | None) -> list[StoredEntry]:
    """The entries chained again (and each seal signed again by ``signer``), as the key's holder could; an entry that
    does not decode is kept as it is (`resealed_with`)."""

    def seal(seq: int, prev: str, entry: JournalEntry) -> dict[str, Any]:
        fields = dict(entry.data)
        if signer is not None:
            fields["sig"] = signer.sign(head_message(fields["session"], seq - 1, prev, entry.at_ms))
        return fields

    return [StoredEntry(seq, raw) for seq, raw in resealed_with([(row.seq, row.data) for row in rows], seal)]
