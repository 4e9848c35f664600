"""A tiny MCP server (the official SDK's server API) for examples/mcp_session.py: run it over stdio."""

from typing import Annotated

from mcp.server.mcpserver import Elicit, ElicitationResult, MCPServer, Resolve
from mcp.types import ToolAnnotations
from pydantic import BaseModel, Field

server = MCPServer("notes")


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def count_words(text: str) -> int:
    """Count the words in a text."""
    return len(text.split())


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))  # a claim trioloop shows but never trusts
def forget_everything() -> str:
    """Delete every note."""
    return "all notes deleted"


class Tag(BaseModel):
    tag: str = Field(description="One word")
    pinned: bool = False


async def ask_tag() -> Elicit[Tag]:
    return Elicit("Which tag should the new note get?", Tag)


@server.tool()
def tag_note(text: str, answer: Annotated[ElicitationResult[Tag], Resolve(ask_tag)]) -> str:
    """Save a note under a tag the person chooses (the server asks them: elicitation)."""
    if answer.action != "accept" or answer.data is None:
        return f"not saved: the person chose {answer.action}"
    return f"saved {text!r} under {answer.data.tag!r}" + (" (pinned)" if answer.data.pinned else "")


if __name__ == "__main__":
    server.run("stdio")
