"""The OpenAI Responses API wire (``POST /responses``): the provider, rendering and error bodies.

Stateless by default: ``store: false``, and every request carries the whole history, reasoning items with
their encrypted content included (``_responses_request.py``). ``previous_response_id`` is the opt-in
alternative. The stream mapping is ``_responses_stream.py`` (the fields its events carry,
``_responses_items.py``); these four are the only modules that know this wire's JSON.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, Final, final

import httpx

from trioloop.protocol.events import StopReason
from trioloop.protocol.preflight import MODEL_TABLE, ModelCapabilities
from trioloop.protocol.tools import ChatRequest
from trioloop.providers._responses_request import (
    DEFAULT_BASE_URL,
    RESPONSES_BLOCK_WIRE,
    OpenAIResponsesOptions,
    build_responses_body,
)
from trioloop.providers._responses_stream import ResponsesStreamMapper
from trioloop.providers.base import (
    ErrorBody,
    WireResponse,
    arguments_json,
    decode_json_object,
    split_text,
    text_or_empty,
)
from trioloop.providers.retry import DEFAULT_RETRY_POLICY, RetryNotice, RetryPolicy
from trioloop.providers.transport import DEFAULT_MAX_RESPONSE_BYTES, DEFAULT_READ_TIMEOUT, HttpChatProvider

__all__ = [
    "RESPONSES_BLOCK_WIRE",
    "RESPONSES_WIRE",
    "OpenAIResponsesOptions",
    "OpenAIResponsesProvider",
    "OpenAIResponsesWire",
    "ResponsesStreamMapper",
    "build_responses_body",
    "render_responses_stream",
]

_ERROR_KINDS: Final[Mapping[int, tuple[str, str]]] = {
    400: ("invalid_request_error", "invalid_request"),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", "unsupported_country_region_territory"),
    404: ("invalid_request_error", "model_not_found"),
    429: ("requests", "rate_limit_exceeded"),
}


def _terminal(response: WireResponse) -> tuple[str, str | None]:
    """The terminal event (and ``incomplete_details.reason``) that ``response``'s stop reason becomes here.

    A refusal ends as content-filtered; a stop sequence is a plain completion (as on Chat Completions); a
    paused turn or any other stop is incomplete for a reason this mapper does not know, which reads as other.
    """
    stop = response.stop_reason
    if stop is StopReason.MAX_TOKENS:
        return "response.incomplete", "max_output_tokens"
    if stop is StopReason.REFUSAL:
        return "response.incomplete", "content_filter"
    if stop in (StopReason.PAUSE_TURN, StopReason.OTHER):
        return "response.incomplete", "other"
    return "response.completed", None


def render_responses_stream(response: WireResponse) -> bytes:
    """``response`` as the Responses API streams it: a message item, then one function-call item per call."""
    events: list[dict[str, Any]] = []

    def emit(kind: str, **fields: Any) -> None:
        events.append({"type": kind, "sequence_number": len(events), **fields})

    shell: dict[str, Any] = {
        "id": "resp_scripted",
        "object": "response",
        "created_at": 0,
        "status": "in_progress",
        "model": response.model,
        "output": [],
        "usage": None,
    }
    emit("response.created", response=shell)
    emit("response.in_progress", response=shell)
    output: list[dict[str, Any]] = []
    if response.text:
        message: dict[str, Any] = {
            "id": "msg_scripted",
            "type": "message",
            "status": "in_progress",
            "role": "assistant",
        }
        place = {"item_id": "msg_scripted", "output_index": 0, "content_index": 0}
        emit("response.output_item.added", output_index=0, item={**message, "content": []})
        emit("response.content_part.added", **place, part={"type": "output_text", "text": "", "annotations": []})
        for piece in split_text(response.text, response.text_piece):
            emit("response.output_text.delta", **place, delta=piece)
        if response.error_type is None:
            part = {"type": "output_text", "text": response.text, "annotations": []}
            emit("response.output_text.done", **place, text=response.text)
            emit("response.content_part.done", **place, part=part)
            message = {**message, "status": "completed", "content": [part]}
            emit("response.output_item.done", output_index=0, item=message)
            output.append(message)
    if response.error_type is not None:
        emit("error", code=response.error_type, message=response.error_message, param=None)
        return _sse(events)
    for call in response.tool_calls:
        index = len(output)
        item: dict[str, Any] = {
            "id": f"fc_scripted_{index}",
            "type": "function_call",
            "status": "in_progress",
            "arguments": "",
            "call_id": call.id,
            "name": call.name,
        }
        emit("response.output_item.added", output_index=index, item=item)
        arguments = arguments_json(call.input)
        for piece in split_text(arguments, response.arguments_piece):
            emit("response.function_call_arguments.delta", item_id=item["id"], output_index=index, delta=piece)
        emit("response.function_call_arguments.done", item_id=item["id"], output_index=index, arguments=arguments)
        item = {**item, "status": "completed", "arguments": arguments}
        emit("response.output_item.done", output_index=index, item=item)
        output.append(item)
    kind, reason = _terminal(response)
    usage = {
        "input_tokens": response.input_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": response.output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": response.input_tokens + response.output_tokens,
    }
    final = {
        **shell,
        "status": "completed" if reason is None else "incomplete",
        "incomplete_details": None if reason is None else {"reason": reason},
        "output": output,
        "usage": usage,
    }
    emit(kind, response=final)
    return _sse(events)


def _sse(events: list[dict[str, Any]]) -> bytes:
    return "".join(
        f"event: {e['type']}\ndata: {json.dumps(e, separators=(',', ':'), ensure_ascii=False)}\n\n" for e in events
    ).encode()


# -- the wire and the provider ----------------------------------------------------------------------------


def _error_text(body: bytes) -> str:
    return body.decode("utf-8", errors="replace")


@final
class OpenAIResponsesWire:
    """The ``WireFormat`` for the OpenAI Responses API.

    ``name`` is the model table's vendor ("openai"): both OpenAI wires serve the same models, with the same
    limits. The blocks it keeps in the history are marked ``RESPONSES_BLOCK_WIRE`` instead.
    """

    name: Final = "openai"
    env_var: Final = "OPENAI_API_KEY"
    default_base_url: Final = DEFAULT_BASE_URL
    endpoint: Final = "/responses"
    models_endpoint: Final = "/models"

    def __init__(self, options: OpenAIResponsesOptions | None = None) -> None:
        self.options = options or OpenAIResponsesOptions()

    def auth_headers(self, api_key: str) -> dict[str, str]:
        if self.options.auth == "api-key":
            return {"api-key": api_key}
        return {"authorization": f"Bearer {api_key}"}

    def build_body(self, request: ChatRequest) -> dict[str, Any]:
        return build_responses_body(request, self.options)

    def new_mapper(self, *, scrub: Callable[[str], str] | None = None) -> ResponsesStreamMapper:
        return ResponsesStreamMapper(scrub=scrub, keep_response_id=self.options.previous_response_id)

    def describe_error_body(self, body: bytes) -> ErrorBody:
        payload = decode_json_object(_error_text(body))
        error = payload.get("error") if payload is not None else None
        if isinstance(error, dict):
            message, code, kind = (
                text_or_empty(error.get("message")),
                text_or_empty(error.get("code")),
                text_or_empty(error.get("type")),
            )
            label = ": ".join(part for part in (code or kind, message) if part)
            return ErrorBody(detail=label, context_overflow=code == "context_length_exceeded")
        return ErrorBody(detail=_error_text(body))

    def render_stream(self, response: WireResponse) -> bytes:
        return render_responses_stream(response)

    def render_error_body(self, status: int, message: str) -> bytes:
        kind, code = _ERROR_KINDS.get(status, ("server_error", "server_error"))
        return json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}}).encode()


RESPONSES_WIRE: Final = OpenAIResponsesWire()


@final
class OpenAIResponsesProvider(HttpChatProvider):
    """Streams from the OpenAI Responses API (``POST {base_url}/responses``); the key comes from ``api_key``
    or ``OPENAI_API_KEY``. Stateless unless ``options`` says otherwise."""

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
        options: OpenAIResponsesOptions | None = None,
        on_retry: Callable[[RetryNotice], None] | None = None,
    ) -> None:
        """``options`` overrides the request fields ``OpenAIResponsesOptions.for_base_url`` picks."""
        super().__init__(
            OpenAIResponsesWire(options or OpenAIResponsesOptions.for_base_url(base_url)),
            api_key=api_key,
            base_url=base_url,
            client=client,
            read_timeout=read_timeout,
            max_response_bytes=max_response_bytes,
            retry=retry,
            model_table=model_table,
            on_retry=on_retry,
        )
