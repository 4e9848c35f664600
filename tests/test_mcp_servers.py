"""trioloop.mcp.servers: the static, local policy (config file, --mcp command lines) and the CLI wiring."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest

from trioloop.cli import main
from trioloop.cli.chat import run_chat
from trioloop.mcp import HttpServer, McpConfigError, StdioServer, load_mcp_config, stdio_server_from_command

SERVER_SCRIPT = Path(__file__).resolve().parent / "fixtures" / "mcp_server.py"
PAYMENT = Path(__file__).resolve().parent.parent / "examples" / "payment.thf"


def test_config_file_names_servers_and_classifies_tools() -> None:
    servers = load_mcp_config(
        """
        [servers.files]
        command = "python"
        args = ["server.py", "--root", "/tmp"]
        [servers.files.tools]
        read_file = "read"
        write_file = "mutate"

        [servers.web]
        url = "http://127.0.0.1:8000/mcp"
        """
    )
    files, web = servers
    assert isinstance(files, StdioServer)
    assert (files.name, files.command, files.args) == ("files", "python", ("server.py", "--root", "/tmp"))
    assert dict(files.tools) == {"read_file": "read", "write_file": "mutate"}
    assert isinstance(web, HttpServer) and web.url.endswith("/mcp") and dict(web.tools) == {}


def test_a_url_servers_headers_take_tokens_from_the_environment_and_never_show_them() -> None:
    text = """
        [servers.gh]
        url = "https://api.example.com/mcp"
        headers = { Authorization = "Bearer ${GH_TOKEN}", X-Team = "core-${TEAM}" }
    """
    [server] = load_mcp_config(text, environ={"GH_TOKEN": "ghp_secret123", "TEAM": "blue"})
    assert isinstance(server, HttpServer)
    assert dict(server.headers) == {"Authorization": "Bearer ghp_secret123", "X-Team": "core-blue"}
    assert "ghp_secret123" not in repr(server) and "core-blue" not in repr(server)
    with pytest.raises(McpConfigError, match=r"names \$\{GH_TOKEN\}, which is not set") as missing:
        load_mcp_config(text, environ={"TEAM": "blue"})
    assert "ghp_" not in str(missing.value)


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("[servers.a]\ncommand = 'x'\nheaders = { A = 'b' }", "headers and oauth apply to a url server"),
        ("[servers.a]\nurl = 'http://h/'\nheaders = { A = 1 }", "headers must be a table of strings"),
        ("[servers.a]\ncommand = 'x'\nurl = 'http://h/'", "exactly one of command"),
        ("[servers.a]\ncommand = 'x'\n[servers.a.tools]\nt = 'trusted'", "read, mutate, destructive"),
        ("[servers.'a b']\ncommand = 'x'", "letters, digits"),
        ("[servers.a]\nurl = 'file:///etc/passwd'", "http:// or https://"),
        ("[servers.a]\ncommand = 'x'\nargs = 'not a list'", "list of strings"),
        ("[servers.a]\ncommand = 'x'\nshell = true", "unknown key(s) shell"),
        ("[server.a]\ncommand = 'x'", "unknown top-level key(s) server"),
        ("not toml [", "not valid TOML"),
    ],
)
def test_bad_configs_say_what_to_fix(text: str, complaint: str) -> None:
    with pytest.raises(McpConfigError, match=None) as caught:
        load_mcp_config(text)
    assert complaint in str(caught.value)


def test_command_lines_become_named_stdio_servers() -> None:
    first = stdio_server_from_command("python 'my server.py' --flag")
    assert (first.name, first.command, first.args) == ("my_server", "python", ("my server.py", "--flag"))
    second = stdio_server_from_command("/usr/bin/python3.11 other.py", taken=["other", "python3"])
    assert second.name == "other-2"
    assert stdio_server_from_command("python x.py", taken=["x"]).name == "x-2"
    with pytest.raises(McpConfigError):
        stdio_server_from_command("   ")
    with pytest.raises(McpConfigError):
        stdio_server_from_command("python 'unterminated")


@pytest.mark.parametrize(
    ("command", "name"),
    [
        ("npx -y @modelcontextprotocol/server-memory", "memory"),
        ("npx -y @modelcontextprotocol/server-filesystem@2025.1.1 /tmp", "filesystem"),
        ("uvx mcp-server-time", "time"),
        ("uvx --from mcp-server-git mcp-server-git --repository .", "git"),
        ("python -m mcp_server_git --repository .", "git"),
        ("docker run -i --rm mcp/fetch", "fetch"),
        ("npx @playwright/mcp@latest", "playwright"),
        ("node build/index.js", "index"),
        ("/usr/local/bin/weather-mcp --units metric", "weather"),
    ],
)
def test_a_server_is_named_after_what_the_launcher_starts(command: str, name: str) -> None:
    assert stdio_server_from_command(command).name == name


def test_name_equals_command_names_a_server_and_env_is_its_whole_environment() -> None:
    named = stdio_server_from_command("notes=npx -y @modelcontextprotocol/server-memory", env={"A": "1"})
    assert (named.name, named.command, named.env) == ("notes", "npx", {"A": "1"})
    with pytest.raises(McpConfigError, match="already used"):
        stdio_server_from_command("notes=python x.py", taken=["notes"])
    assert stdio_server_from_command("python x.py").env is None  # the SDK's default environment


def test_the_cli_gives_servers_the_exported_environment_or_narrows_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from trioloop.cli.mcp_servers import server_environment

    monkeypatch.setenv("MY_SERVER_TOKEN", "t0k3n")
    monkeypatch.setenv("UNRELATED", "x")
    whole = server_environment(None)
    assert whole["MY_SERVER_TOKEN"] == "t0k3n" and whole["UNRELATED"] == "x"
    narrowed = server_environment(["MY_SERVER_TOKEN"])
    assert narrowed["MY_SERVER_TOKEN"] == "t0k3n" and "UNRELATED" not in narrowed and "PATH" in narrowed


def test_cli_chat_accepts_repeatable_mcp_options() -> None:
    assert main(["chat", str(PAYMENT), "--provider", "anthropic", "--model", "m", "--mcp", "a", "--mcp", "b"]) == 2


async def _no_check(provider: object) -> None:
    """No network in these tests: the provider's URL and key check (tests/test_cli_chat.py) is skipped."""


def test_chat_connects_the_servers_and_closes_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test-never-used")
    monkeypatch.setattr("trioloop.cli.chat._check_provider", _no_check)
    config = tmp_path / "mcp.toml"
    config.write_text(
        f'[servers.fx]\ncommand = {sys.executable!r}\nargs = [{str(SERVER_SCRIPT)!r}, "stdio"]\n'
        '[servers.fx.tools]\necho = "read"\n'
    )
    # The prompt answers with an empty line at once: the chat ends before any request reaches the provider.
    code = run_chat(str(PAYMENT), "anthropic", "m", "ask", lambda _: "", mcp_config=str(config))
    assert code == 0
    assert 'MCP server "fx": 10 tool(s)' in capsys.readouterr().out


def test_chat_reports_a_server_that_cannot_start(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test-never-used")
    monkeypatch.setattr("trioloop.cli.chat._check_provider", _no_check)
    command = f"{sys.executable} -c 'raise SystemExit(1)'"
    assert run_chat(str(PAYMENT), "anthropic", "m", "ask", lambda _: "", mcp=[command]) == 1
    assert "Cannot connect to MCP server" in capsys.readouterr().err


def test_mcp_package_surface_and_layering() -> None:
    import trioloop
    import trioloop.mcp

    names = list(trioloop.mcp.__all__)
    assert names == sorted(names) and all(hasattr(trioloop.mcp, name) for name in names)
    core = Path(trioloop.__file__).resolve().parent
    for package in ("machine", "durable", "runtime", "protocol", "providers", "tools", "threatmodel"):
        for source in (core / package).rglob("*.py"):
            text = source.read_text(encoding="utf-8")
            assert "trioloop.mcp" not in text and "import mcp" not in text, source


def test_readme_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    example = Path(__file__).resolve().parent.parent / "examples" / "mcp_session.py"
    runpy.run_path(str(example), run_name="__main__")
    out = capsys.readouterr().out
    assert out.startswith("completed <<<UNTRUSTED_DOCUMENT_DATA>>>") and '"text":"3"' in out
