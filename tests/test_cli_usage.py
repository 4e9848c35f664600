"""The chat's token totals from a journal: the same count the turns' states made, a retried request and a turn of
several requests included, so a resumed chat's session total goes on where the killed one stopped."""

from __future__ import annotations

from pathlib import Path

from trioloop import ScriptedProvider, Session
from trioloop.cli.usage import journaled_usage, usage_of_entries
from trioloop.durable.journal import decode_entries
from trioloop.protocol.events import Usage, usage_sum
from trioloop.providers.retry import RetryPolicy
from trioloop.providers.scripted import ScriptedCall, ScriptStep
from trioloop.stores import SQLiteJournalStore
from trioloop.threatmodel import THREAT_MODEL, create_ai_tool_registry, load_thf

PAYMENT = Path(__file__).resolve().parent.parent / "examples" / "payment.thf"

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


async def test_the_journal_counts_what_the_turns_counted(tmp_path: Path) -> None:
    path = tmp_path / "chat.journal"
    counted = Usage()
    options = {"kind": THREAT_MODEL, "model": "scripted-1", "tools": create_ai_tool_registry()}
    async with (
        ScriptedProvider(STEPS, retry=RetryPolicy(base_delay=0.0)) as provider,
        SQLiteJournalStore(path) as store,
    ):
        session = await Session.open(store, "chat-1", provider=provider, document=load_thf(PAYMENT), **options)
        async with session:
            for text in ("Summarize.", "Again.", "Thanks."):
                state = await session.send(text)
                assert state.usage.input_tokens and state.usage.output_tokens
                counted = usage_sum(counted, state.usage)
            last = state.usage
        entries = decode_entries(await store.read("chat-1"))
        assert {"advance", "retry"} <= {entry.kind for entry in entries}  # both cases are in this journal
        assert await journaled_usage(store, "chat-1") == counted
    without_last = usage_of_entries(entries, without_last_turn=True)
    assert usage_sum(without_last, last) == counted
    assert usage_of_entries([]) == Usage()
