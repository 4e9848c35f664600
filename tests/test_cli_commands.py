"""`trioloop chat` commands: /undo and /redo through several turns, /save and --resume of a session file,
/usage, /help, a one-shot run's exit status, and --timeout."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import trio
import trio.testing

from trioloop.cli.chat import chat_session
from trioloop.cli.exit_codes import EXIT_TURN_FAILED
from trioloop.cli.parser import _build_parser, _journal_path
from trioloop.machine.limits import TurnLimits
from trioloop.providers.scripted import ScriptedCall, ScriptedProvider, ScriptStep
from trioloop.threatmodel import load_thf

PAYMENT = Path(__file__).resolve().parent.parent / "examples" / "payment.thf"


def add_threat(cid: str, title: str) -> ScriptStep:
    threat = {"title": title, "category": "Spoofing", "severity": "medium", "element": "psp"}
    return ScriptStep(tool_calls=(ScriptedCall(id=cid, name="add_threat", input={"threat": threat}),))


def answers(*replies: str) -> Callable[[str], str]:
    queue: Iterator[str] = iter(replies)

    def prompt(_: str) -> str:
        reply = next(queue, None)
        if reply is None:
            raise EOFError
        return reply

    return prompt


@pytest.fixture
def thf(tmp_path: Path) -> Path:
    path = tmp_path / "model.thf"
    path.write_text(PAYMENT.read_text(encoding="utf-8"), encoding="utf-8")
    return path


def titles(path: Path) -> list[str]:
    return [t.title for t in load_thf(path).threats]


async def test_undo_and_redo_step_through_turns_and_the_file_follows(
    thf: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = titles(thf)
    steps = [add_threat("a", "First"), ScriptStep(text="ok"), add_threat("b", "Second"), ScriptStep(text="ok")]
    replies = answers("add one", "add another", "/undo", "/undo", "/undo", "/redo", "/usage", "/help", "/nope")
    async with ScriptedProvider(steps) as provider:
        code = await chat_session(thf, provider, "scripted-1", "safe", replies, journal=tmp_path / "j.journal")
    out = capsys.readouterr().out
    assert code == 0
    assert "Undid turn-2." in out and "Undid turn-1." in out and "Nothing to undo." in out
    assert "Redid turn-1." in out
    assert titles(thf) == [*base, "First"]  # saved after every /undo and /redo
    assert "This session:" in out and "/redo" in out and "Unknown command '/nope'" in out
    # The last turn's tokens too; the scripted model has no price, so no cost is shown (nor guessed).
    assert "; last turn: " in out and "(no price known for 'scripted-1': cost not shown)" in out


async def test_save_then_resume_a_session_file_continues_the_conversation(
    thf: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = tmp_path / "work.session.json"
    async with ScriptedProvider([add_threat("a", "First"), ScriptStep(text="ok")]) as provider:
        assert await chat_session(thf, provider, "scripted-1", "safe", answers("add", f"/save {saved}", "/usage")) == 0
    out = capsys.readouterr().out
    assert f"Saved the session to {saved}" in out
    first = re.search(r"This session: (\d+) in, (\d+) out", out)
    assert first is not None and int(first[1]) > 0
    seen: list[int] = []

    class Counting(ScriptedProvider):
        async def stream(self, request, sink):  # type: ignore[no-untyped-def]
            seen.append(len(request.messages))
            await super().stream(request, sink)

    async with Counting([ScriptStep(text="Still here.")]) as provider:
        code = await chat_session(
            thf, provider, "scripted-1", "safe", answers("/undo", "hello", "/usage"), session_file=saved, journal=None
        )
    out = capsys.readouterr().out
    assert code == 0 and "Undid turn-1." in out  # the undo history came back with the session
    assert seen and seen[0] > 1  # the request carried the earlier conversation
    # The session file kept the token counts: the resumed chat's session total goes on from them.
    turn = re.search(r"tokens: (\d+) in, (\d+) out; session: (\d+) in, (\d+) out", out)
    assert turn is not None
    assert (int(turn[3]), int(turn[4])) == (int(first[1]) + int(turn[1]), int(first[2]) + int(turn[2]))
    assert f"This session: {turn[3]} in, {turn[4]} out" in out


async def test_a_broken_session_file_is_a_usage_error(thf: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text("{}", encoding="utf-8")
    async with ScriptedProvider([]) as provider:
        assert await chat_session(thf, provider, "scripted-1", "safe", answers(), session_file=broken) == 2


async def test_a_one_shot_run_that_ends_at_a_limit_exits_non_zero(
    thf: Path, autojump_clock: trio.testing.MockClock
) -> None:
    stalled = ScriptStep(text="thinking...", stall_after_bytes=0)
    async with ScriptedProvider([stalled], retry=None) as provider:
        code = await chat_session(
            thf, provider, "scripted-1", "safe", answers(), limits=TurnLimits(turn_deadline_ms=2_000), one_shot="go"
        )
    assert code == EXIT_TURN_FAILED
    async with ScriptedProvider([ScriptStep(text="Done.")]) as provider:
        assert await chat_session(thf, provider, "scripted-1", "safe", answers(), one_shot="go") == 0


def test_timeout_prompt_and_resume_options(thf: Path, tmp_path: Path) -> None:
    parser = _build_parser()
    args = parser.parse_args(["chat", str(thf), "--provider", "anthropic", "--timeout", "2.5", "--prompt", "x"])
    assert args.timeout == 2.5 and args.prompt == "x"
    assert _journal_path(args) == (f"{thf}.journal", None)
    for bad in ("0", "-1", "nan", "inf", "soon"):
        with pytest.raises(SystemExit):
            parser.parse_args(["chat", str(thf), "--provider", "anthropic", "--timeout", bad])
    session_file = tmp_path / "s.json"
    session_file.write_text("{}", encoding="utf-8")
    journal = tmp_path / "j.db"
    journal.write_bytes(b"SQLite format 3\x00" + bytes(100))
    resumed = parser.parse_args(["chat", str(thf), "--provider", "anthropic", "--resume", str(session_file)])
    assert _journal_path(resumed) == (f"{thf}.journal", str(session_file))
    resumed = parser.parse_args(["chat", str(thf), "--provider", "anthropic", "--resume", str(journal)])
    assert _journal_path(resumed) == (str(journal), None)


@pytest.mark.parametrize(("command", "option"), [("serve", "--reviewers FILE"), ("worker", "--app MODULE:FACTORY")])
def test_the_web_commands_parse_their_own_options(
    command: str, option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from trioloop.cli.parser import main

    assert main([command, "--help"]) == 0
    assert option in capsys.readouterr().out
    assert main([command]) == 2  # a required option missing: a usage error, nothing started
    assert "required" in capsys.readouterr().err
    assert main(["--help"]) == 0
    assert f"    {command} " in capsys.readouterr().out  # listed with the other commands
