"""Question cards in the terminal: the asker's words labelled, every field listed with its default, answers typed
field by field and checked as typed, a URL shown with its host and never opened, unattended modes cancel."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import pytest
from rich.console import Console

from trioloop import Answer, QuestionField, Session, ToolExecutionContext, ToolOutcome
from trioloop.cli.common import one_turn
from trioloop.cli.questions import parse_field
from trioloop.cli.view import ApproveMode, TurnView
from trioloop.machine.document import define_document_kind
from trioloop.machine.reducer import Outcome, TurnState
from trioloop.providers.scripted import ScriptedCall, ScriptedProvider, ScriptStep
from trioloop.tools import function_tool

NOTE = define_document_kind("note")
FORM = (
    QuestionField(name="name", kind="text", title="Name", required=True, description="Who you are"),
    QuestionField(name="age", kind="integer", minimum=0, maximum=150, default=30),
    QuestionField(name="plan", kind="choice", options=(("free", "Free"), ("pro", "Pro")), default="free"),
    QuestionField(name="tags", kind="choices", options=(("x", "X"), ("y", "Y"))),
    QuestionField(name="ok", kind="boolean", default=True),
)


async def _run(typed: list[str], mode: ApproveMode = "ask", url: str = "") -> tuple[TurnState, list[Any], str]:
    got: list[Any] = []

    @function_tool(effect="read")
    async def ask_person(ctx: ToolExecutionContext[str]) -> ToolOutcome[str]:
        """Ask the person."""
        got.append(
            await ctx.ask(source='MCP server "ff"', message="Details, please.", fields=() if url else FORM, url=url)
        )
        return ToolOutcome.success("asked")

    lines: Iterator[str] = iter(typed)

    def prompt(label: str) -> str:
        try:
            return next(lines)
        except StopIteration:
            raise EOFError from None

    out = io.StringIO()
    console = Console(file=out, width=100, force_terminal=False)
    steps = [ScriptStep(tool_calls=(ScriptedCall(id="c1", name="ask_person"),)), ScriptStep(text="Done.")]
    async with ScriptedProvider(steps) as provider:
        session: Session[Any] = Session(document="", kind=NOTE, provider=provider, model="m", tools=[ask_person])
        async with session:
            state = await one_turn(session, TurnView(console, session, mode, prompt), "go")
    return state, got, out.getvalue()


async def test_a_form_is_shown_whole_and_filled_in_field_by_field() -> None:
    # accept; name left empty (required: asked again), then Ada; age 200 (out of range: asked again), then
    # empty (the default); plan by number; tags by value and number; ok left to its default.
    state, got, screen = await _run(["a", "", "Ada", "200", "", "2", "x, 2", ""])
    assert state.outcome is Outcome.COMPLETED
    assert got == [Answer("accept", got[0].content)]
    assert dict(got[0].content) == {"name": "Ada", "age": 30, "plan": "pro", "tags": ["x", "y"], "ok": True}
    assert 'MCP server "ff" asks, during ask_person. Its own words:' in screen and "Details, please." in screen
    assert "Name (required; text)" in screen and "Who you are" in screen
    assert "age (optional; a whole number, at least 0, at most 150) [default: 30]" in screen
    assert "plan (optional; one of 1) Free, 2) Pro) [default: free]" in screen
    assert '"Name" is required.' in screen and '"age" takes at most 150.' in screen


async def test_decline_and_a_url_shown_with_its_host() -> None:
    _, got, _ = await _run(["d"])
    assert got == [Answer("decline")]
    _state, got, screen = await _run(["a"], url="https://login.example.com/x?y=1")
    assert got == [Answer("accept")]
    assert "https://login.example.com/x?y=1" in screen and "which leads to: login.example.com" in screen
    assert "trioloop does not open it" in screen


@pytest.mark.parametrize("mode", ["none", "safe"])
async def test_nobody_there_to_answer_cancels_and_says_so(mode: ApproveMode) -> None:
    _state, got, screen = await _run([], mode=mode)
    assert got == [Answer("cancel")] and f"cancelled question turn-1:q1 (--approve {mode}" in screen


async def test_q_stops_the_turn_and_the_end_of_input_cancels() -> None:
    state, got, _ = await _run(["q"])
    assert state.outcome is Outcome.CANCELLED
    state, got, _ = await _run([])
    assert got == [Answer("cancel")]


def test_typed_values_are_parsed_by_the_fields_kind() -> None:
    number = QuestionField(name="n", kind="number")
    assert parse_field(number, " 2.5 ") == 2.5 and parse_field(number, "") is None
    assert parse_field(QuestionField(name="b", kind="boolean"), "Yes") is True
    with pytest.raises(ValueError, match="takes a number"):
        parse_field(number, "two")


async def test_a_sampling_card_shows_everything_the_model_would_see_and_sends_only_when_approved() -> None:
    from trioloop import SamplingRequest

    got: list[Any] = []
    request = SamplingRequest(
        messages=(("user", "Summarize the threats.\nBe brief."),),
        system_prompt="You summarize.",
        model_hint="claude-haiku",
        max_tokens=5000,
    )

    @function_tool(effect="read")
    async def summarize(ctx: ToolExecutionContext[str]) -> ToolOutcome[str]:
        """Ask the model, through the person."""
        got.append(await ctx.sample(source='MCP server "ff"', request=request))
        return ToolOutcome.success("asked")

    out = io.StringIO()
    steps = [
        ScriptStep(tool_calls=(ScriptedCall(id="c1", name="summarize"),)),
        ScriptStep(text="Three threats."),
        ScriptStep(text="Done."),
    ]
    async with ScriptedProvider(steps) as provider:
        session: Session[Any] = Session(document="", kind=NOTE, provider=provider, model="m", tools=[summarize])
        async with session:
            answers = iter(["a"])
            view = TurnView(Console(file=out, width=100), session, "ask", lambda _: next(answers))
            state = await one_turn(session, view, "go")
    screen = out.getvalue()
    assert state.outcome is Outcome.COMPLETED
    assert "It asks the model to answer this (no tools; the answer goes to the server only):" in screen
    lines = [line.strip("│ ") for line in screen.splitlines()]
    start = lines.index("system prompt:")
    assert lines[start : start + 5] == [
        "system prompt:",
        "You summarize.",
        "user:",
        "Summarize the threats.",
        "Be brief.",
    ]
    assert "at most 2048 tokens, from this session's model; it prefers claude-haiku" in screen  # capped by the limit
    assert [(s.action, s.text, s.stop_reason) for s in got] == [("accept", "Three threats.", "end_turn")]
    assert len(provider.requests) == 3 and provider.requests[1]["max_tokens"] == 2048
