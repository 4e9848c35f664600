"""A journal (and a session file) is bound to its document: it records the document's kind, its source, and the
digest of every committed document, and a session says whether a document read back is its own
(`Session.match_document`)."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st
from pg_support import postgres_url  # noqa: F401 -- the session fixture the journal fixture reaches by name

from tests.test_journal_integrity import SCRIPT, TOOLS, Journal, _review, rechained
from trioloop import (
    DocumentMatch,
    DocumentMismatch,
    JournalError,
    ScriptedProvider,
    Session,
    SessionFileError,
    define_document_kind,
)
from trioloop.durable.journal import decode_entry, document_digest, encode_entry
from trioloop.machine.transaction import UndoEntry, UndoHistory, match_document, redo_step, undo_step


@pytest.fixture(params=["sqlite", "postgres"])
async def place(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Journal]:
    """A real SQLite file, and a database of a real PostgreSQL server."""
    url = request.getfixturevalue("postgres_url") if request.param == "postgres" else None
    where = Journal(request.param, tmp_path, url)
    yield where
    for store in where.opened:
        await store.close()


NOTE = define_document_kind("note", dump=lambda text: text, load=lambda text: text)
MEMO = define_document_kind("memo", dump=lambda text: text, load=lambda text: text)


async def _wiped(place: Journal, **kw: Any) -> None:
    """A journal whose one turn committed (``wipe`` approved): its document is now empty."""
    async with ScriptedProvider(SCRIPT) as provider:
        session = await Session.open(
            place.store(),
            place.sid("s1"),
            kind=NOTE,
            provider=provider,
            document="keep me\n",
            model="m",
            tools=TOOLS,
            **kw,
        )
        async with session, trio.open_nursery() as nursery:
            nursery.start_soon(session.send, "tidy up")
            await _review(session)
            assert session.approve("w1")
    assert session.document == ""


async def _open(place: Journal, kind: Any = NOTE, **kw: Any) -> Session[str]:
    session = await Session.open(
        place.store(), place.sid("s1"), kind=kind, provider=ScriptedProvider([]), tools=TOOLS, **kw
    )
    await session.aclose()
    return session


async def test_the_journal_records_kind_source_and_the_digest_of_each_commit(place: Journal) -> None:
    path = place
    await _wiped(path, source="/notes/a.txt")
    entries = [decode_entry(raw) for _, raw in path.rows()]
    snapshot = entries[0].data["session"]
    assert (snapshot["kind"], snapshot["source"]) == ("note", "/notes/a.txt")
    commits = [e.data for e in entries if e.kind == "settled" and e.data["document"] is not None]
    assert [c["document_digest"] for c in commits] == [hashlib.sha256(b"").hexdigest()]
    session = await _open(path)
    assert session.source == "/notes/a.txt" and session.document == ""
    assert session.match_document("") is DocumentMatch.SAME
    assert session.match_document("keep me\n") is DocumentMatch.BEHIND  # saved before the wipe, then stopped
    assert session.match_document("something else\n") is DocumentMatch.OTHER


async def test_another_source_or_kind_is_refused_before_replay(place: Journal) -> None:
    path = place
    await _wiped(path, source="/notes/a.txt")
    with pytest.raises(DocumentMismatch, match=r"source is '/notes/a\.txt', not '/notes/b\.txt'") as caught:
        await _open(path, source="/notes/b.txt")
    assert (caught.value.recorded, caught.value.given) == ("/notes/a.txt", "/notes/b.txt")
    with pytest.raises(DocumentMismatch, match="kind is 'note', not 'memo'"):
        await _open(path, kind=MEMO)
    assert (await _open(path, source="/notes/a.txt")).source == "/notes/a.txt"


async def test_opening_an_existing_session_with_another_document_is_refused(place: Journal) -> None:
    # Session.open used to replay the journal's document and silently ignore the one given: the library form of
    # --resume onto another document. The journal's own document goes on, and so does the one before its latest
    # change (the app stopped between the commit and saving it; the session's is the newer, to be saved now).
    path = place
    await _wiped(path)
    assert (await _open(path, document="")).document == ""
    assert (await _open(path, document="keep me\n")).document == ""  # one change behind: the crash case
    rows = path.rows()
    with pytest.raises(DocumentMismatch, match=r"content \(SHA-256\) is 'e3b0c44298fc'") as caught:
        await _open(path, document="another note\n")
    assert caught.value.given == hashlib.sha256(b"another note\n").hexdigest()[:12]
    assert path.rows() == rows  # nothing was written


def test_a_document_of_the_wrong_type_for_its_kind_is_refused_where_the_session_is_made() -> None:
    from trioloop.threatmodel import THREAT_MODEL, load_thf_file

    payment = Path(__file__).resolve().parent.parent / "examples" / "payment.thf"
    with pytest.raises(TypeError, match=r"takes a ThreatModel as its document, not a ThfFile \(its \.model is one\)"):
        Session(document=load_thf_file(payment), kind=THREAT_MODEL, provider=ScriptedProvider([]), model="m")
    typed = define_document_kind("note", dump=str, load=str, document_type=str)
    with pytest.raises(TypeError, match="takes a str as its document, not a bytes"):
        Session(document=b"bytes", kind=typed, provider=ScriptedProvider([]), model="m")
    assert Session(document="text", kind=typed, provider=ScriptedProvider([]), model="m").document == "text"


async def test_a_commit_whose_digest_is_not_its_document_is_refused(place: Journal) -> None:
    # Unsigned, so that only the digest can tell (a signed journal refuses any edit at its seal).
    path = place
    await _wiped(path, signer=None, witness=None)
    rows = path.rows()
    edited = []
    for _, raw in rows:
        entry = decode_entry(raw)
        if entry.kind == "settled" and entry.data["document"] is not None:
            raw = encode_entry(entry.seq, entry.kind, entry.prev, entry.at_ms, {**entry.data, "document": "forged\n"})
        edited.append(raw)
    path.rewrite(rechained(edited))
    with pytest.raises(JournalError, match="digest is not the one it records") as caught:
        await _open(path, signer=None, witness=None)
    assert caught.value.seq is not None


async def test_a_session_file_of_another_kind_is_refused(tmp_path: Path) -> None:
    session = Session(document="hello\n", kind=NOTE, provider=ScriptedProvider([]), model="m", source="/n.txt")
    saved = tmp_path / "s.json"
    session.save(saved)
    assert Session.resume(saved, kind=NOTE, provider=ScriptedProvider([])).source == "/n.txt"
    with pytest.raises(SessionFileError, match="holds a note document, not a memo"):
        Session.resume(saved, kind=MEMO, provider=ScriptedProvider([]))


_STEP = st.sampled_from(["commit", "undo", "redo"])


@given(st.lists(_STEP, max_size=25))
def test_match_document_names_the_live_one_and_the_one_before_the_latest_change(steps: list[str]) -> None:
    # Documents are numbered by when they were made, so each commit's is new; "before" follows the latest
    # change (a commit, an undo or a redo that changed something).
    history: UndoHistory[int] = UndoHistory(max_entries=5)
    live, made, before = 0, 0, None
    for n, step in enumerate(steps):
        if step == "commit":
            made += 1
            history, before, live = history.push(UndoEntry(turn_id=f"turn-{n}", document=live)), live, made
            continue
        moved = (undo_step if step == "undo" else redo_step)(history, live)
        if moved is not None:
            before = live
            live, history, _ = moved
    assert match_document(NOTE, live, live, history) is DocumentMatch.SAME
    if before is not None and before != live:
        assert match_document(NOTE, before, live, history) is DocumentMatch.BEHIND
    assert match_document(NOTE, made + 1, live, history) is DocumentMatch.OTHER  # never held


def test_a_snapshot_names_the_kind_and_the_source_the_app_gives() -> None:
    session = Session(document="x", kind=NOTE, provider=ScriptedProvider([]), model="m")
    assert (session.snapshot().kind, session.snapshot().source) == ("note", None)
    session.source = "/moved/x"  # an app that moved its document says so; the next snapshot records it
    assert session.snapshot().source == "/moved/x"
    assert document_digest("é\n") == hashlib.sha256("é\n".encode()).hexdigest()
