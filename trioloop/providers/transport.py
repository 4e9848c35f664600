"""The httpx transport (running under Trio) and the provider that composes preflight, retry and cancellation.

Decides where a request may go and with which key (https, or http to this machine; the key only in the auth
header), which client each attempt goes through, and how ``HttpChatProvider`` adds preflight, the retrying
transport and ``Aborted`` for its cancel scope. One request's exchange (the SSE body, forwarding its events,
typed failures) is ``_http_exchange.py``; the clients a held provider streams through are ``_http_clients.py``.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import logging
import math
import os
from collections.abc import Callable, Mapping
from typing import Final, Self, final

import httpx
import trio

from trioloop.protocol.errors import ProtocolError, ProtocolErrorCode
from trioloop.protocol.events import Aborted, StreamError, StreamEvent
from trioloop.protocol.preflight import (
    MODEL_TABLE,
    ModelCapabilities,
    lookup_model,
    preflight_request,
    unknown_model_warning,
)
from trioloop.protocol.tools import ChatRequest
from trioloop.providers._http_clients import (
    _CLOSE_GRACE,
    HELD_POOL_LIMITS,
    HELD_STREAMS_PER_CLIENT,
    _HeldClients,
    _streaming_client,
)
from trioloop.providers._http_exchange import ERROR_BODY_LIMIT, _Exchange, _failure, _TerminalGuard, parse_retry_after
from trioloop.providers._network import describe_network_failure
from trioloop.providers._redact import REDACTED, mask_key_in_logs
from trioloop.providers.base import AttemptOutcome, Messages, Transport, WireFormat
from trioloop.providers.retry import DEFAULT_RETRY_POLICY, RetryingTransport, RetryNotice, RetryPolicy

__all__ = [
    "DEFAULT_MAX_RESPONSE_BYTES",
    "DEFAULT_READ_TIMEOUT",
    "ERROR_BODY_LIMIT",
    "HELD_POOL_LIMITS",
    "HELD_STREAMS_PER_CLIENT",
    "ApiKey",
    "HttpChatProvider",
    "HttpTransport",
    "is_loopback_host",
    "parse_retry_after",
]

DEFAULT_READ_TIMEOUT: Final = 300.0
DEFAULT_MAX_RESPONSE_BYTES: Final = 50 * 1024 * 1024

_log = logging.getLogger("trioloop.providers")


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


#: How long `HttpTransport.check` waits for the models list.
_CHECK_TIMEOUT_S = 10.0


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
            free=None if held is None or slot < 0 else functools.partial(held.give, slot),
        )
        try:
            return await exchange.run(client, self._url, body, headers)
        finally:
            if slot >= 0:
                exchange.free(False)  # unless the body ended (and freed it) first: the connection was dropped
            elif client is not self._client:  # a client of this request alone
                with trio.CancelScope(shield=True), trio.move_on_after(_CLOSE_GRACE):
                    await client.aclose()


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
        self._app_client = client is not None  # an app's client serves every request: the provider holds none
        self._holds = 0  # nested `async with` blocks holding the provider's clients open
        self._transport: Transport = http if retry is None else RetryingTransport(http, retry, on_retry)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._transport!r})"

    async def __aenter__(self) -> Self:
        """Without an app-supplied client, hold one for the block: its keep-alive connection serves every
        request (no connect or TLS handshake per iteration). Outside a block, each request has its own.

        Re-entrant: blocks nest (the app's and a `Session`'s, say) and share one client, which closes
        when the outermost block ends. N sessions streaming at once through one provider use N connections,
        each kept alive for the next request (`HELD_POOL_LIMITS`), in clients of `HELD_STREAMS_PER_CLIENT`
        stream each (one more opens when every one is busy)."""
        self._holds += 1
        if self._holds == 1 and not self._app_client:
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
