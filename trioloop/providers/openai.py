"""The OpenAI Chat Completions wire shape: request body, auth header, error bodies, the provider.

The wire modules are the only ones that know a provider's JSON; this one's chunk mapping (sans-IO) is
``_openai_stream.py``. Reasoning a compatible server streamed (an unsigned ``ThinkingBlock`` naming its
field, OpenRouter's ``reasoning_details`` as a ``ProviderBlock``) goes back on an assistant message with
tool calls where the server requires it (``OpenAIRequestOptions.reasoning_field``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any, Final, Literal, TypeAlias, final

import attrs
import httpx

from trioloop.protocol.events import (
    StopReason,
)
from trioloop.protocol.messages import (
    Message,
    ProviderBlock,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
    ToolResultBlock,
)
from trioloop.protocol.preflight import MODEL_TABLE, ModelCapabilities
from trioloop.protocol.tools import ChatRequest
from trioloop.providers._openai_stream import (
    DETAILS_KIND,
    OPENAI_BLOCK_WIRE,
    REASONING_FIELDS,
    OpenAIStreamMapper,
)
from trioloop.providers.base import (
    ErrorBody,
    WireResponse,
    arguments_json,
    decode_json_object,
    split_text,
    text_or_empty,
)
from trioloop.providers.retry import DEFAULT_RETRY_POLICY, RetryNotice, RetryPolicy
from trioloop.providers.transport import (
    DEFAULT_MAX_RESPONSE_BYTES,
    DEFAULT_READ_TIMEOUT,
    HttpChatProvider,
)

__all__ = [
    "OPENAI_WIRE",
    "OpenAIProvider",
    "OpenAIRequestOptions",
    "OpenAIStreamMapper",
    "OpenAIWire",
    "build_openai_body",
    "render_openai_stream",
]

_WIRE_FINISH_REASONS: Final[Mapping[StopReason, str]] = {
    StopReason.END_TURN: "stop",
    StopReason.TOOL_USE: "tool_calls",
    StopReason.MAX_TOKENS: "length",
    StopReason.STOP_SEQUENCE: "stop",  # Chat Completions does not distinguish a stop sequence
    StopReason.REFUSAL: "content_filter",
    StopReason.PAUSE_TURN: "function_call",  # Chat Completions has no paused turn: read back as other
    StopReason.OTHER: "function_call",
}
_WIRE_NAME: Final = OPENAI_BLOCK_WIRE


_ERROR_KINDS: Final[Mapping[int, tuple[str, str]]] = {
    400: ("invalid_request_error", "invalid_request"),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", "unsupported_country_region_territory"),
    404: ("invalid_request_error", "model_not_found"),
    429: ("requests", "rate_limit_exceeded"),
}


def _messages_to_wire(message: Message, options: OpenAIRequestOptions) -> list[dict[str, Any]]:
    text = "".join(b.text for b in message.content if isinstance(b, TextBlock))
    if message.role == "assistant":
        calls = [b for b in message.content if isinstance(b, ToolCallBlock)]
        # OpenAI's rule for a message with tool calls: content is text or null, the ids are the calls' own.
        wire: dict[str, Any] = {"role": "assistant", "content": text if text or not calls else None}
        if calls:
            wire["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": arguments_json(c.input)}}
                for c in calls
            ]
            # Reasoning goes back only beside tool calls: DeepSeek and Moonshot require it exactly there and
            # ignore it elsewhere, and no server documents a use for it on a plain answer.
            wire.update(_reasoning_to_wire(message, options))
        return [wire]
    results = [b for b in message.content if isinstance(b, ToolResultBlock)]
    out: list[dict[str, Any]] = [{"role": "tool", "tool_call_id": r.call_id, "content": r.content} for r in results]
    if text or not results:
        out.append({"role": "user", "content": text})
    return out


def _reasoning_to_wire(message: Message, options: OpenAIRequestOptions) -> dict[str, Any]:
    """The reasoning fields ``options`` sends back on an assistant message with tool calls.

    Only unsigned thinking that names its source was streamed by a compatible server; Anthropic's signed
    blocks never go to this wire. With ``"auto"`` each block goes back in the field it came in (typed
    content parts, which have no field of their own, stay out); with a name, all of it goes in that field.
    """
    fields: dict[str, Any] = {}
    name = options.reasoning_field
    if name is not None:
        for block in message.content:
            if not isinstance(block, ThinkingBlock) or block.signature or not block.source or not block.thinking:
                continue
            if name != _AUTO:
                field = name
            elif block.source in REASONING_FIELDS:
                field = block.source
            else:
                continue
            fields[field] = fields.get(field, "") + block.thinking
    if options.reasoning_details:
        details: list[Any] = []
        for block in message.content:
            if isinstance(block, ProviderBlock) and block.wire == _WIRE_NAME and block.kind == DETAILS_KIND:
                value = decode_json_object(block.data)
                items = value.get(DETAILS_KIND) if value is not None else None
                details.extend(items if isinstance(items, list) else ())
        if details:
            fields[DETAILS_KIND] = details
    return fields


MaxTokensField: TypeAlias = Literal["max_completion_tokens", "max_tokens"]
AuthHeader: TypeAlias = Literal["bearer", "api-key"]

_AUTO: Final = "auto"
_FIELD_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
# Fields of an assistant message the body already sets: a reasoning field may never overwrite one.
_MESSAGE_FIELDS: Final = frozenset(
    {"role", "content", "tool_calls", "name", "refusal", "audio", "function_call", "tool_call_id", DETAILS_KIND}
)


def _reasoning_field(instance: object, attribute: attrs.Attribute[str | None], value: object) -> None:
    if value is None:
        return
    if not isinstance(value, str) or not _FIELD_NAME.fullmatch(value) or value in _MESSAGE_FIELDS:
        raise ValueError(f"{attribute.name} must be None, 'auto' or a free message field name, got {value!r}")


@final
@attrs.frozen(kw_only=True)
class OpenAIRequestOptions:
    """The request fields that vary between OpenAI-compatible servers; ``for_base_url`` picks defaults.

    ``max_tokens_field`` names the output cap (None sends none: the server's default applies);
    ``include_usage`` sends ``stream_options.include_usage``; ``auth`` is ``Authorization: Bearer``
    or Azure's ``api-key`` header.

    ``reasoning_field`` is the assistant-message field that carries the model's reasoning back on a message
    with tool calls: None sends none, ``"auto"`` the field the server streamed it in, any other name that
    field. ``reasoning_details`` sends OpenRouter's ``reasoning_details`` back on the same messages. A
    server that must not get a field it does not know (OpenAI, Groq) gets neither. What the servers read:
    DeepSeek and Moonshot ``reasoning_content`` (a tool loop's next request is refused without it),
    OpenRouter ``reasoning`` and ``reasoning_details``, Ollama ``reasoning``; of the servers a URL cannot
    name, vLLM reads ``reasoning`` since its interleaved-thinking change (PR #28531; ``"auto"`` also suits
    older builds, which stream ``reasoning_content``) and llama.cpp ``reasoning_content`` since its PR #18994
    (earlier builds refuse the field), LM Studio documents none.
    """

    max_tokens_field: MaxTokensField | None = "max_completion_tokens"
    include_usage: bool = True
    auth: AuthHeader = "bearer"
    reasoning_field: str | None = attrs.field(default=None, validator=_reasoning_field)
    reasoning_details: bool = False

    @classmethod
    def for_base_url(cls, base_url: str | None) -> OpenAIRequestOptions:
        """The fields each known server takes, recognized by its host (or Ollama's port); an explicit
        ``OpenAIRequestOptions`` always overrides this.

        OpenAI and Azure OpenAI take the current fields; any other server gets the classic ``max_tokens``:
        vLLM before 0.6, llama.cpp, LiteLLM and several gateways reject or ignore ``max_completion_tokens``,
        and every one of them reads ``max_tokens``. Reasoning goes back where the server's docs ask for it:
        DeepSeek's thinking mode (on by default) and Moonshot's Kimi thinking models answer a tool loop's
        next request with HTTP 400 unless each assistant message with tool calls carries its
        ``reasoning_content``; OpenRouter reads ``reasoning`` and needs ``reasoning_details`` back for
        Gemini's and Anthropic's signed reasoning; Ollama reads ``reasoning``. Groq refuses a message field
        it does not know ("property 'reasoning_content' is unsupported"), so like any other server it gets
        none.
        """
        url = base_url or OpenAIWire.default_base_url
        host = _host(url)
        if host == "api.openai.com":
            return cls()
        if host.endswith(".openai.azure.com") or host.endswith(".cognitiveservices.azure.com"):
            return cls(auth="api-key")
        if host in _REASONING_CONTENT_HOSTS:
            return cls(max_tokens_field="max_tokens", reasoning_field="reasoning_content")
        if host == "openrouter.ai":
            return cls(max_tokens_field="max_tokens", reasoning_field="reasoning", reasoning_details=True)
        if host == "ollama.com" or _port(url) == _OLLAMA_PORT:
            return cls(max_tokens_field="max_tokens", reasoning_field="reasoning")
        return cls(max_tokens_field="max_tokens")


# DeepSeek (api-docs.deepseek.com, "Thinking Mode": tool calls) and Moonshot's two regions
# (platform.moonshot.ai, "Using thinking models").
_REASONING_CONTENT_HOSTS: Final = frozenset({"api.deepseek.com", "api.moonshot.ai", "api.moonshot.cn"})
_OLLAMA_PORT: Final = 11434  # Ollama's documented default (http://localhost:11434/v1)


def _host(url: str) -> str:
    try:
        return httpx.URL(url).host.lower()
    except (httpx.InvalidURL, TypeError, ValueError):
        return ""


def _port(url: str) -> int | None:
    try:
        return httpx.URL(url).port
    except (httpx.InvalidURL, TypeError, ValueError):
        return None


def build_openai_body(request: ChatRequest, options: OpenAIRequestOptions | None = None) -> dict[str, Any]:
    """The Chat Completions request: leading system message, tool_calls, role "tool" results, usage on."""
    options = options or OpenAIRequestOptions()
    messages: list[dict[str, Any]] = []
    if request.system:
        messages.append({"role": "system", "content": request.system})
    for message in request.messages:
        messages.extend(_messages_to_wire(message, options))
    body: dict[str, Any] = {"model": request.model}
    if options.max_tokens_field is not None:
        body[options.max_tokens_field] = request.max_tokens
    body["messages"] = messages
    body["stream"] = True
    if options.include_usage:
        body["stream_options"] = {"include_usage": True}
    if request.tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {"name": t.name, "description": t.description, "parameters": dict(t.json_schema)},
            }
            for t in request.tools
        ]
        if request.tool_choice == "required":
            body["tool_choice"] = "required"
    return body


def _data(payload: Mapping[str, Any]) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'), ensure_ascii=False)}\n\n"


def render_openai_stream(response: WireResponse) -> bytes:
    """``response`` as Chat Completions would stream it with ``stream_options.include_usage``."""

    def chunk(delta: Mapping[str, Any], finish: str | None = None) -> str:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return _data(
            {
                "id": "chatcmpl-scripted",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": response.model,
                "choices": [choice],
            }
        )

    parts = [chunk({"role": "assistant", "content": ""})]
    for piece in split_text(response.text, response.text_piece):
        parts.append(chunk({"content": piece}))
    if response.error_type is not None:
        error = {"message": response.error_message, "type": response.error_type, "param": None, "code": None}
        parts.append(_data({"error": error}))
        return "".join(parts).encode()
    for index, call in enumerate(response.tool_calls):
        first = {"index": index, "id": call.id, "type": "function", "function": {"name": call.name, "arguments": ""}}
        parts.append(chunk({"tool_calls": [first]}))
        for piece in split_text(arguments_json(call.input), response.arguments_piece):
            parts.append(chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}))
    parts.append(chunk({}, _WIRE_FINISH_REASONS[response.stop_reason]))
    usage = {
        "prompt_tokens": response.input_tokens,
        "completion_tokens": response.output_tokens,
        "total_tokens": response.input_tokens + response.output_tokens,
    }
    parts.append(
        _data(
            {
                "id": "chatcmpl-scripted",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": response.model,
                "choices": [],
                "usage": usage,
            }
        )
    )
    parts.append("data: [DONE]\n\n")
    return "".join(parts).encode()


@final
class OpenAIWire:
    """The ``WireFormat`` for OpenAI Chat Completions."""

    name: Final = "openai"
    env_var: Final = "OPENAI_API_KEY"
    default_base_url: Final = "https://api.openai.com/v1"
    endpoint: Final = "/chat/completions"
    models_endpoint: Final = "/models"

    def __init__(self, options: OpenAIRequestOptions | None = None) -> None:
        self.options = options or OpenAIRequestOptions()

    def auth_headers(self, api_key: str) -> dict[str, str]:
        if self.options.auth == "api-key":
            return {"api-key": api_key}
        return {"authorization": f"Bearer {api_key}"}

    def build_body(self, request: ChatRequest) -> dict[str, Any]:
        return build_openai_body(request, self.options)

    def new_mapper(self, *, scrub: Callable[[str], str] | None = None) -> OpenAIStreamMapper:
        return OpenAIStreamMapper(scrub=scrub)

    def describe_error_body(self, body: bytes) -> ErrorBody:
        payload = decode_json_object(body.decode("utf-8", errors="replace"))
        error = payload.get("error") if payload is not None else None
        if isinstance(error, dict):
            message, code, kind = (
                text_or_empty(error.get("message")),
                text_or_empty(error.get("code")),
                text_or_empty(error.get("type")),
            )
            label = ": ".join(part for part in (code or kind, message) if part)
            return ErrorBody(detail=label, context_overflow=code == "context_length_exceeded")
        return ErrorBody(detail=body.decode("utf-8", errors="replace"))

    def render_stream(self, response: WireResponse) -> bytes:
        return render_openai_stream(response)

    def render_error_body(self, status: int, message: str) -> bytes:
        kind, code = _ERROR_KINDS.get(status, ("server_error", "server_error"))
        return json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}}).encode()


OPENAI_WIRE: Final = OpenAIWire()


@final
class OpenAIProvider(HttpChatProvider):
    """Streams from OpenAI Chat Completions; the key comes from ``api_key`` or ``OPENAI_API_KEY``."""

    def __init__(
        self,
        api_key: str | None = None,
        *,
        base_url: str | None = None,
        client: httpx.AsyncClient | None = None,
        read_timeout: float = DEFAULT_READ_TIMEOUT,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        retry: RetryPolicy | None = DEFAULT_RETRY_POLICY,
        model_table: Mapping[str, ModelCapabilities] = MODEL_TABLE,
        options: OpenAIRequestOptions | None = None,
        on_retry: Callable[[RetryNotice], None] | None = None,
    ) -> None:
        """``options`` overrides the request fields ``OpenAIRequestOptions.for_base_url`` picks."""
        super().__init__(
            OpenAIWire(options or OpenAIRequestOptions.for_base_url(base_url)),
            api_key=api_key,
            base_url=base_url,
            client=client,
            read_timeout=read_timeout,
            max_response_bytes=max_response_bytes,
            retry=retry,
            model_table=model_table,
            on_retry=on_retry,
        )
