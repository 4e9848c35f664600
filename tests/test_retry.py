"""Bounded retry: which failures, how often, how long between attempts, and never after an event."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from trioloop.protocol import (
    Aborted,
    ChatRequest,
    Message,
    MessageStart,
    MessageStop,
    ProtocolErrorCode,
    StopReason,
    StreamError,
    StreamEvent,
    TextDelta,
    is_terminal,
)
from trioloop.providers import AnthropicProvider, OpenAIProvider, RetryPolicy, TransientFailure, is_retriable
from trioloop.providers._loopback import LoopbackResponse, LoopbackServer, open_loopback_server, replay
from trioloop.providers.base import AttemptOutcome, Messages
from trioloop.providers.retry import DEFAULT_RETRY_POLICY, RetryingTransport
from trioloop.providers.transport import HttpChatProvider

FIXTURES = Path(__file__).parent / "fixtures" / "providers"
WIRES = ("anthropic", "openai")
REQUEST = ChatRequest(model="fixture-model-1", messages=(Message.user("hi"),))


def fixture(wire: str, name: str) -> bytes:
    return (FIXTURES / wire / f"{name}.sse").read_bytes()


def provider(wire: str, base_url: str, **options: Any) -> HttpChatProvider:
    if wire == "anthropic":
        return AnthropicProvider("k", base_url=base_url, **options)
    return OpenAIProvider("k", base_url=base_url + "/v1", **options)


async def run(
    wire: str, responses: list[LoopbackResponse], **options: Any
) -> tuple[list[StreamEvent], float, LoopbackServer]:
    send, receive = trio.open_memory_channel[StreamEvent](math.inf)
    async with open_loopback_server(replay(responses)) as server:
        start = trio.current_time()
        await provider(wire, server.url, **options).stream(REQUEST, send)
        elapsed = trio.current_time() - start
    send.close()
    events = [event async for event in receive]
    assert sum(is_terminal(e) for e in events) == 1 and is_terminal(events[-1])
    return events, elapsed, server


def status(code: int, *headers: tuple[str, str]) -> LoopbackResponse:
    return LoopbackResponse(status=code, headers=(("content-type", "text/plain"), *headers), body=b"nope")


def ok(wire: str) -> LoopbackResponse:
    return LoopbackResponse(body=fixture(wire, "text_answer"))


DONE = MessageStop(stop_reason=StopReason.END_TURN)


# --- the policy, as pure arithmetic ------------------------------------------------------------------


def test_default_backoff_sequence() -> None:
    assert [DEFAULT_RETRY_POLICY.backoff(n) for n in range(1, 8)] == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert DEFAULT_RETRY_POLICY.max_attempts == 3


def test_retry_after_lengthens_but_never_shortens_and_is_clamped() -> None:
    policy = DEFAULT_RETRY_POLICY
    assert policy.delay(1, 3.0) == 3.0
    assert policy.delay(2, 0.1) == 1.0
    assert policy.delay(1, 45.0) == 45.0  # a hint may exceed the 10 s backoff cap
    assert policy.delay(1, 10_000.0) == 600.0
    assert policy.delay(1, math.nan) == 0.5


@given(
    attempt=st.integers(-5, 200),
    hint=st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True)),
)
def test_delay_is_bounded_and_at_least_the_backoff(attempt: int, hint: float | None) -> None:
    policy = DEFAULT_RETRY_POLICY
    delay = policy.delay(attempt, hint)
    backoff = policy.backoff(attempt)
    assert 0.5 <= backoff <= 10.0
    assert backoff <= delay <= 600.0
    assert policy.backoff(attempt + 1) >= backoff


@pytest.mark.parametrize(
    "bad",
    [{"max_attempts": 0}, {"max_attempts": True}, {"base_delay": -1.0}, {"max_backoff": math.nan}, {"base_delay": "1"}],
)
def test_policy_rejects_nonsense(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**bad)


def test_classification() -> None:
    def error(code: ProtocolErrorCode, message: str) -> StreamError:
        return StreamError(code=code, message=message)

    assert TransientFailure.classify(error(ProtocolErrorCode.RATE_LIMITED, "x")) is TransientFailure.RATE_LIMITED
    assert TransientFailure.classify(error(ProtocolErrorCode.HTTP_STATUS, Messages.SERVER_ERROR)) is (
        TransientFailure.SERVER_ERROR
    )
    assert TransientFailure.classify(error(ProtocolErrorCode.TRANSPORT, Messages.NETWORK)) is TransientFailure.NETWORK
    for permanent in (
        error(ProtocolErrorCode.TRANSPORT, Messages.TOO_LARGE),
        error(ProtocolErrorCode.HTTP_STATUS, Messages.REQUEST_REJECTED),
        error(ProtocolErrorCode.HTTP_STATUS, Messages.STREAM_PROVIDER_ERROR),
        error(ProtocolErrorCode.MALFORMED_STREAM, Messages.INCOMPLETE_STREAM),
        error(ProtocolErrorCode.NO_API_KEY, Messages.NO_API_KEY),
        error(ProtocolErrorCode.UNSUPPORTED_CAPABILITY, "x"),
        error(ProtocolErrorCode.CONTEXT_OVERFLOW, "x"),
        StreamError(code=ProtocolErrorCode.MALFORMED_STREAM, message="x", terminal=False),
    ):
        assert not is_retriable(permanent), permanent


# --- the retrying transport with a stub inner transport ---------------------------------------------


@attrs.define
class StubTransport:
    outcomes: list[AttemptOutcome]
    calls: list[float] = attrs.field(factory=list)

    async def attempt(self, request: ChatRequest, send: trio.abc.SendChannel[StreamEvent]) -> AttemptOutcome:
        self.calls.append(trio.current_time())
        await trio.lowlevel.checkpoint()
        return self.outcomes.pop(0)


RATE = StreamError(code=ProtocolErrorCode.RATE_LIMITED, message=Messages.RATE_LIMITED)
NETWORK = StreamError(code=ProtocolErrorCode.TRANSPORT, message=Messages.NETWORK)


async def test_committed_failure_is_returned_at_once(autojump_clock: trio.testing.MockClock) -> None:
    stub = StubTransport([AttemptOutcome(failure=RATE, committed=True)])
    send, _ = trio.open_memory_channel[StreamEvent](1)
    outcome = await RetryingTransport(stub).attempt(REQUEST, send)
    assert outcome.failure == RATE and len(stub.calls) == 1


async def test_attempts_are_spaced_by_the_policy(autojump_clock: trio.testing.MockClock) -> None:
    stub = StubTransport(
        [
            AttemptOutcome(failure=NETWORK),
            AttemptOutcome(failure=RATE, retry_after=7.0),
            AttemptOutcome(failure=NETWORK),
        ]
    )
    send, _ = trio.open_memory_channel[StreamEvent](1)
    outcome = await RetryingTransport(stub).attempt(REQUEST, send)
    assert outcome.failure == NETWORK
    start = stub.calls[0]
    assert [t - start for t in stub.calls] == [0.0, 0.5, 7.5]


# --- end to end over the loopback server -------------------------------------------------------------


@pytest.mark.parametrize("wire", WIRES)
async def test_transient_failures_before_the_first_event_are_retried(
    wire: str, autojump_clock: trio.testing.MockClock
) -> None:
    events, elapsed, server = await run(wire, [status(503), status(500), ok(wire)])
    assert events[-1] == DONE and events[0] == MessageStart(model="fixture-model-1")
    assert len(server.requests) == 3
    assert elapsed == pytest.approx(1.5)  # 0.5 s then 1.0 s, no jitter


@pytest.mark.parametrize("wire", WIRES)
async def test_the_attempt_bound_holds(wire: str, autojump_clock: trio.testing.MockClock) -> None:
    events, elapsed, server = await run(wire, [status(503)] * 5)
    [error] = events
    assert isinstance(error, StreamError) and error.message == Messages.SERVER_ERROR
    assert len(server.requests) == 3
    assert elapsed == pytest.approx(1.5)


@pytest.mark.parametrize(("hint", "waited"), [("3", 3.0), ("0", 0.5), ("100000", 600.0)])
async def test_429_retry_after_is_honored_within_bounds(
    hint: str, waited: float, autojump_clock: trio.testing.MockClock
) -> None:
    events, elapsed, server = await run("anthropic", [status(429, ("retry-after", hint)), ok("anthropic")])
    assert events[-1] == DONE
    assert len(server.requests) == 2
    assert elapsed == pytest.approx(waited)


@pytest.mark.parametrize("code", [400, 401, 403, 404, 422])
async def test_permanent_4xx_is_not_retried(code: int, autojump_clock: trio.testing.MockClock) -> None:
    events, elapsed, server = await run("openai", [status(code), ok("openai")])
    [error] = events
    assert isinstance(error, StreamError) and error.code is ProtocolErrorCode.HTTP_STATUS
    assert len(server.requests) == 1 and elapsed == 0


@pytest.mark.parametrize("wire", WIRES)
async def test_failure_after_the_first_text_delta_is_surfaced_not_retried(
    wire: str, autojump_clock: trio.testing.MockClock
) -> None:
    raw = fixture(wire, "text_answer")
    cut = raw.index(b"\n\n", raw.index(b"Hello! ")) + 2
    events, _, server = await run(wire, [LoopbackResponse(body=raw, disconnect_after_bytes=cut), ok(wire)])
    assert events[:2] == [MessageStart(model="fixture-model-1"), TextDelta(text="Hello! ")]
    error = events[-1]
    assert isinstance(error, StreamError) and error.message == Messages.NETWORK
    assert is_retriable(error)  # the runner may retry the turn; the transport must not replay the stream
    assert len(server.requests) == 1


@pytest.mark.parametrize("wire", WIRES)
async def test_network_failure_before_the_first_byte_is_retried(
    wire: str, autojump_clock: trio.testing.MockClock
) -> None:
    broken = LoopbackResponse(body=fixture(wire, "text_answer"), disconnect_after_bytes=0)
    events, elapsed, server = await run(wire, [broken, ok(wire)])
    assert events[-1] == DONE and len(server.requests) == 2 and elapsed == pytest.approx(0.5)


async def test_in_stream_rate_limit_before_any_event_is_retried(autojump_clock: trio.testing.MockClock) -> None:
    error = b'event: error\ndata: {"type":"error","error":{"type":"rate_limit_error","message":"slow"}}\n\n'
    events, _, server = await run("anthropic", [LoopbackResponse(body=error), ok("anthropic")])
    assert events[-1] == DONE and len(server.requests) == 2


async def test_in_stream_rate_limit_after_an_event_is_surfaced(autojump_clock: trio.testing.MockClock) -> None:
    events, _, server = await run("openai", [LoopbackResponse(body=fixture("openai", "rate_limit_in_stream"))] * 2)
    assert isinstance(events[-1], StreamError) and events[-1].code is ProtocolErrorCode.RATE_LIMITED
    assert len(server.requests) == 1


async def test_gap_timeout_before_any_event_is_retried(autojump_clock: trio.testing.MockClock) -> None:
    stalled = LoopbackResponse(body=fixture("anthropic", "text_answer"), stall_after_bytes=0)
    events, elapsed, server = await run("anthropic", [stalled, ok("anthropic")], read_timeout=20.0)
    assert events[-1] == DONE and len(server.requests) == 2
    assert elapsed == pytest.approx(20.5)


async def test_retry_none_makes_one_attempt(autojump_clock: trio.testing.MockClock) -> None:
    events, _, server = await run("anthropic", [status(503), ok("anthropic")], retry=None)
    assert isinstance(events[-1], StreamError) and len(server.requests) == 1


async def test_cancelling_during_backoff_aborts_without_another_request(
    autojump_clock: trio.testing.MockClock,
) -> None:
    send, receive = trio.open_memory_channel[StreamEvent](math.inf)
    scope = trio.CancelScope()
    responses = [status(429, ("retry-after", "60")), ok("anthropic")]
    async with open_loopback_server(replay(responses)) as server, trio.open_nursery() as nursery:
        nursery.start_soon(lambda: provider("anthropic", server.url).stream(REQUEST, send, cancel_scope=scope))
        await trio.sleep(30)
        scope.cancel()
    send.close()
    assert [event async for event in receive] == [Aborted()]
    assert len(server.requests) == 1
