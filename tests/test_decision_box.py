"""Reviewers' decisions away from the session's process: the signed record, and the store's decision box.

The record proves one decision on one card and nothing else (every field is signed, a key the session does not
accept or a changed byte is refused); the box keeps one decision per card on every store, across processes'
connections, with numbered changes.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from pg_support import postgres_url  # noqa: F401 -- the session fixture, reached by name (getfixturevalue)

from trioloop.durable.decision_box import DecisionBox, has_decision_box
from trioloop.durable.decisions import (
    MAX_DECISION_BYTES,
    DecisionError,
    ReviewDecision,
    decision_slot,
    open_decision,
    seal_decision,
)
from trioloop.durable.signing import JournalKeys, JournalSigner
from trioloop.durable.store import MemoryJournalStore
from trioloop.stores import PostgresJournalStore, SQLiteJournalStore

SIGNER = JournalSigner.generate()
OTHER = JournalSigner.generate()


def _decision(**changes: Any) -> ReviewDecision:
    fields: dict[str, Any] = {
        "session_id": "s1",
        "turn_id": "t1",
        "call_id": "c1",
        "digest": "d" * 64,
        "action": "approve",
        "reviewer": "ada",
        "reviewer_name": "Ada L.",
        "at": 1,
    }
    fields.update(changes)
    return ReviewDecision(**fields)


# --- the record ---------------------------------------------------------------------------------


def test_a_sealed_decision_opens_with_the_key_that_signed_it() -> None:
    decision = _decision(edited_input={"path": "a.txt"}, always="input")
    raw = seal_decision(decision, SIGNER)
    opened, key_id = open_decision(raw, SIGNER.keys)
    assert opened == decision and key_id == SIGNER.key_id
    assert opened.describe() == "approved with an edited input by Ada L. (ada)"


def test_a_decision_signed_by_a_key_the_session_does_not_accept_is_refused() -> None:
    raw = seal_decision(_decision(), OTHER)
    with pytest.raises(DecisionError, match="does not accept"):
        open_decision(raw, SIGNER.keys)
    with pytest.raises(DecisionError, match="does not accept"):
        open_decision(raw, None)
    assert open_decision(raw, SIGNER.keys | OTHER.keys)[1] == OTHER.key_id


SIGNED = ["session_id", "turn_id", "call_id", "digest", "action", "reason", "reviewer", "reviewer_name", "nonce"]


@pytest.mark.parametrize("field", SIGNED)
def test_changing_any_signed_field_breaks_the_signature(field: str) -> None:
    value = json.loads(seal_decision(_decision(action="deny", reason="no"), SIGNER))
    value[field] = "approve" if field == "action" else value[field] + "x"
    raw = json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
    with pytest.raises(DecisionError, match="does not verify"):
        open_decision(raw, SIGNER.keys)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_for_all_single_byte_changes_a_record_decides_nothing_else(data: st.DataObject) -> None:
    decision = _decision(edited_input={"n": 1}, reason="")
    raw = seal_decision(decision, SIGNER)
    at = data.draw(st.integers(0, len(raw) - 1))
    byte = data.draw(st.integers(0, 255).filter(lambda b: b != raw[at]))
    changed = raw[:at] + bytes([byte]) + raw[at + 1 :]
    try:
        opened, _ = open_decision(changed, SIGNER.keys)
    except DecisionError:
        return
    assert opened == decision  # only a change that does not change the decision (there is none) could pass


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda v: v.update(extra=1), "exactly the fields"),
        (lambda v: v.pop("nonce"), "exactly the fields"),
        (lambda v: v.update(v=2), "version"),
        (lambda v: v.update(signature=5), "must be text"),
    ],
)
def test_records_of_the_wrong_shape_are_refused(mutate: Callable[[dict[str, Any]], Any], message: str) -> None:
    value = json.loads(seal_decision(_decision(), SIGNER))
    mutate(value)
    raw = json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
    with pytest.raises(DecisionError, match=message):
        open_decision(raw, SIGNER.keys)


def test_a_record_not_in_canonical_form_or_over_the_cap_is_refused_before_it_is_trusted() -> None:
    raw = seal_decision(_decision(), SIGNER)
    with pytest.raises(DecisionError, match="canonical"):
        open_decision(json.dumps(json.loads(raw), indent=1, sort_keys=True).encode(), SIGNER.keys)
    with pytest.raises(DecisionError, match="cap"):
        open_decision(b" " * (MAX_DECISION_BYTES + 1), SIGNER.keys)
    with pytest.raises(DecisionError, match="cap"):
        seal_decision(_decision(edited_input={"x": "y" * MAX_DECISION_BYTES}), SIGNER)


@pytest.mark.parametrize(
    "changes",
    [
        {"action": "maybe"},
        {"action": "deny", "edited_input": {}},
        {"action": "deny", "always": "input"},
        {"always": "everything"},
        {"reviewer": ""},
        {"turn_id": ""},
        {"reason": "x" * 2001},
        {"edited_input": [1]},
        {"at": -1},
    ],
)
def test_a_decision_that_is_not_one_cannot_be_made(changes: dict[str, Any]) -> None:
    with pytest.raises(DecisionError):
        _decision(**changes)


# --- the box ------------------------------------------------------------------------------------


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def box_factory(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Callable[[], Any]]:
    opened: list[Any] = []
    if request.param == "memory":
        shared = MemoryJournalStore()

        def make() -> Any:
            return shared
    elif request.param == "sqlite":

        def make() -> Any:
            store = SQLiteJournalStore(tmp_path / "j.db")
            opened.append(store)
            return store
    else:
        url: str = request.getfixturevalue("postgres_url")
        import psycopg

        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute("DROP TABLE IF EXISTS trioloop_decisions")

        def make() -> Any:
            store = PostgresJournalStore(url)
            opened.append(store)
            return store

    yield make
    for store in opened:
        await store.close()


async def test_every_store_has_a_decision_box(box_factory: Callable[[], Any]) -> None:
    store = box_factory()
    assert has_decision_box(store) and isinstance(store, DecisionBox)
    assert await store.decisions("s1") == [] and await store.sessions_with_waiting_decisions() == []


async def test_one_decision_per_card_and_a_refused_one_frees_the_card(box_factory: Callable[[], Any]) -> None:
    store: DecisionBox = box_factory()
    slot = decision_slot("t1", "c1")
    first = seal_decision(_decision(), SIGNER)
    second = seal_decision(_decision(action="deny", reviewer="bob"), SIGNER)
    won, posted = await store.post_decision("s1", slot, first)
    assert won and posted.data == first and posted.status == "waiting"
    won, holder = await store.post_decision("s1", slot, second)
    assert not won and holder.id == posted.id and holder.data == first  # the loser learns who won
    assert await store.sessions_with_waiting_decisions() == ["s1"]
    # Another card, another session: independent.
    assert (await store.post_decision("s1", decision_slot("t1", "c2"), second))[0]
    assert (await store.post_decision("s2", slot, second))[0]
    assert await store.answer_decision(posted.id, "refused", "the card was decided in the terminal")
    assert not await store.answer_decision(posted.id, "applied")  # only from waiting
    won, again = await store.post_decision("s1", slot, second)
    assert won and again.id != posted.id
    records = await store.decisions("s1")
    assert [r.status for r in records] == ["refused", "waiting", "waiting"]
    assert records[0].note == "the card was decided in the terminal"
    assert [r.id for r in await store.decisions("s1", waiting_only=True)] == [records[1].id, records[2].id]
    assert await store.answer_decision(again.id, "applied")
    won, holder = await store.post_decision("s1", slot, first)
    assert not won and holder.id == again.id and holder.status == "applied"


async def test_changes_are_numbered_so_a_page_reads_only_what_changed(box_factory: Callable[[], Any]) -> None:
    store: DecisionBox = box_factory()
    latest, changed = await store.decision_changes()
    assert (latest, list(changed)) == (0, [])
    _, one = await store.post_decision("s1", "a", seal_decision(_decision(), SIGNER))
    _, two = await store.post_decision("s1", "b", seal_decision(_decision(call_id="c2"), SIGNER))
    latest, changed = await store.decision_changes()
    assert latest == 2 and [r.id for r in changed] == [one.id, two.id]
    await store.answer_decision(one.id, "applied")
    latest2, changed = await store.decision_changes(latest)
    assert latest2 == 3 and [(r.id, r.status) for r in changed] == [(one.id, "applied")]
    assert list((await store.decision_changes(latest2))[1]) == []


async def test_two_connections_posting_on_one_card_at_once_one_wins(box_factory: Callable[[], Any]) -> None:
    stores = [box_factory() for _ in range(6)]
    await stores[0].decisions("s1")  # the file and its tables exist before the race (opening is not what is raced)
    results: list[tuple[bool, Any]] = []

    async def post(store: DecisionBox, n: int) -> None:
        raw = seal_decision(_decision(reviewer=f"r{n}"), SIGNER)
        results.append(await store.post_decision("s1", "slot", raw))

    async with trio.open_nursery() as nursery:
        for n, store in enumerate(stores):
            nursery.start_soon(post, store, n)
    winners = [posted for won, posted in results if won]
    assert len(winners) == 1
    assert all(posted.id == winners[0].id for _, posted in results)
    assert len(await stores[0].decisions("s1")) == 1


async def test_a_record_over_the_cap_in_the_database_is_never_read(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    async with SQLiteJournalStore(path) as store:
        await store.post_decision("s1", "a", seal_decision(_decision(), SIGNER))
    with sqlite3.connect(path) as raw:
        raw.execute("UPDATE trioloop_decisions SET data = zeroblob(?)", (MAX_DECISION_BYTES + 1,))
    async with SQLiteJournalStore(path) as store:
        (record,) = await store.decisions("s1")
        assert record.data == b"" and record.status == "refused" and "size cap" in record.note
        with pytest.raises(DecisionError, match="cap"):
            await store.post_decision("s1", "b", b"x" * (MAX_DECISION_BYTES + 1))


def test_keys_accept_only_what_they_hold() -> None:
    keys = JournalKeys([SIGNER])
    assert SIGNER.key_id in keys.ids and OTHER.key_id not in keys.ids


async def test_heads_name_every_journal_and_its_last_entry(box_factory: Callable[[], Any]) -> None:
    from trioloop.durable.store import StoredEntry

    store = box_factory()
    assert await store.heads() == {}
    for session_id, count in (("a", 3), ("b", 1)):
        lease = await store.acquire(session_id)
        await lease.append([StoredEntry(n, b"{}") for n in range(1, count + 1)])
        await lease.release()
    assert await store.heads() == {"a": 3, "b": 1}
    assert await store.heads({"a", "nobody"}) == {"a": 3}  # only those asked (a notice named them)
    assert await store.heads(set()) == {}
    many = {f"x{n}" for n in range(2000)} | {"b"}
    assert (await store.heads(many)).get("b") == 1  # too many to name: every head (a superset) comes back


async def test_turn_marks_say_where_each_sessions_last_turn_stands(box_factory: Callable[[], Any]) -> None:
    from trioloop.durable.journal import GENESIS, encode_entry
    from trioloop.durable.store import StoredEntry

    store = box_factory()
    journals = {
        "settled": ["snapshot", "submit", "stream", "settled", "snapshot", "seal"],
        "in-flight": ["snapshot", "submit", "stream", "approve", "start", "seal"],
        "suspended": ["snapshot", "submit", "stream", "suspend", "seal"],
        "taken-up": ["snapshot", "submit", "suspend", "resume", "start"],
        "none": ["stream", "seal"],
    }
    for session_id, kinds in journals.items():
        lease = await store.acquire(session_id)
        entries = [encode_entry(n, kind, GENESIS, 0, {"text": '"kind":"submit"'}) for n, kind in enumerate(kinds, 1)]
        await lease.append([StoredEntry(n, data) for n, data in enumerate(entries, 1)])
        await lease.release()
    assert await store.turn_marks() == {
        "settled": (5, "snapshot"),
        "in-flight": (2, "submit"),
        "suspended": (4, "suspend"),
        "taken-up": (4, "resume"),
    }
    assert await store.turn_marks({"in-flight", "none", "nobody"}) == {"in-flight": (2, "submit")}
    assert await store.turn_marks(set()) == {}


async def test_reading_a_box_nobody_posted_to_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    async with SQLiteJournalStore(path) as store:
        assert await store.decisions("s1") == [] and await store.sessions_with_waiting_decisions() == []
        assert await store.decision_changes() == (0, [])
    with sqlite3.connect(path) as raw:
        tables = {row[0] for row in raw.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert "trioloop_decisions" not in tables  # looking took no write lock and made no table
