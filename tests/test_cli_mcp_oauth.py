"""The CLI's OAuth parts for a remote MCP server: tokens in a file only the user reads, the loopback redirect URI
that takes the code (and nothing else), the URL printed and a browser tried. The whole flow runs in the
conformance suite's authorization scenarios (tests/test_mcp_conformance.py), through this same code."""

from __future__ import annotations

import stat
from pathlib import Path

import httpx
import pytest
import trio
import trio.testing
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken
from pydantic import AnyUrl

from trioloop.cli.mcp_oauth import FileTokens, LoopbackCallback, OAuthCallbackError, cli_oauth, token_dir
from trioloop.mcp import HttpServer, McpToolset, load_mcp_config


async def test_tokens_are_kept_in_a_file_only_the_user_can_read(tmp_path: Path) -> None:
    storage = FileTokens(tmp_path / "conf" / "remote.json")
    assert await storage.get_tokens() is None and await storage.get_client_info() is None
    await storage.set_tokens(OAuthToken(access_token="at-secret", token_type="Bearer", refresh_token="rt"))
    client = OAuthClientInformationFull(client_id="cid", redirect_uris=[AnyUrl("http://127.0.0.1:1/callback")])
    await storage.set_client_info(client)
    again = FileTokens(tmp_path / "conf" / "remote.json")
    tokens = await again.get_tokens()
    info = await again.get_client_info()
    assert tokens is not None and tokens.access_token == "at-secret" and tokens.refresh_token == "rt"
    assert info is not None and info.client_id == "cid"
    assert stat.S_IMODE(storage.path.stat().st_mode) == 0o600
    assert stat.S_IMODE(storage.path.parent.stat().st_mode) == 0o700
    storage.path.write_text("not json")
    assert await again.get_tokens() is None  # a damaged file means signing in again, not a crash


def test_the_token_directory_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert token_dir() == tmp_path / "trioloop" / "mcp-oauth"


async def test_the_redirect_uri_takes_the_code_and_ignores_other_requests() -> None:
    callback = LoopbackCallback(timeout_s=10)
    await callback.listen()
    assert callback.redirect_uri.startswith("http://127.0.0.1:") and callback.port > 0
    answers: list[int] = []

    async def browser() -> None:
        async with httpx.AsyncClient() as client:
            answers.append((await client.get(f"http://127.0.0.1:{callback.port}/favicon.ico")).status_code)
            answers.append((await client.get(callback.redirect_uri)).status_code)  # no code: keep waiting
            done = await client.get(callback.redirect_uri, params={"code": "c0de", "state": "st", "iss": "i"})
            answers.append(done.status_code)
            assert "Signed in." in done.text

    async with trio.open_nursery() as nursery:
        nursery.start_soon(browser)
        result = await callback.wait()
    await callback.aclose()
    assert (result.code, result.state, result.iss) == ("c0de", "st", "i")
    assert answers == [404, 200, 200]


async def test_a_denied_authorization_and_a_browser_that_never_comes_back_are_errors(
    autojump_clock: trio.testing.MockClock,
) -> None:
    callback = LoopbackCallback(timeout_s=300)
    await callback.listen()

    async def deny() -> None:
        async with await trio.open_tcp_stream("127.0.0.1", callback.port) as stream:
            await stream.send_all(b"GET /callback?error=access_denied HTTP/1.1\r\nHost: x\r\n\r\n")
            await stream.receive_some(1000)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(deny)
        with pytest.raises(OAuthCallbackError, match="access_denied"):
            await callback.wait()
    with pytest.raises(OAuthCallbackError, match="within 300 s"):
        await callback.wait()
    await callback.aclose()


async def test_the_cli_prints_the_address_and_tries_a_browser(tmp_path: Path) -> None:
    said: list[str] = []
    opened: list[str] = []

    async def browser(url: str) -> None:
        opened.append(url)

    callback = LoopbackCallback()
    await callback.listen()
    provider = cli_oauth("remote", "https://mcp.example.com/mcp", callback, said.append, open_browser=browser,
                         storage=FileTokens(tmp_path / "t.json"))  # fmt: skip
    assert provider.context.client_metadata.redirect_uris == [AnyUrl(callback.redirect_uri)]
    assert provider.context.redirect_handler is not None
    await provider.context.redirect_handler("https://auth.example.com/authorize?client_id=x")
    assert said == [
        'To authorize MCP server "remote", open this address in a browser:\n'
        "  https://auth.example.com/authorize?client_id=x"
    ]
    assert opened == ["https://auth.example.com/authorize?client_id=x"]
    await callback.aclose()


def test_a_config_that_asks_for_oauth_needs_auth_before_it_connects() -> None:
    [server] = load_mcp_config('[servers.remote]\nurl = "https://mcp.example.com/mcp"\noauth = true\n')
    assert isinstance(server, HttpServer) and server.oauth and server.auth is None
    with pytest.raises(ValueError, match="signs in with OAuth"):
        McpToolset(server)
    with pytest.raises(ValueError, match="oauth must be true or false"):
        load_mcp_config('[servers.remote]\nurl = "https://mcp.example.com/mcp"\noauth = "yes"\n')
    with pytest.raises(ValueError, match="apply to a url server"):
        load_mcp_config('[servers.local]\ncommand = "x"\noauth = true\n')


async def test_a_client_metadata_url_from_the_config_reaches_the_oauth_client(tmp_path: Path) -> None:
    text = (
        '[servers.remote]\nurl = "https://mcp.example.com/mcp"\noauth = true\n'
        'client_metadata_url = "https://example.com/trioloop.json"\n'
    )
    [server] = load_mcp_config(text)
    assert isinstance(server, HttpServer) and server.client_metadata_url == "https://example.com/trioloop.json"
    callback = LoopbackCallback()
    await callback.listen()
    provider = cli_oauth("remote", server.url, callback, print, storage=FileTokens(tmp_path / "t.json"),
                         client_metadata_url=server.client_metadata_url)  # fmt: skip
    assert provider.context.client_metadata_url == "https://example.com/trioloop.json"
    await callback.aclose()
    for wrong, complaint in (
        ('client_metadata_url = "http://example.com/x.json"', "https:// address with a path"),
        ('client_metadata_url = "https://example.com/"', "https:// address with a path"),
        ("client_metadata_url = 7", "goes with oauth = true"),
    ):
        with pytest.raises(ValueError, match=complaint):
            load_mcp_config(f'[servers.remote]\nurl = "https://mcp.example.com/mcp"\noauth = true\n{wrong}\n')
    with pytest.raises(ValueError, match="goes with oauth = true"):
        load_mcp_config(
            '[servers.r]\nurl = "https://m.example.com/mcp"\nclient_metadata_url = "https://e.com/c.json"\n'
        )
