"""`trioloop audit`: the trail of a journaled session in a real SQLite file (who approved which input, edits,
deny reasons, commits), its JSON lines, and a changed entry named with exit 1."""

from __future__ import annotations

import hashlib
import itertools
import json
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest
import trio

from trioloop import (
    CallStatus,
    Phase,
    ScriptedProvider,
    Session,
    ToolExecutionContext,
    ToolOutcome,
    define_document_kind,
    function_tool,
)
from trioloop.cli import main
from trioloop.providers.scripted import ScriptedCall, ScriptStep
from trioloop.stores import SQLiteJournalStore

NOTE = define_document_kind("note", dump=lambda text: text, load=lambda text: text)


@function_tool
async def append_line(ctx: ToolExecutionContext[str], line: str) -> ToolOutcome[str]:
    """Append one line to the note."""
    return ToolOutcome.success("appended", document=ctx.document + line + "\n")


async def record_a_session(path: Path) -> None:
    step = ScriptStep(
        tool_calls=(
            ScriptedCall(id="a", name="append_line", input={"line": "draft"}),
            ScriptedCall(id="b", name="append_line", input={"line": "evil \u202e\x1b[31mtext"}),
        )
    )
    async with ScriptedProvider([step, ScriptStep(text="Done.")]) as provider, SQLiteJournalStore(path) as store:
        session = await Session.open(
            store, "review-1", kind=NOTE, provider=provider, document="", model="m", tools=[append_line]
        )
        session.actor = "alice"
        async with session:

            async def review() -> None:
                async for state in session.states():
                    if session.busy and state.phase is Phase.AWAITING_APPROVAL:
                        pending = {c.id for c in state.current_calls if c.status is CallStatus.PENDING}
                        if "a" in pending:
                            session.approve("a", {"line": "final"})
                        if "b" in pending:
                            session.deny("b", "looks wrong")

            async with trio.open_nursery() as nursery:
                nursery.start_soon(review)
                await session.send("write it")
                nursery.cancel_scope.cancel()
            assert session.document == "final\n"


@pytest.fixture
def journal(tmp_path: Path) -> Path:
    path = tmp_path / "journal.db"
    trio.run(record_a_session, path)
    return path


def test_the_trail_shows_who_approved_what_with_edits_reasons_and_commits(
    journal: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["audit", str(journal)]) == 0
    out = capsys.readouterr().out
    assert "session review-1:" in out and "hash chain verified" in out
    assert "approved a by alice" in out
    assert "edited line: draft -> final" in out
    assert "declined b by alice: looks wrong" in out
    assert "call a succeeded, committed the document" in out
    assert "turn turn-1 starts: write it" in out
    # What the card showed (every line of the input) is in the trail, made safe to print.
    assert "line: final" in out
    assert "\u202e" not in out and "\x1b" not in out


def test_json_lines_carry_the_chain(journal: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", str(journal), "--session", "review-1", "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    verdict, records = lines[0], lines[1:]  # the session's verdict first, then its entries
    assert verdict["verdict"] == "verified" and verdict["error"] is None and verdict["entry"] is None
    assert (verdict["entries"], verdict["first"], verdict["last"]) == (len(records), 1, len(records))
    assert verdict["signed"] is True and verdict["key_ids"] and verdict["witnessed"] == len(records)
    assert [r["seq"] for r in records] == list(range(1, len(records) + 1))
    assert records[0]["prev"] == "0" * 64
    for before, after in itertools.pairwise(records):
        assert after["prev"] == before["hash"]
    assert records[-1]["kind"] == "seal"  # every append ends with a signed head
    kinds = [r["kind"] for r in records if r["kind"] != "seal"]
    assert kinds[0] == "snapshot" and "approve" in kinds and "deny" in kinds and kinds[-1] == "snapshot"
    approve = next(r for r in records if r["kind"] == "approve")
    assert approve["data"]["by"] == "alice" and approve["data"]["edited_input"] == {"line": "final"}


def test_a_changed_entry_is_named_and_exits_1(journal: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with closing(sqlite3.connect(journal)) as db, db:  # closed, not only committed (3.13 warns otherwise)
        seq, data = db.execute(
            'SELECT seq, data FROM trioloop_journal WHERE CAST(data AS TEXT) LIKE \'%"kind":"deny"%\''
        ).fetchone()
        forged = bytes(data).replace(b"looks wrong", b"fine by me!")
        db.execute("UPDATE trioloop_journal SET data = ? WHERE seq = ?", (forged, seq))
    assert main(["audit", str(journal)]) == 1
    captured = capsys.readouterr()
    # The forged entry still decodes; the next one no longer carries its hash.
    assert f"entry {seq + 1} does not verify" in captured.err
    assert "fine by me!" in captured.out  # everything before the break is printed, the break is named
    assert hashlib.sha256(forged).hexdigest()[:12] in captured.out


def test_a_missing_journal_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", str(tmp_path / "nothing.db")]) == 2
    assert "no journal" in capsys.readouterr().err


def test_the_signatures_are_verified_and_an_appended_approval_exits_1(
    journal: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from trioloop.durable.journal import decode_entry, encode_entry, entry_hash
    from trioloop.durable.signing import JournalSigner

    assert main(["audit", str(journal)]) == 0
    out = capsys.readouterr().out
    own = JournalSigner.default()  # the key the session signed with (this test run's own config folder)
    assert f"signed and verified ({own.key_id})" in out and "signed head of entry" in out
    # An auditor with only the public key verifies the same trail.
    assert main(["audit", str(journal), "--public-key", f"{own.key_id} {own.public_key_text}"]) == 0
    capsys.readouterr()
    with closing(sqlite3.connect(journal)) as db, db:
        seq, last = db.execute("SELECT seq, data FROM trioloop_journal ORDER BY seq DESC LIMIT 1").fetchone()
        entry = decode_entry(last)
        forged = encode_entry(seq + 1, "approve", entry_hash(last), entry.at_ms, {"call_id": "b", "by": "mallory"})
        db.execute("INSERT INTO trioloop_journal (session_id, seq, data) VALUES ('review-1', ?, ?)", (seq + 1, forged))
    assert main(["audit", str(journal)]) == 1
    err = capsys.readouterr().err
    assert f"entry {seq + 1} does not verify" in err and "follow the last seal" in err


@pytest.mark.parametrize("kind", ["empty", "random bytes", "another SQLite database"])
def test_a_file_that_is_not_a_journal_is_left_as_it_was_with_exit_2(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "not-a-journal.db"
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "random bytes":
        path.write_bytes(bytes(range(256)) * 20)
    else:
        with closing(sqlite3.connect(path)) as db, db:
            db.execute("CREATE TABLE notes (text TEXT)")
            db.execute("INSERT INTO notes VALUES ('mine')")
    before = path.read_bytes()
    assert main(["audit", str(path)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and ("not a trioloop journal" in err or "not a database" in err)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["not-a-journal.db"]  # no -wal, -shm or .lock left


def test_entries_that_cannot_be_read_are_named_by_number(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "damaged.db"
    with closing(sqlite3.connect(path)) as db, db:
        db.execute(
            "CREATE TABLE trioloop_journal (session_id TEXT NOT NULL, seq INTEGER NOT NULL, data BLOB NOT NULL, "
            "PRIMARY KEY (session_id, seq)) WITHOUT ROWID"
        )
        db.execute("INSERT INTO trioloop_journal VALUES ('text', 4, 'stored as text')")
        db.execute("INSERT INTO trioloop_journal VALUES ('garbage', 7, X'00ff10')")
    assert main(["audit", str(path)]) == 1
    err = capsys.readouterr().err
    assert "session text: entry 4 does not verify" in err and "session garbage: entry 7 does not verify" in err
    assert "None" not in err and "Traceback" not in err


async def test_an_entry_over_the_size_cap_is_refused_unread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import trioloop.durable._sql as sql
    from trioloop import JournalError
    from trioloop.durable.store import StoredEntry

    monkeypatch.setattr(sql, "MAX_ENTRY_BYTES", 1000)
    async with SQLiteJournalStore(tmp_path / "big.db") as store:
        lease = await store.acquire("s")
        await lease.append([StoredEntry(1, b"x" * 999), StoredEntry(2, b"y" * 5000)])
        for read in (lambda: store.read("s"), lambda: lease.entries()):
            with pytest.raises(JournalError, match="entry 2 is 5000 bytes, over the 1000-byte cap: it was not read"):
                await read()
        await lease.release()


def test_resuming_a_path_that_does_not_exist_makes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    document = tmp_path / "model.thf"
    document.write_text((Path(__file__).resolve().parent.parent / "examples" / "payment.thf").read_text())
    missing = tmp_path / "model.thf.journal"
    assert main(["chat", str(document), "--provider", "anthropic", "--resume", str(missing)]) == 2
    assert "nothing to resume" in capsys.readouterr().err
    assert not missing.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["model.thf"]
