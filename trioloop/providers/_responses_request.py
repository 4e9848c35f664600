"""The request half of the OpenAI Responses wire: per-server options and the body built from the history.

Stateless by default (``store: false``): every request carries the whole conversation as input items, the
reasoning items of earlier responses included (with their ``encrypted_content``), because a reasoning model
continuing after a tool call is refused or degraded without them. The stream half, and the provider, live in
``openai_responses.py``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal, TypeAlias, final

import attrs
import httpx

from trioloop.protocol.messages import Message, ProviderBlock, TextBlock, ToolCallBlock, ToolResultBlock
from trioloop.protocol.tools import ChatRequest
from trioloop.providers.base import arguments_json, decode_json_object
from trioloop.providers.transport import is_loopback_host

__all__ = [
    "ENCRYPTED_REASONING",
    "REASONING_KIND",
    "RESPONSES_BLOCK_WIRE",
    "RESPONSE_KIND",
    "OpenAIResponsesOptions",
    "build_responses_body",
    "response_marker",
]

RESPONSES_BLOCK_WIRE: Final = "openai-responses"
"""``ProviderBlock.wire`` of the blocks this wire keeps in the history; no other wire receives them."""
REASONING_KIND: Final = "reasoning"
RESPONSE_KIND: Final = "response"
"""A block of our own: the id of a stored response (and the call ids it issued), for ``previous_response_id``."""
ENCRYPTED_REASONING: Final = "reasoning.encrypted_content"
DEFAULT_BASE_URL: Final = "https://api.openai.com/v1"

AuthHeader: TypeAlias = Literal["bearer", "api-key"]
ReasoningEffort: TypeAlias = Literal["minimal", "low", "medium", "high"]
ReasoningSummary: TypeAlias = Literal["auto", "concise", "detailed"]


def _chain_needs_store(inst: OpenAIResponsesOptions, attribute: attrs.Attribute[bool], value: bool) -> None:
    if value and inst.store is not True:
        raise ValueError("previous_response_id needs store=True: the server can only continue a stored response")


@final
@attrs.frozen(kw_only=True)
class OpenAIResponsesOptions:
    """The request fields that vary between servers of ``/responses``; ``for_base_url`` picks defaults.

    ``store`` is sent as it is (None leaves the field out, for a server that rejects it).
    ``previous_response_id`` (opt-in, needs ``store=True``) sends only the items after the last stored
    response of this wire in the history, and that response's id; the response id is kept in the history
    as a ``ProviderBlock`` of kind ``"response"``. ``include_encrypted_reasoning`` asks for
    ``include: ["reasoning.encrypted_content"]``, which is what lets a reasoning item go back when nothing
    is stored. ``send_item_ids`` keeps the ``id`` of the items sent back (stripped by default: with
    ``store: false`` an id is looked up, so OpenAI answers "Item with id 'rs_...' not found" when the
    encrypted content is missing, and Azure even when it is there). ``assistant_text_parts`` sends earlier
    answers as ``output_text`` parts, else as plain string content (a server that validates input items
    against the SDK's full output-message type rejects a part-list message without ``id`` and ``status``).
    ``strict_tools`` is each function tool's ``strict``: sent ``false`` by default, since an omitted
    ``strict`` makes the Responses API force strict mode where the schema allows it (every optional
    parameter then filled in), unlike Chat Completions. ``reasoning_effort`` / ``reasoning_summary`` send
    ``reasoning`` (reasoning models only; a summary is what streams as ``ThinkingDelta``).
    """

    store: bool | None = False
    previous_response_id: bool = attrs.field(default=False, validator=_chain_needs_store)
    include_encrypted_reasoning: bool = True
    send_item_ids: bool = False
    assistant_text_parts: bool = True
    strict_tools: bool = False
    reasoning_effort: ReasoningEffort | None = None
    reasoning_summary: ReasoningSummary | None = None
    auth: AuthHeader = "bearer"

    @classmethod
    def for_base_url(cls, base_url: str | None) -> OpenAIResponsesOptions:
        """Defaults for the server at ``base_url``.

        OpenAI, OpenRouter and other hosted gateways: the defaults. Azure OpenAI (base URL
        ``https://RESOURCE.openai.azure.com/openai/v1``): the ``api-key`` header; with ``store: false`` it
        refuses replayed item ids ("not found"), which the defaults already strip. A server on this machine
        (Ollama, LM Studio, vLLM, llama.cpp) encrypts nothing, and either validates input items against the
        OpenAI SDK's types (vLLM: a reasoning item needs its ``id``, an assistant ``output_text`` part its
        ``annotations``) or ignores what it does not know: no ``include``, item ids kept, answers as plain
        strings. ``previous_response_id`` stays opt-in everywhere: OpenRouter and Ollama are stateless only,
        and vLLM stores nothing unless started with ``VLLM_ENABLE_RESPONSES_API_STORE=1``.
        """
        url = _url(base_url or DEFAULT_BASE_URL)
        host = url.host.lower() if url is not None else ""
        if host.endswith((".openai.azure.com", ".cognitiveservices.azure.com", ".services.ai.azure.com")):
            return cls(auth="api-key")
        if host and is_loopback_host(host):
            return cls(include_encrypted_reasoning=False, send_item_ids=True, assistant_text_parts=False)
        return cls()


def _url(value: str) -> httpx.URL | None:
    try:
        return httpx.URL(value)
    except (httpx.InvalidURL, TypeError, ValueError):
        return None


def response_marker(block: ProviderBlock) -> tuple[str, tuple[str, ...]] | None:
    """The stored response id and the call ids it issued, when ``block`` is this wire's response marker."""
    if block.wire != RESPONSES_BLOCK_WIRE or block.kind != RESPONSE_KIND:
        return None
    data = decode_json_object(block.data)
    if data is None:
        return None
    response_id, call_ids = data.get("id"), data.get("call_ids", [])
    if not isinstance(response_id, str) or not response_id or not isinstance(call_ids, list):
        return None
    if not all(isinstance(call_id, str) for call_id in call_ids):
        return None
    return response_id, tuple(call_ids)


def _chain_point(messages: Sequence[Message]) -> tuple[int, str] | None:
    """The index of the newest assistant message whose response the server stored, and that response's id.

    None when there is none, or when its calls no longer carry the ids the server issued (the turn renamed
    a repeated or empty id): then the server's copy and ours disagree, and the whole history is sent.
    """
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if message.role != "assistant":
            continue
        marker = next(
            (m for m in map(_marker_of, message.content) if m is not None),
            None,
        )
        if marker is None:
            continue
        response_id, issued = marker
        calls = tuple(b.id for b in message.content if isinstance(b, ToolCallBlock))
        return (index, response_id) if calls == issued else None
    return None


def _marker_of(block: object) -> tuple[str, tuple[str, ...]] | None:
    return response_marker(block) if isinstance(block, ProviderBlock) else None


def _provider_item(block: ProviderBlock, options: OpenAIResponsesOptions) -> dict[str, Any] | None:
    """One of this wire's blocks as the input item it came from, or None when it cannot go back.

    A reasoning item goes back only with what makes it usable without a lookup: its ``encrypted_content``
    (OpenAI) or its plain reasoning ``content`` (open models). Without an id to find it by, anything less
    would be rejected or carry nothing.
    """
    if block.wire != RESPONSES_BLOCK_WIRE or block.kind == RESPONSE_KIND:
        return None
    data = decode_json_object(block.data)
    if data is None:
        return None
    item = dict(data)
    if not options.send_item_ids:
        item.pop("id", None)
    if block.kind == REASONING_KIND:
        encrypted, content = item.get("encrypted_content"), item.get("content")
        if not (isinstance(encrypted, str) and encrypted) and not (isinstance(content, list) and content):
            return None
        if not isinstance(item.get("summary"), list):
            item["summary"] = []  # required on input, even when empty
    return item


def _message_items(message: Message, options: OpenAIResponsesOptions) -> list[dict[str, Any]]:
    if message.role == "user":
        results = [b for b in message.content if isinstance(b, ToolResultBlock)]
        items: list[dict[str, Any]] = [
            {"type": "function_call_output", "call_id": r.call_id, "output": r.content} for r in results
        ]
        text = "".join(b.text for b in message.content if isinstance(b, TextBlock))
        if text or not results:
            items.append({"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})
        return items
    items = []
    for block in message.content:
        if isinstance(block, TextBlock):
            if block.text:
                content: str | list[dict[str, Any]] = (
                    [{"type": "output_text", "text": block.text}] if options.assistant_text_parts else block.text
                )
                items.append({"type": "message", "role": "assistant", "content": content})
        elif isinstance(block, ToolCallBlock):
            items.append(
                {
                    "type": "function_call",
                    "call_id": block.id,
                    "name": block.name,
                    "arguments": arguments_json(block.input),
                }
            )
        elif isinstance(block, ProviderBlock):
            item = _provider_item(block, options)
            if item is not None:
                items.append(item)
        # Thinking from another wire cannot be verified here: it stays in the history, not in the request.
    return items


def _reasoning(options: OpenAIResponsesOptions) -> Mapping[str, str] | None:
    fields = {"effort": options.reasoning_effort, "summary": options.reasoning_summary}
    chosen = {k: v for k, v in fields.items() if v is not None}
    return chosen or None


def build_responses_body(request: ChatRequest, options: OpenAIResponsesOptions | None = None) -> dict[str, Any]:
    """The ``POST /responses`` body: ``instructions``, the history as input items, tools, ``stream: true``.

    With ``previous_response_id`` on and a stored response of this wire in the history, only the items after
    that response go, with its id. Instructions and tools are always sent: the API does not carry them over.
    """
    options = options or OpenAIResponsesOptions()
    messages: Sequence[Message] = request.messages
    chained = _chain_point(messages) if options.previous_response_id else None
    if chained is not None:
        messages = messages[chained[0] + 1 :]
    body: dict[str, Any] = {"model": request.model}
    if request.system:
        body["instructions"] = request.system
    body["input"] = [item for message in messages for item in _message_items(message, options)]
    if request.tools:
        body["tools"] = [
            {
                "type": "function",
                "name": tool.name,
                "description": tool.description,
                "parameters": dict(tool.json_schema),
                "strict": options.strict_tools,
            }
            for tool in request.tools
        ]
        if request.tool_choice == "required":
            body["tool_choice"] = "required"
    body["max_output_tokens"] = request.max_tokens
    body["stream"] = True
    if options.store is not None:
        body["store"] = options.store
    if options.include_encrypted_reasoning:
        body["include"] = [ENCRYPTED_REASONING]
    reasoning = _reasoning(options)
    if reasoning is not None:
        body["reasoning"] = dict(reasoning)
    if chained is not None:
        body["previous_response_id"] = chained[1]
    return body
