"""Faults injected through the loopback server, read by the real Anthropic and OpenAI providers.

Every fault (a disconnect at a byte offset, a stall past the gap timeout, status storms, a 1-byte
trickle, oversize bodies, redirects, invalid UTF-8, repeated call ids, a stream with no terminal
event) must end in exactly one typed outcome: retried then ok, ``failed`` with the right code, or
``cancelled``/``bounded`` -- never a short success and never an exception. The oracle for what a
byte prefix may produce is the sans-IO mapping of those same bytes. The API key is a canary that the
fake server echoes into every error it can; it must never show up in events, states, messages,
transcripts, reprs or log records.
"""

from __future__ import annotations

import json
import logging
import math
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, TypeVar, cast

import httpx
import pytest
import trio
import trio.testing
from torture_support import FIXTURES, evenly, payment, record, scaled

from trioloop.machine.authorization import Violation
from trioloop.machine.limits import TurnLimits
from trioloop.machine.reducer import CallStatus, Outcome, Phase, TurnState
from trioloop.machine.tools import ToolRegistry
from trioloop.protocol import (
    ChatRequest,
    Message,
    MessageStop,
    ProtocolErrorCode,
    StreamError,
    StreamEvent,
    TextDelta,
    ToolCallBlock,
    assert_tool_pairing,
    event_to_json,
    flatten_text,
    is_terminal,
)
from trioloop.protocol.errors import ProtocolError
from trioloop.protocol.events import StopReason, Usage
from trioloop.providers import AnthropicProvider, OpenAIProvider
from trioloop.providers._loopback import LoopbackRequest, LoopbackResponse, open_loopback_server
from trioloop.providers.anthropic import ANTHROPIC_WIRE
from trioloop.providers.base import Messages, WireFormat, WireResponse, is_retriable, map_chunks
from trioloop.providers.openai import OPENAI_WIRE
from trioloop.providers.retry import RetryPolicy
from trioloop.providers.sse import INVALID_UTF8_MESSAGE, LINE_TOO_LONG_MESSAGE, SseDecoder
from trioloop.providers.transport import HttpChatProvider
from trioloop.runtime.controls import TurnControls
from trioloop.runtime.runner import TurnRequest, Workspace, run_turn
from trioloop.threatmodel import THREAT_MODEL, create_ai_tool_registry, threat_model_session

T = TypeVar("T")

SECRET = "5f3a9c1e7d2b8a4f6e0c3d9b"
KEY = f"sk-canary-{SECRET}"
WIRES = ("anthropic", "openai")
WIRE: dict[str, WireFormat] = {"anthropic": ANTHROPIC_WIRE, "openai": OPENAI_WIRE}
MODEL = {"anthropic": "claude-sonnet-4-5", "openai": "gpt-4.1"}
NAMES = sorted(p.stem for p in (FIXTURES / "anthropic").glob("*.sse"))
REQUEST = ChatRequest(model="fixture-model-1", messages=(Message.user("hi"),))
#: Two attempts, no wait: enough to see whether a failure is retried, cheap enough to do thousands.
QUICK_RETRY = RetryPolicy(max_attempts=2, base_delay=0.0, max_backoff=0.0)


def fixture(wire: str, name: str) -> bytes:
    return (FIXTURES / wire / f"{name}.sse").read_bytes()


def scrub(text: str) -> str:
    return text.replace(KEY, "[redacted-key]")


def oracle(wire: str, body: bytes) -> list[StreamEvent]:
    """What the sans-IO decoder and mapper make of exactly these bytes, ending with the body's end."""
    return map_chunks(WIRE[wire].new_mapper(scrub=scrub), [body])


def cut_oracle(wire: str, body: bytes) -> list[StreamEvent]:
    """What the mapper makes of these bytes when the connection breaks right after them.

    No end of body is seen, so a finish reason without its terminal event does not complete the
    stream (only a clean end of body does): the stream ran out.
    """
    decoder, mapper = SseDecoder(), WIRE[wire].new_mapper(scrub=scrub)
    out: list[StreamEvent] = []
    try:
        for frame in decoder.feed(body):
            for event in mapper.feed(frame):
                out.append(event)
                if is_terminal(event):
                    return out
    except ProtocolError as exc:
        return [*out, StreamError(code=exc.code, message=exc.message)]
    return [*out, StreamError(code=ProtocolErrorCode.MALFORMED_STREAM, message=Messages.INCOMPLETE_STREAM)]


def ran_out(event: StreamEvent) -> bool:
    """The mapper's own verdict on a body that ended before a terminal event."""
    return isinstance(event, StreamError) and event.terminal and event.message == Messages.INCOMPLETE_STREAM


def assert_no_canary(*things: object) -> None:
    for thing in things:
        text = thing if isinstance(thing, str) else repr(thing)
        assert KEY not in text and SECRET not in text and SECRET[:12] not in text, text[:300]


@pytest.fixture(autouse=True)
def no_canary_in_logs(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Every log record of every test here, at DEBUG and from every library, is free of the key."""
    caplog.set_level(logging.DEBUG)
    yield
    assert_no_canary(caplog.text, *(r.getMessage() for r in caplog.records))


class Router:
    """A loopback handler: ``/r/<n>/...`` gets the responses registered under n, in order (the last repeats)."""

    def __init__(self) -> None:
        self.routes: list[list[LoopbackResponse]] = []
        self.hits: Counter[int] = Counter()

    def add(self, *responses: LoopbackResponse) -> int:
        self.routes.append(list(responses))
        return len(self.routes) - 1

    def __call__(self, request: LoopbackRequest) -> LoopbackResponse:
        assert KEY.encode() not in request.body and KEY not in request.target
        route = int(request.target.split("/")[2])
        self.hits[route] += 1
        queue = self.routes[route]
        return queue.pop(0) if len(queue) > 1 else queue[0]


def chat(wire: str, url: str, route: int, client: httpx.AsyncClient | None, **options: Any) -> HttpChatProvider:
    options.setdefault("retry", QUICK_RETRY)
    base = f"{url}/r/{route}" + ("/v1" if wire == "openai" else "")
    cls = AnthropicProvider if wire == "anthropic" else OpenAIProvider
    return cls(KEY, base_url=base, client=client, **options)


async def collect(provider: HttpChatProvider, request: ChatRequest = REQUEST) -> list[StreamEvent]:
    """The provider's events for one request: exactly one terminal event, last, and no canary."""
    send, receive = trio.open_memory_channel[StreamEvent](math.inf)
    await provider.stream(request, send)
    send.close()
    async with receive:
        events = [event async for event in receive]
    assert sum(is_terminal(e) for e in events) == 1 and is_terminal(events[-1]), events
    assert_no_canary(events, [event_to_json(e) for e in events], provider)
    return events


def fetch(
    wire: str, url: str, route: int, http: httpx.AsyncClient, **options: Any
) -> Callable[[], Awaitable[list[StreamEvent]]]:
    """A job for `gather`: one provider request against ``route``."""
    return lambda: collect(chat(wire, url, route, http, **options))


async def gather(jobs: Sequence[Callable[[], Awaitable[T]]], limit: int = 8) -> list[T]:
    results: list[Any] = [None] * len(jobs)
    limiter = trio.CapacityLimiter(limit)

    async def one(index: int, job: Callable[[], Awaitable[T]]) -> None:
        async with limiter:
            results[index] = await job()

    async with trio.open_nursery() as nursery:
        for index, job in enumerate(jobs):
            nursery.start_soon(one, index, job)
    return results


def client() -> httpx.AsyncClient:
    return httpx.AsyncClient(trust_env=False, timeout=httpx.Timeout(30.0, read=None))


def offsets(raw: bytes, budget: int) -> list[int]:
    """Byte offsets to cut ``raw`` at: evenly spread, plus the frame boundaries and their neighbours."""
    ends = [i + 2 for i in range(len(raw)) if raw[i : i + 2] == b"\n\n"]
    near = sorted({n + d for n in ends for d in (-1, 0, 1) if 0 <= n + d <= len(raw)})
    spread = evenly(len(raw) + 1, budget)
    return sorted(set(spread) | {near[i] for i in evenly(len(near), budget)})


def expect_cut(wire: str, raw: bytes, n: int, events: list[StreamEvent], failure: str) -> int:
    """Check the events of a body cut at ``n`` against the sans-IO oracle; return the expected attempts.

    Either the terminal event arrived before the cut (then everything is exactly what the bytes say),
    or everything before the failure is, and the failure is the typed transport error ``failure``.
    """
    expected = cut_oracle(wire, raw[:n])
    if not ran_out(expected[-1]):
        assert events == expected
        # An error before any event (an overload in the stream) is retried, like a 5xx.
        return 2 if len(expected) == 1 and is_retriable(cast(StreamError, expected[0])) else 1
    assert events[:-1] == expected[:-1]
    last = events[-1]
    assert isinstance(last, StreamError) and last.terminal
    assert (last.code, last.message) == (ProtocolErrorCode.TRANSPORT, failure)
    assert not isinstance(last, MessageStop)
    return 1 if expected[:-1] else 2  # only a failure before the first event is retried


# --- the sans-IO oracle itself: a body cut anywhere is never a short success -----------------------


@pytest.mark.parametrize("wire", WIRES)
def test_a_body_cut_at_any_offset_is_never_a_short_success(wire: str) -> None:
    tried = 0
    for name in NAMES:
        raw = fixture(wire, name)
        full = oracle(wire, raw)
        for n in range(len(raw) + 1):
            events = oracle(wire, raw[:n])
            tried += 1
            assert sum(is_terminal(e) for e in events) == 1 and is_terminal(events[-1])
            assert events[:-1] == full[: len(events) - 1]
            if isinstance(events[-1], MessageStop) and events != full:
                # End of body after the finish reason completes the stream (servers that send no [DONE] or
                # message_stop): the same text, calls and stop reason; only a later usage report may be missing.
                assert [e for e in events if not isinstance(e, Usage)] == [e for e in full if not isinstance(e, Usage)]
            elif not ran_out(events[-1]):
                assert events == full  # any other terminal event only ever comes from the whole stream
    record(f"truncation at every byte offset, sans-IO ({wire})", tried=tried, held=tried)


# --- over the socket ---------------------------------------------------------------------------------


@pytest.mark.parametrize("wire", WIRES)
async def test_disconnect_at_byte_offsets(wire: str) -> None:
    router = Router()
    cases = []
    for name in NAMES:
        raw = fixture(wire, name)
        for n in offsets(raw, scaled(6)):
            cases.append((raw, n, router.add(LoopbackResponse(body=raw, disconnect_after_bytes=n))))
    async with client() as http, open_loopback_server(router) as server:
        results = await gather([fetch(wire, server.url, route, http) for _, _, route in cases])
    for (raw, n, route), events in zip(cases, results, strict=True):
        assert router.hits[route] == expect_cut(wire, raw, n, events, Messages.NETWORK)
    record(f"disconnect at byte offset ({wire})", tried=len(cases), held=len(cases), note=f"{len(NAMES)} fixtures")


@pytest.mark.parametrize("wire", WIRES)
async def test_stall_longer_than_the_gap_timeout(wire: str, mock_clock: trio.testing.MockClock) -> None:
    # Jump only after 10 ms of real idleness, so bytes still in the loopback socket are never mistaken
    # for a stall.
    mock_clock.autojump_threshold = 0.01
    router = Router()
    cases = []
    for name in NAMES:
        raw = fixture(wire, name)
        for n in offsets(raw, scaled(2)):
            cases.append((raw, n, router.add(LoopbackResponse(body=raw, stall_after_bytes=n))))
    async with client() as http, open_loopback_server(router) as server:
        results = await gather(
            [fetch(wire, server.url, route, http, read_timeout=5.0) for _, _, route in cases],
            limit=32,
        )
    for (raw, n, route), events in zip(cases, results, strict=True):
        assert router.hits[route] == expect_cut(wire, raw, n, events, Messages.READ_TIMEOUT)
    record(f"stall past the gap timeout ({wire})", tried=len(cases), held=len(cases))


@pytest.mark.parametrize("wire", WIRES)
async def test_one_byte_per_read(wire: str, autojump_clock: trio.testing.MockClock) -> None:
    # The server sleeps between 1-byte chunks; the autojump lands on its wake-up, never on the gap
    # timeout, because the wake-up always comes first.
    names = NAMES if scaled(1) >= 10 else ["keepalive_crlf", "parallel_tools", "text_answer"]
    router = Router()
    cases = [
        (name, router.add(LoopbackResponse(body=fixture(wire, name), chunk_size=1, delay_between_chunks=0.001)))
        for name in names
    ]
    async with client() as http, open_loopback_server(router) as server:
        results = await gather([fetch(wire, server.url, route, http) for _, route in cases])
    for (name, route), events in zip(cases, results, strict=True):
        assert events == oracle(wire, fixture(wire, name))
        assert router.hits[route] == 1
    record(f"1-byte trickle ({wire})", tried=len(cases), held=len(cases))


@pytest.mark.parametrize("wire", WIRES)
async def test_oversize_bodies(wire: str) -> None:
    raw = fixture(wire, "parallel_tools")
    full = oracle(wire, raw)
    first_frame = raw[: raw.index(b"\n\n") + 2]
    giant_error = json.dumps({"error": {"type": "overloaded", "message": f"{KEY} " * 200_000}}).encode()
    giant_in_stream = WIRE[wire].render_stream(
        WireResponse(model="m", text="hi", error_type="overloaded_error", error_message=f"{KEY} " * 10_000)
    )
    router = Router()
    capped = router.add(LoopbackResponse(body=raw, chunk_size=64))
    long_line = router.add(LoopbackResponse(body=first_frame + b"data: " + b"x" * (1024 * 1024 + 16), chunk_size=65536))
    error_body = router.add(
        LoopbackResponse(status=500, headers=(("content-type", "application/json"),), body=giant_error)
    )
    in_stream = router.add(LoopbackResponse(body=giant_in_stream))
    async with client() as http, open_loopback_server(router) as server:
        too_large = await collect(chat(wire, server.url, capped, http, max_response_bytes=len(raw) // 2))
        line = await collect(chat(wire, server.url, long_line, http))
        five_hundred = await collect(chat(wire, server.url, error_body, http))
        provider_error = await collect(chat(wire, server.url, in_stream, http))

    assert too_large[:-1] == full[: len(too_large) - 1]
    assert too_large[-1] == StreamError(
        code=ProtocolErrorCode.TRANSPORT, message=Messages.TOO_LARGE, provider_detail="response_too_large"
    )
    assert line[:-1] == oracle(wire, first_frame)[:-1]
    assert isinstance(line[-1], StreamError) and line[-1].code is ProtocolErrorCode.MALFORMED_STREAM
    assert line[-1].message == LINE_TOO_LONG_MESSAGE
    [error] = five_hundred
    assert isinstance(error, StreamError) and error.message == Messages.SERVER_ERROR
    assert error.provider_detail is not None and len(error.provider_detail) <= 200
    assert router.hits[error_body] == 2  # a 5xx before the first event is retried, then reported
    last = provider_error[-1]
    assert isinstance(last, StreamError) and last.message == Messages.STREAM_PROVIDER_ERROR
    assert last.provider_detail is not None and len(last.provider_detail) <= 200
    assert [router.hits[r] for r in (capped, long_line, in_stream)] == [1, 1, 1]
    record(
        f"oversize bodies ({wire})",
        tried=4,
        held=4,
        note="response cap, 1 MiB line, 7 MB error body, 350 kB in-stream error",
    )


@pytest.mark.parametrize("wire", WIRES)
async def test_redirects_are_refused_never_followed(wire: str) -> None:
    router = Router()
    target = router.add(LoopbackResponse(body=fixture(wire, "text_answer")))
    statuses = (301, 302, 303, 307, 308)
    routes = [
        router.add(LoopbackResponse(status=s, headers=(("location", f"/r/{target}/v1/messages"),), body=b""))
        for s in statuses
    ]
    async with client() as http, open_loopback_server(router) as server:
        results = [await collect(chat(wire, server.url, r, http)) for r in routes]
        # The provider's own client (none passed in) refuses redirects too.
        own = await collect(chat(wire, server.url, routes[0], None))
    for status, route, events in zip(statuses, routes, results, strict=True):
        assert events == [
            StreamError(
                code=ProtocolErrorCode.HTTP_STATUS, message=Messages.REDIRECT_REFUSED, provider_detail=f"HTTP {status}"
            )
        ]
        assert router.hits[route] >= 1
    assert own == results[0]
    assert router.hits[target] == 0
    record(f"redirects ({wire})", tried=len(statuses) + 1, held=len(statuses) + 1)


BAD_UTF8 = (b"\xff", b"\xc3", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe2\x82")


@pytest.mark.parametrize("wire", WIRES)
async def test_invalid_utf8_anywhere(wire: str) -> None:
    router = Router()
    cases = []
    tried = 0
    for name in NAMES:
        raw = fixture(wire, name)
        full = oracle(wire, raw)
        for position in evenly(len(raw), scaled(12)):
            for bad in BAD_UTF8:
                body = raw[:position] + bad + raw[position:]
                expected = oracle(wire, body)
                tried += 1
                last = expected[-1]
                if isinstance(last, MessageStop):
                    assert expected == full  # the bad bytes came after the terminal event
                elif last != full[-1]:
                    assert isinstance(last, StreamError) and last.terminal
                    assert last.code is ProtocolErrorCode.MALFORMED_STREAM
                if tried % 7 == 0:  # one in seven also goes over the socket
                    cases.append((body, expected, router.add(LoopbackResponse(body=body, chunk_size=300))))
    async with client() as http, open_loopback_server(router) as server:
        results = await gather([fetch(wire, server.url, route, http) for _, _, route in cases])
    for (_, expected, route), events in zip(cases, results, strict=True):
        assert events == expected
        assert router.hits[route] == 1
    assert any(isinstance(e[-1], StreamError) and e[-1].message == INVALID_UTF8_MESSAGE for _, e, _ in cases)
    record(
        f"invalid UTF-8 inserted ({wire})",
        tried=tried + len(cases),
        held=tried + len(cases),
        note=f"{tried} sans-IO, {len(cases)} over the socket",
    )


# --- through run_turn ------------------------------------------------------------------------------


def ok(wire: str, text: str = "All good.", calls: tuple[ToolCallBlock, ...] = ()) -> LoopbackResponse:
    reason = StopReason.TOOL_USE if calls else StopReason.END_TURN
    body = WIRE[wire].render_stream(WireResponse(model=MODEL[wire], text=text, tool_calls=calls, stop_reason=reason))
    return LoopbackResponse(body=body)


def failing(wire: str, status: int, retry_after: str | None = "1") -> LoopbackResponse:
    headers = [("content-type", "application/json")]
    if retry_after is not None:
        headers.append(("retry-after", retry_after))
    body = WIRE[wire].render_error_body(status, f"busy; the key {KEY} is throttled")
    return LoopbackResponse(status=status, headers=tuple(headers), body=body)


async def turn(
    wire: str,
    responses: Sequence[LoopbackResponse],
    *,
    tools: bool = False,
    on_state: Callable[[TurnState, TurnControls], None] | None = None,
    read_timeout: float = 300.0,
    **limits: Any,
) -> tuple[TurnState, int, Workspace]:
    """One turn over a real provider against ``responses``; returns the final state and request count."""
    router = Router()
    route = router.add(*responses)
    workspace = Workspace(document=payment(), kind=THREAT_MODEL)
    controls = TurnControls()
    states: list[TurnState] = []

    def observe(state: TurnState) -> None:
        states.append(state)
        if on_state is not None:
            on_state(state, controls)

    request = TurnRequest(
        text="Check the payment flows.",
        turn_id="turn-1",
        model=MODEL[wire],
        registry=create_ai_tool_registry() if tools else ToolRegistry(()),
        limits=TurnLimits(**limits),
    )
    async with client() as http, open_loopback_server(router) as server:
        provider = chat(wire, server.url, route, http, retry=RetryPolicy(), read_timeout=read_timeout)
        final = await run_turn(request, workspace, provider, controls=controls, on_state=observe)
    assert final.is_settled and final.outcome is not None
    assert assert_tool_pairing(final.messages) == ()
    assert_no_canary(final, final.messages, states[-1], [s.error for s in states])
    return final, router.hits[route], workspace


STORM_SIZES = (1, 2, 3, 4, 5, 12)


@pytest.mark.parametrize("wire", WIRES)
async def test_status_storms_end_retried_or_failed(wire: str, autojump_clock: trio.testing.MockClock) -> None:
    sizes = STORM_SIZES if scaled(1) < 10 else tuple(range(16))
    statuses = (429, 500, 503)
    tried = 0
    for status in statuses:
        for size in sizes:
            final, requests, _ = await turn(wire, [failing(wire, status)] * size + [ok(wire)])
            tried += 1
            # One attempt per request and three turn-level retries: at most four requests in all.
            if size <= 3:
                assert final.outcome is Outcome.COMPLETED, (status, size, final.error)
                assert requests == size + 1
                assert final.budget.retries_used == size
                assert "All good." in str(final.messages[-1])
            else:
                assert final.outcome is Outcome.FAILED and final.error is not None
                code = ProtocolErrorCode.RATE_LIMITED if status == 429 else ProtocolErrorCode.HTTP_STATUS
                assert final.error.code is code
                assert requests == 4 and final.budget.retries_used == 3
    # A mixed storm, and a retry-after so long that waiting would outlast the turn: it fails at once.
    mixed = [failing(wire, s) for s in (429, 503, 500)] + [ok(wire)]
    final, requests, _ = await turn(wire, mixed)
    assert final.outcome is Outcome.COMPLETED and requests == 4
    final, requests, _ = await turn(wire, [failing(wire, 429, retry_after="100000")] * 3 + [ok(wire)])
    assert final.outcome is Outcome.FAILED and final.error is not None and requests == 1
    assert final.error.code is ProtocolErrorCode.RATE_LIMITED
    final, requests, _ = await turn(wire, [failing(wire, 503, retry_after="Wed, 21 Oct 2015 07:28:00 GMT"), ok(wire)])
    assert final.outcome is Outcome.COMPLETED and requests == 2
    tried += 3
    record(f"429/500/503 storms through the turn ({wire})", tried=tried, held=tried, note=f"storm sizes {sizes}")


ANSWER = "A complete answer that the first attempt never finished."


@pytest.mark.parametrize("fault", ["disconnect", "stall"])
@pytest.mark.parametrize("wire", WIRES)
async def test_a_broken_answer_through_the_turn(wire: str, fault: str, mock_clock: trio.testing.MockClock) -> None:
    mock_clock.autojump_threshold = 0.01  # a stall is a jump; bytes still in flight never are
    good = ok(wire, ANSWER)
    raw = good.body
    tried = 0
    for n in evenly(len(raw), scaled(10)):
        if fault == "disconnect":
            broken = LoopbackResponse(body=raw, disconnect_after_bytes=n, chunk_size=32)
            failure = Messages.NETWORK
        else:
            broken = LoopbackResponse(body=raw, stall_after_bytes=n, chunk_size=32)
            failure = Messages.READ_TIMEOUT
        final, requests, _ = await turn(wire, [broken, good], read_timeout=5.0)
        tried += 1
        if oracle(wire, raw[:n])[:-1]:
            # Events reached the turn: never retried, a typed transport failure, the partial text kept.
            assert final.outcome is Outcome.FAILED and requests == 1
            assert final.error is not None and final.error.code is ProtocolErrorCode.TRANSPORT
            assert final.error.message == failure
        else:
            assert final.outcome is Outcome.COMPLETED and requests == 2  # retried, then ok
            assert flatten_text(final.messages[-1]) == ANSWER
    record(f"{fault} mid-answer through the turn ({wire})", tried=tried, held=tried)


@pytest.mark.parametrize("wire", WIRES)
async def test_stream_without_a_terminal_event(wire: str, autojump_clock: trio.testing.MockClock) -> None:
    final, requests, _ = await turn(wire, [LoopbackResponse(body=fixture(wire, "truncated"))])
    assert final.outcome is Outcome.FAILED and requests == 1
    assert final.error is not None and final.error.code is ProtocolErrorCode.MALFORMED_STREAM
    assert final.messages[-1].role == "assistant"  # the partial text is kept, and marked failed
    # Nothing at all, or only keep-alives: never a silent success, never an endless re-request. A body
    # whose frames produce no event is retried as a whole (within the turn's budget); one that
    # started a message is not.
    for body in (b"", b": keep-alive\n\n" * 20, b'event: ping\ndata: {"type": "ping"}\n\n'):
        final, requests, _ = await turn(wire, [LoopbackResponse(body=body)], max_retries_per_turn=2)
        assert final.outcome is Outcome.FAILED and final.error is not None
        assert final.error.code is ProtocolErrorCode.MALFORMED_STREAM
        retried = not oracle(wire, body)[:-1]
        assert (final.budget.retries_used, requests) == ((2, 3) if retried else (0, 1))
    record(f"stream that never sends its stop ({wire})", tried=4, held=4)


@pytest.mark.parametrize("wire", WIRES)
async def test_stop_during_a_stalled_stream_is_cancelled(wire: str, autojump_clock: trio.testing.MockClock) -> None:
    raw = ok(wire, "Partial text before the provider goes quiet.").body
    stalled = LoopbackResponse(body=raw, stall_after_bytes=raw.index(b"\n\n", raw.index(b"Partial")) + 2)

    def stop_on_text(state: TurnState, controls: TurnControls) -> None:
        if state.streaming_text:
            controls.stop()

    final, requests, workspace = await turn(wire, [stalled], on_state=stop_on_text)
    assert final.outcome is Outcome.CANCELLED and requests == 1
    assert workspace.document is payment()
    final, _, _ = await turn(wire, [stalled], turn_deadline_ms=20_000)
    assert final.outcome is Outcome.BOUNDED
    record(f"stop / deadline during a stalled stream ({wire})", tried=2, held=2)


def call(cid: str, name: str, **arguments: Any) -> ToolCallBlock:
    return ToolCallBlock(id=cid, name=name, input=arguments)


def approve_everything(state: TurnState, controls: TurnControls) -> None:
    if state.phase is Phase.AWAITING_APPROVAL:
        for c in state.current_calls:
            if c.status is CallStatus.PENDING:
                controls.approve(c.id)


@pytest.mark.parametrize("wire", WIRES)
async def test_a_provider_repeating_a_call_id(wire: str, autojump_clock: trio.testing.MockClock) -> None:
    threat = {"title": "Replay", "category": "Spoofing", "severity": "high", "element": "psp"}
    first = ok(
        wire, "Two calls, one id.", (call("dup", "add_threat", threat=threat), call("dup", "get_document_summary"))
    )
    other = {**threat, "title": "Replay again"}
    again = ok(wire, "Same id next iteration.", (call("dup", "add_threat", threat=other),))
    final, requests, workspace = await turn(
        wire, [first, again, ok(wire, "Done.")], tools=True, on_state=approve_everything
    )
    # Within one message the repeat is answered and not run; in the next iteration the same id is a new
    # call under a fresh id, with its own card and grant: it runs once, after its own approval.
    assert final.outcome is Outcome.COMPLETED and requests == 3
    ids = [c.id for c in final.calls]
    assert ids[0] == "dup" and len(set(ids)) == 3
    assert [c.status for c in final.calls] == [CallStatus.SUCCEEDED, CallStatus.FAILED, CallStatus.SUCCEEDED]
    assert [v.violation for v in final.violations] == [Violation.DUPLICATE_CALL_ID]
    assert len(workspace.document.threats) == len(payment().threats) + 2  # each approved call ran once
    blocks = [b for m in final.messages for b in m.content if isinstance(b, ToolCallBlock)]
    assert [b.id for b in blocks] == ids and assert_tool_pairing(final.messages) == ()

    # Across turns: a call id from the conversation so far is renamed in the next turn and gets a card.
    router = Router()
    route = router.add(
        ok(wire, "Reading.", (call("c1", "get_document_summary"),)),
        ok(wire, "Read."),
        ok(wire, "Again.", (call("c1", "add_threat", threat=threat),)),
        ok(wire, "Done."),
    )
    async with (
        open_loopback_server(router) as server,
        threat_model_session(
            document=payment(), provider=chat(wire, server.url, route, None), model=MODEL[wire]
        ) as session,
    ):
        await session.send("first")

        async def reviewer() -> None:
            async for state in session.states():
                if state.phase is Phase.AWAITING_APPROVAL:
                    for pending in state.current_calls:
                        if pending.status is CallStatus.PENDING:
                            session.approve(pending.id)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(reviewer)
            second = await session.send("second")
            nursery.cancel_scope.cancel()
    assert second.outcome is Outcome.COMPLETED and second.violations == ()
    (renamed,) = second.calls
    assert renamed.id != "c1" and renamed.status is CallStatus.SUCCEEDED
    assert len(session.document.threats) == len(payment().threats) + 1
    assert assert_tool_pairing(second.messages) == ()
    assert_no_canary(session.transcript(), json.dumps(session.transcript()))
    record(f"repeated call ids, within and across turns ({wire})", tried=3, held=3)


@pytest.mark.parametrize("wire", WIRES)
async def test_a_provider_echoing_the_key_into_model_output(wire: str, autojump_clock: trio.testing.MockClock) -> None:
    # Split across deltas of every size, in text, call ids, names, arguments and the model name.
    tried = 0
    for piece in (1, 3, 7, 16, 64):
        echoed = WIRE[wire].render_stream(
            WireResponse(
                model=KEY,
                text=f"Your key is {KEY}, again {KEY}{KEY}.",
                tool_calls=(call(KEY, f"get_{KEY}", key=KEY, **{KEY: [KEY]}),),
                text_piece=piece,
                arguments_piece=piece,
            )
        )
        router = Router()
        route = router.add(LoopbackResponse(body=echoed))
        async with open_loopback_server(router) as server:
            events = await collect(chat(wire, server.url, route, None))  # asserts no canary
        text = "".join(e.text for e in events if isinstance(e, TextDelta))
        assert text.count("[redacted-key]") == 3
        tried += 1
    final, _, _ = await turn(
        wire, [ok(wire, f"The key: {KEY}", (call(KEY, "get_document_summary", k=KEY),)), ok(wire)], tools=True
    )
    assert final.outcome is Outcome.COMPLETED  # turn() asserts no canary in the state and messages
    record(f"key echoed into model text and call fields ({wire})", tried=tried + 1, held=tried + 1)
