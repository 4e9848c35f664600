"""HttpTransport over the loopback server: statuses, redirects, timeouts, caps, and the API key's secrecy."""

from __future__ import annotations

import json
import logging
import math
import pickle
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from trioloop.protocol import (
    ChatRequest,
    HoldsConnections,
    Message,
    MessageStart,
    MessageStop,
    ProtocolErrorCode,
    StopReason,
    StreamError,
    StreamEvent,
    TextDelta,
    ToolCallComplete,
    ToolCallInputDelta,
    ToolCallStart,
    event_to_json,
    is_terminal,
)
from trioloop.providers import AnthropicProvider, OpenAIProvider, is_retriable
from trioloop.providers._loopback import (
    LoopbackRequest,
    LoopbackResponse,
    LoopbackServer,
    open_loopback_server,
    replay,
)
from trioloop.providers._redact import MIN_HOLD, REDACTED, EventScrubber, StreamRedactor
from trioloop.providers.base import Messages
from trioloop.providers.transport import ApiKey, HttpChatProvider, HttpTransport, parse_retry_after

FIXTURES = Path(__file__).parent / "fixtures" / "providers"
WIRES = ("anthropic", "openai")
REQUEST = ChatRequest(model="fixture-model-1", messages=(Message.user("hi"),))
KEY = "test-key-0123456789"


def fixture(wire: str, name: str) -> bytes:
    return (FIXTURES / wire / f"{name}.sse").read_bytes()


def provider(wire: str, base_url: str, api_key: str | None = KEY, **options: Any) -> HttpChatProvider:
    options.setdefault("retry", None)
    if wire == "anthropic":
        return AnthropicProvider(api_key, base_url=base_url, **options)
    return OpenAIProvider(api_key, base_url=base_url + "/v1", **options)


async def collect(chat: HttpChatProvider, request: ChatRequest = REQUEST) -> list[StreamEvent]:
    send, receive = trio.open_memory_channel[StreamEvent](math.inf)
    await chat.stream(request, send)
    send.close()
    async with receive:
        events = [event async for event in receive]
    assert sum(is_terminal(e) for e in events) == 1 and is_terminal(events[-1]), events
    return events


async def one_failure(wire: str, response: LoopbackResponse, **options: Any) -> tuple[StreamError, LoopbackServer]:
    async with open_loopback_server(replay([response])) as server:
        events = await collect(provider(wire, server.url, **options))
    assert len(events) == 1 and isinstance(events[0], StreamError), events
    return events[0], server


def json_response(status: int, body: Any, *headers: tuple[str, str]) -> LoopbackResponse:
    return LoopbackResponse(
        status=status, headers=(("content-type", "application/json"), *headers), body=json.dumps(body).encode()
    )


@pytest.mark.parametrize("wire", WIRES)
async def test_auth_headers_and_body(wire: str, autojump_clock: trio.testing.MockClock) -> None:
    async with open_loopback_server(replay([LoopbackResponse(body=fixture(wire, "text_answer"))])) as server:
        await collect(provider(wire, server.url))
    [request] = server.requests
    assert request.method == "POST"
    if wire == "anthropic":
        assert request.target == "/v1/messages"
        assert request.header("x-api-key") == KEY
        assert request.header("anthropic-version") == "2023-06-01"
        assert request.header("authorization") is None
    else:
        assert request.target == "/v1/chat/completions"
        assert request.header("authorization") == f"Bearer {KEY}"
        assert request.header("x-api-key") is None
    assert request.header("content-type") == "application/json"
    assert KEY.encode() not in request.body and KEY not in request.target
    assert request.json()["stream"] is True


@pytest.mark.parametrize("wire", WIRES)
async def test_key_from_the_environment(
    wire: str, monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY" if wire == "anthropic" else "OPENAI_API_KEY", "env-key-42")
    async with open_loopback_server(replay([LoopbackResponse(body=fixture(wire, "text_answer"))])) as server:
        events = await collect(provider(wire, server.url, api_key=None))
    assert isinstance(events[-1], MessageStop)
    header = "x-api-key" if wire == "anthropic" else "authorization"
    assert server.requests[0].header(header) in ("env-key-42", "Bearer env-key-42")


@pytest.mark.parametrize("wire", WIRES)
@pytest.mark.parametrize("key", [None, "", "   ", "bad key", "ключ"])
async def test_missing_or_unusable_key_fails_before_any_request(
    wire: str, key: str | None, monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock
) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    error, server = await one_failure(wire, LoopbackResponse(), api_key=key)
    assert error.code is ProtocolErrorCode.NO_API_KEY and error.terminal
    assert not is_retriable(error)
    assert server.requests == []


@pytest.mark.parametrize("wire", WIRES)
@pytest.mark.parametrize(
    ("status", "code", "message", "retriable"),
    [
        (401, ProtocolErrorCode.HTTP_STATUS, Messages.AUTH_REJECTED, False),
        (403, ProtocolErrorCode.HTTP_STATUS, Messages.AUTH_REJECTED, False),
        (400, ProtocolErrorCode.HTTP_STATUS, Messages.REQUEST_REJECTED, False),
        (404, ProtocolErrorCode.HTTP_STATUS, Messages.REQUEST_REJECTED, False),
        (429, ProtocolErrorCode.RATE_LIMITED, Messages.RATE_LIMITED, True),
        (500, ProtocolErrorCode.HTTP_STATUS, Messages.SERVER_ERROR, True),
        (503, ProtocolErrorCode.HTTP_STATUS, Messages.SERVER_ERROR, True),
        (529, ProtocolErrorCode.HTTP_STATUS, Messages.SERVER_ERROR, True),
    ],
)
async def test_http_status_mapping(
    wire: str,
    status: int,
    code: ProtocolErrorCode,
    message: str,
    retriable: bool,
    autojump_clock: trio.testing.MockClock,
) -> None:
    body = {"type": "error", "error": {"type": "some_error", "message": "provider says no"}}
    if wire == "openai":
        body = {"error": {"message": "provider says no", "type": "some_error", "code": None}}
    error, server = await one_failure(wire, json_response(status, body))
    assert (error.code, error.message, is_retriable(error)) == (code, message, retriable)
    assert error.provider_detail is not None and error.provider_detail.startswith(f"HTTP {status}")
    assert "provider says no" in error.provider_detail
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    ("wire", "body"),
    [
        ("anthropic", {"type": "error", "error": {"type": "invalid_request_error", "message": "prompt is too long"}}),
        (
            "openai",
            {"error": {"message": "too long", "type": "invalid_request_error", "code": "context_length_exceeded"}},
        ),
    ],
)
async def test_context_length_rejection_is_context_overflow(
    wire: str, body: dict[str, Any], autojump_clock: trio.testing.MockClock
) -> None:
    error, _ = await one_failure(wire, json_response(400, body))
    assert error.code is ProtocolErrorCode.CONTEXT_OVERFLOW


async def test_error_body_that_is_not_json_is_kept_as_redacted_text(autojump_clock: trio.testing.MockClock) -> None:
    body = b"<html>bad gateway sk-proxy-LEAKED</html>" + b"x" * 40_000
    error, _ = await one_failure("openai", LoopbackResponse(status=502, headers=(), body=body))
    assert error.provider_detail is not None
    assert "LEAKED" not in error.provider_detail and "[redacted-key]" in error.provider_detail
    assert len(error.provider_detail) <= 200


@pytest.mark.parametrize("wire", WIRES)
@pytest.mark.parametrize("follow", [False, True])
async def test_redirect_is_refused_and_the_key_never_reaches_the_target(
    wire: str, follow: bool, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_loopback_server(replay([LoopbackResponse(body=fixture(wire, "text_answer"))])) as target:
        redirect = LoopbackResponse(status=307, headers=(("location", target.url + "/v1/messages"),))
        async with (
            open_loopback_server(replay([redirect])) as origin,
            httpx.AsyncClient(follow_redirects=follow, trust_env=False) as client,
        ):
            events = await collect(provider(wire, origin.url, client=client))
    [error] = events
    assert isinstance(error, StreamError)
    assert (error.code, error.message) == (ProtocolErrorCode.HTTP_STATUS, Messages.REDIRECT_REFUSED)
    assert not is_retriable(error)
    assert target.requests == []
    assert len(origin.requests) == 1


@pytest.mark.parametrize("wire", WIRES)
async def test_read_gap_timeout_after_the_first_event(wire: str, autojump_clock: trio.testing.MockClock) -> None:
    raw = fixture(wire, "text_answer")
    # MessageStart goes out with the first content, so stall after the first text.
    response = LoopbackResponse(body=raw, stall_after_bytes=raw.index(b"\n\n", raw.index(b"Hello")) + 2)
    start = trio.current_time()
    async with open_loopback_server(replay([response])) as server:
        events = await collect(provider(wire, server.url, read_timeout=42.0))
    assert trio.current_time() - start == pytest.approx(42.0)
    assert events[:2] == [MessageStart(model="fixture-model-1"), TextDelta(text="Hello! ")]
    [error] = events[2:]
    assert isinstance(error, StreamError)
    assert (error.code, error.message) == (ProtocolErrorCode.TRANSPORT, Messages.READ_TIMEOUT)


async def test_default_gap_timeout_is_300_seconds(autojump_clock: trio.testing.MockClock) -> None:
    async def never_answers(request: LoopbackRequest) -> LoopbackResponse:
        await trio.sleep_forever()
        raise AssertionError

    start = trio.current_time()
    async with open_loopback_server(never_answers) as server:
        events = await collect(provider("anthropic", server.url))
    assert trio.current_time() - start == pytest.approx(300.0)
    [error] = events
    assert isinstance(error, StreamError) and error.message == Messages.READ_TIMEOUT
    assert is_retriable(error)


@pytest.mark.parametrize("wire", WIRES)
async def test_total_bytes_cap(wire: str, autojump_clock: trio.testing.MockClock) -> None:
    raw = fixture(wire, "parallel_tools")
    response = LoopbackResponse(body=raw, chunk_size=64)
    async with open_loopback_server(replay([response])) as server:
        events = await collect(provider(wire, server.url, max_response_bytes=len(raw) - 1))
    error = events[-1]
    assert isinstance(error, StreamError)
    assert (error.code, error.message, error.provider_detail) == (
        ProtocolErrorCode.TRANSPORT,
        Messages.TOO_LARGE,
        "response_too_large",
    )
    assert not is_retriable(error)
    async with open_loopback_server(replay([response])) as server:
        events = await collect(provider(wire, server.url, max_response_bytes=len(raw)))
    assert events[-1] == MessageStop(stop_reason=StopReason.TOOL_USE)


@pytest.mark.parametrize("wire", WIRES)
@pytest.mark.parametrize("content_length", [False, True])
async def test_disconnect_mid_body_is_a_network_failure(
    wire: str, content_length: bool, autojump_clock: trio.testing.MockClock
) -> None:
    raw = fixture(wire, "text_answer")
    cut = raw.index(b"\n\n", raw.index(b"Hello")) + 2
    response = LoopbackResponse(body=raw, disconnect_after_bytes=cut, content_length=content_length)
    async with open_loopback_server(replay([response])) as server:
        events = await collect(provider(wire, server.url))
    assert events[0] == MessageStart(model="fixture-model-1")
    error = events[-1]
    assert isinstance(error, StreamError)
    assert (error.code, error.message) == (ProtocolErrorCode.TRANSPORT, Messages.NETWORK)


async def test_invalid_utf8_body_is_malformed(autojump_clock: trio.testing.MockClock) -> None:
    body = fixture("openai", "text_answer").replace("Grüße".encode(), b"Gr\xff\xfee")
    async with open_loopback_server(replay([LoopbackResponse(body=body)])) as server:
        events = await collect(provider("openai", server.url))
    error = events[-1]
    assert isinstance(error, StreamError) and error.code is ProtocolErrorCode.MALFORMED_STREAM and error.terminal
    assert TextDelta(text="Hello! ") in events


async def test_connection_refused_is_a_retriable_network_failure(autojump_clock: trio.testing.MockClock) -> None:
    async with open_loopback_server(replay([])) as server:
        url = server.url
    [error] = await collect(provider("anthropic", url))
    assert isinstance(error, StreamError)
    assert (error.code, error.message) == (ProtocolErrorCode.TRANSPORT, Messages.NETWORK)
    assert is_retriable(error)


@pytest.mark.parametrize("url", ["http://example.com", "ftp://127.0.0.1", "not a url"])
async def test_plain_http_is_only_for_this_machine(url: str) -> None:
    [error] = await collect(AnthropicProvider(KEY, base_url=url, retry=None))
    assert isinstance(error, StreamError)
    assert (error.code, error.message) == (ProtocolErrorCode.TRANSPORT, Messages.INSECURE_URL)


async def test_app_supplied_client_is_used_and_left_open() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, content=fixture("openai", "text_answer"))

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        chat = OpenAIProvider(KEY, base_url="https://llm.invalid/v1", client=client)
        events = await collect(chat)
        assert not client.is_closed
        await collect(chat)
    assert events[-1] == MessageStop(stop_reason=StopReason.END_TURN)
    assert [str(r.url) for r in seen] == ["https://llm.invalid/v1/chat/completions"] * 2


async def test_consumer_that_went_away_does_not_raise(autojump_clock: trio.testing.MockClock) -> None:
    send, receive = trio.open_memory_channel[StreamEvent](0)
    await receive.aclose()
    async with open_loopback_server(replay([LoopbackResponse(body=fixture("anthropic", "text_answer"))])) as server:
        await provider("anthropic", server.url).stream(REQUEST, send)


async def test_send_channel_is_not_closed(autojump_clock: trio.testing.MockClock) -> None:
    send, receive = trio.open_memory_channel[StreamEvent](math.inf)
    async with open_loopback_server(replay([LoopbackResponse(body=fixture("anthropic", "text_answer"))])) as server:
        await provider("anthropic", server.url).stream(REQUEST, send)
    send.send_nowait(TextDelta(text="still open"))
    assert receive.statistics().current_buffer_used == 7


def test_parse_retry_after() -> None:
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after(" 1.5 ") == 1.5
    assert parse_retry_after("86400") == 600.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") is None
    for bad in (None, "", "-1", "1e3", "nan", "inf", "٣"):
        assert parse_retry_after(bad) is None


def test_transport_rejects_nonsense_limits() -> None:
    from trioloop.providers.anthropic import ANTHROPIC_WIRE

    for bad in ({"read_timeout": 0}, {"read_timeout": math.inf}, {"max_response_bytes": 0}):
        with pytest.raises(ValueError):
            HttpTransport(ANTHROPIC_WIRE, **bad)


# --- The API key never leaves the auth header ------------------------------------------------------

CANARIES = ("CANARY-7f3a9c1e5b2d-NOT-SK-SHAPED", "sk-canary-0123456789abcdefABCDEF")


def _echo_error(wire: str, status: int, key: str) -> LoopbackResponse:
    text = f"invalid x-api-key {key}" if status != 429 else f"slow down {key}"
    if wire == "anthropic":
        return json_response(status, {"type": "error", "error": {"type": "x", "message": text}}, ("retry-after", "1"))
    return json_response(status, {"error": {"message": text, "type": "x", "code": None}}, ("retry-after", "1"))


def _in_stream_error(wire: str, key: str, padding: int) -> LoopbackResponse:
    message = "p" * padding + f" key={key} rest"
    if wire == "anthropic":
        head = fixture(wire, "overloaded_in_stream").split(b"event: error")[0]
        error = {"type": "error", "error": {"type": "overloaded_error", "message": message}}
        return LoopbackResponse(body=head + f"event: error\ndata: {json.dumps(error)}\n\n".encode())
    head = fixture(wire, "overloaded_in_stream").split(b'data: {"error"')[0]
    return LoopbackResponse(body=head + f"data: {json.dumps({'error': {'message': message}})}\n\n".encode())


def _bad_frame(wire: str, key: str) -> LoopbackResponse:
    raw = fixture(wire, "invalid_json_frame").replace(b"{not valid json", b"{broken " + key.encode())
    return LoopbackResponse(body=raw)


def _failure_paths(wire: str, key: str) -> list[tuple[str, LoopbackResponse, dict[str, Any]]]:
    raw = fixture(wire, "text_answer")
    first = raw.index(b"\n\n") + 2
    return [
        *[(f"http {s}", _echo_error(wire, s, key), {}) for s in (400, 401, 403, 404, 429, 500, 503)],
        *[(f"in-stream {p}", _in_stream_error(wire, key, p), {}) for p in (0, 150, 185, 195)],
        ("bad frame", _bad_frame(wire, key), {}),
        ("redirect", LoopbackResponse(status=302, headers=(("location", "http://127.0.0.1:9/elsewhere"),)), {}),
        ("disconnect", LoopbackResponse(body=raw, disconnect_after_bytes=first), {}),
        ("stall", LoopbackResponse(body=raw, stall_after_bytes=first), {"read_timeout": 5.0}),
        ("too large", LoopbackResponse(body=raw), {"max_response_bytes": 10}),
        ("truncated", LoopbackResponse(body=fixture(wire, "truncated")), {}),
        ("bad utf-8", LoopbackResponse(body=raw[:first] + b"data: \xff\n\n"), {}),
        ("success", LoopbackResponse(body=raw), {}),
    ]


@pytest.mark.parametrize("key", CANARIES)
@pytest.mark.parametrize("wire", WIRES)
async def test_canary_key_never_appears_in_any_output(
    wire: str, key: str, caplog: pytest.LogCaptureFixture, autojump_clock: trio.testing.MockClock
) -> None:
    caplog.set_level(logging.DEBUG)
    paths = _failure_paths(wire, key)
    outputs: list[str] = []
    for label, response, options in paths:
        async with open_loopback_server(replay([response, response, response])) as server:
            chat = provider(wire, server.url, api_key=key, retry=None, **options)
            events = await collect(chat)
            outputs.append(repr(chat))
        assert server.requests, label
        assert all(key.encode() not in r.body for r in server.requests), label
        outputs += [repr(e) for e in events] + [json.dumps(event_to_json(e)) for e in events]
        for event in events:
            if isinstance(event, StreamError):
                outputs += [event.message, event.provider_detail or "", str(is_retriable(event))]
    retrying = provider(wire, "http://127.0.0.1:9", api_key=key, retry=None)
    outputs += [repr(retrying), str(vars(retrying))]
    text = "\n".join([*outputs, caplog.text])
    for fragment in (key, key[:12], key[-12:]):
        assert fragment not in text


def test_api_key_holder_never_shows_itself() -> None:
    secret = ApiKey(CANARIES[0])
    assert CANARIES[0] not in repr(secret) + str(secret) + f"{secret}"
    assert secret.reveal() == CANARIES[0]
    with pytest.raises(TypeError):
        pickle.dumps(secret)


async def test_a_bug_below_the_provider_still_ends_with_a_typed_error(autojump_clock: trio.testing.MockClock) -> None:
    from trioloop.providers.anthropic import ANTHROPIC_WIRE, AnthropicWire

    class Exploding:
        done = False

        def feed(self, frame: object) -> list[StreamEvent]:
            raise ZeroDivisionError

        def finish(self) -> list[StreamEvent]:
            return []

    class BrokenWire:
        name = "anthropic"
        env_var = "ANTHROPIC_API_KEY"
        default_base_url = "https://api.anthropic.com"
        endpoint = "/v1/messages"
        auth_headers = ANTHROPIC_WIRE.auth_headers
        build_body = ANTHROPIC_WIRE.build_body
        describe_error_body = ANTHROPIC_WIRE.describe_error_body
        render_stream = ANTHROPIC_WIRE.render_stream
        render_error_body = ANTHROPIC_WIRE.render_error_body

        def new_mapper(self, *, scrub: object = None) -> Exploding:
            return Exploding()

    assert isinstance(ANTHROPIC_WIRE, AnthropicWire)
    async with open_loopback_server(replay([LoopbackResponse(body=fixture("anthropic", "text_answer"))])) as server:
        chat = HttpChatProvider(BrokenWire(), api_key=KEY, base_url=server.url, retry=None)
        [error] = await collect(chat)
    assert isinstance(error, StreamError)
    assert (error.code, error.message, error.provider_detail) == (
        ProtocolErrorCode.TRANSPORT,
        Messages.REQUEST_FAILED,
        "ZeroDivisionError",
    )


# --- streaming redaction: a key echoed into text, split anywhere, never survives the join ------------

_key_chars = st.sampled_from("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")


@settings(max_examples=300, deadline=None)
@given(
    key=st.text(_key_chars, min_size=8, max_size=24),
    pieces=st.lists(st.text(st.sampled_from("AB-x ✓"), max_size=12), max_size=6),
    data=st.data(),
)
def test_stream_redactor_never_lets_the_key_through(key: str, pieces: list[str], data: st.DataObject) -> None:
    inserts = data.draw(st.lists(st.integers(0, 200), max_size=3))
    text = "".join(pieces)
    for where in inserts:
        at = where % (len(text) + 1)
        text = text[:at] + key + text[at:]
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=12)))
    fragments = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    redactor = StreamRedactor(key)
    released = [redactor.push(f) for f in fragments]
    joined = "".join(released) + redactor.flush()
    assert key not in joined
    if key not in text:
        assert joined == text
    if len(fragments) <= 1:
        assert joined == text.replace(key, REDACTED)
    # What leaks of a split key is at most its first MIN_HOLD - 1 characters.
    assert joined.replace(REDACTED, "\0").count(key[:MIN_HOLD]) <= text.count(key[:MIN_HOLD])


@settings(max_examples=300, deadline=None)
@given(
    key=st.text(_key_chars, min_size=2, max_size=24),
    steps=st.lists(st.one_of(st.none(), st.text(st.sampled_from("AB-x✓CD"), max_size=14)), max_size=14),
)
def test_the_redactors_fast_path_releases_exactly_what_the_full_scan_does(key: str, steps: list[str | None]) -> None:
    """For any fragments and flushes (None), ``push`` (with its one-search shortcut) equals the full scan."""
    fast, slow = StreamRedactor(key), StreamRedactor(key)
    for step in steps:
        if step is None:
            assert fast.flush() == slow.flush()
        else:
            assert fast.push(step) == slow._push(step)
    assert fast.flush() == slow.flush()


def test_event_scrubber_keeps_order_and_flushes_held_text_before_other_events() -> None:
    key = "CANARY-KEY-1234"
    scrubber = EventScrubber(key)
    out: list[StreamEvent] = []
    events: list[StreamEvent] = [
        TextDelta(text="Your key is CANA"),
        TextDelta(text="RY-KEY-1234, and CANA"),
        ToolCallStart(id=key, name="n"),
        ToolCallInputDelta(id=key, partial_json='{"k": "CANARY-'),
        ToolCallInputDelta(id=key, partial_json='KEY-1234"}'),
        ToolCallComplete(id=key, name=key, input={key: [key, 1]}),
        MessageStop(stop_reason=StopReason.END_TURN),
    ]
    for event in events:
        out += scrubber.process(event)
    assert out == [
        TextDelta(text="Your key is "),
        TextDelta(text="[redacted-key], and "),
        TextDelta(text="CANA"),
        ToolCallStart(id=REDACTED, name="n"),
        ToolCallInputDelta(id=REDACTED, partial_json='{"k": "'),
        ToolCallInputDelta(id=REDACTED, partial_json='[redacted-key]"}'),
        ToolCallComplete(id=REDACTED, name=REDACTED, input={REDACTED: [REDACTED, 1]}),
        MessageStop(stop_reason=StopReason.END_TURN),
    ]


@pytest.mark.parametrize("wire", WIRES)
async def test_a_key_echoed_into_model_output_is_redacted(wire: str, autojump_clock: trio.testing.MockClock) -> None:
    from trioloop.protocol import ToolCallBlock
    from trioloop.providers.anthropic import ANTHROPIC_WIRE
    from trioloop.providers.base import WireResponse
    from trioloop.providers.openai import OPENAI_WIRE

    key = CANARIES[0]
    render = (ANTHROPIC_WIRE if wire == "anthropic" else OPENAI_WIRE).render_stream
    echoed = render(
        WireResponse(
            model=key,
            text=f"Your key is {key}.",
            tool_calls=(ToolCallBlock(id=key, name=key, input={"key": key}),),
            stop_reason=StopReason.TOOL_USE,
            text_piece=5,
            arguments_piece=3,
        )
    )
    async with open_loopback_server(replay([LoopbackResponse(body=echoed)])) as server:
        events = await collect(provider(wire, server.url, api_key=key))
    dumped = json.dumps([event_to_json(e) for e in events])
    assert key not in dumped and key not in "".join(e.text for e in events if isinstance(e, TextDelta))
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert text in (f"Your key is {REDACTED}.", f"Your key is {key[: MIN_HOLD - 1]}{REDACTED}.")
    assert events[-1] == MessageStop(stop_reason=StopReason.TOOL_USE)


async def _connects_for(wire: str, responses: list[LoopbackResponse]) -> tuple[list[list[StreamEvent]], int]:
    """Each response fetched in turn through one app-held client; the TCP connections the server accepted."""
    async with (
        open_loopback_server(replay(responses), keep_alive=True) as server,
        httpx.AsyncClient(trust_env=False) as client,
    ):
        chat = provider(wire, server.url, client=client)
        found = [await collect(chat) for _ in responses]
        assert len(server.requests) == len(responses)
        return found, server.connections


@pytest.mark.parametrize("wire", WIRES)
@pytest.mark.parametrize("chunk_size", [None, 7])
async def test_one_keep_alive_connection_serves_every_request(
    wire: str, chunk_size: int | None, autojump_clock: trio.testing.MockClock
) -> None:
    answer = LoopbackResponse(body=fixture(wire, "text_answer"), chunk_size=chunk_size)
    refused = _echo_error(wire, 429, "none")
    found, connects = await _connects_for(wire, [answer, refused, answer, answer])
    assert connects == 1
    assert [type(events[-1]) for events in found] == [MessageStop, StreamError, MessageStop, MessageStop]


@pytest.mark.parametrize("wire", WIRES)
async def test_a_long_tail_after_the_terminal_event_drops_the_connection(
    wire: str, autojump_clock: trio.testing.MockClock
) -> None:
    # more than the tail bound after the stop: the client gives up on the body and closes, so the next
    # request needs a new connection; the answer itself is unaffected.
    padded = LoopbackResponse(body=fixture(wire, "text_answer") + b": pad\n\n" * 20_000, chunk_size=4096)
    answer = LoopbackResponse(body=fixture(wire, "text_answer"))
    found, connects = await _connects_for(wire, [padded, answer])
    assert connects == 2
    assert [events[-1] for events in found] == [MessageStop(stop_reason=StopReason.END_TURN)] * 2


async def test_a_broken_stream_is_not_reused(autojump_clock: trio.testing.MockClock) -> None:
    broken = LoopbackResponse(body=b"data: \xff\xfe\n\n" + fixture("anthropic", "text_answer"))
    answer = LoopbackResponse(body=fixture("anthropic", "text_answer"))
    found, connects = await _connects_for("anthropic", [broken, answer])
    assert connects == 2
    assert isinstance(found[0][-1], StreamError) and found[0][-1].code is ProtocolErrorCode.MALFORMED_STREAM
    assert isinstance(found[1][-1], MessageStop)


async def test_scripted_provider_session_uses_one_connection(autojump_clock: trio.testing.MockClock) -> None:
    from trioloop.providers.scripted import ScriptedProvider, ScriptStep

    async with ScriptedProvider([ScriptStep(text="one"), ScriptStep(text="two"), ScriptStep(text="three")]) as chat:
        for _ in range(3):
            send, receive = trio.open_memory_channel[StreamEvent](math.inf)
            await chat.stream(REQUEST, send)
            assert isinstance(receive.receive_nowait(), MessageStart)
        assert (len(chat.server.requests), chat.server.connections) == (3, 1)


@pytest.mark.parametrize("wire", WIRES)
async def test_an_open_provider_holds_one_connection_for_all_its_requests(
    wire: str, autojump_clock: trio.testing.MockClock
) -> None:
    answer = LoopbackResponse(body=fixture(wire, "text_answer"))
    async with open_loopback_server(replay([answer] * 5), keep_alive=True) as server:
        chat = provider(wire, server.url)
        async with chat:
            for _ in range(3):
                assert isinstance((await collect(chat))[-1], MessageStop)
        assert server.connections == 1
        for _ in range(2):  # closed again: each request has its own client and connection
            assert isinstance((await collect(chat))[-1], MessageStop)
        assert (len(server.requests), server.connections) == (5, 3)


@pytest.mark.parametrize("wire", WIRES)
async def test_nested_holds_share_one_client_that_closes_at_the_outermost_exit(
    wire: str, autojump_clock: trio.testing.MockClock
) -> None:
    answer = LoopbackResponse(body=fixture(wire, "text_answer"))
    async with open_loopback_server(replay([answer] * 3), keep_alive=True) as server:
        chat = provider(wire, server.url)
        assert isinstance(chat, HoldsConnections) and chat.hold_connections() is chat
        async with chat:
            client = chat._http.held_client
            assert isinstance((await collect(chat))[-1], MessageStop)
            async with chat.hold_connections():  # a Session's hold inside the app's block
                assert chat._http.held_client is client
                assert isinstance((await collect(chat))[-1], MessageStop)
            assert chat._http.held_client is client and client is not None and not client.is_closed
            assert isinstance((await collect(chat))[-1], MessageStop)
        assert chat._http.held_client is None and client.is_closed
        assert (len(server.requests), server.connections) == (3, 1)


@pytest.mark.parametrize("wire", ["anthropic", "openai"])
async def test_a_compressed_stream_is_decoded_and_a_plain_one_read_raw_gives_the_same_events(wire: str) -> None:
    """A server may gzip its SSE body (Content-Encoding: gzip): it reads as the plain body does, chunk for chunk."""
    import gzip

    plain = fixture(wire, "text_answer")
    packed = gzip.compress(plain)
    compressed = LoopbackResponse(
        headers=(("content-type", "text/event-stream"), ("content-encoding", "gzip")),
        body=packed,
        chunk_size=7,  # the gzip stream cut anywhere, as a real network would
    )
    async with open_loopback_server(replay([LoopbackResponse(body=plain, chunk_size=7), compressed])) as server:
        chat = provider(wire, server.url)
        assert await collect(chat) == await collect(chat)
