"""`trioloop chat` saves after every turn that changed the document, and on Ctrl-C at any point."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import trio

from trioloop.cli.chat import chat_session
from trioloop.durable.witness import default_witness_path
from trioloop.providers.scripted import ScriptedCall, ScriptedProvider, ScriptStep
from trioloop.threatmodel import load_thf

PAYMENT = Path(__file__).resolve().parent.parent / "examples" / "payment.thf"
COMMENT = "# kept by hand: this comment must survive every save\n"


def add_threat(cid: str, title: str) -> ScriptStep:
    threat = {"title": title, "category": "Spoofing", "severity": "medium", "element": "psp"}
    return ScriptStep(
        text=f"Proposing {title}.", tool_calls=(ScriptedCall(id=cid, name="add_threat", input={"threat": threat}),)
    )


def _read(path: Path) -> bytes:
    with open(path, "rb") as file:  # a plain read: these tests run no other task while they check
        return file.read()


def answers(*replies: str | BaseException) -> Callable[[str], str]:
    """A prompt that gives each reply in turn (raising it when it is an exception), then EOF."""
    queue: Iterator[str | BaseException] = iter(replies)

    def prompt(_: str) -> str:
        reply = next(queue, EOFError())
        if isinstance(reply, BaseException):
            raise reply
        return reply

    return prompt


def interrupted(error: BaseException) -> bool:
    """A KeyboardInterrupt, alone or inside the exception groups Trio's nurseries wrap it in."""
    if isinstance(error, BaseExceptionGroup):
        return error.subgroup(KeyboardInterrupt) is not None
    return isinstance(error, KeyboardInterrupt)


@pytest.fixture
def thf(tmp_path: Path) -> Path:
    path = tmp_path / "model.thf"
    path.write_text(COMMENT + PAYMENT.read_text(encoding="utf-8"), encoding="utf-8")
    return path


async def test_each_turn_that_changes_the_document_is_saved_in_place(
    thf: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    steps = [add_threat("c1", "First"), ScriptStep(text="ok"), ScriptStep(text="just talk")]
    seen: list[int] = []
    base = len(load_thf(thf).threats)

    def prompt(text: str) -> str:
        seen.append(len(load_thf(thf).threats) - base)  # what is on disk when the user is asked again
        return answers("add one", "thanks")(text) if len(seen) == 1 else ["thanks", ""][len(seen) - 2]

    async with ScriptedProvider(steps) as provider:
        assert await chat_session(thf, provider, "scripted-1", "safe", prompt) == 0
    assert seen == [0, 1, 1]  # saved right after the first turn, before the next prompt
    out = capsys.readouterr().out
    assert out.count(f"Saved {thf}") == 1  # the talk-only turn changed nothing, so no second save
    text = _read(thf).decode()
    assert text.startswith(COMMENT) and "title: First" in text


async def test_out_receives_the_saves_and_the_source_is_untouched(thf: Path, tmp_path: Path) -> None:
    original = _read(thf)
    out = tmp_path / "edited.thf"
    async with ScriptedProvider([add_threat("c1", "First"), ScriptStep(text="ok")]) as provider:
        assert await chat_session(thf, provider, "scripted-1", "safe", answers("add"), out=out) == 0
    assert _read(thf) == original
    assert _read(out).decode().startswith(COMMENT)
    assert len(load_thf(out).threats) == len(load_thf(thf).threats) + 1


async def test_ctrl_c_at_the_prompt_or_mid_turn_keeps_every_committed_change(
    thf: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The first call is approved and commits; Ctrl-C arrives at the second call's review card.
    steps = [add_threat("c1", "First"), add_threat("c2", "Second"), ScriptStep(text="unreached")]
    base = len(load_thf(thf).threats)
    with pytest.raises(BaseException) as caught:
        async with ScriptedProvider(steps) as provider:
            await chat_session(thf, provider, "scripted-1", "ask", answers("add two", "a", KeyboardInterrupt()))
    assert interrupted(caught.value)
    threats = load_thf(thf).threats
    assert len(threats) == base + 1 and threats[-1].title == "First"
    assert f"Saved {thf}" in capsys.readouterr().out
    assert _read(thf).decode().startswith(COMMENT)


async def test_a_failed_save_is_reported_and_leaves_the_file(
    thf: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    original = _read(thf)

    def full(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    async with ScriptedProvider([add_threat("c1", "First"), ScriptStep(text="ok")]) as provider:
        assert await chat_session(thf, provider, "scripted-1", "safe", answers("add")) == 0
    monkeypatch.undo()
    assert _read(thf) == original
    assert "could not save" in capsys.readouterr().err


async def test_a_failed_folder_sync_says_the_new_content_is_in_place(
    thf: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import trioloop.durable.files

    def failing(folder: Path) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(trioloop.durable.files, "_fsync_folder", failing)
    async with ScriptedProvider([add_threat("c1", "First"), ScriptStep(text="ok")]) as provider:
        assert await chat_session(thf, provider, "scripted-1", "safe", answers("add"), journal=None) == 0
    monkeypatch.undo()
    err = capsys.readouterr().err
    assert "was written, but" in err and "the new content is in place" in err and "left as it was" not in err
    assert load_thf(thf).threats[-1].title == "First"


def test_trio_delivers_ctrl_c_to_the_loop(thf: Path) -> None:
    # The same path through trio.run, as `trioloop chat` runs it.
    async def main() -> int:
        async with ScriptedProvider([add_threat("c1", "First"), ScriptStep(text="ok")]) as provider:
            return await chat_session(thf, provider, "scripted-1", "safe", answers("add", KeyboardInterrupt()))

    with pytest.raises(BaseException) as caught:
        trio.run(main)
    assert interrupted(caught.value)
    assert len(load_thf(thf).threats) == len(load_thf(PAYMENT).threats) + 1


async def test_a_killed_chat_resumes_from_its_journal_at_the_open_review(
    thf: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The first call is approved and commits; at the second call's card the terminal is killed. What a
    # SIGKILL leaves is the journal as it stood (copied here at that instant: every entry is durable
    # before the card is shown); `--resume` continues that very review.
    journal = tmp_path / "model.thf.journal"
    killed = tmp_path / "killed.journal"
    witnessed = tmp_path / "witness-at-kill"
    base = len(load_thf(thf).threats)

    class Killed(Exception):
        pass

    replies: Iterator[str] = iter(["add two", "a"])
    at_kill: list[bytes] = []

    def prompt(label: str) -> str:
        reply = next(replies, None)
        if reply is not None:
            return reply
        for suffix in ("", "-wal"):  # WAL mode: the database and its log, as the process left them
            source = Path(f"{journal}{suffix}")
            if source.exists():
                Path(f"{killed}{suffix}").write_bytes(source.read_bytes())
        shutil.copytree(default_witness_path(), witnessed)  # and the witness of its heads, as it stood
        at_kill.append(_read(thf))  # and the document: a SIGKILL saves nothing on the way out
        raise Killed

    steps = [add_threat("c1", "First"), add_threat("c2", "Second"), ScriptStep(text="unreached")]
    with pytest.raises(BaseException):  # noqa: B017 - the "kill", wrapped in Trio's exception groups
        async with ScriptedProvider(steps) as provider:
            await chat_session(thf, provider, "scripted-1", "ask", prompt, journal=journal)
    assert f"resume with --resume {journal}" in capsys.readouterr().out
    # This process went on after the "kill" and wrote more: put back the witness a killed one leaves.
    shutil.rmtree(default_witness_path())
    shutil.copytree(witnessed, default_witness_path())
    await trio.Path(thf).write_bytes(at_kill[0])  # c1 committed, not saved yet

    async with ScriptedProvider([ScriptStep(text="Both added.")]) as provider:
        code = await chat_session(thf, provider, "scripted-1", "ask", answers("a"), journal=killed, resume=True)
    out = capsys.readouterr().out
    assert code == 0 and "Continuing the turn the journal left open." in out
    assert f"{thf} is one change behind {killed} (the chat stopped before saving it)" in out
    threats = load_thf(thf).threats
    assert [t.title for t in threats[base:]] == ["First", "Second"]  # c1 once (not run again), then c2
    assert len(provider.requests) == 1  # the open review did not ask the model again


async def test_resume_without_a_journal_is_a_usage_error(thf: Path, tmp_path: Path) -> None:
    async with ScriptedProvider([]) as provider:
        code = await chat_session(
            thf, provider, "scripted-1", "ask", answers(), journal=tmp_path / "none.journal", resume=True
        )
    assert code == 2


async def test_a_second_chat_on_the_same_file_says_who_holds_it_and_touches_nothing(
    thf: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _read(thf)
    entered = trio.Event()
    release = trio.Event()

    def first_prompt(_: str) -> str:
        trio.from_thread.run_sync(entered.set)
        trio.from_thread.run(release.wait)
        raise EOFError

    async with (
        ScriptedProvider([]) as first_provider,
        ScriptedProvider([]) as second_provider,
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(lambda: chat_session(thf, first_provider, "scripted-1", "ask", first_prompt))
        await entered.wait()
        listing = sorted(p.name for p in thf.parent.iterdir())
        code = await chat_session(thf, second_provider, "scripted-1", "ask", answers("hello"))
        assert sorted(p.name for p in thf.parent.iterdir()) == listing  # no journal, no file of its own
        release.set()
    err = capsys.readouterr().err
    assert code == 2 and "is being edited by another trioloop chat" in err and f"pid {os.getpid()}" in err
    assert _read(thf) == before and not second_provider.requests
    # Once the first chat has ended, the file is free again.
    async with ScriptedProvider([]) as provider:
        assert await chat_session(thf, provider, "scripted-1", "ask", answers()) == 0


async def test_a_save_after_the_file_changed_on_disk_goes_beside_it(
    thf: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    edited_by_hand = COMMENT + "# an edit made in another editor meanwhile\n" + PAYMENT.read_text(encoding="utf-8")

    def prompt(label: str) -> str:
        prompt.calls += 1  # type: ignore[attr-defined]
        if prompt.calls == 1:  # type: ignore[attr-defined]
            thf.write_text(edited_by_hand, encoding="utf-8")  # someone saves the file while the chat is open
            return "add one"
        if prompt.calls == 2:  # type: ignore[attr-defined]
            return "a"
        raise EOFError

    prompt.calls = 0  # type: ignore[attr-defined]
    base = len(load_thf(PAYMENT).threats)
    async with ScriptedProvider([add_threat("c1", "Approved"), ScriptStep(text="Added.")]) as provider:
        assert await chat_session(thf, provider, "scripted-1", "ask", prompt) == 0
    assert _read(thf).decode("utf-8") == edited_by_hand  # their edit is not overwritten
    beside = [p for p in thf.parent.iterdir() if p.name.startswith("model.conflict-") and p.suffix == ".thf"]
    assert len(beside) == 1
    assert [t.title for t in load_thf(beside[0]).threats[base:]] == ["Approved"]  # nor is the approved change lost
    assert f"The approved changes go to {beside[0]}" in capsys.readouterr().err
