"""`trioloop audit` never guesses: without a public key it says it verified nothing and exits 5 (never 0, since a
journal `Session.open` would refuse can look the same without one); a key that cannot be read is an error; a
signature by a key not given is named as such; old keys can be given (repeated, or in a file); ``--json`` carries
the verdict; and a running session is audited as one consistent view, so a healthy live journal always verifies.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
import trio
from pg_support import postgres_url  # noqa: F401 -- the session fixture, reached by name (getfixturevalue)
from test_audit import NOTE, append_line, journal  # noqa: F401 -- the fixture is reached by name

from trioloop import ScriptedProvider, Session
from trioloop.cli import EXIT_UNVERIFIED, main
from trioloop.durable.audit import verify_session
from trioloop.durable.journal import decode_entry, encode_entry, entry_hash
from trioloop.durable.signing import JournalSigner, head_message
from trioloop.durable.witness import FileWitness
from trioloop.providers.scripted import ScriptStep
from trioloop.stores import PostgresJournalStore, SQLiteJournalStore


@pytest.fixture
def no_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An auditor with no signing key of their own (another machine, another user)."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "auditor"))
    monkeypatch.delenv("TRIOLOOP_JOURNAL_KEY", raising=False)


def _rows(path: Path) -> list[tuple[int, bytes]]:
    with closing(sqlite3.connect(path)) as db:
        return [(s, bytes(d)) for s, d in db.execute("SELECT seq, data FROM trioloop_journal ORDER BY seq")]


def _rewrite(path: Path, rows: list[tuple[int, bytes]]) -> None:
    with closing(sqlite3.connect(path)) as db, db:
        db.execute("DELETE FROM trioloop_journal")
        db.executemany("INSERT INTO trioloop_journal (session_id, seq, data) VALUES ('review-1', ?, ?)", rows)


def _public(signer: JournalSigner) -> str:
    return f"{signer.key_id} {signer.public_key_text}"


def test_without_a_key_nothing_is_verified_and_the_exit_is_never_0(
    journal: Path,  # noqa: F811
    no_key: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["audit", str(journal)]) == EXIT_UNVERIFIED
    assert "NOT VERIFIED: no public key was given" in capsys.readouterr().err
    # Every seal stripped: Session.open with the key refuses it; audit without a key must not say 0 either.
    stripped = [(seq, raw) for seq, raw in _rows(journal) if decode_entry(raw).kind != "seal"]
    prev, rechained = "0" * 64, []
    for n, (_, raw) in enumerate(stripped, start=1):
        entry = decode_entry(raw)
        raw = encode_entry(n, entry.kind, prev, entry.at_ms, dict(entry.data))
        rechained.append((n, raw))
        prev = entry_hash(raw)
    _rewrite(journal, rechained)
    assert main(["audit", str(journal)]) == EXIT_UNVERIFIED
    assert "NOT VERIFIED" in capsys.readouterr().err


def test_a_forged_approval_resigned_by_another_key_is_named_with_the_key_and_never_passes(
    journal: Path,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    writer = JournalSigner.default()  # the key the session signed with (this test run's config folder)
    mallory = JournalSigner.generate()
    rows = _rows(journal)
    seq, last = rows[-1]
    entry = decode_entry(last)
    forged = encode_entry(seq + 1, "approve", entry_hash(last), entry.at_ms + 1, {"call_id": "b", "by": "mallory"})
    head = entry_hash(forged)
    seal = {"session": "review-1", "v": 2, "key": mallory.key_id}
    seal["sig"] = mallory.sign(head_message("review-1", seq + 1, head, entry.at_ms + 2))
    _rewrite(journal, [*rows, (seq + 1, forged), (seq + 2, encode_entry(seq + 2, "seal", head, entry.at_ms + 2, seal))])
    assert main(["audit", str(journal), "--public-key", _public(writer)]) == 1
    err = capsys.readouterr().err
    assert f"signed by key {mallory.key_id}, which is not among the keys given" in err and "forged" not in err
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "auditor"))
    assert main(["audit", str(journal)]) == EXIT_UNVERIFIED  # no key: "not verified", never 0


def test_a_journal_key_that_is_not_there_is_an_error(
    journal: Path,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for named in (tmp_path / "missing-key", tmp_path):  # a file that does not exist, a folder
        monkeypatch.setenv("TRIOLOOP_JOURNAL_KEY", str(named))
        assert main(["audit", str(journal)]) == 2
        assert "could not be read" in capsys.readouterr().err
    monkeypatch.delenv("TRIOLOOP_JOURNAL_KEY")
    bad = tmp_path / "keys.txt"
    bad.write_text("# old keys\nnot a key\n")
    assert main(["audit", str(journal), "--public-keys", str(bad)]) == 2
    assert "keys.txt, line 2" in capsys.readouterr().err


def test_old_keys_verify_given_again_or_in_a_keys_file(
    tmp_path: Path, no_key: None, capsys: pytest.CaptureFixture[str]
) -> None:
    old = JournalSigner.generate()
    path = tmp_path / "j.db"
    trio.run(_one_turn, path, old)
    assert main(["audit", str(path), "--public-key", _public(JournalSigner.generate())]) == 1
    assert "which is not among the keys given" in capsys.readouterr().err
    keys = tmp_path / "keys.txt"
    keys.write_text(f"# rotated 2026-12\n{_public(JournalSigner.generate())}\n\n{_public(old)}  # the old one\n")
    assert main(["audit", str(path), "--public-keys", str(keys)]) == 0
    capsys.readouterr()
    assert main(["audit", str(path), "--public-key", old.public_key_text, "--json"]) == 0
    verdict = json.loads(capsys.readouterr().out.splitlines()[0])
    assert verdict["verdict"] == "verified" and verdict["key_ids"] == [old.key_id]


async def _one_turn(path: Path, signer: JournalSigner) -> None:
    async with ScriptedProvider([ScriptStep(text="Fine.")]) as provider, SQLiteJournalStore(path) as store:
        session = await Session.open(
            store, "review-1", kind=NOTE, provider=provider, document="", model="m", signer=signer, witness=None
        )
        async with session:
            await session.send("anything?")


@pytest.fixture(params=["sqlite", "postgres"])
async def target(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    yield request.getfixturevalue("postgres_url") if request.param == "postgres" else str(tmp_path / "live.db")


def _store(target: str) -> Any:
    return PostgresJournalStore(target) if target.startswith("postgresql://") else SQLiteJournalStore(target)


async def test_running_sessions_always_verify_when_audited(target: str, tmp_path: Path) -> None:
    # Three sessions append turn after turn while an auditor reads them a hundred times: the witnessed head is read
    # before the journal, so the journal read always holds it (it was read after, and appends only lengthen it).
    signer = JournalSigner.generate()
    witness = FileWitness(tmp_path / "witness", signer=signer)
    ids = [f"live-{n}-{tmp_path.name[-6:]}" for n in range(3)]
    verdicts: list[str] = []
    answers = [ScriptStep(text=f"Answer {n}.") for n in range(400)]
    async with _store(target) as writing, _store(target) as reading, trio.open_nursery() as nursery:

        async def chat(session_id: str, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            async with ScriptedProvider(answers) as provider:
                session = await Session.open(
                    writing, session_id, kind=NOTE, provider=provider, document="", model="m", tools=[append_line],
                    signer=signer, witness=witness,
                )  # fmt: skip
                async with session:
                    task_status.started()  # its journal exists: the auditor may read it from now on
                    while True:
                        await session.send("again")

        for session_id in ids:
            await nursery.start(chat, session_id)
        await trio.sleep(0.2)
        for round_ in range(100):
            session_id = ids[round_ % len(ids)]
            _, verdict = await verify_session(reading, session_id, keys=signer.keys, witness=witness)
            assert verdict.verdict == "verified", verdict.describe()
            verdicts.append(verdict.verdict)
            await trio.sleep(0.005)
        nursery.cancel_scope.cancel()
    assert len(verdicts) == 100
