"""The OpenAI Chat Completions wire shape: request body, auth header, chunk mapping, error bodies.

This and ``anthropic.py`` are the only modules that know a provider's JSON. Tool calls arrive as
fragments keyed by ``index``; a call is complete when the index moves on or ``finish_reason`` arrives,
which gives the same event order Anthropic's content blocks give. ``data: [DONE]`` ends the stream.
Reasoning that compatible servers stream beside the answer (``reasoning_content``, ``reasoning``) is
kept as an unsigned ``ThinkingBlock`` naming its field, and OpenRouter's ``reasoning_details`` as a
``ProviderBlock``, so a server that needs them back on the next request of a tool loop gets them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any, Final, Literal, TypeAlias, final

import attrs
import httpx

from trioloop.protocol.errors import ProtocolErrorCode
from trioloop.protocol.events import (
    MessageStart,
    MessageStop,
    ProviderBlockComplete,
    StopReason,
    StreamError,
    StreamEvent,
    TextDelta,
    ThinkingComplete,
    ThinkingDelta,
    ToolCallInputDelta,
    ToolCallStart,
    Usage,
    is_terminal,
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
from trioloop.providers.base import (
    ErrorBody,
    Messages,
    NoticeFolder,
    WireResponse,
    decode_json_object,
    effective_stop,
    finish_tool_call,
    non_negative_int,
    notice,
    split_text,
    unreadable_call,
)
from trioloop.providers.retry import DEFAULT_RETRY_POLICY, RetryNotice, RetryPolicy
from trioloop.providers.sse import SseFrame
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

_FINISH_REASONS: Final[Mapping[str, StopReason]] = {
    "stop": StopReason.END_TURN,
    "tool_calls": StopReason.TOOL_USE,
    "length": StopReason.MAX_TOKENS,
    "content_filter": StopReason.REFUSAL,
    "model_length": StopReason.MAX_TOKENS,  # Mistral: the model's context window, not max_tokens, ran out
    "eos_token": StopReason.END_TURN,  # TGI before its PR #2344: the model's own end-of-sequence token
    "stop_sequence": StopReason.STOP_SEQUENCE,  # TGI: one of the request's stop sequences
}
# Finish reasons that say the answer broke off: a failure, never a short success. OpenRouter and Mistral end
# a response that failed mid-stream with "error"; DeepSeek ends one it cut for lack of capacity with
# "insufficient_system_resource" (its API docs), which is a temporary server error.
_FAILED_FINISH_REASONS: Final[Mapping[str, str]] = {
    "error": Messages.STREAM_PROVIDER_ERROR,
    "insufficient_system_resource": Messages.SERVER_ERROR,
}
_WIRE_FINISH_REASONS: Final[Mapping[StopReason, str]] = {
    StopReason.END_TURN: "stop",
    StopReason.TOOL_USE: "tool_calls",
    StopReason.MAX_TOKENS: "length",
    StopReason.STOP_SEQUENCE: "stop",  # Chat Completions does not distinguish a stop sequence
    StopReason.REFUSAL: "content_filter",
    StopReason.PAUSE_TURN: "function_call",  # Chat Completions has no paused turn: read back as other
    StopReason.OTHER: "function_call",
}
_ERROR_KINDS: Final[Mapping[int, tuple[str, str]]] = {
    400: ("invalid_request_error", "invalid_request"),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", "unsupported_country_region_territory"),
    404: ("invalid_request_error", "model_not_found"),
    429: ("requests", "rate_limit_exceeded"),
}


def _identity(text: str) -> str:
    return text


class _Undecodable(Exception):
    """A chunk whose JSON does not have the documented shape."""


@attrs.define
class _OpenCall:
    """The call now streaming; ``runnable`` is false for one that named no function (already reported)."""

    key: int | str
    id: str
    name: str
    runnable: bool = True
    fragments: list[str] = attrs.field(factory=list)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


_REASONING_FIELDS: Final = ("reasoning_content", "reasoning")
_REASONING_PARTS: Final = frozenset({"thinking", "reasoning"})
# The source of reasoning streamed as typed parts of ``content`` (Mistral): never a field to send back.
_CONTENT_PARTS_SOURCE: Final = "content"
_WIRE_NAME: Final = "openai"
# OpenRouter's structured reasoning: signed or encrypted blocks that go back verbatim (a ProviderBlock).
_DETAILS_KIND: Final = "reasoning_details"
# Fragments of one streamed detail (same type and index) are joined: text pieces are concatenated, the
# signature arrives alone in a last fragment (reported in agno-agi/agno#8794, langchain-ai/langchain#36401).
_DETAIL_TEXT_KEYS: Final = ("text", "summary", "data")


_PART_DEPTH: Final = 4


def _parts_text(parts: list[Any], reasoning: list[str], depth: int = 0) -> str:
    """The answer text of a list-typed ``content``; reasoning parts go to ``reasoning`` instead.

    Mistral's reasoning models stream ``[{"type": "thinking", "thinking": [{"type": "text", ...}]},
    {"type": "text", "text": ...}]``; parts of any other type carry no answer text and are skipped.
    """
    answer: list[str] = []
    for part in parts:
        if isinstance(part, str):
            answer.append(part)
            continue
        if not isinstance(part, dict):
            raise _Undecodable
        kind = _text(part.get("type"))  # a hostile type may be a list: never hashed as it is
        if kind == "text":
            answer.append(_text(part.get("text")))
        elif kind in _REASONING_PARTS:
            inner = part.get(kind)
            if isinstance(inner, str):
                reasoning.append(inner)
            elif isinstance(inner, list) and depth < _PART_DEPTH:  # hostile nesting stops here
                reasoning.append(_parts_text(inner, reasoning, depth + 1))
            else:
                reasoning.append(_text(part.get("text")))
    return "".join(answer)


@final
class OpenAIStreamMapper:
    """Maps Chat Completions stream chunks onto ``StreamEvent``s; one instance per response.

    Read liberally, as real servers stream: a call is keyed by its ``index``, else by its ``id``, else
    it continues the open call; a new ``id`` with a function name at the open call's index starts a new
    call (Ollama reuses index 0), a new ``id`` without one continues it (LM Studio sends a fresh id with
    every fragment); a fragment with a name that does not continue the open call always starts a call,
    under an id of our own when the server sent none (the reducer answers an id repeated in the response
    as a duplicate, never runs it twice); a response that completed a call asks for tools whatever its
    finish reason says (the call still needs approval like any other); end of body after a finish reason
    completes the stream. Each uninterrupted run of reasoning becomes one ``ThinkingComplete`` when the
    answer, a call or the end follows it (every documented server streams all reasoning first, so that is
    one block per response).
    """

    def __init__(self, *, scrub: Callable[[str], str] | None = None) -> None:
        self._scrub = scrub or _identity
        self._started = False
        self._done = False
        self._model = ""
        self._stop: StopReason | None = None
        self._open: _OpenCall | None = None
        self._used_keys: set[int | str] = set()
        self._used_ids: set[str] = set()
        self._completed_calls = 0
        self._refused = False
        self._thinking: list[str] = []
        self._thinking_source = ""
        self._details: list[dict[str, Any]] = []
        self._detail_slots: dict[tuple[str, int], int] = {}
        self._folder = NoticeFolder()

    @property
    def done(self) -> bool:
        return self._done

    def feed(self, frame: SseFrame) -> list[StreamEvent]:
        if self._done:
            return []
        if frame.data.strip() == "[DONE]":
            return self._folder.admit(self._end())
        payload = decode_json_object(frame.data)
        if payload is None:
            # An event the body ended inside is a cut frame, not a bad one: finish() decides the outcome.
            return (
                []
                if frame.at_eof
                else self._folder.admit([notice(Messages.UNDECODABLE_EVENT, self._scrub(frame.data))])
            )
        error = payload.get("error")
        if error is not None:
            return [self._error(error)]
        out: list[StreamEvent] = []
        try:
            self._chunk(payload, out)
        except _Undecodable:
            out.append(notice(Messages.UNDECODABLE_EVENT, self._scrub(frame.data)))
        if not self._started and any(not is_terminal(event) for event in out):
            self._started = True
            out.insert(0, MessageStart(model=self._model))
        return self._folder.admit(out)

    def finish(self) -> list[StreamEvent]:
        """End of body: a finish reason already seen completes the stream (no ``[DONE]`` needed)."""
        if self._done:
            return []
        if self._stop is not None:
            return self._folder.admit(self._end())
        self._done = True
        return self._folder.admit(
            [StreamError(code=ProtocolErrorCode.MALFORMED_STREAM, message=Messages.INCOMPLETE_STREAM)]
        )

    def _chunk(self, payload: Mapping[str, Any], out: list[StreamEvent]) -> None:
        if not self._model:
            # Azure's first chunk (prompt filter results) has no model: take it from the first chunk with one.
            self._model = _text(payload.get("model"))
        choices = payload.get("choices")
        usage = payload.get("usage")
        if (choices is not None and not isinstance(choices, list)) or (
            usage is not None and not isinstance(usage, dict)
        ):
            raise _Undecodable
        choice = next((c for c in choices or () if isinstance(c, dict) and c.get("index", 0) == 0), None)
        if choice is not None:
            delta = choice.get("delta")
            if delta is not None and not isinstance(delta, dict):
                raise _Undecodable
            if delta:
                self._delta(delta, out)
            reason = choice.get("finish_reason")
            if isinstance(reason, str) and reason:
                failure = _FAILED_FINISH_REASONS.get(reason)
                if failure is not None:
                    out.append(self._broken_off(failure, reason))
                    return
                self._start(out)
                self._close_open_call(out)
                self._close_thinking(out)
                self._stop = _FINISH_REASONS.get(reason, StopReason.OTHER)
                if self._refused and self._stop is StopReason.END_TURN:
                    self._stop = StopReason.REFUSAL
            if usage is None and isinstance(choice.get("usage"), dict):
                usage = choice["usage"]  # Moonshot puts the usage in the last chunk's choice
        if usage is None:
            extension = payload.get("x_groq")  # Groq: the usage rides in x_groq on the finishing chunk
            if isinstance(extension, dict) and isinstance(extension.get("usage"), dict):
                usage = extension["usage"]
        if isinstance(usage, dict):
            self._start(out)
            out.append(_usage(usage))

    def _delta(self, delta: Mapping[str, Any], out: list[StreamEvent]) -> None:
        content = delta.get("content")
        if type(content) is str and len(delta) == 1:  # the common chunk: answer text and nothing else
            if content:
                if not self._started:
                    self._start(out)
                if self._thinking:
                    self._close_thinking(out)
                out.append(TextDelta(text=content))
            return
        # (field, text) pairs. A server in transition (vLLM renaming reasoning_content to reasoning) may
        # send both fields with the same text: it is read once.
        pieces: list[tuple[str, str]] = []
        for field in _REASONING_FIELDS:
            text = _text(delta.get(field))
            if text and all(text != seen for _, seen in pieces):
                pieces.append((field, text))
        if isinstance(content, list):
            parts: list[str] = []
            content = _parts_text(content, parts)
            if any(parts):
                pieces.append((_CONTENT_PARTS_SOURCE, "".join(parts)))
        elif content is not None and not isinstance(content, str):
            raise _Undecodable
        thinking = "".join(text for _, text in pieces)
        if thinking:
            self._start(out)
            if not self._thinking:
                self._thinking_source = pieces[0][0]
            self._thinking.append(thinking)
            out.append(ThinkingDelta(text=thinking))
        if content:
            self._start(out)
            self._close_thinking(out)
            out.append(TextDelta(text=content))
        refusal = delta.get("refusal")
        if refusal is not None and not isinstance(refusal, str):
            raise _Undecodable
        if refusal:
            # A refusal streams in its own field; it reads like Anthropic's refusal text + stop reason.
            self._refused = True
            self._start(out)
            self._close_thinking(out)
            out.append(TextDelta(text=refusal))
        details = delta.get(_DETAILS_KIND)
        if details is not None:
            self._detail_fragments(details, out)
        fragments = delta.get("tool_calls")
        if fragments is not None and not isinstance(fragments, list):
            raise _Undecodable
        for fragment in fragments or ():
            try:
                self._fragment(fragment, out)
            except _Undecodable:
                # One bad fragment costs that fragment, not the rest of the chunk.
                out.append(notice(Messages.UNDECODABLE_EVENT, self._scrub(_fragment_text(fragment))))

    def _detail_fragments(self, details: Any, out: list[StreamEvent]) -> None:
        """OpenRouter's ``reasoning_details``: fragments sharing a type and an ``index`` make one detail."""
        if not isinstance(details, list):
            out.append(notice(Messages.UNDECODABLE_EVENT, self._scrub(_fragment_text(details))))
            return
        for item in details:
            if not isinstance(item, dict):
                out.append(notice(Messages.UNDECODABLE_EVENT, self._scrub(_fragment_text(item))))
                continue
            index = non_negative_int(item.get("index"))
            slot_key = (_text(item.get("type")), index) if index is not None else None
            slot = self._detail_slots.get(slot_key) if slot_key is not None else None
            if slot is None:
                if slot_key is not None:
                    self._detail_slots[slot_key] = len(self._details)
                self._details.append(dict(item))
                continue
            merged = self._details[slot]
            for key, value in item.items():
                if key in _DETAIL_TEXT_KEYS and isinstance(value, str):
                    merged[key] = _text(merged.get(key)) + value
                elif key == "signature" and isinstance(value, str) and value:
                    merged[key] = value  # sent whole, in the last fragment
                elif merged.get(key) is None:
                    merged[key] = value

    def _fragment(self, fragment: Any, out: list[StreamEvent]) -> None:
        if not isinstance(fragment, dict):
            raise _Undecodable
        function = fragment.get("function")
        if function is None:
            function = {}
        if not isinstance(function, dict):
            raise _Undecodable
        arguments = function.get("arguments")
        if isinstance(arguments, dict):
            arguments = _arguments(arguments)  # some servers send the arguments as an object
        elif arguments is not None and not isinstance(arguments, str):
            raise _Undecodable
        arguments = arguments or ""
        call_id, name = _text(fragment.get("id")), _text(function.get("name"))
        raw_index = fragment.get("index")
        index = non_negative_int(raw_index)
        if raw_index is not None and index is None:
            raise _Undecodable
        current = self._open
        if current is not None and _continues(current, index, call_id, name):
            if arguments and current.runnable:
                current.fragments.append(arguments)
                out.append(ToolCallInputDelta(id=current.id, partial_json=arguments))
            return
        # Which call does this fragment belong to: the index, else the id, else its place in the order.
        key: int | str = index if index is not None else (call_id or f"#order{len(self._used_keys)}")
        if not name and key in self._used_keys:
            # Arguments for a call that already completed: they cannot join it any more.
            if arguments:
                out.append(notice(Messages.ORPHAN_ARGUMENTS, self._scrub(arguments) or None))
            return
        self._start(out)
        self._close_open_call(out)
        self._close_thinking(out)
        self._used_keys.add(key)
        if not name:
            # A call that names no function cannot be answered as one: reported once, the rest of it ignored.
            self._open = _OpenCall(key, call_id, "", runnable=False)
            out.append(notice(Messages.ORPHAN_ARGUMENTS, self._scrub(arguments) or None))
            return
        call_id = call_id or self._own_id(index)
        self._used_ids.add(call_id)
        self._open = _OpenCall(key, call_id, name)
        out.append(ToolCallStart(id=call_id, name=name))
        if arguments:
            self._open.fragments.append(arguments)
            out.append(ToolCallInputDelta(id=call_id, partial_json=arguments))

    def _own_id(self, index: int | None) -> str:
        """An id for a call the server sent none for (SGLang past index 0, StepFun, Gemini's and LM Studio's
        empty ids), unused in this response; the reducer renames it if the session already has it."""
        base = f"call_{index}" if index is not None else f"call_n{len(self._used_keys)}"
        candidate, attempt = base, 0
        while candidate in self._used_ids:
            attempt += 1
            candidate = f"{base}_{attempt}"
        return candidate

    def _close_open_call(self, out: list[StreamEvent]) -> None:
        if self._open is not None:
            call, self._open = self._open, None
            if call.runnable:
                out.append(finish_tool_call(call.id, call.name, call.fragments))
                self._completed_calls += 1

    def _close_thinking(self, out: list[StreamEvent]) -> None:
        """The reasoning streamed since the last close, as one block for the assistant message."""
        if self._thinking:
            text, self._thinking = "".join(self._thinking), []
            out.append(ThinkingComplete(block=ThinkingBlock(thinking=text, source=self._thinking_source)))

    def _start(self, out: list[StreamEvent]) -> None:
        """``MessageStart`` goes out with the first content, so an error before any content can be retried."""
        if not self._started:
            self._started = True
            out.append(MessageStart(model=self._model))

    def _end(self) -> list[StreamEvent]:
        out: list[StreamEvent] = []
        self._start(out)
        if self._open is not None:
            if self._stop is None and self._open.runnable:
                out.append(unreadable_call(self._open.id, self._open.name, Messages.UNFINISHED_CALL))
                self._open = None
            else:
                self._close_open_call(out)
        self._close_thinking(out)
        if self._details:
            data = _compact({_DETAILS_KIND: self._details})
            if data is None:
                out.append(notice(Messages.UNDECODABLE_EVENT, _DETAILS_KIND))
            else:
                out.append(ProviderBlockComplete(block=ProviderBlock(wire=_WIRE_NAME, kind=_DETAILS_KIND, data=data)))
        out.append(MessageStop(stop_reason=effective_stop(self._stop, self._completed_calls)))
        self._done = True
        return out

    def _broken_off(self, message: str, reason: str) -> StreamError:
        """A finish reason that says the answer failed part way: terminal, and retried only before content."""
        self._done = True
        if message == Messages.SERVER_ERROR and self._started:
            message = Messages.STREAM_PROVIDER_ERROR
        return StreamError(code=ProtocolErrorCode.HTTP_STATUS, message=message, provider_detail=self._scrub(reason))

    def _error(self, error: Any) -> StreamError:
        self._done = True
        if isinstance(error, dict):
            kind, code, message = _text(error.get("type")), _text(error.get("code")), _text(error.get("message"))
        else:
            kind, code, message = "", "", _text(error)
        label = f"{kind} {code}"
        rate_limited = "rate_limit" in label or "insufficient_quota" in label
        if rate_limited:
            text = Messages.STREAM_RATE_LIMITED
        elif ("server_error" in label or "overloaded" in label) and not self._started:
            text = Messages.SERVER_ERROR  # before any content, a server error is retried like a 5xx
        else:
            text = Messages.STREAM_PROVIDER_ERROR
        return StreamError(
            code=ProtocolErrorCode.RATE_LIMITED if rate_limited else ProtocolErrorCode.HTTP_STATUS,
            message=text,
            provider_detail=self._scrub(message or code or kind) or None,
        )


def _continues(current: _OpenCall, index: int | None, call_id: str, name: str) -> bool:
    """Whether a fragment continues the open call: the same index, else the same (or no) id.

    A new id together with a function name at the open index is a new call (Ollama numbers every call 0);
    a new id alone is not (LM Studio sends one with every fragment of one call, reported in
    NousResearch/hermes-agent#106943); the same id and name again is the same call (Fireworks and vLLM's
    finishing chunk repeat them, SillyTavern/SillyTavern#5948, vllm-project/vllm#31438).
    """
    same = index == current.key if index is not None else (not call_id or call_id == current.id)
    return same and not (call_id and call_id != current.id and name)


def _usage(usage: Mapping[str, Any]) -> Usage:
    """Token counts from any of the places compatible servers put them.

    Cache reads: ``prompt_tokens_details.cached_tokens`` (OpenAI, OpenRouter), DeepSeek's
    ``prompt_cache_hit_tokens``, Moonshot's top-level ``cached_tokens``; reasoning tokens:
    ``completion_tokens_details.reasoning_tokens``.
    """
    prompt = usage.get("prompt_tokens_details")
    completion = usage.get("completion_tokens_details")
    cached = (
        (non_negative_int(prompt.get("cached_tokens")) if isinstance(prompt, dict) else None)
        or non_negative_int(usage.get("prompt_cache_hit_tokens"))
        or non_negative_int(usage.get("cached_tokens"))
    )
    reasoning = non_negative_int(completion.get("reasoning_tokens")) if isinstance(completion, dict) else None
    return Usage(
        input_tokens=non_negative_int(usage.get("prompt_tokens")) or 0,
        output_tokens=non_negative_int(usage.get("completion_tokens")) or 0,
        cache_read_input_tokens=cached or 0,
        reasoning_tokens=reasoning or 0,
    )


def _compact(value: Any) -> str | None:
    """``value`` as compact JSON, or None when it has no strict JSON form."""
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return None


def _fragment_text(fragment: Any) -> str:
    try:
        return json.dumps(fragment, ensure_ascii=False)[:200]
    except (TypeError, ValueError):
        return ""


def _arguments(value: Any) -> str:
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):
        return "{}"


def _messages_to_wire(message: Message, options: OpenAIRequestOptions) -> list[dict[str, Any]]:
    text = "".join(b.text for b in message.content if isinstance(b, TextBlock))
    if message.role == "assistant":
        calls = [b for b in message.content if isinstance(b, ToolCallBlock)]
        # OpenAI's rule for a message with tool calls: content is text or null, the ids are the calls' own.
        wire: dict[str, Any] = {"role": "assistant", "content": text if text or not calls else None}
        if calls:
            wire["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": _arguments(c.input)}}
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
            elif block.source in _REASONING_FIELDS:
                field = block.source
            else:
                continue
            fields[field] = fields.get(field, "") + block.thinking
    if options.reasoning_details:
        details: list[Any] = []
        for block in message.content:
            if isinstance(block, ProviderBlock) and block.wire == _WIRE_NAME and block.kind == _DETAILS_KIND:
                value = decode_json_object(block.data)
                items = value.get(_DETAILS_KIND) if value is not None else None
                details.extend(items if isinstance(items, list) else ())
        if details:
            fields[_DETAILS_KIND] = details
    return fields


MaxTokensField: TypeAlias = Literal["max_completion_tokens", "max_tokens"]
AuthHeader: TypeAlias = Literal["bearer", "api-key"]

_AUTO: Final = "auto"
_FIELD_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
# Fields of an assistant message the body already sets: a reasoning field may never overwrite one.
_MESSAGE_FIELDS: Final = frozenset(
    {"role", "content", "tool_calls", "name", "refusal", "audio", "function_call", "tool_call_id", _DETAILS_KIND}
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
        for piece in split_text(_arguments(call.input), response.arguments_piece):
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
            message, code, kind = _text(error.get("message")), _text(error.get("code")), _text(error.get("type"))
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
