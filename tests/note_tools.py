"""The note app the review tests share (`test_remote_review`, `test_review_document`): a text document, a tool that
appends a line and a destructive one that erases it all, each noting in `RUNS` that it ran; `fresh_runs` (autouse
where imported) empties `RUNS` before each test; `open_note` opens a session of it from a journal store."""

from __future__ import annotations

from typing import Any

import pytest

from trioloop import Session, ToolExecutionContext, ToolOutcome, define_document_kind, function_tool
from trioloop.durable.store import JournalStore
from trioloop.protocol.provider import ChatProvider

NOTE = define_document_kind("note", dump=lambda text: text, load=lambda text: text)
RUNS: list[str] = []


@function_tool(summary="Append {line!r}")
async def append_line(ctx: ToolExecutionContext[str], line: str) -> ToolOutcome[str]:
    """Append one line to the note."""
    RUNS.append(line)
    return ToolOutcome.success(f"appended {line}", document=ctx.document + line + "\n")


@function_tool(destructive=True, summary="Erase the note")
async def erase(ctx: ToolExecutionContext[str]) -> ToolOutcome[str]:
    """Erase the whole note."""
    RUNS.append("erase")
    return ToolOutcome.success("erased", document="")


TOOLS = [append_line, erase]


@pytest.fixture(autouse=True)
def fresh_runs() -> None:
    RUNS.clear()


async def open_note(
    store: JournalStore,
    provider: ChatProvider,
    session_id: str,
    *,
    signer: Any,
    keys: Any,
    kind: Any = NOTE,
    tools: Any = TOOLS,
    **kw: Any,
) -> Session[str]:
    """The note session ``session_id`` of ``store`` (a new one with an empty note), no witness file; another app's
    note kind and tools where given."""
    new = not await store.read(session_id)
    return await Session.open(
        store,
        session_id,
        kind=kind,
        provider=provider,
        tools=tools,
        document="" if new else None,
        model="m",
        signer=signer,
        keys=keys,
        witness=None,
        **kw,
    )
