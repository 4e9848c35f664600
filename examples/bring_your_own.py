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


def check(note: str) -> str | None:  # None, or what the model must fix
    return None if note.startswith("# ") else "a note must start with a '# ' title line"


NOTE = define_document_kind("Markdown note", validate=check)  # a str is immutable: tools share it


@function_tool(summary="Append {line!r} to the note")  # effect="mutate" by default: always reviewed
async def append_line(ctx: ToolExecutionContext[str], line: str) -> ToolOutcome[str]:
    """Append one line (the text, without a newline) to the note."""
    return ToolOutcome.success("Appended.", document=f"{ctx.document}{line}\n")


async def review(session: Session[str]) -> None:
    async for state in session.states():  # always the newest state: a slow UI never stalls the turn
        if state.phase is Phase.AWAITING_APPROVAL:
            for call in (c for c in state.current_calls if c.status is CallStatus.PENDING):
                print("review:", call.summary)
                session.approve(call.id)  # or session.deny(call.id) / session.stop()


async def main() -> None:
    calls = [ScriptedCall(id="c1", name="append_line", input={"line": "- milk"})]
    script = [ScriptStep(tool_calls=calls), ScriptStep(text="Added milk.")]
    async with (
        ScriptedProvider(script) as provider,  # or AnthropicProvider(), OpenAIProvider(base_url=...)
        Session(document="# Shopping\n", kind=NOTE, provider=provider, model="scripted-1", tools=[append_line]) as s,
        trio.open_nursery() as ui,
    ):
        ui.start_soon(review, s)
        state = await s.send("Add milk to my list.")
        ui.cancel_scope.cancel()
    print(state.outcome, repr(s.document), "| undone:", s.undo_last_turn() and s.document == "# Shopping\n")


if __name__ == "__main__":
    trio.run(main)
