"""`trioloop chat FILE --resume J` goes on only with J's own document: the binding of a journal (or a session
file) to the document it was started on, checked against real files and a real SQLite journal."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio

from tests.test_cli_autosave import COMMENT, PAYMENT, _read, add_threat, answers
from trioloop.cli import main
from trioloop.cli.chat import chat_session
from trioloop.durable.journal import document_digest
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
    committed = document_digest(THREAT_MODEL.dump(load_thf(payment)))[:16]
    assert f"committed the document (sha256 {committed}…)" in out
