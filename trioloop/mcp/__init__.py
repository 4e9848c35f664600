"""Tools from Model Context Protocol servers, under the same review and bounds as every other tool.

Needs the ``mcp`` extra (``pip install trioloop[mcp]``). Nothing in the core imports this package.
"""

from trioloop.mcp.errors import McpConnectionError, McpMessageTooLarge
from trioloop.mcp.servers import (
    HttpServer,
    McpConfigError,
    McpServer,
    StdioServer,
    ToolClass,
    load_mcp_config,
    stdio_server_from_command,
)
from trioloop.mcp.tools import namespaced_name
from trioloop.mcp.toolset import McpToolset, SkippedTool

__all__ = [
    "HttpServer",
    "McpConfigError",
    "McpConnectionError",
    "McpMessageTooLarge",
    "McpServer",
    "McpToolset",
    "SkippedTool",
    "StdioServer",
    "ToolClass",
    "load_mcp_config",
    "namespaced_name",
    "stdio_server_from_command",
]
