"""`trioloop chat FILE --resume J` goes on only with J's own document: the binding of a journal (or a session
file) to the document it was started on, checked against real files and a real SQLite journal."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

import pytest
import trio

from tests.test_cli_autosave import COMMENT, PAYMENT, _read, add_threat, answers
from trioloop.cli import main
from trioloop.cli.chat import chat_session
from trioloop.cli.document_lock import lock_folder
from trioloop.durable.document_form import DocumentCodec
from trioloop.durable.journal import document_digest
from trioloop.durable.witness import default_witness_path
from trioloop.providers.scripted import ScriptedProvider, ScriptStep
from trioloop.threatmodel import THREAT_MODEL, load_thf

GARDEN = PAYMENT.read_text(encoding="utf-8").replace("title: Payment platform", "title: Garden irrigation")


@pytest.fixture
def payment(tmp_path: Path) -> Path:
    path = tmp_path / "payment.thf"
    path.write_text(COMMENT + PAYMENT.read_text(encoding="utf-8"), encoding="utf-8")
    return path


@pytest.fixture
def garden(tmp_path: Path) -> Path:
    path = tmp_path / "garden.thf"
    path.write_text(GARDEN, encoding="utf-8")
    return path


async def _one_change(path: Path, title: str = "Added") -> Path:
    """A chat on ``path`` that adds one threat, journaled beside it; the journal."""
    steps = [add_threat("c1", title), ScriptStep(text="Added.")]
    async with ScriptedProvider(steps) as provider:
        code = await chat_session(path, provider, "scripted-1", "ask", answers("add one", "a"), journal=_journal(path))
    assert code == 0
    return _journal(path)


def _write(path: Path, data: bytes) -> None:
    with open(path, "wb") as file:  # a plain write: these tests run no other task meanwhile
        file.write(data)


def _journal(path: Path) -> Path:
    return path.with_name(path.name + ".journal")


async def _resume(path: Path, journal: Path, *, out: Path | None = None, replies: tuple[str, ...] = ()) -> int:
    async with ScriptedProvider([ScriptStep(text="Still here.")]) as provider:
        code = await chat_session(
            path, provider, "scripted-1", "ask", answers(*replies), out=out, journal=journal, resume=True
        )
        _resume.requests = len(provider.requests)  # type: ignore[attr-defined]
    return code


async def test_another_documents_journal_is_refused_and_nothing_is_written(
    payment: Path, garden: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    journal = await _one_change(payment)
    before, listing = _read(garden), sorted(p.name for p in garden.parent.iterdir() if not p.name.startswith("."))
    capsys.readouterr()
    assert await _resume(garden, journal, replies=("hello",)) == 2
    err = capsys.readouterr().err
    assert f"is the chat of {payment}, not of {garden}" in err
    assert f"trioloop chat {garden} --resume {journal} --out NEW.thf" in err  # how to go on, both ways
    assert f"trioloop chat {garden}\n" in err + "\n"
    assert _read(garden) == before and _resume.requests == 0  # type: ignore[attr-defined]
    assert sorted(p.name for p in garden.parent.iterdir() if not p.name.startswith(".")) == listing


async def test_a_file_changed_outside_the_chat_since_its_last_commit_is_refused(
    payment: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    journal = await _one_change(payment)
    edited = _read(payment).replace(b"title: Payment platform", b"title: Payments (edited)")
    _write(payment, edited)
    capsys.readouterr()
    assert await _resume(payment, journal) == 2
    assert f"{payment} is not the document {journal} last committed: it changed outside the chat" in (
        capsys.readouterr().err
    )
    assert _read(payment) == edited


async def test_the_same_document_resumes_and_a_comment_or_a_move_does_not_matter(
    payment: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    journal = await _one_change(payment)
    assert load_thf(payment).threats[-1].title == "Added"
    moved = tmp_path / "moved.thf"
    _write(moved, b"# a comment added by hand\n" + _read(payment))
    os.unlink(payment)
    capsys.readouterr()
    assert await _resume(moved, journal, replies=("hello",)) == 0
    out = capsys.readouterr().out
    assert f"This chat was started on {payment}; it goes on in {moved}." in out
    assert _resume.requests == 1  # type: ignore[attr-defined]
    # The journal now records the new home: a second resume there is silent about it.
    assert await _resume(moved, journal) == 0
    assert "was started on" not in capsys.readouterr().out


async def test_a_journal_continues_into_a_new_file_and_leaves_the_other_alone(
    payment: Path, garden: Path, tmp_path: Path
) -> None:
    journal = await _one_change(payment, "From payment")
    before = _read(garden)
    new = tmp_path / "continued.thf"
    steps = [add_threat("c9", "Later"), ScriptStep(text="Added.")]
    async with ScriptedProvider(steps) as provider:
        code = await chat_session(
            garden, provider, "scripted-1", "ask", answers("more", "a"), out=new, journal=journal, resume=True
        )
    assert code == 0 and _read(garden) == before
    titles = [t.title for t in load_thf(new).threats]
    assert titles[-2:] == ["From payment", "Later"] and load_thf(new).metadata.title == "Payment platform"


async def test_a_session_file_of_another_document_is_refused(
    payment: Path, garden: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = payment.with_name("payment.session.json")
    steps = [add_threat("c1", "Added"), ScriptStep(text="Added.")]
    async with ScriptedProvider(steps) as provider:
        code = await chat_session(payment, provider, "scripted-1", "ask", answers("add one", "a", f"/save {saved}"))
    assert code == 0 and saved.is_file()
    before = _read(garden)
    capsys.readouterr()
    async with ScriptedProvider([]) as provider:
        code = await chat_session(garden, provider, "scripted-1", "ask", answers("hello"), session_file=saved)
    assert code == 2 and _read(garden) == before and not provider.requests
    assert f"{saved} is the chat of {payment}, not of {garden}" in capsys.readouterr().err
    assert not await trio.Path(_journal(garden)).exists()  # a failed resume makes no journal
    # On its own document it resumes.
    async with ScriptedProvider([ScriptStep(text="Hello.")]) as provider:
        assert await chat_session(payment, provider, "scripted-1", "ask", answers("hi"), session_file=saved) == 0


async def test_the_audit_names_the_document_and_each_commits_digest(
    payment: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    journal = await _one_change(payment)
    capsys.readouterr()
    assert await trio.to_thread.run_sync(main, ["audit", str(journal)]) == 0
    out = capsys.readouterr().out
    assert f"session snapshot of the threat model ({payment}):" in out
    # The journal keeps the model in its data form (JSON of the .thf mapping); the audit says so.
    form, text = DocumentCodec.of(THREAT_MODEL).encode(load_thf(payment))
    assert form == "json"
    committed = document_digest(text)[:16]
    assert f"committed the document (its data form, sha256 {committed}…)" in out


def everything(*folders: Path) -> dict[str, bytes]:
    """Every file under ``folders``, hidden ones included, with its bytes (a symlink: where it points)."""
    found: dict[str, bytes] = {}
    for folder in folders:
        for path in sorted(folder.rglob("*")) if folder.is_dir() else ():
            if path.is_symlink():
                found[str(path)] = os.readlink(path).encode()
            elif path.is_file():
                found[str(path)] = _read(path)
            else:
                found[str(path)] = b"<folder>"
    return found


def _copy_beside(payment: Path) -> Path:
    return payment.with_name("payment-copy.thf")


def _copy_elsewhere(payment: Path) -> Path:
    folder = payment.parent / "copies"
    folder.mkdir(exist_ok=True)
    return folder / "payment.thf"


@pytest.mark.parametrize("where", [_copy_beside, _copy_elsewhere])
async def test_a_copy_while_the_chats_own_file_is_there_is_refused_naming_both(
    payment: Path, where: Callable[[Path], Path], capsys: pytest.CaptureFixture[str]
) -> None:
    journal = await _one_change(payment)
    copy = where(payment)
    _write(copy, _read(payment))  # J's very document, in another file
    before = everything(payment.parent, lock_folder(), default_witness_path())
    capsys.readouterr()
    assert await _resume(copy, journal, replies=("hello",)) == 2
    err = capsys.readouterr().err
    assert f"{copy} is a copy of {payment}, the file {journal} is the chat of, which is still there" in err
    assert f"To go on in the chat's own file: trioloop chat {payment} --resume {journal}\n" in err
    assert f"trioloop chat {copy} --resume {journal} --out NEW.thf" in err and "nothing was written" in err
    assert _resume.requests == 0  # type: ignore[attr-defined]
    assert everything(payment.parent, lock_folder(), default_witness_path()) == before
    # The journal still records the first file: it resumes there, silently about any move.
    assert await _resume(payment, journal) == 0
    assert "was started on" not in capsys.readouterr().out
    # A real move (the chat's own file gone) goes on where the document is now.
    os.unlink(payment)
    assert await _resume(copy, journal) == 0
    assert f"This chat was started on {payment}; it goes on in {copy}." in capsys.readouterr().out


async def test_the_same_file_by_a_symlink_is_no_copy(payment: Path, tmp_path: Path) -> None:
    journal = await _one_change(payment)
    link = tmp_path / "linked.thf"
    link.symlink_to(payment)
    assert await _resume(link, journal) == 0


def _another_document(payment: Path, garden: Path) -> Path:
    return garden


def _changed_outside(payment: Path, garden: Path) -> Path:
    _write(payment, _read(payment).replace(b"title: Payment platform", b"title: Payments (edited)"))
    return payment


def _a_copy(payment: Path, garden: Path) -> Path:
    copy = garden.with_name("copy.thf")
    _write(copy, _read(payment))
    return copy


def _a_forged_journal(payment: Path, garden: Path) -> Path:
    with closing(sqlite3.connect(_journal(payment))) as db, db:
        seq, data = db.execute(
            "SELECT seq, data FROM trioloop_journal WHERE CAST(data AS TEXT) LIKE '%add one%'"
        ).fetchone()
        forged = bytes(data).replace(b"add one", b"ADD ONE")  # the person's request, rewritten
        db.execute("UPDATE trioloop_journal SET data = ? WHERE seq = ?", (forged, seq))
    return payment


@pytest.mark.parametrize("refused", [_another_document, _changed_outside, _a_copy, _a_forged_journal])
async def test_a_refused_resume_writes_not_a_byte_to_either_place(
    payment: Path, garden: Path, refused: Callable[[Path, Path], Path], tmp_path: Path
) -> None:
    # J and its document in one folder, the file resumed (another document, an edit, a copy) in another; or J forged.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    moved = elsewhere / garden.name
    os.rename(garden, moved)
    journal = await _one_change(payment)
    target = refused(payment, moved)
    places = (payment.parent, elsewhere, lock_folder(), default_witness_path())
    before = everything(*places)
    assert await _resume(target, journal, replies=("hello",)) == 2
    after = everything(*places)
    assert after == before  # the journal (no lease row, no entry), both documents, no lock file, no witness
    assert not [name for name in after if name.endswith(("-wal", "-shm", ".trioloop-lock"))]


async def test_a_file_that_is_no_journal_is_refused_and_left_as_it_was(
    payment: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "other.db"
    with closing(sqlite3.connect(other)) as db, db:
        db.execute("CREATE TABLE notes (text TEXT)")
    before = everything(tmp_path)
    assert await _resume(payment, other) == 2
    assert "cannot be used" in capsys.readouterr().err
    assert everything(tmp_path) == before  # no trioloop table made in another program's database


async def test_after_a_save_conflict_resume_names_the_conflict_file(
    payment: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    edited_by_hand = _read(payment).replace(b"title: Payment platform", b"title: Payments (edited elsewhere)")
    replies = iter(["add one", "a"])

    def prompt(label: str) -> str:
        reply = next(replies, None)
        if reply is None:
            raise EOFError
        if reply == "add one":
            _write(payment, edited_by_hand)  # another editor saves the file while the chat is open
        return reply

    steps = [add_threat("c1", "Approved"), ScriptStep(text="Added.")]
    async with ScriptedProvider(steps) as provider:
        assert await chat_session(payment, provider, "scripted-1", "ask", prompt, journal=_journal(payment)) == 0
    (conflict,) = payment.parent.glob("payment.conflict-*.thf")
    capsys.readouterr()
    assert await _resume(payment, _journal(payment)) == 2
    err = capsys.readouterr().err
    assert f"{payment} is not the document {_journal(payment)} last committed: it changed outside the chat" in err
    assert f"the chat saved its approved changes to {conflict} instead (compare the two)" in err
    assert _read(payment) == edited_by_hand
