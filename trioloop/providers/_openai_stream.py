"""The OpenAI Chat Completions stream, sans-IO: SSE chunks in, ``StreamEvent``s out, never raising.

Tool calls arrive as fragments keyed by ``index``; a call is complete when the index moves on or
``finish_reason`` arrives, which gives the same event order Anthropic's content blocks give. ``data: [DONE]``
ends the stream. Reasoning that compatible servers stream beside the answer (``reasoning_content``,
``reasoning``) is kept as an unsigned ``ThinkingBlock`` naming its field, and OpenRouter's
``reasoning_details`` as a ``ProviderBlock``. The request half, the wire and the provider are ``openai.py``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, Final, final

import attrs

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
from trioloop.protocol.messages import ProviderBlock, ThinkingBlock
from trioloop.providers.base import (
    Messages,
    NoticeFolder,
    arguments_json,
    compact_json,
    decode_json_object,
    effective_stop,
    finish_tool_call,
    no_scrub,
    non_negative_int,
    notice,
    text_or_empty,
    unreadable_call,
)
from trioloop.providers.sse import SseFrame

__all__ = [
    "CONTENT_PARTS_SOURCE",
    "DETAILS_KIND",
    "OPENAI_BLOCK_WIRE",
    "REASONING_FIELDS",
    "OpenAIStreamMapper",
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


REASONING_FIELDS: Final = ("reasoning_content", "reasoning")
_REASONING_PARTS: Final = frozenset({"thinking", "reasoning"})
# The source of reasoning streamed as typed parts of ``content`` (Mistral): never a field to send back.
CONTENT_PARTS_SOURCE: Final = "content"
OPENAI_BLOCK_WIRE: Final = "openai"
_WIRE_NAME: Final = OPENAI_BLOCK_WIRE
# OpenRouter's structured reasoning: signed or encrypted blocks that go back verbatim (a ProviderBlock).
DETAILS_KIND: Final = "reasoning_details"
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
        kind = text_or_empty(part.get("type"))  # a hostile type may be a list: never hashed as it is
        if kind == "text":
            answer.append(text_or_empty(part.get("text")))
        elif kind in _REASONING_PARTS:
            inner = part.get(kind)
            if isinstance(inner, str):
                reasoning.append(inner)
            elif isinstance(inner, list) and depth < _PART_DEPTH:  # hostile nesting stops here
                reasoning.append(_parts_text(inner, reasoning, depth + 1))
            else:
                reasoning.append(text_or_empty(part.get("text")))
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
        self._scrub = scrub or no_scrub
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
            self._model = text_or_empty(payload.get("model"))
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
        for field in REASONING_FIELDS:
            text = text_or_empty(delta.get(field))
            if text and all(text != seen for _, seen in pieces):
                pieces.append((field, text))
        if isinstance(content, list):
            parts: list[str] = []
            content = _parts_text(content, parts)
            if any(parts):
                pieces.append((CONTENT_PARTS_SOURCE, "".join(parts)))
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
        details = delta.get(DETAILS_KIND)
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
            slot_key = (text_or_empty(item.get("type")), index) if index is not None else None
            slot = self._detail_slots.get(slot_key) if slot_key is not None else None
            if slot is None:
                if slot_key is not None:
                    self._detail_slots[slot_key] = len(self._details)
                self._details.append(dict(item))
                continue
            merged = self._details[slot]
            for key, value in item.items():
                if key in _DETAIL_TEXT_KEYS and isinstance(value, str):
                    merged[key] = text_or_empty(merged.get(key)) + value
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
            arguments = arguments_json(arguments)  # some servers send the arguments as an object
        elif arguments is not None and not isinstance(arguments, str):
            raise _Undecodable
        arguments = arguments or ""
        call_id, name = text_or_empty(fragment.get("id")), text_or_empty(function.get("name"))
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
            data = compact_json({DETAILS_KIND: self._details})
            if data is None:
                out.append(notice(Messages.UNDECODABLE_EVENT, DETAILS_KIND))
            else:
                out.append(ProviderBlockComplete(block=ProviderBlock(wire=_WIRE_NAME, kind=DETAILS_KIND, data=data)))
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
            kind, code, message = (
                text_or_empty(error.get("type")),
                text_or_empty(error.get("code")),
                text_or_empty(error.get("message")),
            )
        else:
            kind, code, message = "", "", text_or_empty(error)
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


def _fragment_text(fragment: Any) -> str:
    try:
        return json.dumps(fragment, ensure_ascii=False)[:200]
    except (TypeError, ValueError):
        return ""
