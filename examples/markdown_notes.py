"""A second domain on trioloop's generic core: reviewed, undoable AI edits of a Markdown note.

The document is a plain ``str``. Its kind says what a valid note is (headings unique) and how two notes
differ; three typed tools read, replace and delete a section (deleting is destructive, so "approve all
safe" never covers it). Run it with no key and no network: ``python examples/markdown_notes.py``. The
scripted model reads a section, rewrites it and asks to delete another; the reviewer approves the
rewrite, declines the deletion, looks at the diff and undoes the turn.
"""

from __future__ import annotations

import re
from collections import Counter

import trio

from trioloop import (
    CallStatus,
    Phase,
    ScriptedProvider,
    Session,
    ToolExecutionContext,
    ToolOutcome,
    define_document_kind,
    function_tool,
)
from trioloop.providers.scripted import ScriptedCall, ScriptStep
from trioloop.tools import ToolError, fence

_HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t]*#*[ \t]*$", re.MULTILINE)


def headings(note: str) -> list[str]:
    """The note's heading texts, in order."""
    return [match.group(2).strip() for match in _HEADING.finditer(note)]


def validate_note(note: str) -> str | None:
    """None for a valid note; else what the model must fix (each heading may appear only once)."""
    repeated = sorted(title for title, count in Counter(headings(note)).items() if count > 1)
    if repeated:
        return "every heading must be unique, but these appear more than once: " + ", ".join(repeated)
    return None


NOTE = define_document_kind("Markdown note", validate=validate_note)


def _section_span(note: str, heading: str) -> tuple[int, int, int]:
    """(start of the heading line, start of the body, end of the section) for ``heading``."""
    matches = list(_HEADING.finditer(note))
    for index, match in enumerate(matches):
        if match.group(2).strip() != heading:
            continue
        level = len(match.group(1))
        end = len(note)
        for later in matches[index + 1 :]:
            if len(later.group(1)) <= level:
                end = later.start()
                break
        body_start = min(match.end() + 1, len(note))
        return match.start(), body_start, end
    known = ", ".join(headings(note)) or "none"
    raise ToolError(f"No section is headed {heading!r}. The headings are: {known}.")


@function_tool(effect="read")
async def read_section(ctx: ToolExecutionContext[str], heading: str) -> str:
    """Read one section of the note: its heading and body, as untrusted data.

    Args:
        heading: The section's heading text, exactly as written (without the leading #).
    """
    start, _, end = _section_span(ctx.document, heading)
    return fence({"heading": heading, "text": ctx.document[start:end]})


@function_tool(summary="Replace the body of section {heading!r}")
async def replace_section(ctx: ToolExecutionContext[str], heading: str, body: str) -> ToolOutcome[str]:
    """Replace the body of one section, keeping its heading and every other section.

    Args:
        heading: The section's heading text, exactly as written.
        body: The new body in Markdown (the heading line is kept; do not repeat it).
    """
    _, body_start, end = _section_span(ctx.document, heading)
    separator = "\n" if end < len(ctx.document) else ""  # a blank line before the next section, if any
    new_body = (body.strip("\n") + "\n" if body.strip() else "") + separator
    note = ctx.document[:body_start] + new_body + ctx.document[end:]
    return ToolOutcome.success(f"Replaced the body of {heading!r}.", document=note)


@function_tool(destructive=True, summary="Delete section {heading!r} and everything under it")
async def delete_section(ctx: ToolExecutionContext[str], heading: str) -> ToolOutcome[str]:
    """Delete one section, its heading and its subsections.

    Args:
        heading: The section's heading text, exactly as written.
    """
    start, _, end = _section_span(ctx.document, heading)
    return ToolOutcome.success(f"Deleted {heading!r}.", document=ctx.document[:start] + ctx.document[end:])


NOTE_TOOLS = (read_section, replace_section, delete_section)

EXAMPLE_NOTE = """# Trip plan

## Travel
Train on Friday at 9:00.

## Packing
- passport
- charger

## Budget
About 300 EUR.
"""

SCRIPT = [
    ScriptStep(
        text="Let me look.", tool_calls=[ScriptedCall(id="r1", name="read_section", input={"heading": "Packing"})]
    ),
    ScriptStep(
        text="I will add a rain jacket and drop the budget section.",
        tool_calls=[
            ScriptedCall(
                id="w1",
                name="replace_section",
                input={"heading": "Packing", "body": "- passport\n- charger\n- rain jacket"},
            ),
            ScriptedCall(id="d1", name="delete_section", input={"heading": "Budget"}),
        ],
    ),
    ScriptStep(text="Added the rain jacket; the budget section stays, as you asked."),
]


async def review(session: Session[str]) -> None:
    """Approve every safe change, decline every destructive one, printing each card."""
    async for state in session.states():
        if state.phase is Phase.AWAITING_APPROVAL:
            for call in state.current_calls:
                if call.status is CallStatus.PENDING:
                    verdict = "declined" if call.destructive else "approved"
                    print(f"card: {call.summary} -> {verdict}")
                    (session.deny if call.destructive else session.approve)(call.id)


async def main() -> None:
    async with (
        ScriptedProvider(SCRIPT) as provider,
        Session(document=EXAMPLE_NOTE, kind=NOTE, provider=provider, model="scripted-1", tools=NOTE_TOOLS) as session,
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(review, session)
        state = await session.send("Add a rain jacket to the packing list and remove the budget.")
        nursery.cancel_scope.cancel()
    print("outcome:", state.outcome)
    print(NOTE.diff(EXAMPLE_NOTE, session.document), end="")
    print("undone:", session.undo_last_turn() and session.document == EXAMPLE_NOTE)


if __name__ == "__main__":
    trio.run(main)
