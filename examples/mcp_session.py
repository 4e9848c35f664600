"""A session offering one stdio MCP server's tools next to the threat-model tools (docs/howto/mcp.md shows it)."""

import sys
from pathlib import Path

import trio

from trioloop import ScriptedProvider, load_thf, threat_model_session
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
    async with (
        ScriptedProvider(script) as provider,
        threat_model_session(document=load_thf(HERE / "payment.thf"), provider=provider, model="scripted-1") as session,
    ):
        await session.add_toolset(McpToolset(notes))  # the connection lives in the session's nursery
        state = await session.send("How many words are in 'a b c'?")
        print(state.outcome.value, state.calls[0].result)
    # Leaving the block closed the connection and stopped the server.


if __name__ == "__main__":
    trio.run(main)
