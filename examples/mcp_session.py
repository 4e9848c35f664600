"""A session offering one stdio MCP server's tools next to the threat-model tools (the README's MCP example)."""

import sys
from pathlib import Path

import trio

from trioloop import ScriptedProvider, Session, create_ai_tool_registry, create_tool_registry, load_thf
from trioloop.mcp import McpToolset, StdioServer
from trioloop.providers.scripted import ScriptedCall, ScriptStep

HERE = Path(__file__).resolve().parent


async def main() -> None:
    # Only the app classifies tools; every tool it does not name is destructive and needs its own approval.
    notes = StdioServer(
        name="notes", command=sys.executable, args=[str(HERE / "mcp_notes_server.py")], tools={"count_words": "read"}
    )
    script = [
        ScriptStep(tool_calls=[ScriptedCall(id="c1", name="notes__count_words", input={"text": "a b c"})]),
        ScriptStep(text="Three words."),
    ]
    async with trio.open_nursery() as nursery, ScriptedProvider(script) as provider:
        mcp_tools = await nursery.start(McpToolset(notes).run)  # the connection lives in this nursery
        registry = create_tool_registry([*create_ai_tool_registry(), *mcp_tools])
        session = Session(
            document=load_thf(HERE / "payment.thf"), provider=provider, model="scripted-1", registry=registry
        )
        state = await session.send("How many words are in 'a b c'?")
        print(state.outcome.value, state.calls[0].result)
        nursery.cancel_scope.cancel()  # closes the connection and stops the server


if __name__ == "__main__":
    trio.run(main)
