"""`trioloop chat` says what went wrong: host and cause, retry progress, exit codes, checks before the prompt."""

from __future__ import annotations

import argparse
import socket
import ssl
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import trio
import trio.testing

from trioloop.cli.chat import _chat
from trioloop.cli.exit_codes import EXIT_TURN_FAILED, EXIT_USAGE
from trioloop.cli.parser import _build_parser, main
from trioloop.providers._loopback import LoopbackResponse, open_loopback_server, replay
from trioloop.providers._network import describe_network_failure

PAYMENT = Path(__file__).resolve().parent.parent / "examples" / "payment.thf"
FIXTURES = Path(__file__).parent / "fixtures" / "providers"
KEY = "sk-cli-canary-0123456789abcdef"


@pytest.fixture(autouse=True)
def _environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "ANTHROPIC_BASE_URL", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)


def one_request(seen: list[str] | None = None, read: Callable[[], str] | None = None) -> Callable[[str], str]:
    """A prompt answering one request, then Ctrl-D; ``read`` records what was on screen at the first prompt."""
    answers: Iterator[str] = iter(["summarize the model"])

    def prompt(label: str) -> str:
        if seen is not None and read is not None and not seen:
            seen.append(read())
        try:
            return next(answers)
        except StopIteration:
            raise EOFError from None

    return prompt


async def closed_port() -> int:
    sock = trio.socket.socket()
    await sock.bind(("127.0.0.1", 0))
    port: int = sock.getsockname()[1]
    sock.close()
    return port


def test_version_and_help_on_every_option(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("trioloop ")
    parser = _build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in [("trioloop", parser), *subparsers.choices.items()]:
        for action in sub._actions:
            if not isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
                assert action.help, (name, action.dest)


async def test_no_connection_names_host_and_cause_and_exits_3(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], autojump_clock: trio.testing.MockClock
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    port = await closed_port()
    asked: list[str] = []

    def prompt(label: str) -> str:
        asked.append(label)
        raise EOFError

    code = await _chat(PAYMENT, "openai", "gpt-4.1", "none", prompt, f"http://127.0.0.1:{port}/v1")
    captured = capsys.readouterr()
    err = captured.err
    # Checked once before the first prompt (the models list): said at once, no request typed, no retries.
    assert code == EXIT_TURN_FAILED and asked == []
    assert f"127.0.0.1:{port}" in err and "connection refused" in err
    assert "retry" not in captured.out
    assert KEY not in err


async def test_a_529_storm_shows_progress_then_the_status(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], autojump_clock: trio.testing.MockClock
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    overloaded = LoopbackResponse(
        status=529,
        headers=(("content-type", "application/json"),),
        body=b'{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}',
    )
    async with open_loopback_server(replay([], fallback=overloaded)) as server:
        code = await _chat(PAYMENT, "anthropic", None, "none", one_request(), server.url)
    captured = capsys.readouterr()
    err = captured.err
    # One counter: the first request and three retries, each retry shown once with its cause and wait.
    posts = [r for r in server.requests if r.method == "POST"]
    assert code == EXIT_TURN_FAILED and len(posts) == 4
    retries = [line.strip() for line in captured.out.splitlines() if "retry" in line]
    assert retries == [
        "! HTTP 529, retry 1 of 3 in 0.5 s",
        "! HTTP 529, retry 2 of 3 in 1 s",
        "! HTTP 529, retry 3 of 3 in 2 s",
    ]
    assert f"127.0.0.1:{server.port}" in err and "overloaded_error: Overloaded" in err


async def test_tls_to_a_plain_http_server_is_named(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], autojump_clock: trio.testing.MockClock
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    async with open_loopback_server(replay([])) as server:
        code = await _chat(PAYMENT, "openai", "gpt-4.1", "none", one_request(), f"https://127.0.0.1:{server.port}/v1")
    assert code == EXIT_TURN_FAILED
    assert "TLS handshake failed" in capsys.readouterr().err


def test_dns_and_certificate_causes_are_named() -> None:
    def wrapped(cause: BaseException) -> httpx.ConnectError:
        error = httpx.ConnectError(str(cause))
        error.__cause__ = cause
        return error

    assert describe_network_failure(wrapped(socket.gaierror(-2, "Name or service not known"))).startswith(
        "DNS lookup failed"
    )
    assert describe_network_failure(wrapped(ssl.SSLCertVerificationError("bad cert"))).startswith(
        "TLS certificate verification failed"
    )
    group = ExceptionGroup("all attempts failed", [ConnectionRefusedError(111, "refused")])
    assert describe_network_failure(wrapped(group)).startswith("connection refused")
    assert describe_network_failure(httpx.ConnectTimeout("slow")).startswith("timed out while connecting")


async def test_local_server_needs_no_key_and_an_unknown_model_warns_before_the_prompt(
    capsys: pytest.CaptureFixture[str], autojump_clock: trio.testing.MockClock
) -> None:
    answer = LoopbackResponse(body=(FIXTURES / "compat" / "tgi_no_done.sse").read_bytes())
    seen: list[str] = []
    async with open_loopback_server(replay([answer])) as server:
        code = await _chat(
            PAYMENT, "openai", "qwen2.5:7b", "none", one_request(seen, lambda: capsys.readouterr().err), server.url
        )
    assert code == 0
    assert seen and 'warning: Model "qwen2.5:7b" is not in trioloop\'s model table' in seen[0]
    assert server.requests[0].header("authorization") == "Bearer no-key-needed-locally"


@pytest.mark.parametrize(
    ("base_url", "key", "problem"),
    [
        ("http://example.com/v1", KEY, "must be https"),
        ("https://api.example.com/v1", None, "set OPENAI_API_KEY"),
    ],
)
async def test_configuration_is_checked_before_the_first_prompt(
    base_url: str,
    key: str | None,
    problem: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if key is not None:
        monkeypatch.setenv("OPENAI_API_KEY", key)
    monkeypatch.setenv("OPENAI_BASE_URL", base_url)  # the environment variable is read like --base-url

    def never(label: str) -> str:
        raise AssertionError("prompted despite a configuration error")

    assert await _chat(PAYMENT, "openai", None, "none", never) == EXIT_USAGE
    assert problem in capsys.readouterr().err


async def test_usage_with_cache_tokens_is_shown_per_turn_and_for_the_session(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], autojump_clock: trio.testing.MockClock
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    body = (
        (FIXTURES / "anthropic" / "text_answer.sse")
        .read_bytes()
        .replace(b'"input_tokens":12,', b'"input_tokens":2,"cache_read_input_tokens":10,')
    )
    answers = iter(["first", "second"])

    def prompt(label: str) -> str:
        try:
            return next(answers)
        except StopIteration:
            raise EOFError from None

    async with open_loopback_server(replay([LoopbackResponse(body=body)] * 2)) as server:
        assert await _chat(PAYMENT, "anthropic", "claude-sonnet-4-5", "none", prompt, server.url) == 0
    out = capsys.readouterr().out
    # At claude-sonnet-4-5's price: 2 uncached in at $3, 10 cache reads at $0.30, 9 out at $15 a million: $0.000144.
    assert (
        "tokens: 12 in (cache: 10 read, 0 written), 9 out, $0.0001; session: 12 in (cache: 10 read, 0 written), 9 out,"
        " $0.0001" in out
    )
    assert "session: 24 in (cache: 20 read, 0 written), 18 out, $0.0003" in out


async def test_a_wrong_key_is_said_before_the_first_prompt(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    refused = LoopbackResponse(
        status=401,
        headers=(("content-type", "application/json"),),
        body=b'{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}',
    )
    asked: list[str] = []

    def prompt(label: str) -> str:
        asked.append(label)
        raise EOFError

    async with open_loopback_server(lambda request: refused) as server:
        code = await _chat(PAYMENT, "anthropic", None, "none", prompt, server.url)
    err = capsys.readouterr().err
    assert code == EXIT_TURN_FAILED and asked == []
    assert [(r.method, r.target) for r in server.requests] == [("GET", "/v1/models")]
    assert "invalid x-api-key" in err and KEY not in err
