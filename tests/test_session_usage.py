"""`Session.usage`: the tokens every settled turn used, the same count the turns' states made (a retried request and
a turn of several requests included), and it survives what a session survives: reopening its journal (from a
compaction's snapshot too), a session file, a turn suspended in review and continued in another session."""

from __future__ import annotations

import json
from contextlib import aclosing
from pathlib import Path

import pytest
import trio
import trio.testing

from trioloop import (
    MemoryJournalStore,
    ScriptedProvider,
    Session,
    ToolExecutionContext,
    ToolOutcome,
    define_document_kind,
    function_tool,
)
from trioloop.durable.journal import decode_entries
from trioloop.durable.session_file import SessionFileError
from trioloop.machine.state import Phase, TurnState
from trioloop.protocol.events import Usage, usage_sum
from trioloop.providers.retry import RetryPolicy
from trioloop.providers.scripted import ScriptedCall, ScriptStep
from trioloop.stores import SQLiteJournalStore
from trioloop.threatmodel import THREAT_MODEL, create_ai_tool_registry, load_thf

PAYMENT = Path(__file__).resolve().parent.parent / "examples" / "payment.thf"
OPTIONS = {"kind": THREAT_MODEL, "model": "scripted-1", "tools": create_ai_tool_registry()}

STEPS = [
    # Turn 1: a read, then the answer (two requests).
    ScriptStep(text="Reading.", tool_calls=(ScriptedCall(id="r1", name="get_document_summary", input={}),)),
    ScriptStep(text="The model has twelve elements."),
    # Turn 2: the stream breaks after its start (its usage said) and is asked again: the retry's usage counts.
    ScriptStep(in_stream_error="overloaded_error"),
    ScriptStep(text="A whole answer, the second time."),
    # Turn 3: one request.
    ScriptStep(text="Done."),
]


async def _three_turns(session: Session[object]) -> Usage:
    counted = Usage()
    for text in ("Summarize.", "Again.", "Thanks."):
        state = await session.send(text)
        assert state.usage.input_tokens and state.usage.output_tokens
        counted = usage_sum(counted, state.usage)
        assert session.usage == counted
    return counted


@pytest.mark.parametrize("compact", [False, True])
async def test_a_reopened_journal_counts_what_the_turns_counted(tmp_path: Path, compact: bool) -> None:
    path = tmp_path / "chat.journal"
    async with (
        ScriptedProvider(STEPS, retry=RetryPolicy(base_delay=0.0)) as provider,
        SQLiteJournalStore(path) as store,
    ):
        session = await Session.open(
            store, "chat-1", provider=provider, document=load_thf(PAYMENT), compact=compact, **OPTIONS
        )
        async with session:
            assert session.usage == Usage()
            counted = await _three_turns(session)
            if compact:
                session._journal.journal.turns.writer.snapshot(session.snapshot())  # type: ignore[union-attr]
                await session._journal.journal.flush()  # type: ignore[union-attr]
        kinds = [entry.kind for entry in decode_entries(await store.read("chat-1"))]
        reopened = await Session.open(store, "chat-1", provider=provider, **OPTIONS)
        async with reopened:
            assert reopened.usage == counted
    assert {"advance", "retry"} <= set(kinds) or compact  # both cases are in this journal (before compaction)


async def test_a_session_file_keeps_the_count(tmp_path: Path) -> None:
    saved = tmp_path / "work.session.json"
    steps = ScriptedProvider(STEPS, retry=RetryPolicy(base_delay=0.0))
    async with steps as provider, Session(document=load_thf(PAYMENT), provider=provider, **OPTIONS) as session:
        counted = await _three_turns(session)
        session.save(saved)
    async with ScriptedProvider([ScriptStep(text="Still here.")]) as provider:
        resumed = Session.resume(saved, provider=provider, **OPTIONS)
        async with resumed:
            assert resumed.usage == counted
            state = await resumed.send("hello")
            assert resumed.usage == usage_sum(counted, state.usage)
    # A version 2 file written before the count was kept reads as counting from nothing; a wrong count is refused.
    value = json.loads(saved.read_text())
    del value["usage"]
    saved.write_text(json.dumps(value))
    assert Session.resume(saved, provider=ScriptedProvider([]), **OPTIONS).usage == Usage()
    value["usage"] = {"input_tokens": -1}
    saved.write_text(json.dumps(value))
    with pytest.raises(SessionFileError, match="usage"):
        Session.resume(saved, provider=ScriptedProvider([]), **OPTIONS)


NOTE = define_document_kind("note", dump=lambda text: text, load=lambda text: text)


@function_tool
async def append_line(ctx: ToolExecutionContext[str], line: str) -> ToolOutcome[str]:
    """Append one line to the note."""
    return ToolOutcome.success(f"appended {line}", document=ctx.document + line + "\n")


async def test_a_suspended_turn_counts_once_when_it_settles_in_another_session() -> None:
    store = MemoryJournalStore()
    steps = [
        ScriptStep(text="Adding.", tool_calls=(ScriptedCall(id="a", name="append_line", input={"line": "one"}),)),
        ScriptStep(text="Added."),
    ]
    options = {"kind": NOTE, "model": "m", "tools": [append_line]}
    async with ScriptedProvider(steps) as provider:
        async with await Session.open(store, "s", provider=provider, document="", **options) as session:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(session.send, "add a line")
                async with aclosing(session.states()) as states:
                    async for state in states:
                        if session.busy and state.phase is Phase.AWAITING_APPROVAL:
                            break
                suspended = await session.suspend()
            assert suspended is not None and suspended.usage.output_tokens > 0
            assert session.usage == Usage()  # not settled: not counted yet
        reopened = await Session.open(store, "s", provider=provider, **options)
        async with reopened:
            assert reopened.usage == Usage()
            async with trio.open_nursery() as nursery:
                result: list[TurnState] = []

                async def drive() -> None:
                    result.append(await reopened.continue_turn())

                nursery.start_soon(drive)
                await trio.testing.wait_all_tasks_blocked()  # taken up: in review again
                assert reopened.approve("a")
            final = result[0]
            assert final.is_settled and final.usage.output_tokens > suspended.usage.output_tokens  # both requests
            assert reopened.usage == final.usage
        again = await Session.open(store, "s", provider=provider, **options)
        async with again:
            assert again.usage == final.usage
