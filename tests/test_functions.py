"""Tools from typed functions: schema and strict validation from annotations, descriptions from the
docstring, static effect flags (never auto-approved by default), sync bodies in a worker thread."""

from __future__ import annotations

import enum
import threading
from typing import Any, Literal

import attrs
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from trioloop import (
    CallStatus,
    Outcome,
    Phase,
    PreparedCall,
    PrepareFailure,
    ScriptedProvider,
    Session,
    ToolExecutionContext,
    ToolOutcome,
    TurnLimits,
    define_document_kind,
    function_tool,
)
from trioloop.lowlevel import Submit, reduce_turn
from trioloop.machine.reducer import TurnState
from trioloop.protocol import MessageStart, ToolCallComplete
from trioloop.providers.scripted import ScriptedCall, ScriptStep
from trioloop.tools import ToolError, parse_docstring

TEXT = define_document_kind("text")


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


@attrs.frozen
class Point:
    x: int
    y: int = 0


@function_tool(effect="read")
async def look(ctx: ToolExecutionContext[str], heading: str, depth: int = 2) -> str:
    """Read one section.

    Returns the section as text.

    Args:
        heading: The heading text,
            exactly as written.
        depth: Heading level.

    Returns:
        The section.
    """
    return f"{ctx.document}:{heading}:{depth}"


@function_tool
def paint(
    color: Color,
    where: Point | None = None,
    tags: list[str] | None = None,
    mode: Literal["a", "b"] = "a",
    ratio: float = 1.0,
    bold: bool = False,
) -> ToolOutcome[str]:
    """Paint something."""
    return ToolOutcome.success(f"{color.value} {where} {tags} {mode} {ratio} {bold}")


def prepared(tool: Any, raw: Any) -> PreparedCall[Any]:
    result = tool.prepare(raw)
    assert isinstance(result, PreparedCall), result
    return result


def test_the_schema_comes_from_the_annotations_and_the_docstring() -> None:
    assert look.name == "look" and look.effect == "read" and not look.destructive
    assert look.description == "Read one section.\n\nReturns the section as text."
    assert look.json_schema == {
        "type": "object",
        "properties": {
            "heading": {"type": "string", "description": "The heading text, exactly as written."},
            "depth": {"type": "integer", "description": "Heading level."},
        },
        "additionalProperties": False,
        "required": ["heading"],
    }
    props = paint.json_schema["properties"]
    assert paint.json_schema["required"] == ["color"]
    assert props["color"] == {"type": "string", "enum": ["red", "blue"]}
    assert props["where"]["type"] == ["object", "null"] and props["where"]["required"] == ["x"]
    assert props["tags"] == {"type": ["array", "null"], "items": {"type": "string"}}
    assert props["mode"] == {"type": "string", "enum": ["a", "b"]}
    assert props["ratio"] == {"type": "number"} and props["bold"] == {"type": "boolean"}


def test_the_default_is_a_mutation_and_the_flags_are_explicit() -> None:
    assert paint.effect == "mutate" and not paint.destructive

    @function_tool(destructive=True, name="wipe_all")
    async def wipe(ctx: ToolExecutionContext[str]) -> ToolOutcome[str]:
        """Wipe the document."""
        return ToolOutcome.success("wiped", document="")

    assert wipe.name == "wipe_all" and wipe.effect == "mutate" and wipe.destructive
    with pytest.raises(ValueError, match="read-only and destructive"):

        @function_tool(effect="read", destructive=True)
        async def odd(ctx: ToolExecutionContext[str]) -> str:
            """Odd."""
            return ""


def test_a_default_function_tool_is_never_auto_approved() -> None:
    state = TurnState.idle()
    from trioloop import create_tool_registry

    for item in (
        Submit(turn_id="t", text="go", tool_set=create_tool_registry([paint, look]), limits=TurnLimits(), now_ms=0),
        MessageStart(),
        ToolCallComplete(id="p", name="paint", input={"color": "red"}),
        ToolCallComplete(id="l", name="look", input={"heading": "x"}),
    ):
        state = reduce_turn(state, item)
    assert state.call("p").status is CallStatus.PENDING  # type: ignore[union-attr]
    assert state.call("l").status is CallStatus.APPROVED  # type: ignore[union-attr]
    assert not any(g.call_id == "p" for g in state.grants)


@pytest.mark.parametrize(
    ("raw", "issue"),
    [
        ({"color": "green"}, "color: must be one of 'red', 'blue'"),
        ({}, "color: required field is missing"),
        ({"color": "red", "extra": 1}, "extra: 'extra' is not an accepted key"),
        ({"color": "red", "where": {"x": "1"}}, "where.x: expected an integer, got string"),
        ({"color": "red", "tags": "a"}, "tags: expected an array, got string"),
        ({"color": "red", "mode": "c"}, "mode: must be one of 'a', 'b'"),
        ({"color": "red", "bold": 1}, "bold: expected a boolean, got integer"),
        ("red", "the input must be a JSON object, got string"),
    ],
)
def test_validation_is_strict_and_says_what_to_fix(raw: Any, issue: str) -> None:
    result = paint.prepare(raw)
    assert isinstance(result, PrepareFailure) and issue in result.issues


@settings(max_examples=60, deadline=None)
@given(
    heading=st.text(max_size=30),
    depth=st.integers(min_value=-(2**53), max_value=2**53),
)
def test_any_valid_input_prepares_and_its_digest_binds_the_values(heading: str, depth: int) -> None:
    one = prepared(look, {"heading": heading, "depth": depth})
    again = prepared(look, {"depth": depth, "heading": heading})
    other = prepared(look, {"heading": heading, "depth": depth + 1})
    assert one.input_digest == again.input_digest != other.input_digest
    assert "\n" not in one.summary and "\x1b" not in one.summary


def test_summaries_format_string_function_or_default() -> None:
    @function_tool(summary="Delete {heading!r}")
    async def a(heading: str) -> str:
        """A."""
        return ""

    @function_tool(summary=lambda heading: f"Delete {heading.upper()}")
    async def b(heading: str) -> str:
        """B."""
        return ""

    assert prepared(a, {"heading": "x"}).summary == "Delete 'x'"
    assert prepared(b, {"heading": "x"}).summary == "Delete X"
    hostile = prepared(look, {"heading": "a\u202eb\x1b[31m" + "z" * 100})
    assert "\u202e" not in hostile.summary and "\x1b" not in hostile.summary and "…" in hostile.summary


@pytest.mark.parametrize(
    ("doc", "description", "params"),
    [
        ("One line.", "One line.", {}),
        (
            "Do it.\n\n:param a: first\n:param int b: second\n    more\n:returns: x",
            "Do it.",
            {"a": "first", "b": "second more"},
        ),
        (
            "Do it.\n\nArgs:\n    a (int): first\n    b: second\n        wrapped\n",
            "Do it.",
            {"a": "first", "b": "second wrapped"},
        ),
        (None, "", {}),
    ],
)
def test_docstrings_in_both_common_styles(doc: str | None, description: str, params: dict[str, str]) -> None:
    assert parse_docstring(doc) == (description, params)


def test_functions_that_cannot_be_described_are_refused_when_decorated() -> None:
    with pytest.raises(ValueError, match="needs a description"):

        @function_tool
        async def nameless(x: int) -> str:
            return ""

    with pytest.raises(TypeError, match="needs a type annotation"):

        @function_tool
        async def untyped(x) -> str:  # type: ignore[no-untyped-def]
            """Untyped."""
            return ""

    with pytest.raises(TypeError, match="unsupported tool input type"):

        @function_tool
        async def odd_type(x: complex) -> str:
            """Odd."""
            return ""

    with pytest.raises(TypeError, match=r"\*args"):

        @function_tool
        async def star(*x: int) -> str:
            """Star."""
            return ""

    with pytest.raises(ValueError, match="must be 1-64"):

        @function_tool(name="has space")
        async def spaced() -> str:
            """Spaced."""
            return ""


async def test_results_errors_and_exceptions() -> None:
    @function_tool(effect="read")
    async def fails(ctx: ToolExecutionContext[str], why: str) -> str:
        """Fail on purpose."""
        raise ToolError(f"cannot: {why}")

    ctx = ToolExecutionContext(document="doc")
    assert await prepared(look, {"heading": "h"}).run(ctx) == ToolOutcome.success("doc:h:2")
    assert await prepared(fails, {"why": "no"}).run(ctx) == ToolOutcome.failure("cannot: no")
    assert (
        await prepared(paint, {"color": "blue", "where": {"x": 3}}).run(ctx)
    ).result == "blue Point(x=3, y=0) None a 1.0 False"


async def test_a_sync_function_runs_in_a_worker_thread() -> None:
    seen: list[bool] = []

    @function_tool(effect="read")
    def where(ctx: ToolExecutionContext[str]) -> str:
        """Say where it ran."""
        seen.append(threading.current_thread() is threading.main_thread())
        return ctx.document

    assert await prepared(where, {}).run(ToolExecutionContext(document="d")) == ToolOutcome.success("d")
    assert seen == [False]


def reviewer(session: Session[str]) -> Any:
    async def review() -> None:
        async for state in session.states():
            if state.phase is Phase.AWAITING_APPROVAL:
                for call in state.current_calls:
                    if call.status is CallStatus.PENDING:
                        session.approve(call.id)

    return review


async def test_stop_abandons_a_blocking_sync_tool_and_discards_its_value() -> None:
    release = threading.Event()
    entered = trio.Event()
    token = trio.lowlevel.current_trio_token()

    @function_tool
    def blocking(ctx: ToolExecutionContext[str]) -> ToolOutcome[str]:
        """Block until released, then try to change the document."""
        token.run_sync_soon(entered.set)
        release.wait(10)
        return ToolOutcome.success("late", document="changed")

    steps = [ScriptStep(tool_calls=[ScriptedCall(id="b", name="blocking")]), ScriptStep(text="unused")]
    try:
        async with (
            ScriptedProvider(steps) as provider,
            Session(document="doc", kind=TEXT, provider=provider, model="scripted-1", tools=[blocking]) as session,
            trio.open_nursery() as ui,
        ):
            ui.start_soon(reviewer(session))

            async def stop_when_entered() -> None:
                await entered.wait()
                session.stop()

            ui.start_soon(stop_when_entered)
            final = await session.send("go")
            ui.cancel_scope.cancel()
    finally:
        release.set()
    assert final.outcome is Outcome.CANCELLED
    assert session.document == "doc" and session.undo_history.entries == ()


async def test_a_function_tool_edits_a_str_document_through_a_session() -> None:
    @function_tool(summary="Upper-case the document")
    async def shout(ctx: ToolExecutionContext[str]) -> ToolOutcome[str]:
        """Upper-case the whole document."""
        return ToolOutcome.success("done", document=ctx.document.upper())

    steps = [ScriptStep(tool_calls=[ScriptedCall(id="s", name="shout")]), ScriptStep(text="ok")]
    async with (
        ScriptedProvider(steps) as provider,
        Session(document="quiet", kind=TEXT, provider=provider, model="scripted-1", tools=[shout]) as session,
        trio.open_nursery() as ui,
    ):
        ui.start_soon(reviewer(session))
        final = await session.send("go")
        ui.cancel_scope.cancel()
    assert final.outcome is Outcome.COMPLETED and session.document == "QUIET"
    assert final.call("s").summary == "Upper-case the document"  # type: ignore[union-attr]
    assert session.undo_last_turn() and session.document == "quiet"
