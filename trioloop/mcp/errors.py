"""The errors of an MCP connection, below every module that raises them (the transport, the connection, the toolset)."""

from __future__ import annotations

from typing import final

__all__ = ["McpConnectionError", "McpMessageTooLarge"]


class McpConnectionError(RuntimeError):
    """The toolset could not connect to its server or list its tools; the message names the server."""


@final
class McpMessageTooLarge(McpConnectionError):
    """A stdio server sent a message longer than its ``max_message_bytes``: the connection was dropped as soon as the
    cap was passed, without reading the rest (a call on it fails, and the next call starts a new connection)."""

    def __init__(self, server: str, limit: int) -> None:
        super().__init__(
            f'MCP server "{server}" sent a message over its cap of {limit:,} bytes (max_message_bytes), so its '
            "connection was dropped"
        )
        self.server = server
        self.limit = limit
