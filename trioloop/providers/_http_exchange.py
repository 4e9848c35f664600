"""One HTTP request and its response: send the body, read the SSE stream, forward its events to the consumer.

Decides how a body is read (a per-read gap deadline, a total-bytes cap, the tail read so the connection goes
back to the pool), which events go on and in what batches (key-scrubbed, none after a terminal one), and
which typed failure an HTTP status, a broken stream or a network error becomes.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from functools import partial
from typing import Final, cast, final

import httpx
import trio

from trioloop.protocol.errors import ProtocolError, ProtocolErrorCode
from trioloop.protocol.events import StreamError, StreamEvent, TextDelta, is_terminal, terminal_cut
from trioloop.protocol.provider import send_events
from trioloop.providers._http_clients import _CLOSE_GRACE
from trioloop.providers._network import describe_network_failure
from trioloop.providers._redact import REDACTED, EventScrubber
from trioloop.providers.base import AttemptOutcome, Messages, StreamMapper, WireFormat
from trioloop.providers.sse import SseDecoder

__all__ = ["ERROR_BODY_LIMIT", "parse_retry_after"]

ERROR_BODY_LIMIT: Final = 16 * 1024
RETRY_AFTER_CEILING: Final = 600.0
_DRAIN_LIMIT: Final = 1024
# Once the terminal event is decoded, the rest of the body (the final chunk terminator, a trailing ping) is
# read before that event is sent on and the response released, so httpcore has the connection back in its
# pool before the consumer can ask for the next request (and before a settled turn cancels this task);
# bounded so a server that keeps talking costs at most this much before the connection is dropped instead.
_TAIL_BYTES: Final = 64 * 1024
_TAIL_SECONDS: Final = 0.5
_CONNECTION_SUSPECT: Final = frozenset({ProtocolErrorCode.TRANSPORT, ProtocolErrorCode.MALFORMED_STREAM})
_RETRY_AFTER_SECONDS = re.compile(r"[0-9]{1,10}(\.[0-9]{1,6})?")

_log = logging.getLogger("trioloop.providers")


@final
class _RequestBody(httpx.AsyncByteStream):
    """The request body as one chunk, iterated by a plain object rather than an async generator."""

    def __init__(self, body: bytes) -> None:
        self._body = body

    def __aiter__(self) -> _BodyChunks:
        return _BodyChunks(self._body)


@final
class _BodyChunks:
    def __init__(self, body: bytes) -> None:
        self._body: bytes | None = body

    def __aiter__(self) -> _BodyChunks:
        return self

    async def __anext__(self) -> bytes:
        body, self._body = self._body, None
        if body is None:
            raise StopAsyncIteration
        return body


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a ``retry-after`` header in delay-seconds form, clamped to 10 minutes.

    An HTTP-date is ignored: honoring it would need the wall clock, and the backoff covers the case.
    """
    if value is None:
        return None
    value = value.strip()
    if not _RETRY_AFTER_SECONDS.fullmatch(value):
        return None
    seconds = float(value)
    return min(seconds, RETRY_AFTER_CEILING) if math.isfinite(seconds) else None


def _failure(
    code: ProtocolErrorCode,
    message: str,
    detail: str | None = None,
    *,
    committed: bool = False,
    retry_after: float | None = None,
) -> AttemptOutcome:
    return AttemptOutcome(
        failure=StreamError(code=code, message=message, provider_detail=detail, retry_after=retry_after),
        committed=committed,
        retry_after=retry_after,
    )


#: How long a read-gap deadline stays where it is before the next read moves it (see ``_read_stream``).
_GAP_SLACK_S: Final = 0.001


class _Exchange:
    """The state of one request/response: what was sent on, and how the body is being read."""

    def __init__(
        self,
        *,
        wire: WireFormat,
        key: str,
        send: trio.abc.SendChannel[StreamEvent],
        read_timeout: float,
        max_bytes: int,
        free: Callable[[bool], None] | None = None,
    ) -> None:
        self._wire = wire
        self._key = key
        self._send = send
        self._read_timeout = read_timeout
        self._max_bytes = max_bytes
        self.committed = False
        # The mapper scrubs with a function of the key alone, not this exchange's bound method: a reference
        # cycle would leave every request's exchange, mapper and buffers to the cyclic garbage collector.
        self._mapper: StreamMapper = wire.new_mapper(scrub=partial(_scrub, key))
        self._scrubber = EventScrubber(key)
        # A consumer that takes batches never waits for its reader (the runner's inbox), so forwarding a
        # read's events cannot eat into the read gap, and the gap's deadline need not be lifted meanwhile.
        self._batches = bool(getattr(send, "takes_batches", getattr(send, "send_batch", None) is not None))
        self._send_batch = getattr(send, "send_batch", None)
        # Our own guard in front of a batch channel: `_forward` already stops at the first terminal event, so
        # its batches go straight to the channel behind the guard, and the guard is told when one ended it.
        guard = send if isinstance(send, _TerminalGuard) else None
        self._guard = guard
        self._guard_batch = None if guard is None else guard.inner_batch
        self._on_free = free

    def free(self, reusable: bool) -> None:
        """Hand the client back to its provider, once: ``reusable`` when the body was read to its end (httpx then
        put the connection back in the pool idle). Done before the terminal event goes on, so a consumer that
        asks again at once finds this connection free."""
        on_free, self._on_free = self._on_free, None
        if on_free is not None:
            on_free(reusable)

    def scrub(self, text: str) -> str:
        """Remove the literal key from provider text before anything caps or stores it."""
        return _scrub(self._key, text)

    def fail(
        self, code: ProtocolErrorCode, message: str, detail: str | None = None, *, retry_after: float | None = None
    ) -> AttemptOutcome:
        return _failure(
            code,
            message,
            None if detail is None else self.scrub(detail),
            committed=self.committed,
            retry_after=retry_after,
        )

    async def run(self, client: httpx.AsyncClient, url: str, body: bytes, headers: Mapping[str, str]) -> AttemptOutcome:
        try:
            request = client.build_request("POST", url, content=body, headers=headers)
            # httpx's own byte stream is an async generator; one cut mid-write by Stop or the deadline
            # is left unfinished and warns when collected. Ours is a plain iterator with nothing to leak.
            request.stream = _RequestBody(body)
            with trio.move_on_after(self._read_timeout) as waiting:
                response = await client.send(request, stream=True, follow_redirects=False)
            if waiting.cancelled_caught:
                return self.fail(ProtocolErrorCode.TRANSPORT, Messages.READ_TIMEOUT, "no response headers")
            # A body without a content coding (SSE almost always) is read raw: aiter_bytes would pass every chunk
            # through an identity decoder and a re-chunker on the way.
            # (A response whose body is already in memory, as a mock transport gives, is read as such.)
            encoding = response.headers.get("content-encoding", "").strip().lower()
            raw = encoding in ("", "identity") and not response.is_stream_consumed
            iterate = response.aiter_raw if raw else response.aiter_bytes
            chunks = cast(AsyncGenerator[bytes, None], iterate())
            try:
                if not 200 <= response.status_code < 300:
                    outcome = await self._status_failure(response, chunks)
                else:
                    outcome = await self._read_stream(chunks)
                if outcome.failure is None or outcome.failure.code not in _CONNECTION_SUSPECT:
                    self.free(await _read_tail(chunks))
                return outcome
            finally:
                await _release(response, chunks)
        except (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError, httpx.ProxyError) as exc:
            _log.debug("provider connection failed: %s", type(exc).__name__)
            return self.fail(ProtocolErrorCode.TRANSPORT, Messages.NETWORK, describe_network_failure(exc))
        except (httpx.HTTPError, httpx.InvalidURL, OSError) as exc:
            _log.debug("provider request failed: %s", type(exc).__name__)
            return self.fail(ProtocolErrorCode.TRANSPORT, Messages.REQUEST_FAILED, type(exc).__name__)

    async def _forward(
        self, events: list[StreamEvent], chunks: AsyncGenerator[bytes, None] | None = None
    ) -> AttemptOutcome | None:
        """Send events on, key-scrubbed and together; a terminal error is held back and returned, a stop ends.

        With ``chunks``, the body's tail is read before a terminal batch goes on (see ``_TAIL_BYTES``).
        """
        out: list[StreamEvent] = []
        failure: StreamError | None = None
        stopped = False
        process = self._scrubber.process
        for event in events:
            if type(event) is TextDelta:  # the common case: neither an error nor a terminal event
                out += process(event)
                continue
            if isinstance(event, StreamError) and event.terminal:
                out += self._scrubber.flush()
                failure = event
                break
            out += process(event)
            if is_terminal(event):
                stopped = True
                break
        if (
            chunks is not None
            and (stopped or (failure is not None and failure.code not in _CONNECTION_SUSPECT))
            and await _read_tail(chunks)
        ):
            self.free(True)
        await self._send_all(out, ends=stopped)
        if failure is not None:
            return AttemptOutcome(failure=failure, committed=self.committed)
        return AttemptOutcome(committed=True) if stopped else None

    async def _send_all(self, events: list[StreamEvent], *, ends: bool = False) -> None:
        """Send ``events`` (none after a terminal one; ``ends`` when the last one is terminal) on."""
        if not events:
            return
        guard, direct = self._guard, self._guard_batch
        if guard is not None and direct is not None and not guard.terminal_sent:
            await direct(events)
            guard.terminal_sent = ends
            self.committed = True
            return
        batch = self._send_batch
        if batch is not None:  # all of them with one checkpoint; delivered all or (cancelled first) none
            await batch(events)
            self.committed = True
            return
        for event in events:
            await self._send.send(event)
            self.committed = True

    async def _read_stream(self, chunks: AsyncGenerator[bytes, None]) -> AttemptOutcome:
        decoder = SseDecoder()
        received = 0
        timeout = self._read_timeout
        batches = self._batches
        process = self._scrubber.process
        moved = -math.inf
        # One gap scope for the whole body (a fresh scope per read costs about three times as much). Its
        # deadline moves forward before a read unless it moved less than _GAP_SLACK_S ago: the HTTP chunks one
        # socket read brought are taken within microseconds, and moving a Trio deadline costs a heap update
        # each time. So the gap fires after at least ``read_timeout - _GAP_SLACK_S`` of silence, and exactly
        # ``read_timeout`` after the last chunk that came after a wait. The events of a chunk go on together.
        with trio.CancelScope() as gap:
            while True:
                now = trio.current_time()
                if now - moved > _GAP_SLACK_S:
                    gap.deadline = now + timeout
                    moved = now
                try:
                    chunk = await chunks.__anext__()
                except StopAsyncIteration:
                    break
                received += len(chunk)
                if received > self._max_bytes:
                    return self.fail(ProtocolErrorCode.TRANSPORT, Messages.TOO_LARGE, "response_too_large")
                try:
                    frames = decoder.feed(chunk)
                except ProtocolError as exc:
                    return self.fail(exc.code, exc.message)
                if not frames:
                    continue
                feed = self._mapper.feed
                events = feed(frames[0]) if len(frames) == 1 else [e for frame in frames for e in feed(frame)]
                if not batches:  # the gap bounds the server's silence, not how long the consumer takes
                    gap.deadline = math.inf
                    moved = -math.inf
                if len(events) == 1 and type(events[0]) is TextDelta:  # the common chunk: one text delta
                    await self._send_all(process(events[0]))
                    continue
                ended = await self._forward(events, chunks)
                if ended is not None:
                    return ended
        if gap.cancelled_caught:
            return self.fail(ProtocolErrorCode.TRANSPORT, Messages.READ_TIMEOUT, "read gap timeout")
        self.free(True)  # the body ended: httpx put the connection back in the pool
        try:
            frames = decoder.close()
        except ProtocolError as exc:
            return self.fail(exc.code, exc.message)
        events = [event for frame in frames for event in self._mapper.feed(frame)]
        ended = await self._forward(events + self._mapper.finish())
        assert ended is not None, "finish() always yields a terminal event"
        return ended

    async def _status_failure(self, response: httpx.Response, chunks: AsyncGenerator[bytes, None]) -> AttemptOutcome:
        status = response.status_code
        if 300 <= status < 400:
            return self.fail(ProtocolErrorCode.HTTP_STATUS, Messages.REDIRECT_REFUSED, f"HTTP {status}")
        body = await self._read_error_body(chunks)
        described = self._wire.describe_error_body(body)
        detail = f"HTTP {status}: {described.detail}" if described.detail else f"HTTP {status}"
        retry_after = parse_retry_after(response.headers.get("retry-after"))
        if status == 429:
            return self.fail(ProtocolErrorCode.RATE_LIMITED, Messages.RATE_LIMITED, detail, retry_after=retry_after)
        if status in (401, 403):
            return self.fail(ProtocolErrorCode.HTTP_STATUS, Messages.AUTH_REJECTED, detail)
        if status >= 500:
            return self.fail(ProtocolErrorCode.HTTP_STATUS, Messages.SERVER_ERROR, detail, retry_after=retry_after)
        if described.context_overflow:
            return self.fail(ProtocolErrorCode.CONTEXT_OVERFLOW, _CONTEXT_OVERFLOW_MESSAGE, detail)
        return self.fail(ProtocolErrorCode.HTTP_STATUS, Messages.REQUEST_REJECTED, detail)

    async def _read_error_body(self, chunks: AsyncGenerator[bytes, None]) -> bytes:
        """At most ``ERROR_BODY_LIMIT`` bytes of an error body; a slow or broken body yields what arrived."""
        collected = bytearray()
        while len(collected) < ERROR_BODY_LIMIT:
            with trio.move_on_after(self._read_timeout):
                try:
                    collected += await chunks.__anext__()
                    continue
                except StopAsyncIteration:
                    break
                except (httpx.HTTPError, OSError):
                    break
            break
        return bytes(collected[:ERROR_BODY_LIMIT])


async def _read_tail(chunks: AsyncGenerator[bytes, None]) -> bool:
    """Read what is left of a body after its terminal event; True when it ended within the bounds.

    A body read to its end leaves httpcore's connection idle in the pool, so the next request of the
    session reuses it (no new TCP connect, no new TLS handshake). Too many bytes, too slow, or broken:
    False, and ``_release`` closes the response, which drops the connection.
    """
    left = _TAIL_BYTES
    with trio.move_on_after(_TAIL_SECONDS):
        while left >= 0:
            try:
                left -= len(await chunks.__anext__())
            except StopAsyncIteration:
                return True
            except (httpx.HTTPError, OSError):
                return False
    return False


def _scrub(key: str, text: str) -> str:
    return text.replace(key, REDACTED) if key in text else text


async def _release(response: httpx.Response, chunks: AsyncGenerator[bytes, None]) -> None:
    """Close the response, then run its byte generator to its end.

    httpx reads through a chain of nested async generators; closing only the outer one would leave the
    inner ones suspended until garbage collection. Once the connection is closed, resuming the chain makes
    the innermost read fail, and that failure finishes every generator in it.
    """
    with trio.CancelScope(shield=True), trio.move_on_after(_CLOSE_GRACE):
        await response.aclose()
        for _ in range(_DRAIN_LIMIT):
            try:
                await chunks.__anext__()
            except (StopAsyncIteration, Exception):
                break
    # The response and its stream refer to each other (httpx's BoundAsyncStream): closed, it needs the stream no
    # more, and without the cycle the request's objects go when the last reference does, not at a collection.
    response.stream = httpx.ByteStream(b"")


_CONTEXT_OVERFLOW_MESSAGE: Final = (
    "The conversation is too long for the model's context window. "
    "Start a new conversation or shorten the latest message."
)


class _TerminalGuard(trio.abc.SendChannel[StreamEvent]):
    """Forwards to the consumer's channel and remembers whether a terminal event went through."""

    def __init__(self, inner: trio.abc.SendChannel[StreamEvent]) -> None:
        self._inner = inner
        self.terminal_sent = False
        #: The consumer's own ``send_batch``, if it takes batches (else it forwards one event at a time).
        self.inner_batch: Callable[[Sequence[StreamEvent]], Awaitable[None]] | None = getattr(inner, "send_batch", None)
        self.takes_batches = self.inner_batch is not None

    async def send(self, value: StreamEvent) -> None:
        if self.terminal_sent:
            await trio.lowlevel.checkpoint()
            return
        await self._inner.send(value)
        if is_terminal(value):
            self.terminal_sent = True

    async def send_batch(self, events: Sequence[StreamEvent]) -> None:
        """Forward ``events`` up to the first terminal one, in one batch when the consumer takes batches."""
        if self.terminal_sent:
            await trio.lowlevel.checkpoint()
            return
        cut, ends = terminal_cut(events)
        events = events if cut == len(events) else events[:cut]
        batch = self.inner_batch
        await (batch(events) if batch is not None else send_events(self._inner, events))
        if ends:
            self.terminal_sent = True

    async def aclose(self) -> None:
        """Never closes the consumer's channel: the provider contract leaves that to the caller."""
        await trio.lowlevel.checkpoint()
