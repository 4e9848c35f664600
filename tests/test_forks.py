"""Forks: a journaled session's settled turns are listed (`Session.settled_turns`), and a new session opens from the
state after any of them (`Session.fork`) with a journal of its own whose snapshots name the source session, entry and
head. The source is never written: it verifies byte for byte as before, with the same head. A source that does not
verify, and a point that is not a settled turn, refuse the fork with a typed error and write nothing.

Every turn runs on the scripted provider over real HTTP, on a real SQLite file and a real PostgreSQL server (the
property test, which runs many sessions, on the memory store).
"""

from __future__ import annotations

import secrets
import sqlite3
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing, closing
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pg_support import postgres_url  # noqa: F401 -- the session fixture, reached by name (getfixturevalue)

from trioloop import (
    JournalError,
    MemoryJournalStore,
    Outcome,
    Phase,
    ScriptedProvider,
    Session,
    ToolExecutionContext,
    ToolOutcome,
    define_document_kind,
    function_tool,
)
from trioloop.durable.audit import audit_lines, verify_session
from trioloop.durable.history import ForkError, ForkOrigin, SettledTurn
from trioloop.durable.journal import decode_entry, encode_entry, entry_hash
from trioloop.durable.postgres import PostgresJournalStore
from trioloop.durable.signing import JournalSigner
from trioloop.durable.sqlite import SQLiteJournalStore
from trioloop.durable.witness import FileWitness
from trioloop.providers.scripted import ScriptedCall, ScriptStep
from trioloop.runtime.session import ToolsMissing

NOTE = define_document_kind("note", dump=lambda text: text, load=lambda text: text)


@function_tool(summary="Append {line!r} to the note")
async def append_line(ctx: ToolExecutionContext[str], line: str) -> ToolOutcome[str]:
    """Append one line to the note."""
    return ToolOutcome.success("Appended.", document=f"{ctx.document}{line}\n")


TOOLS = [append_line]


def appending(call_id: str, line: str, reply: str = "Done.") -> list[ScriptStep]:
    """The model's two answers of a turn that appends ``line``: the call, then its reply once the call settled."""
    return [
        ScriptStep(tool_calls=(ScriptedCall(id=call_id, name="append_line", input={"line": line}),)),
        ScriptStep(text=reply),
    ]


class Place:
    """Where the journals live: a real SQLite file, or a database of a real PostgreSQL server (shared by the tests,
    so each test's session ids carry a prefix of its own). ``rows`` reads and ``rewrite`` writes the stored entries
    directly, as someone with access to the store would."""

    def __init__(self, backend: str, tmp_path: Path, url: str | None) -> None:
        self.backend = backend
        self.file = tmp_path / "forks.db"
        self.url = url
        self.prefix = f"f{secrets.token_hex(4)}-" if url is not None else ""
        self.opened: list[Any] = []

    def sid(self, name: str) -> str:
        return self.prefix + name

    def store(self) -> Any:
        store = SQLiteJournalStore(self.file) if self.url is None else PostgresJournalStore(self.url)
        self.opened.append(store)
        return store

    def _connect(self) -> Any:
        if self.url is None:
            return closing(sqlite3.connect(self.file))
        import psycopg

        return psycopg.connect(self.url, autocommit=True)

    def rows(self, session_id: str) -> list[tuple[int, bytes]]:
        mark = "?" if self.url is None else "%s"
        query = f"SELECT seq, data FROM trioloop_journal WHERE session_id = {mark} ORDER BY seq"
        with self._connect() as db:
            return [(int(seq), bytes(data)) for seq, data in db.execute(query, (session_id,)).fetchall()]

    def rewrite(self, session_id: str, entries: Sequence[tuple[int, bytes]]) -> None:
        mark = "?" if self.url is None else "%s"
        with self._connect() as db:
            db.execute(f"DELETE FROM trioloop_journal WHERE session_id = {mark}", (session_id,))
            for seq, data in entries:
                db.execute(
                    f"INSERT INTO trioloop_journal (session_id, seq, data) VALUES ({mark}, {mark}, {mark})",
                    (session_id, seq, data),
                )
            if self.url is None:
                db.commit()


@pytest.fixture(params=["sqlite", "postgres"])
async def place(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Place]:
    url = request.getfixturevalue("postgres_url") if request.param == "postgres" else None
    where = Place(request.param, tmp_path, url)
    yield where
    for store in where.opened:
        await store.close()


@pytest.fixture
def signer() -> JournalSigner:
    return JournalSigner.generate()


async def decide(
    session: Session[str], deny: frozenset[str] = frozenset(), always: frozenset[str] = frozenset()
) -> None:
    """The person: approves every card as it comes (denies the calls in ``deny``; approves those in ``always`` with a
    session rule allowing the tool from then on)."""
    async with aclosing(session.states()) as states:
        async for state in states:
            if state.phase is Phase.AWAITING_APPROVAL:
                for call in state.current_calls:
                    if not call.is_terminal:
                        if call.id in deny:
                            session.deny(call.id, "no")
                        else:
                            session.approve(call.id, always="tool" if call.id in always else None)


async def send(
    session: Session[str], text: str, deny: frozenset[str] = frozenset(), always: frozenset[str] = frozenset()
) -> Outcome | None:
    async with trio.open_nursery() as person:
        person.start_soon(decide, session, deny, always)
        state = await session.send(text)
        person.cancel_scope.cancel()
    return state.outcome


async def three_turns(store: Any, session_id: str, signer: JournalSigner | None) -> list[tuple[str, tuple[Any, ...]]]:
    """A session of three turns, each appending a line: the document and the conversation after each."""
    script = [*appending("c1", "one"), *appending("c2", "two"), *appending("c3", "three")]
    after: list[tuple[str, tuple[Any, ...]]] = []
    async with ScriptedProvider(script) as provider:
        session = await Session.open(
            store, session_id, kind=NOTE, provider=provider, tools=TOOLS, model="m", document="# note\n", signer=signer
        )
        async with session:
            for text in ("first", "second", "third"):
                assert await send(session, text) is Outcome.COMPLETED
                after.append((session.document, session.history))
    return after


async def test_a_session_lists_its_settled_turns(place: Place, signer: JournalSigner) -> None:
    source = place.sid("src")
    await three_turns(place.store(), source, signer)
    turns = await Session.settled_turns(place.store(), source, kind=NOTE, tools=TOOLS, signer=signer)
    assert [(t.turn_id, t.ordinal, t.text, t.outcome) for t in turns] == [
        ("turn-1", 1, "first", Outcome.COMPLETED),
        ("turn-2", 2, "second", Outcome.COMPLETED),
        ("turn-3", 3, "third", Outcome.COMPLETED),
    ]
    rows = dict(place.rows(source))
    for turn in turns:
        assert turn.session == source and entry_hash(rows[turn.seq]) == turn.head  # the chained head at that entry
    assert turns[0].seq < turns[1].seq < turns[2].seq and turns[0].at_ms <= turns[2].at_ms
    with pytest.raises(ToolsMissing):  # the turns are folded as replay folds them: with the tools they used
        await Session.settled_turns(place.store(), source, kind=NOTE, signer=signer)
    with pytest.raises(ForkError, match="no journal"):
        await Session.settled_turns(place.store(), place.sid("nobody"), kind=NOTE, tools=TOOLS, signer=signer)


async def test_a_fork_after_turn_one_of_three_goes_on_from_there_and_the_source_is_untouched(
    place: Place, signer: JournalSigner
) -> None:
    source = place.sid("src")
    after = await three_turns(place.store(), source, signer)
    before_rows = place.rows(source)
    turns = await Session.settled_turns(place.store(), source, kind=NOTE, tools=TOOLS, signer=signer)

    store = place.store()
    async with ScriptedProvider(appending("d1", "fork line", "Forked.")) as provider:
        fork = await Session.fork(
            store, source, after=turns[0], kind=NOTE, provider=provider, tools=TOOLS, signer=signer
        )
        async with fork:
            assert fork.document == after[0][0] == "# note\none\n"
            assert fork.history == after[0][1]
            assert fork.forked_from == ForkOrigin(
                session=source,
                journal=fork.forked_from.journal if fork.forked_from else "",
                seq=turns[0].seq,
                head=turns[0].head,
            )
            assert await send(fork, "a different second turn") is Outcome.COMPLETED
            assert fork.document == "# note\none\nfork line\n"
            assert fork.history[: len(after[0][1])] == after[0][1]  # the source's conversation, then the fork's turn
            assert fork.state is not None and fork.state.turn_id == "turn-2"  # numbering goes on after turn 1
            assert fork.undo_last_turn() and fork.document == after[0][0]
            assert fork.undo_step() == "turn-1" and fork.document == "# note\n"  # the source's turn 1, undone here

    # The source: not one byte changed, and it still verifies with its head where it was.
    assert place.rows(source) == before_rows
    _, verdict = await verify_session(store, source, keys=signer.keys, witness=FileWitness(signer=signer))
    assert verdict.verdict == "verified" and verdict.last == before_rows[-1][0]
    sessions = [sid for sid in await store.session_ids() if sid.startswith(place.prefix)]
    (forked,) = [sid for sid in sessions if sid != source]
    assert forked.startswith(f"{source}.fork-")

    # The fork's journal: its first entry is a snapshot naming where it came from, signed like any; it verifies.
    first = decode_entry(place.rows(forked)[0][1])
    assert first.kind == "snapshot"
    assert first.data["forked_from"] == {
        "session": source,
        "journal": first.data["forked_from"]["journal"],
        "seq": turns[0].seq,
        "head": turns[0].head,
    }
    _, verdict = await verify_session(store, forked, keys=signer.keys, witness=FileWitness(signer=signer))
    assert verdict.verdict == "verified"
    assert any(
        f"forked from session {source} after its entry {turns[0].seq}" in line
        for line in audit_lines(await store.read(forked))
    )

    # Reopened, the fork is the fork, and still says where it came from.
    async with ScriptedProvider([]) as provider:
        reopened = await Session.open(store, forked, kind=NOTE, provider=provider, tools=TOOLS, signer=signer)
        async with reopened:
            assert reopened.document == "# note\n"  # the undos were journaled too
            assert reopened.redo_last_undo() == "turn-1" and reopened.document == "# note\none\n"
            assert reopened.forked_from is not None and reopened.forked_from.seq == turns[0].seq

    # The source opens as it was: three turns, its document after the third.
    async with ScriptedProvider([]) as provider:
        again = await Session.open(store, source, kind=NOTE, provider=provider, tools=TOOLS, signer=signer)
        async with again:
            assert again.document == after[2][0] and again.history == after[2][1] and again.forked_from is None


async def test_a_fork_of_a_fork_and_a_fork_from_before_the_first_turn(place: Place, signer: JournalSigner) -> None:
    source = place.sid("src")
    after = await three_turns(place.store(), source, signer)
    store = place.store()
    turns = await Session.settled_turns(store, source, kind=NOTE, tools=TOOLS, signer=signer)
    first_fork = place.sid("fork-a")
    async with ScriptedProvider(appending("d1", "A")) as provider:
        fork = await Session.fork(
            store,
            source,
            after="turn-2",
            new_session_id=first_fork,
            kind=NOTE,
            provider=provider,
            tools=TOOLS,
            signer=signer,
        )
        async with fork:
            assert fork.document == after[1][0]
            await send(fork, "on the fork")
    fork_turns = await Session.settled_turns(store, first_fork, kind=NOTE, tools=TOOLS, signer=signer)
    assert [t.turn_id for t in fork_turns] == ["turn-3"]  # the fork's journal holds its own turns only
    async with ScriptedProvider(appending("e1", "B")) as provider:
        second = await Session.fork(
            store,
            first_fork,
            after=fork_turns[0],
            new_session_id=place.sid("fork-b"),
            kind=NOTE,
            provider=provider,
            tools=TOOLS,
            signer=signer,
        )
        async with second:
            assert second.document == "# note\none\ntwo\nA\n"
            assert second.forked_from is not None and second.forked_from.session == first_fork
            await send(second, "on the fork of the fork")
            assert second.document == "# note\none\ntwo\nA\nB\n"
    async with ScriptedProvider([]) as provider:
        blank = await Session.fork(
            store,
            source,
            after=None,
            new_session_id=place.sid("fork-0"),
            kind=NOTE,
            provider=provider,
            tools=TOOLS,
            signer=signer,
        )
        async with blank:
            assert blank.document == "# note\n" and blank.history == () and blank.forked_from is not None
            assert blank.forked_from.seq == 1
    assert (await Session.settled_turns(store, source, kind=NOTE, tools=TOOLS, signer=signer)) == turns


async def test_a_tampered_source_refuses_to_fork_and_nothing_is_written(place: Place, signer: JournalSigner) -> None:
    source = place.sid("src")
    await three_turns(place.store(), source, signer)
    rows = place.rows(source)
    # The committed line of turn 2 edited, the chain recomputed from there: every seal after it is now wrong.
    edited: list[tuple[int, bytes]] = []
    prev = None
    for seq, raw in rows:
        entry = decode_entry(raw)
        data = dict(entry.data)
        if entry.kind == "settled" and data.get("document") == "# note\none\ntwo\n":
            data["document"] = "# note\none\nmallory\n"
            data["document_digest"] = None
        if prev is not None or data != entry.data:
            raw = encode_entry(seq, entry.kind, prev or entry.prev, entry.at_ms, data)
            prev = entry_hash(raw)
        edited.append((seq, raw))
    place.rewrite(source, edited)
    store = place.store()
    async with ScriptedProvider([]) as provider:
        with pytest.raises(JournalError, match="does not verify"):
            await Session.fork(store, source, after="turn-1", kind=NOTE, provider=provider, tools=TOOLS, signer=signer)
        with pytest.raises(JournalError):
            await Session.settled_turns(store, source, kind=NOTE, tools=TOOLS, signer=signer)
        # Signed by another key than the ones given: refused too.
        with pytest.raises(JournalError):
            await Session.fork(
                store,
                source,
                after="turn-1",
                kind=NOTE,
                provider=provider,
                tools=TOOLS,
                signer=JournalSigner.generate(),
                witness=None,
            )
    assert [sid for sid in await store.session_ids() if sid.startswith(place.prefix)] == [source]
    assert place.rows(source) == edited


async def test_only_a_settled_turn_is_a_fork_point(place: Place, signer: JournalSigner) -> None:
    source = place.sid("src")
    store = place.store()
    script = [*appending("c1", "one"), *appending("c2", "two")]
    async with ScriptedProvider(script) as provider:
        session = await Session.open(
            store, source, kind=NOTE, provider=provider, tools=TOOLS, model="m", document="", signer=signer
        )
        async with session:
            await send(session, "first")
            async with trio.open_nursery() as nursery:
                nursery.start_soon(session.send, "second")
                async with aclosing(session.states()) as states:
                    async for state in states:
                        if state.phase is Phase.AWAITING_APPROVAL:
                            break
                await trio.testing.wait_all_tasks_blocked()
                await session.suspend()  # turn 2 waits in review, its card pending: not a fork point
    turns = await Session.settled_turns(store, source, kind=NOTE, tools=TOOLS, signer=signer)
    assert [t.turn_id for t in turns] == ["turn-1"]
    async with ScriptedProvider([]) as provider:
        for after, match in (("turn-2", "not a settled turn"), ("turn-9", "not a settled turn")):
            with pytest.raises(ForkError, match=match):
                await Session.fork(store, source, after=after, kind=NOTE, provider=provider, tools=TOOLS, signer=signer)
        stale = SettledTurn(
            session=source,
            turn_id="turn-1",
            ordinal=1,
            text="first",
            outcome=Outcome.COMPLETED,
            seq=turns[0].seq,
            head="0" * 64,
            at_ms=0,
        )
        with pytest.raises(ForkError, match="not the one listed"):
            await Session.fork(store, source, after=stale, kind=NOTE, provider=provider, tools=TOOLS, signer=signer)
        with pytest.raises(ForkError, match="already has a journal"):
            await Session.fork(
                store,
                source,
                after="turn-1",
                new_session_id=source,
                kind=NOTE,
                provider=provider,
                tools=TOOLS,
                signer=signer,
            )
        # Turn 1's fork carries nothing of turn 2: no live turn, no card, no grant.
        fork = await Session.fork(
            store, source, after=turns[0], kind=NOTE, provider=provider, tools=TOOLS, signer=signer
        )
        async with fork:
            assert not fork.suspended and fork.state is None and fork.document == "one\n"
    async with ScriptedProvider([ScriptStep(text="Approved elsewhere.")]) as provider:
        resumed = await Session.open(store, source, kind=NOTE, provider=provider, tools=TOOLS, signer=signer)
        async with resumed:
            assert resumed.suspended  # the source's review still waits for its person


# -- for all settled turns k: the fork's state is the source's after turn k ---------------------------------------

#: What a turn does (append a line, approved; approved with a session rule for the tool; denied; no tool), and whether
#: the person undoes it afterwards.
TURN = st.tuples(st.sampled_from(["append", "always", "deny", "talk"]), st.booleans())


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=st.lists(TURN, min_size=1, max_size=4), data=st.data())
def test_for_any_settled_turn_the_fork_is_the_source_after_it(
    plan: list[tuple[str, bool]], data: st.DataObject
) -> None:
    script: list[ScriptStep] = []
    for number, (action, _) in enumerate(plan, 1):
        script += appending(f"c{number}", f"line {number}") if action != "talk" else [ScriptStep(text="Hello.")]
    deny = frozenset(f"c{n}" for n, (action, _) in enumerate(plan, 1) if action == "deny")
    always = frozenset(f"c{n}" for n, (action, _) in enumerate(plan, 1) if action == "always")
    k = data.draw(st.integers(min_value=0, max_value=len(plan)), label="fork after turn")

    async def scenario() -> None:
        store, signer = MemoryJournalStore(), JournalSigner.generate()
        seen: list[tuple[str, tuple[Any, ...], tuple[Any, ...]]] = []
        async with ScriptedProvider(script) as provider:
            session = await Session.open(
                store, "s", kind=NOTE, provider=provider, tools=TOOLS, model="m", document="", signer=signer
            )
            async with session:
                seen.append((session.document, session.history, session.rules))
                for number, (_, undo) in enumerate(plan, 1):
                    await send(session, f"turn {number}", deny, always)
                    seen.append((session.document, session.history, session.rules))
                    if undo:
                        await session.undo()
        turns = await Session.settled_turns(store, "s", kind=NOTE, tools=TOOLS, signer=signer)
        assert [t.ordinal for t in turns] == list(range(1, len(plan) + 1))
        async with ScriptedProvider([]) as provider:
            fork = await Session.fork(
                store,
                "s",
                after=turns[k - 1] if k else None,
                kind=NOTE,
                provider=provider,
                tools=TOOLS,
                signer=signer,
            )
            async with fork:
                assert (fork.document, fork.history, fork.rules) == seen[k]

    trio.run(scenario)


async def test_a_compacted_fork_still_says_where_it_came_from(place: Place, signer: JournalSigner) -> None:
    source = place.sid("src")
    await three_turns(place.store(), source, signer)
    store = place.store()
    fork_id = place.sid("compacted")
    script = [*appending("d1", "A"), *appending("d2", "B")]
    async with ScriptedProvider(script) as provider:
        fork = await Session.fork(
            store,
            source,
            after="turn-3",
            new_session_id=fork_id,
            kind=NOTE,
            provider=provider,
            tools=TOOLS,
            signer=signer,
            compact=True,
        )
        async with fork:
            await send(fork, "a fourth")
            await send(fork, "a fifth")
    rows = place.rows(fork_id)
    first = decode_entry(rows[0][1])
    assert rows[0][0] > 1 and first.kind == "snapshot"  # the fork's own first snapshot was compacted away
    assert first.data["forked_from"]["session"] == source
    async with ScriptedProvider([]) as provider:
        reopened = await Session.open(store, fork_id, kind=NOTE, provider=provider, tools=TOOLS, signer=signer)
        async with reopened:
            assert reopened.forked_from is not None and reopened.forked_from.session == source
            assert reopened.document == "# note\none\ntwo\nthree\nA\nB\n"
