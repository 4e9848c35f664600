"""The document interface: define_document_kind's defaults, copies for mutable types, a validator that
raises, and the session lifecycle that owns the tools' nursery."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from trioloop import (
    CallStatus,
    Outcome,
    Phase,
    RegisteredTool,
    ScriptedProvider,
    Session,
    SessionClosed,
    ToolExecutionContext,
    ToolOutcome,
    create_tool_registry,
    define_document_kind,
    function_tool,
    text_diff,
)
from trioloop.lowlevel import Refusal, Refused, commit_tool_outcome
from trioloop.machine.transaction import UndoHistory
from trioloop.providers.scripted import ScriptedCall, ScriptStep


def test_a_kind_is_immutable_by_default_and_shares_the_document() -> None:
    kind = define_document_kind("note")
    note = "text"
    assert kind.immutable and kind.private_copy(note) is note
    assert kind.validate(note) is None and kind.same("a", "a") and not kind.same("a", "b")
    assert kind.diff("a\n", "a\n") == "" and kind.diff("a\n", "b\n") == text_diff("a\n", "b\n")


def test_a_mutable_kind_copies_deeply() -> None:
    kind = define_document_kind("settings", mutable=True)
    doc: dict[str, Any] = {"a": [1, {"b": 2}]}
    copy = kind.private_copy(doc)
    assert copy == doc and copy is not doc and copy["a"] is not doc["a"] and copy["a"][1] is not doc["a"][1]
    assert not kind.immutable


def test_text_diff_is_a_unified_diff() -> None:
    diff = text_diff("one\ntwo\n", "one\nthree\n")
    assert diff.splitlines() == ["--- before", "+++ after", "@@ -1,2 +1,2 @@", " one", "-two", "+three"]
    assert text_diff("x", "y").endswith("\n")  # a last line without a newline still ends the diff's line


def failing_validator(document: str) -> str | None:
    raise RuntimeError("validator bug")


def test_a_validator_that_raises_refuses_the_change() -> None:
    kind = define_document_kind("note", validate=failing_validator)

    @function_tool
    async def edit(ctx: ToolExecutionContext[str]) -> ToolOutcome[str]:
        """Edit."""
        return ToolOutcome.success("x", document="new")

    result = commit_tool_outcome(
        "old", "old", ToolOutcome.success("x", document="new"), edit, UndoHistory(), turn_id="t", kind=kind
    )
    assert isinstance(result, Refused) and result.refusal is Refusal.INVALID_DOCUMENT
    assert "could not be validated (RuntimeError)" in result.result


def counter_tool() -> RegisteredTool[int]:
    @function_tool(summary="Add one")
    async def add_one(ctx: ToolExecutionContext[int]) -> ToolOutcome[int]:
        """Add one to the counter."""
        return ToolOutcome.success("added", document=ctx.document + 1)

    return add_one


COUNTER = define_document_kind("counter", validate=lambda n: None if n < 10 else "the counter stops at 9")


async def test_send_needs_an_open_session() -> None:
    async with ScriptedProvider([ScriptStep(text="hi")]) as provider:
        session = Session(document=1, kind=COUNTER, provider=provider, model="scripted-1")
        with pytest.raises(SessionClosed, match="async with session"):
            await session.send("hi")
        async with session:
            assert (await session.send("hi")).outcome is Outcome.COMPLETED
        with pytest.raises(SessionClosed):
            session.nursery  # noqa: B018 -- the property raises once the block has ended


async def test_a_session_may_use_the_apps_nursery_and_an_int_document() -> None:
    steps = [ScriptStep(tool_calls=[ScriptedCall(id="c", name="add_one")]), ScriptStep(text="ok")]
    async with ScriptedProvider(steps) as provider, trio.open_nursery() as app:
        session = Session(
            document=1, kind=COUNTER, provider=provider, model="scripted-1", tools=[counter_tool()], nursery=app
        )

        async def review() -> None:
            async for state in session.states():
                if state.phase is Phase.AWAITING_APPROVAL:
                    for call in state.current_calls:
                        if call.status is CallStatus.PENDING:
                            session.approve(call.id)

        app.start_soon(review)
        final = await session.send("count")
        app.cancel_scope.cancel()
    assert final.outcome is Outcome.COMPLETED and session.document == 2
    with pytest.raises(RuntimeError, match="already has a nursery"):
        async with session:
            pass


class Counting:
    """A toolset: offers one tool, holds its 'connection' until cancelled, and records its lifecycle."""

    def __init__(self) -> None:
        self.events: list[str] = []

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        self.events.append("connected")
        task_status.started((counter_tool(),))
        try:
            await trio.sleep_forever()
        finally:
            self.events.append("closed")


async def test_a_toolset_lives_in_the_session_nursery_and_closes_with_it() -> None:
    toolset = Counting()
    async with ScriptedProvider([ScriptStep(text="hi")]) as provider:
        async with Session(document=1, kind=COUNTER, provider=provider, model="scripted-1") as session:
            tools = await session.add_toolset(toolset)
            assert [t.name for t in tools] == ["add_one"] and session.registry.names == ("add_one",)
            assert toolset.events == ["connected"]
            refused = Counting()
            with pytest.raises(ValueError, match="Duplicate tool name"):
                await session.add_toolset(refused)
            await trio.testing.wait_all_tasks_blocked()
            assert refused.events == ["connected", "closed"]  # closed at once, not at session close
        assert toolset.events == ["connected", "closed"]
    assert create_tool_registry(tools).names == ("add_one",)
