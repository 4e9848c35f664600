"""The soak's document, its tools, and the ledger every process of the soak writes what it saw to.

The document is a note: text, one line per entry. The model (``benchmarks._soak_server``) appends lines that
start with a token unique to the call (``T-<nonce>-<iteration>-<n>``) and archives lines (``~`` before the
token: a destructive change that keeps the token readable), so whether a committed change is in a document
read back from the journal is a look-up. Every tool writes a ``run`` event to the `Ledger` before it does
anything else (its call id comes in its input as ``call``), so the soak counts runs by call id whatever
happens after.

The tools are made once per process (`make_tools`) and learn which session runs them from `SESSION`, a context
variable the conversation sets: tasks inherit it from the task that starts them, so a tool's run is written under
its session's id. (Made per session instead, each definition would stay in memory for good: see
``docs/howto/reliability.md``.)

A `Ledger` turns events (plain dicts) into either a callback (in the soak's own process) or JSON lines
appended to a file (``os.write`` of whole lines on an ``O_APPEND`` descriptor: a worker killed with SIGKILL
loses nothing it wrote, the page cache outlives it); `read_events` reads such a file back, skipping a line
cut short.
"""

from __future__ import annotations

import contextvars
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

import trio

from trioloop import QuestionField, QuestionRefused, ToolExecutionContext, ToolOutcome, define_document_kind
from trioloop.machine.tools import RegisteredTool
from trioloop.tools.functions import function_tool

NOTE: Final = define_document_kind("soak-note", dump=lambda text: text, load=lambda text: text)
START_DOCUMENT: Final = "# soak note\n"
#: The tools a session offers by name, and the ones that only read (run without a card).
READS: Final = frozenset({"read_note", "count_lines", "slow_read", "ask_person", "notes__count_words"})

Event = dict[str, Any]
#: The session id of the conversation a task works for (set by the conversation; inherited by its tools).
SESSION: contextvars.ContextVar[str] = contextvars.ContextVar("soak_session", default="?")


class Ledger:
    """Where a process tells the soak what happened: ``emit(kind, **fields)``."""

    def __init__(self, sink: Callable[[Event], None] | None = None, path: str | os.PathLike[str] | None = None):
        self._sink = sink
        self._fd = -1 if path is None else os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def emit(self, event_kind: str, /, **fields: Any) -> None:
        event = {"e": event_kind, "t": round(time.monotonic(), 4), **fields}
        if self._sink is not None:
            self._sink(event)
        if self._fd >= 0:
            os.write(self._fd, (json.dumps(event, separators=(",", ":")) + "\n").encode())

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def read_events(path: Path) -> Iterator[Event]:
    """The events of a ledger file; a last line cut short by a kill is skipped."""
    if not path.exists():
        return
    with path.open("rb") as handle:
        for line in handle:
            if not line.endswith(b"\n"):
                continue
            try:
                yield json.loads(line)
            except ValueError:
                continue


def token_lines(document: str) -> dict[str, bool]:
    """Every token line of ``document``: token -> archived (``~`` before it)."""
    found: dict[str, bool] = {}
    for line in document.splitlines():
        archived = line.startswith("~")
        word = line.lstrip("~").split(" ", 1)[0]
        if word.startswith("T-"):
            found[word] = archived
    return found


def make_tools(ledger: Ledger) -> list[RegisteredTool[str]]:
    """The tools every session of a process offers; each writes its run to ``ledger`` first thing, under the
    session id `SESSION` holds."""

    def ran(tool: str, call: str, **fields: Any) -> None:
        ledger.emit("run", sid=SESSION.get(), call=call, tool=tool, **fields)

    @function_tool(effect="read")
    async def read_note(ctx: ToolExecutionContext[str], call: str) -> ToolOutcome[str]:
        """Read the whole note."""
        ran("read_note", call)
        await trio.sleep(0.001)
        return ToolOutcome.success(ctx.document)

    @function_tool(effect="read")
    async def count_lines(ctx: ToolExecutionContext[str], call: str) -> ToolOutcome[str]:
        """Count the note's lines."""
        ran("count_lines", call)
        await trio.lowlevel.checkpoint()
        return ToolOutcome.success(str(len(ctx.document.splitlines())))

    @function_tool(effect="read")
    async def slow_read(ctx: ToolExecutionContext[str], call: str, seconds: float) -> ToolOutcome[str]:
        """Read the note slowly (``seconds``; the soak sends some past the turn deadline)."""
        ran("slow_read", call)
        await trio.sleep(min(max(seconds, 0.0), 30.0))
        return ToolOutcome.success(f"{len(ctx.document)} characters")

    @function_tool(effect="read")
    async def ask_person(ctx: ToolExecutionContext[str], call: str) -> ToolOutcome[str]:
        """Ask the person which section the next line belongs in."""
        ran("ask_person", call)
        section = QuestionField(name="section", kind="choice", options=(("top", "Top"), ("end", "End")), default="end")
        try:
            answer = await ctx.ask(source="the soak", message="Where should it go?", fields=(section,))
        except QuestionRefused as exc:
            return ToolOutcome.failure(f"could not ask: {exc}")
        return ToolOutcome.success(f"{answer.action}: {dict(answer.content)}")

    @function_tool(summary="Append {line!r}")
    async def append_line(ctx: ToolExecutionContext[str], call: str, line: str) -> ToolOutcome[str]:
        """Append one line to the note."""
        ran("append_line", call, line=line)
        await trio.sleep(0.002)
        return ToolOutcome.success("Appended.", document=f"{ctx.document}{line}\n")

    @function_tool(destructive=True, summary="Archive the line {token}")
    async def archive_line(ctx: ToolExecutionContext[str], call: str, token: str) -> ToolOutcome[str]:
        """Archive a line (marks it with ~ at its start)."""
        ran("archive_line", call, token=token)
        await trio.sleep(0.002)
        lines = ctx.document.splitlines(keepends=True)
        for index, line in enumerate(lines):
            if line.split(" ", 1)[0] == token:
                lines[index] = "~" + line
                return ToolOutcome.success("Archived.", document="".join(lines))
        return ToolOutcome.failure(f"no line {token} to archive (already archived, or never there)")

    return [read_note, count_lines, slow_read, ask_person, append_line, archive_line]
