"""The MCP servers a chat offers the tools of (``--mcp``, ``--mcp-config``, ``--mcp-env``): each started, or
reached and signed in to, as a toolset of the chat's session."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeAlias

import attrs
import trio
from rich.console import Console
from rich.text import Text

from trioloop.cli.common import error, make_console
from trioloop.runtime.session import Session
from trioloop.threatmodel import ThreatModel

if TYPE_CHECKING:
    from trioloop.mcp import HttpServer

__all__ = ["McpOptions", "add_mcp_servers", "server_environment"]

#: The --mcp commands, the --mcp-config file, and (optionally) the --mcp-env variables.
McpOptions: TypeAlias = tuple[Sequence[str], str | None] | tuple[Sequence[str], str | None, Sequence[str] | None]


def server_environment(narrowed: Sequence[str] | None) -> dict[str, str]:
    """What an --mcp server's process gets: the environment the user exported (a server reads its own keys and
    settings from it), or with --mcp-env only the variables named, beside PATH, HOME and the like."""
    if narrowed is None:
        return dict(os.environ)
    from mcp.client.stdio import get_default_environment

    environment = get_default_environment()
    environment.update({name: os.environ[name] for name in narrowed if name in os.environ})
    return environment


async def add_mcp_servers(session: Session[ThreatModel], mcp_servers: McpOptions) -> bool:
    """Connect every MCP server as a toolset of ``session`` (its connection lives in the session's nursery)."""
    commands, config = mcp_servers[0], mcp_servers[1]
    narrowed = mcp_servers[2] if len(mcp_servers) > 2 else None
    if not commands and config is None:
        return True
    try:
        from trioloop import mcp
    except ImportError:
        error('error: --mcp needs the mcp extra: pip install "trioloop[mcp]"')
        return False
    try:
        servers: list[mcp.McpServer] = []
        if config is not None:
            servers.extend(mcp.load_mcp_config(await trio.Path(config).read_text(encoding="utf-8")))
        environment = server_environment(narrowed)
        for command in commands:
            taken = [server.name for server in servers]
            servers.append(mcp.stdio_server_from_command(command, taken=taken, env=environment))
        console = make_console()
        for server in servers:
            if isinstance(server, mcp.HttpServer) and server.oauth and server.auth is None:
                server = await with_oauth(server, console)
            toolset = mcp.McpToolset(server)
            added = await session.add_toolset(toolset)
            console.print(Text(f'MCP server "{server.name}": {len(added)} tool(s)', style="dim"))
            for skipped in toolset.skipped:
                console.print(Text(f"  skipped {skipped.name}: {skipped.reason}", style="dim"))
        return True
    except OSError as exc:
        error(f"error: cannot read the MCP config {config}: {exc.strerror}")
    except (mcp.McpConfigError, mcp.McpConnectionError, ValueError) as exc:
        error(f"error: {exc}")
    return False


async def with_oauth(server: HttpServer, console: Console) -> HttpServer:
    """``server`` signing in with OAuth: tokens kept in the user's config directory, the authorization URL
    printed (and opened in a browser when one can start), the code taken on a loopback redirect URI."""
    from trioloop.cli.mcp_oauth import LoopbackCallback, cli_oauth

    callback = LoopbackCallback()
    await callback.listen()
    say = lambda text: console.print(Text(text))  # noqa: E731
    auth = cli_oauth(server.name, server.url, callback, say, client_metadata_url=server.client_metadata_url)
    return attrs.evolve(server, auth=auth)
