"""No way around the proof: a session has one journal, witnessed under a name the journal cannot choose, and every
stored byte of it is under a signature.

The scene is `test_journal_integrity`'s (a destructive ``wipe`` waits for the person, the session suspended in
review, on a real SQLite file and a real PostgreSQL database). The attacker here does not forge entries: they put
another journal of the same session in its place (signed by the same key), empty the session, or edit one stored
field at a time; each is refused by `Session.open`, and ``wipe`` never runs.
"""

# ruff: noqa: F811 -- the fixtures imported from test_journal_integrity are the parameters of the tests below
from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
import trio
from pg_support import postgres_url  # noqa: F401 -- the session fixture, reached by name (getfixturevalue)
from test_journal_integrity import (  # noqa: F401 -- fixtures, reached by name
    NOTE,
    RUNS,
    SCRIPT,
    TOOLS,
    Journal,
    _fresh_runs,
    journal,
    open_note,
    refused,
    signer,
    suspended_in_review,
)

from trioloop import JournalError, ScriptedProvider, Session
from trioloop.durable.journal import decode_entry, encode_entry
from trioloop.durable.signing import JournalSigner
from trioloop.durable.store import MemoryJournalStore
from trioloop.durable.witness import FileWitness
from trioloop.providers.scripted import ScriptStep


def witness_in(path: Journal, signer: JournalSigner) -> FileWitness:
    return FileWitness(path.file.parent / "witness", signer=signer)


async def witnessed_in_review(path: Journal, signer: JournalSigner) -> FileWitness:
    """The scene, suspended in review, then opened once with a witness of the test's own: witnessed from then on."""
    witness = witness_in(path, signer)
    await suspended_in_review(path, signer)
    session = await open_note(path, signer=signer, witness=witness)
    await session.aclose()
    return witness


async def test_another_journal_of_the_same_session_is_refused_naming_both_heads(
    journal: Journal, signer: JournalSigner
) -> None:
    path = journal
    witness = await witnessed_in_review(path, signer)
    mine = path.rows()
    # The same session id, the same key, another journal (another run of the app, on another store); then that
    # journal, and its first entries alone, put in place of this session's.
    elsewhere = MemoryJournalStore()
    chat = [ScriptStep(text="Nothing to change."), ScriptStep(text="Still nothing.")]
    async with ScriptedProvider(chat) as provider:
        other = await Session.open(
            elsewhere, path.sid("s1"), kind=NOTE, provider=provider, document="keep me\n", model="m", tools=TOOLS,
            signer=signer, witness=None,
        )  # fmt: skip
        async with other:
            await other.send("anything to do?")
            await other.send("and now?")
    theirs = [(entry.seq, entry.data) for entry in await elsewhere.read(path.sid("s1"))]
    for replacement in (theirs, theirs[:8]):
        path.rewrite(replacement)
        error = await refused(path, signer, "another journal of the same session", witness=witness)
        assert str(mine[-1][0]) in str(error) and "journal" in str(error)
    # Put back, the session's own journal still opens, suspended in review as it was.
    path.rewrite(mine)
    session = await open_note(path, signer=signer, witness=witness)
    assert session.suspended
    await session.aclose()
    assert RUNS == []


async def test_an_emptied_session_is_refused_until_it_is_retired(journal: Journal, signer: JournalSigner) -> None:
    path = journal
    witness = await witnessed_in_review(path, signer)
    mine = path.rows()
    path.rewrite([])
    error = await refused(path, signer, "has no journal, but entry", witness=witness)
    assert str(mine[-1][0]) in str(error) and "Session.retire" in str(error)
    # Starting over under a witnessed id is an explicit act: retire it; the journal retired never opens again.
    retired = await Session.retire(path.store(), path.sid("s1"), signer=signer, witness=witness)
    assert retired is not None and retired.retired and retired.seq == mine[-1][0]
    fresh = await open_note(path, signer=signer, witness=witness)
    assert not fresh.suspended and fresh.state is None
    await fresh.aclose()
    started = path.rows()
    path.rewrite(mine)
    await refused(path, signer, "another journal of the same session", witness=witness)
    path.rewrite(started)
    again = await open_note(path, signer=signer, witness=witness)
    await again.aclose()
    # Retiring a journal that is there erases it, and the witness then refuses it if it is put back.
    await Session.retire(path.store(), path.sid("s1"), signer=signer, witness=witness)
    assert path.rows() == []
    path.rewrite(started)
    await refused(path, signer, "was retired", witness=witness)
    assert RUNS == []


def _edits(entry_bytes: bytes) -> list[tuple[str, bytes]]:
    """Every stored field of one entry changed in turn (and each field of a seal's data): what an attacker with
    write access to the store can do to one row."""
    entry = decode_entry(entry_bytes)
    value = json.loads(entry_bytes)
    edits: list[tuple[str, dict[str, Any]]] = [
        ("seq", {**value, "seq": entry.seq + 1}),
        ("kind", {**value, "kind": "advance" if entry.kind != "advance" else "retry"}),
        ("prev", {**value, "prev": ("1" if entry.prev[0] != "1" else "2") + entry.prev[1:]}),
        ("at", {**value, "at": entry.at_ms + 1}),
        ("data", {**value, "data": {**entry.data, "edited": True}}),
    ]
    if entry.kind == "seal":
        sig = base64.b64decode(entry.data["sig"])
        changed = {
            "session": "someone-else",
            "v": 1,
            "key": "ed25519:0000000000000000",
            "sig": base64.b64encode(bytes([sig[0] ^ 1]) + sig[1:]).decode(),
        }
        edits += [(f"data.{k}", {**value, "data": {**entry.data, k: v}}) for k, v in changed.items()]
        edits.append(("data.v dropped", {**value, "data": {k: v for k, v in entry.data.items() if k != "v"}}))
    return [(name, encode_entry(v["seq"], v["kind"], v["prev"], v["at"], v["data"])) for name, v in edits]


async def test_every_stored_field_of_every_entry_is_under_the_signature(
    journal: Journal, signer: JournalSigner
) -> None:
    path = journal
    await suspended_in_review(path, signer)
    rows = path.rows()
    refusals = 0
    for index, (seq, data) in enumerate(rows):
        for _field, edited in _edits(data):
            changed = list(rows)
            changed[index] = (seq, edited)
            path.rewrite(changed)
            with pytest.raises(JournalError):
                await open_note(path, signer=signer, witness=None)
            refusals += 1
        # The row's own columns: stored under another number, or under another session.
        changed = [row for row in rows if row[0] != seq] + [(len(rows) + 5, data)]
        path.rewrite(sorted(changed))
        with pytest.raises(JournalError):
            await open_note(path, signer=signer, witness=None)
    path.rewrite(rows[1:])  # the first row moved away (another session would have it)
    with pytest.raises(JournalError):
        await open_note(path, signer=signer, witness=None)
    assert refusals >= 5 * len(rows) and RUNS == []
    path.rewrite(rows)
    session = await open_note(path, signer=signer, witness=None)
    assert session.suspended
    await session.aclose()


async def test_the_newest_seals_time_is_signed(journal: Journal, signer: JournalSigner) -> None:
    # The last entry of a journal is a seal, and nothing after it hashes it: its time must be inside its own
    # signature, or it could say 2058 and still verify, with a key alone on another machine.
    path = journal
    await suspended_in_review(path, signer)
    rows = path.rows()
    seq, data = rows[-1]
    seal = decode_entry(data)
    assert seal.kind == "seal" and seal.data["v"] == 2
    path.rewrite([*rows[:-1], (seq, encode_entry(seq, "seal", seal.prev, 2_840_000_000_000, dict(seal.data)))])
    await refused(path, signer, "signature does not verify", witness=None)
    from trioloop.durable.journal import verify_journal

    entries = [decode_entry(raw) for _, raw in path.rows()]
    with pytest.raises(JournalError, match="signature does not verify"):
        verify_journal(entries, session_id=path.sid("s1"), keys=JournalSigner.generate().keys | signer.keys)


async def test_an_edited_witness_file_is_refused_like_a_damaged_one(journal: Journal, signer: JournalSigner) -> None:
    path = journal
    witness = await witnessed_in_review(path, signer)
    (file,) = [p for p in witness.folder.iterdir() if p.suffix == ".head"]
    data = file.read_bytes()
    assert b'"mac":' in data
    # Any byte of a head changed (here: its number, the slot's own checksum recomputed) is seen.
    from test_witness_file import _reslot

    _reslot(file, lambda value: {**value, "seq": value["seq"] - 3})
    await refused(path, signer, "was edited", witness=witness)
    file.write_bytes(data)
    async with ScriptedProvider(SCRIPT) as provider:
        reopened = await Session.open(
            path.store(), path.sid("s1"), kind=NOTE, provider=provider, tools=TOOLS, signer=signer, witness=witness
        )
        assert reopened.suspended
        await reopened.aclose()


async def test_a_compacted_journal_cut_back_to_its_snapshot_is_refused(journal: Journal, signer: JournalSigner) -> None:
    # Reopening a compacted journal replays from the snapshot its last turn started from, so that turn's state comes
    # back; cut back to that snapshot alone, it used to reopen with `state` None, as if no turn had run.
    path = journal
    script = [ScriptStep(text="First."), ScriptStep(text="Second."), ScriptStep(text="Third.")]
    async with ScriptedProvider(script) as provider:
        session = await Session.open(
            path.store(), path.sid("s1"), kind=NOTE, provider=provider, document="keep me\n", model="m", tools=TOOLS,
            signer=signer, compact=True, witness=witness_in(path, signer),
        )  # fmt: skip
        async with session:
            for text in ("one", "two", "three"):
                await session.send(text)
    rows = path.rows()
    assert rows[0][0] > 1
    reopened = await open_note(path, signer=signer, witness=None)
    assert reopened.state is not None and reopened.state.turn_id == "turn-3"
    await reopened.aclose()
    first_seal = next(i for i, (_, raw) in enumerate(rows) if decode_entry(raw).kind == "seal")
    path.rewrite(rows[: first_seal + 1])  # the snapshot and its seal: a journal that verifies on its own
    await refused(path, signer, "holds no turn after it", witness=None)
    await refused(path, signer, "holds no turn after it|witnessed", witness=witness_in(path, signer))


TESTS = Path(__file__).resolve().parent
_HOSTILE_OPEN = """
import resource, sys, time
import trio
from trioloop import JournalError, ScriptedProvider, Session
from trioloop.durable.signing import JournalSigner
from trioloop.stores import open_store
from test_journal_integrity import NOTE, TOOLS

signer = JournalSigner.load(sys.argv[2])

async def main():
    async with open_store(sys.argv[1]) as store:
        try:
            await Session.open(store, sys.argv[3], kind=NOTE, provider=ScriptedProvider([]), tools=TOOLS,
                               signer=signer, witness=None)
        except JournalError as exc:
            print(exc)

before, cpu = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.process_time()
trio.run(main)
print(time.process_time() - cpu, (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024)
"""


async def _hostile_open(path: Journal, key_file: Path) -> tuple[str, float, float]:
    """`Session.open` of ``path``'s session in a process of its own (its peak memory and CPU are this open's
    alone): what it said, its CPU seconds, and the memory it took beyond its start, in MB."""
    import subprocess
    import sys

    target = str(path.file) if path.url is None else path.url
    done = await trio.to_thread.run_sync(
        lambda: subprocess.run(
            [sys.executable, "-c", _HOSTILE_OPEN, target, str(key_file), path.sid("s1")],
            capture_output=True, text=True, check=True, cwd=TESTS, env=_child_env(key_file.parent),
        )
    )  # fmt: skip
    message, figures = done.stdout.strip().splitlines()
    cpu_s, extra_mb = (float(x) for x in figures.split())
    return message, cpu_s, extra_mb


def _child_env(config: Path) -> dict[str, str]:
    return {"PYTHONPATH": f"{TESTS}:{TESTS.parent}", "PATH": "/usr/bin:/bin", "XDG_CONFIG_HOME": str(config)}


def _put_large(path: Journal, seq: int, size: int) -> None:
    """An entry of ``size`` bytes stored as entry ``seq``, made by the database itself (never in this process)."""
    import contextlib
    import sqlite3
    from contextlib import closing

    if path.url is None:
        with closing(sqlite3.connect(path.file)) as db, db:
            db.execute(
                "INSERT OR REPLACE INTO trioloop_journal VALUES (?, ?, zeroblob(?))", (path.sid("s1"), seq, size)
            )
        return
    import psycopg

    with psycopg.connect(path.url, autocommit=True) as db:
        with contextlib.suppress(psycopg.Error):  # LZ4 where the server has it: pglz takes seconds over 300 MB
            db.execute("SET default_toast_compression = 'lz4'")
        db.execute("DELETE FROM trioloop_journal WHERE session_id = %s AND seq = %s", (path.sid("s1"), seq))
        sql = "INSERT INTO trioloop_journal VALUES (%s, %s, decode(repeat('00', %s), 'hex'))"
        db.execute(sql, (path.sid("s1"), seq, size))


async def test_an_entry_of_hundreds_of_mb_is_refused_unread(journal: Journal, signer: JournalSigner) -> None:
    # An unsigned entry after the last seal used to be decoded whole before its place settled the verdict (1.2 GB and
    # minutes of CPU for 200 MB); one over the size cap was read whole by SQLite to be refused (316 MB for 300 MB).
    path = journal
    await suspended_in_review(path, signer)
    last = path.rows()[-1][0]
    key_file = path.file.parent / "keys" / "journal-key"
    signer.save(key_file)
    rows = path.rows()
    cases = (  # (where, size, what the refusal says)
        (last + 1, 200_000_000, "follow the last seal the keys given verify: nobody signed them (refused unread)"),
        (3, 300_000_000, "over the 268435456-byte cap: it was not read"),  # before the last seal, over the cap
    )
    for seq, size, said in cases:
        path.rewrite(rows)
        _put_large(path, seq, size)
        message, cpu_s, extra_mb = await _hostile_open(path, key_file)
        assert said in message, message
        assert cpu_s < 2 and extra_mb < 64, (size, cpu_s, extra_mb)  # judged by its place and length: never read
        print(f"{path.backend}: entry {seq} of {size // 10**6} MB refused in {cpu_s:.2f} s CPU, +{extra_mb:.0f} MB")
    assert RUNS == []


async def test_a_journal_file_of_an_earlier_version_is_moved_to_the_table_that_never_reads_an_entry_to_find_it(
    tmp_path: Path, signer: JournalSigner
) -> None:
    import sqlite3
    from contextlib import closing

    path = Journal("sqlite", tmp_path, None)
    await suspended_in_review(path, signer)
    rows = path.rows()
    old = tmp_path / "old.db"
    with closing(sqlite3.connect(old)) as db, db:  # the table as earlier versions made it
        db.execute(
            "CREATE TABLE trioloop_journal (session_id TEXT NOT NULL, seq INTEGER NOT NULL, data BLOB NOT NULL, "
            "PRIMARY KEY (session_id, seq)) WITHOUT ROWID"
        )
        db.executemany("INSERT INTO trioloop_journal VALUES ('s1', ?, ?)", rows)
    path.file = old
    session = await open_note(path, signer=signer, witness=None)
    assert session.suspended
    await session.aclose()
    with closing(sqlite3.connect(old)) as db:
        (sql,) = db.execute("SELECT sql FROM sqlite_master WHERE name = 'trioloop_journal'").fetchone()
        moved = [(seq, bytes(data)) for seq, data in db.execute("SELECT seq, data FROM trioloop_journal ORDER BY seq")]
    assert "WITHOUT ROWID" not in sql.upper() and moved[: len(rows)] == rows
    assert RUNS == []
