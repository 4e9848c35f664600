"""OAuth for a remote MCP server in the CLI: the SDK's ``OAuthClientProvider`` with the parts an app supplies.

- Token storage: one JSON file per server in ``$XDG_CONFIG_HOME/trioloop/mcp-oauth/`` (``~/.config`` by default),
  readable by the user alone (0600 in a 0700 directory), written whole and renamed into place.
- The browser round trip: the CLI prints the authorization URL and opens a browser when it can; a one-shot HTTP
  server on 127.0.0.1 (the redirect URI, bound before the client registers) takes the code and the state.

No token, code or client secret is ever printed or logged; the URL printed carries neither.
"""

from __future__ import annotations

import json
import os
import webbrowser
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final
from urllib.parse import parse_qs, urlsplit

import trio
from mcp.client.auth import OAuthClientProvider, TokenStorage
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientInformationFull, OAuthClientMetadata, OAuthToken
from pydantic import AnyUrl

__all__ = ["CALLBACK_TIMEOUT_S", "FileTokens", "LoopbackCallback", "OAuthCallbackError", "cli_oauth", "token_dir"]

CALLBACK_TIMEOUT_S: Final = 300.0
"""How long the CLI waits for the browser to come back with the code."""
_REQUEST_MAX: Final = 16_384
_PAGE: Final = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nConnection: close\r\n\r\n"
    b"<!doctype html><title>trioloop</title><p>%s You can close this window and return to the terminal.</p>"
)


class OAuthCallbackError(RuntimeError):
    """The browser did not come back with a code (the person denied access, or the wait timed out)."""


def token_dir() -> Path:
    """Where the CLI keeps MCP servers' OAuth tokens."""
    from trioloop.durable.files import config_folder

    return config_folder() / "mcp-oauth"


class FileTokens(TokenStorage):
    """One server's tokens and registered client, in a JSON file only the user can read."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _read(self) -> dict[str, object]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _write(self, key: str, value: object) -> None:
        data = self._read()
        data[key] = value
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        temporary = self.path.with_suffix(".tmp")
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as file:
            json.dump(data, file)
        os.replace(temporary, self.path)

    async def get_tokens(self) -> OAuthToken | None:
        stored = self._read().get("tokens")
        return OAuthToken.model_validate(stored) if isinstance(stored, dict) else None

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self._write("tokens", tokens.model_dump(mode="json", exclude_none=True))

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        stored = self._read().get("client")
        return OAuthClientInformationFull.model_validate(stored) if isinstance(stored, dict) else None

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self._write("client", client_info.model_dump(mode="json", exclude_none=True))


class LoopbackCallback:
    """The redirect URI's server: listens on 127.0.0.1 from `listen` until the first request that carries the
    authorization code (or an error), answers it with a short page, and returns what it carried."""

    def __init__(self, timeout_s: float = CALLBACK_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self._listener: trio.SocketListener | None = None
        self.port = 0

    @property
    def redirect_uri(self) -> str:
        return f"http://127.0.0.1:{self.port}/callback"

    async def listen(self) -> None:
        """Bind the port now, so the redirect URI is known before the client registers."""
        if self._listener is None:
            (listener,) = await trio.open_tcp_listeners(0, host="127.0.0.1")
            self._listener = listener
            self.port = listener.socket.getsockname()[1]

    async def aclose(self) -> None:
        if self._listener is not None:
            await self._listener.aclose()
            self._listener = None

    async def wait(self) -> AuthorizationCodeResult:
        """The code and state of the first request to the redirect URI that carries them."""
        await self.listen()
        assert self._listener is not None
        with trio.move_on_after(self.timeout_s):
            while True:
                stream = await self._listener.accept()
                async with stream:
                    result = await _one_request(stream)
                if result is not None:
                    return result
        raise OAuthCallbackError(f"no answer from the browser within {self.timeout_s:g} s")


async def _one_request(stream: trio.SocketStream) -> AuthorizationCodeResult | None:
    data = b""
    with trio.move_on_after(10):
        while b"\r\n\r\n" not in data and len(data) < _REQUEST_MAX:
            chunk = await stream.receive_some(4096)
            if not chunk:
                break
            data += chunk
    line = data.split(b"\r\n", 1)[0].decode("latin-1")
    parts = line.split(" ")
    if len(parts) != 3 or parts[0] != "GET" or urlsplit(parts[1]).path != "/callback":
        await stream.send_all(b"HTTP/1.1 404 Not Found\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
        return None
    query = parse_qs(urlsplit(parts[1]).query)
    if "error" in query:
        await stream.send_all(_PAGE % b"Access was not granted.")
        raise OAuthCallbackError(f"the authorization server answered: {query['error'][0][:100]}")
    code = query.get("code", [""])[0]
    if not code:
        await stream.send_all(_PAGE % b"No authorization code came back.")
        return None
    await stream.send_all(_PAGE % b"Signed in.")
    return AuthorizationCodeResult(code=code, state=query.get("state", [None])[0], iss=query.get("iss", [None])[0])


def _open_browser(url: str) -> bool:
    try:
        return webbrowser.open(url)
    except webbrowser.Error:
        return False


def cli_oauth(
    name: str,
    url: str,
    callback: LoopbackCallback,
    say: Callable[[str], None],
    *,
    storage: TokenStorage | None = None,
    open_browser: Callable[[str], Awaitable[None]] | None = None,
    client_metadata_url: str | None = None,
) -> OAuthClientProvider:
    """The SDK's OAuth client for server ``name`` at ``url``, as the CLI runs it (``callback`` already
    listening): ``say`` prints the authorization URL; a browser opens on it when one can be started. With
    ``client_metadata_url`` the client id is that URL where the authorization server takes URL-based client ids
    (its metadata must list the loopback redirect URI), else the client registers dynamically."""

    async def redirect(authorization_url: str) -> None:
        say(f'To authorize MCP server "{name}", open this address in a browser:\n  {authorization_url}')
        if open_browser is not None:
            await open_browser(authorization_url)
        elif not await trio.to_thread.run_sync(_open_browser, authorization_url):
            say("(No browser could be started here: open the address yourself.)")

    return OAuthClientProvider(
        server_url=url,
        client_metadata=OAuthClientMetadata(
            client_name="trioloop",
            redirect_uris=[AnyUrl(callback.redirect_uri)],
            grant_types=["authorization_code", "refresh_token"],
            response_types=["code"],
        ),
        storage=storage if storage is not None else FileTokens(token_dir() / f"{name}.json"),
        redirect_handler=redirect,
        callback_handler=callback.wait,
        client_metadata_url=client_metadata_url,
    )
