"""The httpx transport (running under Trio) and the provider that composes preflight, retry and cancellation.

One ``HttpTransport.attempt`` posts one request and streams the body through the SSE decoder and the
wire's mapper, with a per-read gap deadline and a total-bytes cap; redirects are refused, HTTP statuses
become typed errors, and the API key lives only in the auth header. ``HttpChatProvider`` is the
``ChatProvider`` built on top: preflight, the retrying transport, and ``Aborted`` for its cancel scope.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import math
import os
import re
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from typing import Any, Final, Self, cast, final

import httpx
import trio

from trioloop.protocol.errors import ProtocolError, ProtocolErrorCode
from trioloop.protocol.events import Aborted, StreamError, StreamEvent, TextDelta, is_terminal, terminal_cut
from trioloop.protocol.preflight import (
    MODEL_TABLE,
    ModelCapabilities,
    lookup_model,
    preflight_request,
    unknown_model_warning,
)
from trioloop.protocol.provider import send_events
from trioloop.protocol.tools import ChatRequest
from trioloop.providers._network import describe_network_failure
from trioloop.providers._redact import REDACTED, EventScrubber, mask_key_in_logs
from trioloop.providers.base import AttemptOutcome, Messages, StreamMapper, Transport, WireFormat
from trioloop.providers.retry import DEFAULT_RETRY_POLICY, RetryingTransport, RetryNotice, RetryPolicy
from trioloop.providers.sse import SseDecoder

__all__ = [
    "DEFAULT_MAX_RESPONSE_BYTES",
    "DEFAULT_READ_TIMEOUT",
    "ERROR_BODY_LIMIT",
    "ApiKey",
    "HttpChatProvider",
    "HttpTransport",
    "is_loopback_host",
    "parse_retry_after",
]

DEFAULT_READ_TIMEOUT: Final = 300.0
DEFAULT_MAX_RESPONSE_BYTES: Final = 50 * 1024 * 1024
ERROR_BODY_LIMIT: Final = 16 * 1024
RETRY_AFTER_CEILING: Final = 600.0
_CLOSE_GRACE: Final = 5.0
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


@final
class ApiKey:
    """A secret that never shows itself: no repr, no str, no pickling; ``reveal()`` is the one way out."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "ApiKey(<redacted>)"

    __str__ = __repr__

    def __reduce__(self) -> str:
        raise TypeError("an ApiKey cannot be pickled")


def _usable_key(value: str | None) -> str | None:
    """The key, stripped, if it can go in a header: printable ASCII with no spaces."""
    if value is None:
        return None
    value = value.strip()
    if not value or not value.isascii() or not value.isprintable() or " " in value:
        return None
    return value


def is_loopback_host(host: str) -> bool:
    """Whether ``host`` (a name or an address, IPv6 in brackets or not) is this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _endpoint_url(base_url: str, endpoint: str) -> str:
    """``endpoint`` appended to the base URL's path; a query (Azure's ``?api-version=``) stays at the end."""
    try:
        url = httpx.URL(base_url)
        return str(url.copy_with(path=url.path.rstrip("/") + endpoint))
    except (httpx.InvalidURL, TypeError, ValueError):
        return base_url.rstrip("/") + endpoint  # refused when the request is made, with a typed error


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


#: How long `HttpTransport.check` waits for the models list.
_CHECK_TIMEOUT_S = 10.0
#: How long a read-gap deadline stays where it is before the next read moves it (see ``_read_stream``).
_GAP_SLACK_S: Final = 0.001
#: The pool of each client a provider holds (``async with provider``, or every `Session` using it). A streamed
#: answer keeps its HTTP/1.1 connection until it ends, so N sessions streaming at once need N connections:
#: httpx's default pool (at most 100, 20 kept alive) makes the 101st wait for another's answer and reconnects
#: most requests past 20. Unbounded here, the pool holds as many connections as there were concurrent streams,
#: each closed after 4 idle seconds: before uvicorn's default 5 s keep-alive (vLLM and many OpenAI-compatible
#: servers) closes it from the other end, which would race a request sent on it. An app that passes its own
#: ``client=`` sets its own limits (``httpx.Limits(max_connections=None, max_keepalive_connections=None)``).
HELD_POOL_LIMITS: Final = httpx.Limits(max_connections=None, max_keepalive_connections=None, keepalive_expiry=4.0)
#: Streams one held client carries at once before the provider opens another beside it. httpcore 1.0 walks
#: every connection of a pool for every connection each time a request starts or a response closes, so one
#: pool of N connections costs O(N²) per request: 37% of the CPU at 300 sessions on one provider. Pools of
#: at most this many streams keep that walk short; they share one TLS context.
HELD_STREAMS_PER_CLIENT: Final = 32


def _streaming_client(**options: Any) -> httpx.AsyncClient:
    """A client for streamed answers: 30 s to connect and write, no total read bound (the transport's own
    read gap bounds the silence), redirects refused."""
    return httpx.AsyncClient(timeout=httpx.Timeout(30.0, read=None), follow_redirects=False, **options)


@final
class _HeldClients:
    """The clients a held provider streams through: the least busy one takes the next request, and a new one
    opens when every one carries `HELD_STREAMS_PER_CLIENT` streams. They close together when the hold ends."""

    __slots__ = ("_tls", "busy", "clients")

    def __init__(self) -> None:
        self._tls = httpx.create_ssl_context()
        self.clients: list[httpx.AsyncClient] = []
        self.busy: list[int] = []
        self._open()

    def _open(self) -> None:
        self.clients.append(_streaming_client(limits=HELD_POOL_LIMITS, verify=self._tls))
        self.busy.append(0)

    def take(self) -> int:
        """The index of the client the next request goes through, counted busy until `give` returns it."""
        busy = self.busy
        index = min(range(len(busy)), key=busy.__getitem__)
        if busy[index] >= HELD_STREAMS_PER_CLIENT:
            self._open()
            index = len(busy) - 1
        busy[index] += 1
        return index

    def give(self, index: int) -> None:
        self.busy[index] -= 1

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True), trio.move_on_after(_CLOSE_GRACE):
            for client in self.clients:
                await client.aclose()


@final
class HttpTransport:
    """One HTTP attempt per call; the ``Transport`` every real provider and the scripted one use."""

    def __init__(
        self,
        wire: WireFormat,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        client: httpx.AsyncClient | None = None,
        read_timeout: float = DEFAULT_READ_TIMEOUT,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
    ) -> None:
        if not (isinstance(read_timeout, int | float) and read_timeout > 0 and math.isfinite(read_timeout)):
            raise ValueError("read_timeout must be a positive number of seconds")
        if not (isinstance(max_response_bytes, int) and max_response_bytes > 0):
            raise ValueError("max_response_bytes must be a positive int")
        self._wire = wire
        self._key = None if api_key is None else ApiKey(api_key)
        self._url = _endpoint_url(base_url or wire.default_base_url, wire.endpoint)
        self._url_verdict: bool | None = None  # `_url_allowed`, once known
        # A wire written before the models list was part of the protocol has none: nothing to check then.
        models = getattr(wire, "models_endpoint", None)
        self._models_url = None if models is None else _endpoint_url(base_url or wire.default_base_url, models)
        self._client = client
        self.held: _HeldClients | None = None  # the provider's own clients, while it is held (async with)
        self._read_timeout = float(read_timeout)
        self._max_bytes = max_response_bytes

    def __repr__(self) -> str:
        return f"HttpTransport(wire={self._wire.name!r}, url={self._url!r})"

    @property
    def held_client(self) -> httpx.AsyncClient | None:
        """The first client the provider holds (the one `check` asks), or None when it is not held."""
        return None if self.held is None else self.held.clients[0]

    def _resolve_key(self) -> str | None:
        raw = self._key.reveal() if self._key is not None else os.environ.get(self._wire.env_var)
        return _usable_key(raw)

    def _url_allowed(self) -> bool:
        """Whether the base URL is https, or http to a loopback host (decided once: the URL never changes)."""
        allowed = self._url_verdict
        if allowed is None:
            url = httpx.URL(self._url)
            allowed = self._url_verdict = url.scheme == "https" or (url.scheme == "http" and is_loopback_host(url.host))
        return allowed

    async def check(self) -> StreamError | None:
        """Ask the server for its models list once, with the key: None when it answers (any status but 401 and
        403: a server without a models list, or one that is busy, is not a wrong URL or key), else what failed,
        as a turn would report it (no connection, TLS, DNS, a refused key). Never raises for the server's sake."""
        await trio.lowlevel.checkpoint()
        models_url = self._models_url
        if models_url is None:
            return None
        key = self._resolve_key()
        if key is None:
            return StreamError(
                code=ProtocolErrorCode.NO_API_KEY,
                message=Messages.NO_API_KEY,
                provider_detail=f"Set {self._wire.env_var} or pass api_key to the provider.",
            )
        try:
            allowed = self._url_allowed()
        except httpx.InvalidURL:
            allowed = False
        if not allowed:
            return StreamError(code=ProtocolErrorCode.TRANSPORT, message=Messages.INSECURE_URL)
        mask_key_in_logs(key)
        headers = {**self._wire.auth_headers(key), "accept": "application/json", "accept-encoding": "identity"}
        client = self._client or self.held_client
        owned = client is None
        if client is None:
            client = httpx.AsyncClient(timeout=httpx.Timeout(_CHECK_TIMEOUT_S), follow_redirects=False)
        try:
            with trio.move_on_after(_CHECK_TIMEOUT_S) as waiting:
                response = await client.get(models_url, headers=headers, follow_redirects=False)
                status = response.status_code
                body = response.content[:ERROR_BODY_LIMIT] if status in (401, 403) else b""
            if waiting.cancelled_caught:
                return StreamError(
                    code=ProtocolErrorCode.TRANSPORT, message=Messages.READ_TIMEOUT, provider_detail="no answer"
                )
        except (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError, httpx.ProxyError) as exc:
            return StreamError(
                code=ProtocolErrorCode.TRANSPORT,
                message=Messages.NETWORK,
                provider_detail=describe_network_failure(exc),
            )
        except (httpx.HTTPError, OSError) as exc:
            return StreamError(
                code=ProtocolErrorCode.TRANSPORT, message=Messages.REQUEST_FAILED, provider_detail=type(exc).__name__
            )
        finally:
            if owned:
                with trio.CancelScope(shield=True), trio.move_on_after(_CLOSE_GRACE):
                    await client.aclose()
        if status in (401, 403):
            described = self._wire.describe_error_body(body)
            detail = f"HTTP {status}: {described.detail}" if described.detail else f"HTTP {status}"
            return StreamError(
                code=ProtocolErrorCode.HTTP_STATUS,
                message=Messages.AUTH_REJECTED,
                provider_detail=detail.replace(key, REDACTED),
            )
        return None

    async def attempt(self, request: ChatRequest, send: trio.abc.SendChannel[StreamEvent]) -> AttemptOutcome:
        await trio.lowlevel.checkpoint()
        key = self._resolve_key()
        if key is None:
            return _failure(
                ProtocolErrorCode.NO_API_KEY,
                Messages.NO_API_KEY,
                f"Set {self._wire.env_var} or pass api_key to the provider.",
            )
        mask_key_in_logs(key)
        try:
            allowed = self._url_allowed()
        except httpx.InvalidURL:
            allowed = False
        if not allowed:
            return _failure(ProtocolErrorCode.TRANSPORT, Messages.INSECURE_URL)
        try:
            body = json.dumps(
                self._wire.build_body(request), ensure_ascii=False, separators=(",", ":"), allow_nan=False
            ).encode()
        except (TypeError, ValueError):
            return _failure(ProtocolErrorCode.TRANSPORT, Messages.REQUEST_FAILED, "The request was not valid JSON.")
        headers = {
            **self._wire.auth_headers(key),
            "content-type": "application/json",
            "accept": "text/event-stream",
            "accept-encoding": "identity",
        }
        held, slot = self.held, -1
        if self._client is not None:
            client = self._client
        elif held is not None:
            slot = held.take()
            client = held.clients[slot]
        else:
            client = _streaming_client()
        exchange = _Exchange(
            wire=self._wire,
            key=key,
            send=send,
            read_timeout=self._read_timeout,
            max_bytes=self._max_bytes,
        )
        try:
            return await exchange.run(client, self._url, body, headers)
        finally:
            if slot >= 0:
                assert held is not None
                held.give(slot)
            elif client is not self._client:  # a client of this request alone
                with trio.CancelScope(shield=True), trio.move_on_after(_CLOSE_GRACE):
                    await client.aclose()


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
    ) -> None:
        self._wire = wire
        self._key = key
        self._send = send
        self._read_timeout = read_timeout
        self._max_bytes = max_bytes
        self.committed = False
        self._mapper: StreamMapper = wire.new_mapper(scrub=self.scrub)
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

    def scrub(self, text: str) -> str:
        """Remove the literal key from provider text before anything caps or stores it."""
        return text.replace(self._key, REDACTED) if self._key in text else text

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
                    await _read_tail(chunks)
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
        if chunks is not None and (stopped or (failure is not None and failure.code not in _CONNECTION_SUSPECT)):
            await _read_tail(chunks)
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
                ended = await self._forward(events, chunks)
                if ended is not None:
                    return ended
        if gap.cancelled_caught:
            return self.fail(ProtocolErrorCode.TRANSPORT, Messages.READ_TIMEOUT, "read gap timeout")
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


class HttpChatProvider:
    """A ``ChatProvider`` over one ``WireFormat``: preflight, bounded retry, typed failures, ``Aborted``."""

    def __init__(
        self,
        wire: WireFormat,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        client: httpx.AsyncClient | None = None,
        read_timeout: float = DEFAULT_READ_TIMEOUT,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        retry: RetryPolicy | None = DEFAULT_RETRY_POLICY,
        model_table: Mapping[str, ModelCapabilities] = MODEL_TABLE,
        on_retry: Callable[[RetryNotice], None] | None = None,
    ) -> None:
        self._wire = wire
        self._table = model_table
        self._warned: set[str] = set()
        http = HttpTransport(
            wire,
            api_key=api_key,
            base_url=base_url,
            client=client,
            read_timeout=read_timeout,
            max_response_bytes=max_response_bytes,
        )
        self._http = http
        self._holds = 0  # nested `async with` blocks holding the provider's clients open
        self._transport: Transport = http if retry is None else RetryingTransport(http, retry, on_retry)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._transport!r})"

    async def __aenter__(self) -> Self:
        """Without an app-supplied client, hold one for the block: its keep-alive connection serves every
        request (no connect or TLS handshake per iteration). Outside a block, each request has its own.

        Re-entrant: blocks nest (the app's and a `Session`'s, say) and share one client, which closes
        when the outermost block ends. Its pools have no connection cap (`HELD_POOL_LIMITS`): N sessions
        streaming at once through one provider use N connections, each kept alive for the next request, in
        clients of at most `HELD_STREAMS_PER_CLIENT` streams each (one more opens as they fill)."""
        self._holds += 1
        if self._holds == 1 and self._http._client is None:
            self._http.held = _HeldClients()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._holds -= 1
        if self._holds:
            return
        held, self._http.held = self._http.held, None
        if held is not None:
            await held.aclose()

    def hold_connections(self) -> Self:
        """The provider itself, as a re-entrant hold (see ``HoldsConnections``)."""
        return self

    async def check(self) -> StreamError | None:
        """Check the URL and key once with the server's models list (see `HttpTransport.check`): None when the
        server answers, else the failure a turn would report. The CLI calls it before its first prompt."""
        return await self._http.check()

    async def stream(
        self,
        request: ChatRequest,
        send: trio.abc.SendChannel[StreamEvent],
        *,
        cancel_scope: trio.CancelScope | None = None,
    ) -> None:
        """Stream one response into ``send``; see ``ChatProvider`` for the contract."""
        guard = _TerminalGuard(send)
        try:
            if cancel_scope is None:
                await self._run(request, guard)
                return
            with cancel_scope:
                await self._run(request, guard)
            if cancel_scope.cancelled_caught and not guard.terminal_sent:
                await guard.send(Aborted())
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            _log.debug("provider consumer went away before the stream ended")

    async def _run(self, request: ChatRequest, out: _TerminalGuard) -> None:
        if (
            request.model not in self._warned
            and lookup_model(request.model, provider=self._wire.name, table=self._table) is None
        ):
            self._warned.add(request.model)  # once per model: a warning per request would drown the log
            _log.warning("%s", unknown_model_warning(request.model))
        try:
            prepared = preflight_request(request, provider=self._wire.name, table=self._table)
        except ProtocolError as exc:
            await out.send(StreamError(code=exc.code, message=exc.message, provider_detail=exc.provider_detail))
            return
        # A caller that retries itself (a turn, counting against its own budget) gets one attempt and the
        # failure with the server's retry-after hint: one counter bounds the requests, not two nested ones.
        transport = self._http if request.caller_retries else self._transport
        try:
            outcome = await transport.attempt(prepared, out)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            raise
        except Exception as exc:  # a bug below must still end the stream with a typed error, not a crash
            _log.debug("provider stream raised %s", type(exc).__name__)
            outcome = AttemptOutcome(
                failure=StreamError(
                    code=ProtocolErrorCode.TRANSPORT,
                    message=Messages.REQUEST_FAILED,
                    provider_detail=type(exc).__name__,
                )
            )
        if outcome.failure is not None:
            _log.debug("provider stream failed: %s", outcome.failure.code.value)
            await out.send(outcome.failure)
