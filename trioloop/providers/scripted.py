"""The scripted provider: a deterministic model that replays a script over a real wire format.

Each ``ScriptStep`` answers one HTTP request, rendered as Anthropic, OpenAI Chat Completions or OpenAI
Responses SSE bytes and served by the in-process loopback server; the real provider (transport, SSE
decoder, mapper, retry) reads it.
So the demo and the tests exercise exactly the code production traffic goes through. The bodies the
"model" received are kept in ``requests`` for tests to inspect.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from contextlib import AsyncExitStack
from types import TracebackType
from typing import Final, Literal, final

import attrs
import httpx
import trio

from trioloop.protocol.events import StopReason, StreamEvent
from trioloop.protocol.messages import JsonValue, ToolCallBlock
from trioloop.protocol.preflight import MODEL_TABLE, ModelCapabilities, lookup_model, model_table
from trioloop.protocol.tools import ChatRequest
from trioloop.providers._loopback import (
    SSE_HEADERS,
    LoopbackRequest,
    LoopbackResponse,
    LoopbackServer,
    open_loopback_server,
)
from trioloop.providers.anthropic import ANTHROPIC_WIRE
from trioloop.providers.base import WireFormat, WireResponse
from trioloop.providers.openai import OPENAI_WIRE
from trioloop.providers.openai_responses import RESPONSES_WIRE
from trioloop.providers.retry import DEFAULT_RETRY_POLICY, RetryPolicy
from trioloop.providers.transport import DEFAULT_MAX_RESPONSE_BYTES, DEFAULT_READ_TIMEOUT, HttpChatProvider

__all__ = ["EXHAUSTED_TEXT", "SCRIPTED_API_KEY", "ScriptStep", "ScriptedCall", "ScriptedProvider", "WireName"]

WireName = Literal["anthropic", "openai", "openai-responses"]
EXHAUSTED_TEXT: Final = "script exhausted"
SCRIPTED_API_KEY: Final = "scripted-dummy-key"
_WIRES: Final[dict[str, WireFormat]] = {
    "anthropic": ANTHROPIC_WIRE,
    "openai": OPENAI_WIRE,
    "openai-responses": RESPONSES_WIRE,
}
_BASE_PATHS: Final = {"anthropic": "", "openai": "/v1", "openai-responses": "/v1"}


@final
@attrs.frozen(kw_only=True)
class ScriptedCall:
    """A tool call the scripted model makes: its id, the tool name and the (JSON) input."""

    id: str
    name: str
    input: JsonValue = attrs.field(factory=dict)


def _calls(value: Iterable[ScriptedCall]) -> tuple[ScriptedCall, ...]:
    return tuple(value)


def _optional_reason(value: StopReason | str | None) -> StopReason | None:
    return None if value is None else StopReason(value)


@final
@attrs.frozen(kw_only=True)
class ScriptStep:
    """One scripted answer to one request.

    ``status`` other than 200 answers with an error body (``error_body`` or the wire's own shape) and
    ``retry_after`` seconds if set. ``in_stream_error`` names a provider error type (e.g.
    ``rate_limit_error``, ``overloaded_error``) sent after the text in place of the rest of the answer.
    The delivery knobs are those of ``LoopbackResponse``. ``input_tokens`` and ``output_tokens`` are the usage
    the answer reports (None: about a token per four characters of the request body, and of the answer).
    """

    text: str = ""
    tool_calls: tuple[ScriptedCall, ...] = attrs.field(default=(), converter=_calls)
    stop_reason: StopReason | None = attrs.field(default=None, converter=_optional_reason)
    status: int = 200
    retry_after: float | None = None
    error_body: bytes | None = None
    in_stream_error: str | None = None
    chunk_size: int | None = None
    delay_between_chunks: float = 0.0
    stall_after_bytes: int | None = None
    disconnect_after_bytes: int | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None


def _retry_after_header(seconds: float) -> str:
    return str(int(seconds)) if float(seconds).is_integer() else str(seconds)


@final
class ScriptedProvider:
    """The embedded default ``ChatProvider``; use as ``async with ScriptedProvider(steps) as provider``."""

    def __init__(
        self,
        steps: Iterable[ScriptStep] = (),
        *,
        wire: WireName = "anthropic",
        model: str = "scripted-1",
        retry: RetryPolicy | None = DEFAULT_RETRY_POLICY,
        read_timeout: float = DEFAULT_READ_TIMEOUT,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
    ) -> None:
        if wire not in _WIRES:
            raise ValueError(f"wire must be 'anthropic', 'openai' or 'openai-responses', not {wire!r}")
        self._steps = list(steps)
        self._wire_name: WireName = wire
        self._wire = _WIRES[wire]
        self._model = model
        self._retry = retry
        self._read_timeout = read_timeout
        self._max_response_bytes = max_response_bytes
        self._requests: list[JsonValue] = []
        self._stack: AsyncExitStack | None = None
        self._server: LoopbackServer | None = None
        self._provider: HttpChatProvider | None = None

    def __repr__(self) -> str:
        return f"ScriptedProvider(wire={self._wire_name!r}, model={self._model!r}, steps_left={len(self._steps)})"

    @property
    def requests(self) -> tuple[JsonValue, ...]:
        """Every request body the scripted model received, parsed from JSON, oldest first."""
        return tuple(self._requests)

    @property
    def server(self) -> LoopbackServer:
        """The loopback server (raw requests, headers included); only while the provider is open."""
        if self._server is None:
            raise RuntimeError("ScriptedProvider is not running; use it with 'async with'")
        return self._server

    @property
    def steps_left(self) -> int:
        """How many scripted answers have not been given yet."""
        return len(self._steps)

    def _table(self) -> dict[str, ModelCapabilities]:
        table = dict(MODEL_TABLE)
        if lookup_model(self._model, provider=self._wire.name) is None:
            table[self._model] = ModelCapabilities(
                id=self._model,
                provider=self._wire.name,
                tool_calling=True,
                parallel_tool_calls=True,
                max_input_tokens=200_000,
                max_output_tokens=8_192,
            )
        return table

    async def __aenter__(self) -> ScriptedProvider:
        if self._stack is not None:
            raise RuntimeError("ScriptedProvider is already running")
        stack = AsyncExitStack()
        try:
            server = await stack.enter_async_context(open_loopback_server(self._answer, keep_alive=True))
            # Plain HTTP to this process's own loopback server, never https: no TLS context is needed, and
            # building one (certificate store included) costs about 15 ms per provider.
            client = httpx.AsyncClient(trust_env=False, timeout=httpx.Timeout(30.0, read=None), verify=False)
            stack.push_async_callback(self._close_client, client)
            self._provider = HttpChatProvider(
                self._wire,
                api_key=SCRIPTED_API_KEY,
                base_url=server.url + _BASE_PATHS[self._wire_name],
                client=client,
                read_timeout=self._read_timeout,
                max_response_bytes=self._max_response_bytes,
                retry=self._retry,
                model_table=model_table(self._table().values()),
            )
        except BaseException:
            await stack.aclose()
            raise
        self._stack = stack
        self._server = server
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        stack, self._stack = self._stack, None
        self._provider = None
        self._server = None
        if stack is not None:
            await stack.aclose()

    @staticmethod
    async def _close_client(client: httpx.AsyncClient) -> None:
        with trio.CancelScope(shield=True):
            await client.aclose()

    async def stream(
        self,
        request: ChatRequest,
        send: trio.abc.SendChannel[StreamEvent],
        *,
        cancel_scope: trio.CancelScope | None = None,
    ) -> None:
        """Stream the next scripted answer; the ``ChatProvider`` contract holds exactly."""
        if self._provider is None:
            raise RuntimeError("ScriptedProvider is not running; use it with 'async with'")
        await self._provider.stream(request, send, cancel_scope=cancel_scope)

    def _answer(self, request: LoopbackRequest) -> LoopbackResponse:
        try:
            body = request.json()
        except ValueError:
            body = None
        self._requests.append(body)
        step = self._steps.pop(0) if self._steps else ScriptStep(text=EXHAUSTED_TEXT)
        if step.status != 200:
            headers = [("content-type", "application/json")]
            if step.retry_after is not None:
                headers.append(("retry-after", _retry_after_header(step.retry_after)))
            error = step.error_body
            if error is None:
                error = self._wire.render_error_body(step.status, f"scripted HTTP {step.status}")
            return LoopbackResponse(status=step.status, headers=tuple(headers), body=error)
        model = body.get("model") if isinstance(body, dict) else None
        calls = tuple(ToolCallBlock(id=c.id, name=c.name, input=c.input) for c in step.tool_calls)
        stop = step.stop_reason or (StopReason.TOOL_USE if calls else StopReason.END_TURN)
        produced = len(step.text) + sum(len(json.dumps(c.input)) for c in calls)
        rendered = self._wire.render_stream(
            WireResponse(
                model=model if isinstance(model, str) else self._model,
                text=step.text,
                tool_calls=calls,
                stop_reason=stop,
                input_tokens=math.ceil(len(request.body) / 4) if step.input_tokens is None else step.input_tokens,
                output_tokens=math.ceil(produced / 4) if step.output_tokens is None else step.output_tokens,
                error_type=step.in_stream_error,
                error_message="scripted in-stream error",
            )
        )
        return LoopbackResponse(
            status=200,
            headers=SSE_HEADERS,
            body=rendered,
            chunk_size=step.chunk_size,
            delay_between_chunks=step.delay_between_chunks,
            stall_after_bytes=step.stall_after_bytes,
            disconnect_after_bytes=step.disconnect_after_bytes,
        )
