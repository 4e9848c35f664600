"""Which MCP servers to connect to and how the app classifies their tools: the local, static policy.

A server's own annotations never decide anything; only what is written here (by the app, or in a CLI config
file the user wrote) makes a tool read-only or non-destructive. A tool not named here is a destructive mutation.
"""

from __future__ import annotations

import os
import re
import shlex
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final, Literal, TypeAlias, final
from urllib.parse import urlsplit

import attrs

__all__ = [
    "HttpServer",
    "McpConfigError",
    "McpServer",
    "StdioServer",
    "ToolClass",
    "load_mcp_config",
    "stdio_server_from_command",
]

ToolClass: TypeAlias = Literal["read", "mutate", "destructive"]
"""How the app classifies one MCP tool: ``read`` is auto-approved, ``mutate`` may be batch-approved,
``destructive`` (the default for every tool not named) always needs its own click."""

TOOL_CLASSES: Final[frozenset[str]] = frozenset({"read", "mutate", "destructive"})
SERVER_NAME_PATTERN: Final = re.compile(r"[A-Za-z0-9_-]{1,24}")
#: The longest message a stdio server may send (one line of JSON-RPC, in bytes, without its newline): 64 MiB, room
#: for a tool list of tens of MB. A longer one drops the connection (`McpMessageTooLarge`) as soon as the cap is
#: passed, however long the line would have run.
DEFAULT_MAX_MESSAGE_BYTES: Final = 64 * 1024 * 1024


class McpConfigError(ValueError):
    """A server definition or config file that cannot be used; the message says what to fix."""


def _server_name(_: Any, attribute: attrs.Attribute[str], value: str) -> None:
    if not isinstance(value, str) or SERVER_NAME_PATTERN.fullmatch(value) is None:
        raise McpConfigError(
            f"MCP server name {value!r} must be 1 to 24 letters, digits, '_' or '-' (it prefixes tool names)."
        )


def _classes(value: Mapping[str, str] | None) -> Mapping[str, ToolClass]:
    checked: dict[str, ToolClass] = {}
    for name, cls in (value or {}).items():
        if not isinstance(name, str) or cls not in TOOL_CLASSES:
            raise McpConfigError(f"tool {name!r}: the class must be one of read, mutate, destructive; got {cls!r}.")
        checked[name] = cls  # type: ignore[assignment]  # checked against TOOL_CLASSES just above
    return MappingProxyType(checked)


def _headers(value: Mapping[str, str] | None) -> Mapping[str, str]:
    checked: dict[str, str] = {}
    for name, text in (value or {}).items():
        if not (isinstance(name, str) and isinstance(text, str)) or "\n" in name + text or "\r" in name + text:
            raise McpConfigError(f"header {name!r}: a name and a value of one line each are needed.")
        checked[name] = text
    return MappingProxyType(checked)


def _header_names(headers: Mapping[str, str]) -> str:
    """A repr that names the headers and shows none of their values (a token is one)."""
    return "{" + ", ".join(f"{name!r}: '***'" for name in headers) + "}"


def _str_tuple(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


def _message_bytes(_: Any, attribute: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise McpConfigError(f"max_message_bytes must be a positive whole number of bytes; got {value!r}.")


@final
@attrs.frozen(kw_only=True)
class StdioServer:
    """An MCP server the toolset starts as a subprocess and talks to over its stdin and stdout.

    ``tools`` classifies tools by the exact name the server gives them; any other tool is destructive.
    ``sampling=True`` lets the server ask for the session's model (``sampling/createMessage``): each request
    is then a card the person approves or declines; by default every request is refused.
    ``max_message_bytes`` caps one message from the server (a line of its stdout, `DEFAULT_MAX_MESSAGE_BYTES`):
    a longer one drops the connection with `McpMessageTooLarge` once the cap is passed.
    """

    name: str = attrs.field(validator=_server_name)
    command: str
    args: tuple[str, ...] = attrs.field(default=(), converter=_str_tuple)
    env: Mapping[str, str] | None = None
    cwd: str | None = None
    tools: Mapping[str, ToolClass] = attrs.field(factory=dict, converter=_classes)
    sampling: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    max_message_bytes: int = attrs.field(default=DEFAULT_MAX_MESSAGE_BYTES, validator=_message_bytes)


@final
@attrs.frozen(kw_only=True)
class HttpServer:
    """An MCP server reached over streamable HTTP at ``url``; ``tools`` and ``sampling`` as for ``StdioServer``.

    ``headers`` go with every request (``{"Authorization": "Bearer ..."}`` for a server that takes a static
    token); ``auth`` is an ``httpx2.Auth`` the SDK's client runs, such as the SDK's
    ``mcp.client.auth.OAuthClientProvider`` (OAuth 2.1: discovery, PKCE, registration, refresh; the app gives
    it token storage and the redirect handling). Header values and the auth never appear in a repr, and every
    header value (a bearer token's token too) is masked in the log lines of httpx2, httpcore2 and the SDK.
    """

    name: str = attrs.field(validator=_server_name)
    url: str
    tools: Mapping[str, ToolClass] = attrs.field(factory=dict, converter=_classes)
    headers: Mapping[str, str] = attrs.field(factory=dict, converter=_headers, repr=_header_names)
    auth: Any = attrs.field(default=None, repr=lambda auth: "None" if auth is None else f"<{type(auth).__name__}>")
    sampling: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    #: The config file asked for OAuth (``oauth = true``): whoever connects supplies ``auth`` (the CLI runs the
    #: browser flow; an app passes its own ``OAuthClientProvider``). A toolset refuses it without ``auth``.
    oauth: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    #: With ``oauth``: the HTTPS address of this client's metadata document, used as its client id where the
    #: authorization server accepts URL-based client ids (else it registers dynamically, as without it).
    client_metadata_url: str | None = None

    def __attrs_post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise McpConfigError(f"MCP server {self.name!r}: url must start with http:// or https://.")
        metadata = self.client_metadata_url
        if metadata is not None and not _metadata_url_ok(metadata):
            raise McpConfigError(
                f"MCP server {self.name!r}: client_metadata_url must be an https:// address with a path "
                "(the client's metadata document)."
            )


McpServer: TypeAlias = StdioServer | HttpServer


def _metadata_url_ok(url: str) -> bool:
    """A client metadata document's address, as URL-based client ids need it: https, a host, a path."""
    parts = urlsplit(url)
    return parts.scheme == "https" and bool(parts.hostname) and parts.path not in ("", "/")


#: Programs that launch a server rather than being one: the server is named after what they launch.
_LAUNCHERS: Final = frozenset(
    {"npx", "pnpx", "bunx", "uvx", "pipx", "uv", "node", "deno", "bun", "python", "python3", "docker", "podman"}
)
#: Launcher words that are not the server either (``uv run``, ``pipx run``, ``docker run``, ``deno run``).
_LAUNCHER_WORDS: Final = frozenset({"run", "tool", "exec", "x", "dlx", "--", "-m"})
#: Words a server package's name carries that say nothing about the server.
_NOISE: Final = re.compile(
    r"^(?:mcp[-_]server[-_]|server[-_]mcp[-_]|mcp[-_]|server[-_])|(?:[-_]mcp[-_]server|[-_]mcp|[-_]server)$"
)
_EXPLICIT_NAME: Final = re.compile(r"^([A-Za-z0-9_-]{1,24})=(\S.*)$", re.DOTALL)


def _server_word(argv: list[str]) -> str:
    """The word that names the server in a command line: what a launcher (npx, uvx, python -m, docker run...)
    starts, else the program itself; a package's scope, version and the words "mcp" and "server" dropped,
    a script's extension dropped (its name kept whole)."""
    words = list(argv)
    while words and re.sub(r"[0-9.]+$", "", Path(words[0]).name) in _LAUNCHERS:  # python3.11 is python
        words.pop(0)
        # Skip the launcher's own words and options (``-y``, ``--from pkg``, ``-m``, ``--rm``...).
        while words and (words[0] in _LAUNCHER_WORDS or words[0].startswith("-")):
            option = words.pop(0)
            if option in ("--from", "--with", "-p", "--package", "-e", "--env", "-v", "--volume") and words:
                words.pop(0)
    word = words[0] if words else argv[0]
    if word.endswith((".py", ".js", ".mjs", ".cjs", ".ts")):
        return Path(word).stem  # a script: its own name, whole
    scope = ""
    if word.startswith("@") and "/" in word:
        scope, word = word[1:].split("/", 1)
    word = word.rsplit("/", 1)[-1].split("@", 1)[0]  # a path's last part; a version (pkg@1.2.3) dropped
    bare = _NOISE.sub("", word)
    if bare in ("", "mcp", "server") and scope:
        return scope  # @playwright/mcp is "playwright"
    return bare or word


def _name_from_command(argv: list[str], taken: Iterable[str]) -> str:
    stem = _server_word(argv)
    base = re.sub(r"[^A-Za-z0-9_-]", "_", stem)[:20] or "mcp"
    used = set(taken)
    name, number = base, 1
    while name in used:
        number += 1
        name = f"{base}-{number}"
    return name


def stdio_server_from_command(
    command_line: str,
    *,
    taken: Iterable[str] = (),
    tools: Mapping[str, ToolClass] | None = None,
    env: Mapping[str, str] | None = None,
) -> StdioServer:
    """A ``StdioServer`` from one shell-style ``"COMMAND ARGS"`` string, or ``"NAME=COMMAND ARGS"`` to name it.

    Named after the server, not its launcher: ``npx -y @modelcontextprotocol/server-memory`` is ``memory``,
    ``uvx mcp-server-time`` is ``time``, ``python my_server.py`` is ``my_server``. ``taken`` holds names
    already in use; a repeat gets ``-2``, ``-3`` and so on (an explicit name must be free). ``env`` is the
    server's whole environment (None: the SDK's default, a few safe variables such as PATH and HOME).
    """
    explicit = _EXPLICIT_NAME.match(command_line.strip())
    name = explicit.group(1) if explicit else None
    if explicit:
        command_line = explicit.group(2)
        if name in set(taken):
            raise McpConfigError(f"--mcp {name}=...: the name {name!r} is already used by another server.")
    try:
        argv = shlex.split(command_line)
    except ValueError as exc:
        raise McpConfigError(f"--mcp {command_line!r}: {exc}.") from None
    if not argv:
        raise McpConfigError('--mcp needs a command, e.g. --mcp "python my_server.py".')
    return StdioServer(
        name=name or _name_from_command(argv, taken),
        command=argv[0],
        args=tuple(argv[1:]),
        tools=tools,
        env=None if env is None else dict(env),
    )


def _string_list(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise McpConfigError(f"{where} must be a list of strings.")
    return tuple(value)


_ENV_REFERENCE: Final = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _config_headers(value: Any, where: str, environ: Mapping[str, str]) -> dict[str, str]:
    """A url server's ``headers`` table, each ``${VAR}`` replaced from ``environ`` (so a token stays out of the
    file); a variable that is not set is an error naming it, never its would-be value."""
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise McpConfigError(f"{where}.headers must be a table of strings.")

    def expand(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in environ:
            raise McpConfigError(f"{where}.headers names ${{{name}}}, which is not set in the environment.")
        return environ[name]

    return {header: _ENV_REFERENCE.sub(expand, text) for header, text in value.items()}


def _one_server(name: str, table: Any, environ: Mapping[str, str]) -> McpServer:
    where = f"[servers.{name}]"
    if not isinstance(table, dict):
        raise McpConfigError(f"{where} must be a table.")
    known = {
        *("command", "args", "env", "cwd", "max_message_bytes"),
        *("url", "headers", "oauth", "client_metadata_url"),
        *("tools", "sampling"),
    }
    unknown = sorted(set(table) - known)
    if unknown:
        raise McpConfigError(f"{where}: unknown key(s) {', '.join(unknown)}.")
    sampling = table.get("sampling", False)
    if not isinstance(sampling, bool):
        raise McpConfigError(f"{where}.sampling must be true or false.")
    tools = table.get("tools", {})
    if not isinstance(tools, dict):
        raise McpConfigError(f'{where}.tools must be a table of tool name = "read" | "mutate" | "destructive".')
    has_command, has_url = "command" in table, "url" in table
    if has_command == has_url:
        raise McpConfigError(f"{where} needs exactly one of command (stdio) or url (streamable HTTP).")
    if has_url:
        if "max_message_bytes" in table:
            raise McpConfigError(f"{where}: max_message_bytes applies to a command server (stdio).")
        if not isinstance(table["url"], str):
            raise McpConfigError(f"{where}.url must be a string.")
        headers = _config_headers(table.get("headers", {}), where, environ)
        oauth = table.get("oauth", False)
        if not isinstance(oauth, bool):
            raise McpConfigError(f"{where}.oauth must be true or false.")
        metadata = table.get("client_metadata_url")
        if metadata is not None and (not isinstance(metadata, str) or not oauth):
            raise McpConfigError(f"{where}.client_metadata_url is an https:// address, and goes with oauth = true.")
        return HttpServer(
            name=name,
            url=table["url"],
            tools=tools,
            headers=headers,
            sampling=sampling,
            oauth=oauth,
            client_metadata_url=metadata,
        )
    if "headers" in table or "oauth" in table or "client_metadata_url" in table:
        raise McpConfigError(f"{where}: headers and oauth apply to a url server (a stdio server takes env).")
    if not isinstance(table["command"], str):
        raise McpConfigError(f"{where}.command must be a string.")
    env = table.get("env")
    if env is not None and (not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values())):
        raise McpConfigError(f"{where}.env must be a table of strings.")
    cwd = table.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise McpConfigError(f"{where}.cwd must be a string.")
    max_message_bytes = table.get("max_message_bytes", DEFAULT_MAX_MESSAGE_BYTES)
    if isinstance(max_message_bytes, bool) or not isinstance(max_message_bytes, int) or max_message_bytes < 1:
        raise McpConfigError(f"{where}.max_message_bytes must be a positive whole number of bytes.")
    return StdioServer(
        name=name,
        command=table["command"],
        args=_string_list(table.get("args", []), f"{where}.args"),
        env=env,
        cwd=cwd,
        tools=tools,
        sampling=sampling,
        max_message_bytes=max_message_bytes,
    )


def load_mcp_config(text: str, environ: Mapping[str, str] | None = None) -> tuple[McpServer, ...]:
    """Parse a TOML config: one ``[servers.NAME]`` table per server, each with ``command`` (+ ``args``,
    ``env``, ``cwd``) or ``url`` (+ ``headers``, whose ``${VAR}`` references are read from ``environ``, by
    default the process environment) and ``oauth = true`` (sign in with OAuth: the CLI runs the browser flow),
    a command server's optional ``max_message_bytes`` (the cap on one message from it),
    an optional ``sampling = true`` (the server may ask for the model, each
    request a card), and an optional ``[servers.NAME.tools]`` table classifying tools."""
    environ = os.environ if environ is None else environ
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise McpConfigError(f"the MCP config is not valid TOML: {exc}.") from None
    unknown = sorted(set(data) - {"servers"})
    if unknown:
        raise McpConfigError(
            f"the MCP config has unknown top-level key(s) {', '.join(unknown)}; expected [servers.NAME]."
        )
    servers = data.get("servers", {})
    if not isinstance(servers, dict):
        raise McpConfigError("servers must be a table of [servers.NAME] tables.")
    return tuple(_one_server(name, table, environ) for name, table in servers.items())
