"""The journal is an input like any other: no forged, edited, reordered, inserted, transplanted or cut entry may
make a tool run. Each test tampers with a real journal (a SQLite file, and a database of a real PostgreSQL server
the tests start) the way an attacker with write access to the store would, then opens it as the app would; the
destructive tool must never run.

The scene: a turn asks for ``wipe`` (destructive), the person has not decided yet, and the session is suspended
in review. An attacker who can write the journal wants the call approved without the person.
"""

from __future__ import annotations

import base64
import json
import secrets
import sqlite3
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import aclosing, closing
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from pg_support import postgres_url  # noqa: F401 -- the session fixture, reached by name (getfixturevalue)

from trioloop import (
    CallStatus,
    JournalError,
    Phase,
    ScriptedProvider,
    Session,
    ToolExecutionContext,
    ToolOutcome,
    define_document_kind,
    function_tool,
)
from trioloop.durable.journal import JournalEntry, decode_entry, encode_entry, entry_hash
from trioloop.durable.postgres import PostgresJournalStore
from trioloop.durable.signing import JournalKeys, JournalSigner, head_message
from trioloop.durable.sqlite import SQLiteJournalStore
from trioloop.durable.witness import FileWitness
from trioloop.providers.scripted import ScriptedCall, ScriptStep
from trioloop.runtime.session import ToolsMissing

NOTE = define_document_kind("note", dump=lambda text: text, load=lambda text: text)
RUNS: list[str] = []


@function_tool(destructive=True)
async def wipe(ctx: ToolExecutionContext[str], reason: str) -> ToolOutcome[str]:
    """Erase the note."""
    RUNS.append(reason)
    return ToolOutcome.success("wiped", document="")


@function_tool(effect="read")
def read_note(ctx: ToolExecutionContext[str]) -> ToolOutcome[str]:
    """Read the note."""
    return ToolOutcome.success(ctx.document)


TOOLS = [wipe, read_note]
SCRIPT = [
    ScriptStep(tool_calls=(ScriptedCall(id="w1", name="wipe", input={"reason": "spring cleaning"}),)),
    ScriptStep(text="Done."),
]


@pytest.fixture(autouse=True)
def _fresh_runs() -> None:
    RUNS.clear()


@pytest.fixture
def signer() -> JournalSigner:
    return JournalSigner.generate()


class Journal:
    """Where the journal under attack lives: a real SQLite file, or a real PostgreSQL database (shared by the
    tests, so each test's session ids carry a prefix of its own). ``rows`` and ``rewrite`` are the attacker's
    direct access to the stored entries."""

    def __init__(self, backend: str, tmp_path: Path, url: str | None) -> None:
        self.backend = backend
        self.file = tmp_path / "j.db"
        self.url = url
        self.prefix = f"t{secrets.token_hex(4)}-" if backend == "postgres" else ""
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

    def rows(self, name: str = "s1") -> list[tuple[int, bytes]]:
        mark = "?" if self.url is None else "%s"
        query = f"SELECT seq, data FROM trioloop_journal WHERE session_id = {mark} ORDER BY seq"
        with self._connect() as db:
            return [(int(seq), bytes(data)) for seq, data in db.execute(query, (self.sid(name),)).fetchall()]

    def rewrite(self, entries: Sequence[tuple[int, bytes]], name: str = "s1") -> None:
        mark = "?" if self.url is None else "%s"
        with self._connect() as db:
            db.execute(f"DELETE FROM trioloop_journal WHERE session_id = {mark}", (self.sid(name),))
            for seq, data in entries:
                db.execute(
                    f"INSERT INTO trioloop_journal (session_id, seq, data) VALUES ({mark}, {mark}, {mark})",
                    (self.sid(name), seq, data),
                )
            if self.url is None:
                db.commit()


@pytest.fixture(params=["sqlite", "postgres"])
async def journal(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Journal]:
    url = request.getfixturevalue("postgres_url") if request.param == "postgres" else None
    place = Journal(request.param, tmp_path, url)
    yield place
    for store in place.opened:
        await store.close()


async def _review(session: Session[str]) -> None:
    async with aclosing(session.states()) as states:
        async for state in states:
            if session.busy and state.phase is Phase.AWAITING_APPROVAL:
                return


async def open_note(path: Journal, session_id: str = "s1", **kw: Any) -> Session[str]:
    kw.setdefault("tools", TOOLS)
    provider = ScriptedProvider(SCRIPT)
    return await Session.open(
        path.store(), path.sid(session_id), kind=NOTE, provider=provider, document="keep me\n", model="m", **kw
    )


async def suspended_in_review(path: Journal, signer: JournalSigner | None, session_id: str = "s1") -> None:
    """A journal whose last turn waits, suspended, for the person to decide on ``wipe``."""
    async with ScriptedProvider(SCRIPT) as provider:
        session = await Session.open(
            path.store(),
            path.sid(session_id),
            kind=NOTE,
            provider=provider,
            document="keep me\n",
            model="m",
            tools=TOOLS,
            signer=signer,
        )
        async with session, trio.open_nursery() as nursery:
            nursery.start_soon(session.send, "tidy up")
            await _review(session)
            await trio.testing.wait_all_tasks_blocked()
            await session.suspend()
    assert RUNS == []


def rechained(entries: Sequence[bytes], first_seq: int = 1, first_prev: str = "0" * 64) -> list[tuple[int, bytes]]:
    """``entries`` renumbered from ``first_seq`` with every ``prev`` recomputed: a chain an attacker can make."""
    out: list[tuple[int, bytes]] = []
    prev = first_prev
    for offset, raw in enumerate(entries):
        entry = decode_entry(raw)
        new = encode_entry(first_seq + offset, entry.kind, prev, entry.at_ms, entry.data)
        out.append((first_seq + offset, new))
        prev = entry_hash(new)
    return out


def forged_approval(last: bytes) -> bytes:
    """An approval of ``w1`` that follows ``last``, as the journal writer would have written it."""
    entry = decode_entry(last)
    data = {"call_id": "w1", "by": "mallory", "edited_input": None, "card": None}
    return encode_entry(entry.seq + 1, "approve", entry_hash(last), entry.at_ms + 1, data)


def seal_by(signer: JournalSigner, session_id: str, last: bytes) -> bytes:
    """A seal over ``last`` made with ``signer``'s key (an attacker's own key, say)."""
    entry = decode_entry(last)
    head = entry_hash(last)
    data = {
        "session": session_id,
        "seq": entry.seq,
        "head": head,
        "key": signer.key_id,
        "sig": signer.sign(head_message(session_id, entry.seq, head)),
    }
    return encode_entry(entry.seq + 1, "seal", head, entry.at_ms + 1, data)


async def refused(path: Journal, signer: JournalSigner | None, match: str, **kw: Any) -> JournalError:
    with pytest.raises(JournalError, match=match) as caught:
        await open_note(path, signer=signer, **kw)
    assert RUNS == []
    return caught.value


async def test_an_untouched_signed_journal_opens_verified_and_the_person_still_decides(
    journal: Journal, signer: JournalSigner
) -> None:
    path = journal
    await suspended_in_review(path, signer)
    session = await open_note(path, signer=signer)
    integrity = session.journal_integrity
    assert integrity is not None and integrity.signed and integrity.verified and integrity.key_ids == {signer.key_id}
    assert session.suspended and session.state is not None
    assert session.state.call("w1").status is CallStatus.PENDING  # type: ignore[union-attr]
    await session.aclose()
    assert all(decode_entry(data).kind == "seal" for seq, data in path.rows()[-1:])


async def test_an_approval_appended_with_a_recomputed_chain_is_refused(journal: Journal, signer: JournalSigner) -> None:
    path = journal
    await suspended_in_review(path, signer)
    entries = path.rows()
    forged = forged_approval(entries[-1][1])
    path.rewrite([*entries, (len(entries) + 1, forged)])
    error = await refused(path, signer, "follow the last seal")
    assert error.seq == len(entries) + 1


async def test_an_approval_sealed_with_another_key_is_refused(journal: Journal, signer: JournalSigner) -> None:
    path = journal
    await suspended_in_review(path, signer)
    entries = path.rows()
    forged = forged_approval(entries[-1][1])
    mallory = JournalSigner.generate()
    path.rewrite([*entries, (len(entries) + 1, forged), (len(entries) + 2, seal_by(mallory, path.sid("s1"), forged))])
    error = await refused(path, signer, "which is not among the keys given")
    assert error.seq == len(entries) + 2


async def test_an_edited_entry_the_last_one_included_is_refused(journal: Journal, signer: JournalSigner) -> None:
    path = journal
    await suspended_in_review(path, signer)
    entries = path.rows()
    for index in (len(entries) // 2, len(entries) - 2, len(entries) - 1):
        changed = list(entries)
        seq, data = changed[index]
        entry = decode_entry(data)
        if entry.kind == "seal":
            sig = base64.b64decode(entry.data["sig"])
            flipped = base64.b64encode(bytes([sig[0] ^ 1]) + sig[1:]).decode()
            new = {**entry.data, "sig": flipped}
        else:
            new = {**entry.data, "edited": True}
        changed[index] = (seq, encode_entry(seq, entry.kind, entry.prev, entry.at_ms, new))
        path.rewrite(changed)
        await refused(path, signer, "does not (verify|carry the hash)")
    # Recomputing the chain after an edit does not help: the seals sign the old heads.
    edited = [data for _, data in entries]
    middle = decode_entry(edited[3])
    edited[3] = encode_entry(middle.seq, middle.kind, middle.prev, middle.at_ms, {**middle.data, "edited": True})
    path.rewrite(rechained(edited))
    await refused(path, signer, "seals an entry that is not|does not verify|a seal of an unknown form")


async def test_reordered_inserted_and_deleted_entries_are_refused(journal: Journal, signer: JournalSigner) -> None:
    path = journal
    await suspended_in_review(path, signer)
    raw = [data for _, data in path.rows()]
    swapped = list(raw)
    swapped[2], swapped[3] = swapped[3], swapped[2]
    inserted = [*raw[:3], forged_approval(raw[2]), *raw[3:]]
    deleted = raw[:2] + raw[3:]
    for tampered in (swapped, inserted, deleted):
        path.rewrite(rechained(tampered))  # even with every prev recomputed
        await refused(path, signer, "seal|verify")


async def test_a_prefix_removed_up_to_a_snapshot_is_refused(journal: Journal, signer: JournalSigner) -> None:
    path = journal
    await suspended_in_review(path, signer)
    session = await open_note(path, signer=signer)
    async with session:
        session.deny("w1", "no")
        await session.continue_turn()
    entries = path.rows()
    snapshots = [i for i, (_, data) in enumerate(entries) if decode_entry(data).kind == "snapshot"]
    assert len(snapshots) >= 2
    path.rewrite(entries[snapshots[-1] :])
    await refused(path, signer, "entries before it were removed")


async def test_entries_of_another_session_are_refused(journal: Journal, signer: JournalSigner) -> None:
    path = journal
    await suspended_in_review(path, signer, session_id="payments")
    path.rewrite(path.rows("payments"), "garden")
    with pytest.raises(JournalError, match="another session"):
        await open_note(path, "garden", signer=signer)
    assert RUNS == []


async def test_a_journal_signed_by_an_older_key_verifies_with_its_public_key(journal: Journal) -> None:
    path = journal
    old, new = JournalSigner.generate(), JournalSigner.generate()
    await suspended_in_review(path, old)
    await refused(path, new, "which is not among the keys given")
    session = await open_note(path, signer=new, keys=JournalKeys([old.public_key]))
    async with session:
        session.deny("w1", "not today")
        final = await session.continue_turn()
    assert final.outcome is not None and RUNS == []
    reopened = await open_note(path, signer=new, keys=JournalKeys([old.public_key]))
    integrity = reopened.journal_integrity
    assert integrity is not None and integrity.key_ids == {old.key_id, new.key_id}
    await reopened.aclose()


async def test_without_a_key_a_journal_is_read_as_unsigned_and_said_to_be(journal: Journal) -> None:
    path = journal
    await suspended_in_review(path, None)
    session = await open_note(path, signer=None)
    integrity = session.journal_integrity
    assert integrity is not None and not integrity.signed and not integrity.verified
    assert "unsigned" in integrity.describe()
    await session.aclose()
    # A signing opener refuses what nobody signed.
    await refused(path, JournalSigner.generate(), "not signed")


async def test_opening_without_a_tool_the_calls_used_says_which_and_replays_nothing(
    journal: Journal, signer: JournalSigner
) -> None:
    path = journal
    await suspended_in_review(path, signer)
    with pytest.raises(ToolsMissing, match="wipe") as caught:
        await open_note(path, signer=signer, tools=[read_note])
    assert caught.value.names == {"wipe"}
    # The lease was released: the right tools open it.
    session = await open_note(path, signer=signer)
    await session.aclose()


async def test_the_default_key_is_made_once_readable_by_its_owner_alone(tmp_path: Path) -> None:
    environ = {"XDG_CONFIG_HOME": str(tmp_path / "config")}
    first = JournalSigner.default(environ)
    again = JournalSigner.default(environ)
    assert first.key_id == again.key_id
    key_file = tmp_path / "config" / "trioloop" / "journal-key"
    assert key_file.stat().st_mode & 0o777 == 0o600
    key_file.chmod(0o644)
    with pytest.raises(ValueError, match="readable by others"):
        JournalSigner.default(environ)
    assert repr(first) == f"JournalSigner(key_id={first.key_id!r})"  # the private key never shows


def _kinds(path: Journal) -> list[str]:
    return [decode_entry(data).kind for _, data in path.rows()]


async def test_every_batch_ends_with_a_seal(journal: Journal, signer: JournalSigner) -> None:
    path = journal
    await suspended_in_review(path, signer)
    kinds = _kinds(path)
    assert kinds[-1] == "seal" and kinds.count("seal") >= 3
    seals = [json.loads(data)["data"] for _, data in path.rows() if decode_entry(data).kind == "seal"]
    assert {seal["session"] for seal in seals} == {path.sid("s1")} and {seal["key"] for seal in seals} == {
        signer.key_id
    }


def resealed_with(
    rows: Sequence[tuple[int, bytes]], seal: Callable[[int, str, JournalEntry], dict[str, Any]]
) -> list[tuple[int, bytes]]:
    """The journal chained again, each seal's fields made by ``seal(seq, prev, entry)`` (``prev``: the hash of the
    entry before it, as chained again); an entry that does not decode is kept as it is (the next chained to it)."""
    out: list[tuple[int, bytes]] = []
    prev = decode_entry(rows[0][1], lazy=True).prev
    for seq, data in rows:
        try:
            entry = decode_entry(data)
        except JournalError:
            out.append((seq, data))
            prev = entry_hash(data)
            continue
        fields = seal(seq, prev, entry) if entry.kind == "seal" else dict(entry.data)
        raw = encode_entry(seq, entry.kind, prev, entry.at_ms, fields)
        out.append((seq, raw))
        prev = entry_hash(raw)
    return out


def with_repeated_heads(
    rows: Sequence[tuple[int, bytes]], signer: JournalSigner, session_id: str, wrong: int = 0
) -> list[tuple[int, bytes]]:
    """The journal as earlier versions wrote it: every seal repeating the number and hash of the entry it signs
    (``seq``, ``head``), chained and signed again; ``wrong`` makes the repeated number of that seal differ."""

    def seal(seq: int, prev: str, entry: JournalEntry) -> dict[str, Any]:
        return {
            "session": session_id,
            "seq": seq - 1 + (seq == wrong),
            "head": prev,
            "key": signer.key_id,
            "sig": signer.sign(head_message(session_id, seq - 1, prev)),
        }

    return resealed_with(rows, seal)


async def test_a_seal_signs_its_own_place_and_seals_of_earlier_versions_still_verify(
    journal: Journal, signer: JournalSigner
) -> None:
    path = journal
    await suspended_in_review(path, signer)
    rows = path.rows()
    seals = [decode_entry(data) for _, data in rows if decode_entry(data).kind == "seal"]
    # The head is the seal's own prev, and a seal of version 2 signs its own time too.
    assert all(set(seal.data) == {"session", "v", "key", "sig"} and seal.data["v"] == 2 for seal in seals)
    # A journal whose seals repeat the head (as earlier versions wrote it) opens verified, the card still open.
    path.rewrite(with_repeated_heads(rows, signer, path.sid("s1")))
    session = await open_note(path, signer=signer, witness=None)
    assert session.journal_integrity is not None and session.journal_integrity.verified and session.suspended
    await session.aclose()
    # A repeated number that is not the seal's own place is refused.
    last_seal = max(seal.seq for seal in seals)
    path.rewrite(with_repeated_heads(rows, signer, path.sid("s1"), wrong=last_seal))
    await refused(path, signer, "not the one before it", witness=None)


async def test_a_compacted_journal_reopens_with_the_last_turn_and_verifies(
    journal: Journal, signer: JournalSigner
) -> None:
    path = journal
    script = [
        ScriptStep(tool_calls=(ScriptedCall(id="r1", name="read_note", input={}),)),
        ScriptStep(text="It says keep me."),
        ScriptStep(tool_calls=(ScriptedCall(id="r2", name="read_note", input={}),)),
        ScriptStep(text="Still there."),
        ScriptStep(text="Nothing else to do."),
    ]
    async with ScriptedProvider(script) as provider:
        session = await Session.open(
            path.store(),
            path.sid("s1"),
            kind=NOTE,
            provider=provider,
            document="keep me\n",
            model="m",
            tools=TOOLS,
            signer=signer,
            compact=True,
        )
        async with session:
            for text in ("read it", "read it again", "anything else?"):
                await session.send(text)
        live = session.state
    assert live is not None and live.is_settled
    stored = path.rows()
    assert stored[0][0] > 1 and decode_entry(stored[0][1]).kind == "snapshot"  # compacted
    reopened = await open_note(path, signer=signer)
    assert reopened.state is not None
    assert reopened.state.turn_id == live.turn_id and reopened.state.outcome is live.outcome
    assert reopened.state.messages == live.messages and reopened.history == session.history
    assert attrs.evolve(reopened.state, draft=None) == attrs.evolve(live, draft=None)  # every call, status, result
    integrity = reopened.journal_integrity
    assert integrity is not None and integrity.verified and integrity.first_seq == stored[0][0]
    await reopened.aclose()
    # The snapshot names the signed head it followed: a forged "after" is refused.
    first = decode_entry(stored[0][1])
    forged = encode_entry(first.seq, "snapshot", first.prev, first.at_ms, {**first.data, "after": "x"})
    path.rewrite([(stored[0][0], forged), *stored[1:]])
    await refused(path, signer, "signed head|carry the hash")


async def test_with_a_witness_a_cut_tail_and_a_rolled_back_copy_are_refused(
    journal: Journal, signer: JournalSigner
) -> None:
    path = journal
    witness = FileWitness(journal.file.parent / "witness")
    await suspended_in_review(path, signer)
    older = path.rows()  # an attacker's copy, from before the person decided
    session = await open_note(path, signer=signer, witness=witness)
    async with session:
        session.deny("w1", "keep it")
        final = await session.continue_turn()
    assert final.outcome is not None and RUNS == []
    after = path.rows()
    denial = next(i for i, (_, data) in enumerate(after) if decode_entry(data).kind == "deny")
    seal = next(i for i in range(denial, len(after)) if decode_entry(after[i][1]).kind == "seal")
    # Without a witness, a journal cut at a batch boundary (the denial gone) still verifies: it cannot see that.
    path.rewrite(after[:denial])
    unwitnessed = await open_note(path, signer=signer, witness=None)
    assert unwitnessed.suspended
    await unwitnessed.aclose()
    # With the witness, the cut and the rolled-back copy are refused, naming the witnessed entry.
    for tampered in (after[:denial], older, after[: seal + 1]):
        path.rewrite(tampered)
        error = await refused(path, signer, "witnessed", witness=witness)
        assert str(after[-1][0]) in str(error)
    # A copy that goes on from the older one and is signed again (a rewritten history) diverges from the head.
    path.rewrite(older)
    forked = await open_note(path, signer=signer, witness=FileWitness(journal.file.parent / "elsewhere"))
    async with forked:
        forked.deny("w1", "another answer")
        await forked.continue_turn()
    with pytest.raises(JournalError, match=r"witnessed|rolled back"):
        await open_note(path, signer=signer, witness=witness)
    assert RUNS == []
