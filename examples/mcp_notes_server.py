"""A tiny MCP server (the official SDK's server API) for examples/mcp_session.py: run it over stdio."""

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

server = MCPServer("notes")


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def count_words(text: str) -> int:
    """Count the words in a text."""
    return len(text.split())


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))  # a claim trioloop shows but never trusts
def forget_everything() -> str:
    """Delete every note."""
    return "all notes deleted"


if __name__ == "__main__":
    server.run("stdio")
