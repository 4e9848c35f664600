"""The Anthropic Messages API stream, sans-IO: SSE frames in, ``StreamEvent``s out, never raising on hostile input.

Blocks are read as the official SDK accumulates them. Blocks the server ran itself (server tools, the MCP
connector, compaction) are kept whole as ``ProviderBlock``s and go back in place; the known types and the
open-block records are in ``_anthropic_blocks.py``, the request half, the wire and the provider in ``anthropic.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, final

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
from trioloop.protocol.messages import JsonValue, ProviderBlock, RedactedThinkingBlock, ThinkingBlock
from trioloop.providers._anthropic_blocks import (
    _DELTA_TARGETS,
    _KNOWN_EVENTS,
    _REQUEST_ONLY,
    _TRANSIENT_ERRORS,
    _WIRE_NAME,
    ANTHROPIC_BLOCK_WIRE,
    BLOCK_NOT_JSON,
    CALLER_MARKER,
    CONTAINER_MARKER,
    SERVER_BLOCKS,
    SERVER_INPUT_UNREADABLE,
    STOP_REASONS,
    _compaction_delta,
    _index,
    _input_tokens,
    _marker,
    _OpenBlock,
    _OpenCall,
    _OpenServer,
    _OpenText,
    _OpenThinking,
    _Undecodable,
)
from trioloop.providers.base import (
    Messages,
    NoticeFolder,
    compact_json,
    decode_json_object,
    effective_stop,
    finish_tool_call,
    loads_strict_json,
    no_scrub,
    non_negative_int,
    notice,
    text_or_empty,
    unreadable_call,
)
from trioloop.providers.sse import SseFrame

__all__ = [
    "ANTHROPIC_BLOCK_WIRE",
    "BLOCK_NOT_JSON",
    "CALLER_MARKER",
    "CONTAINER_MARKER",
    "SERVER_BLOCKS",
    "SERVER_INPUT_UNREADABLE",
    "STOP_REASONS",
    "AnthropicStreamMapper",
]


@final
class AnthropicStreamMapper:
    """Maps Anthropic Messages stream frames onto ``StreamEvent``s; one instance per response.

    Blocks are read as the official SDK accumulates them: blocks already in ``message_start`` come
    first, then one block per ``content_block_start`` at its index, changed by the deltas addressed to
    that index, complete at its ``content_block_stop``. Our tool calls become ``ToolCall*`` events;
    server-side blocks become ``ProviderBlockComplete`` (kept and sent back, never run).
    """

    def __init__(self, *, scrub: Callable[[str], str] | None = None) -> None:
        self._scrub = scrub or no_scrub
        self._started = False
        self._message_seen = False
        self._done = False
        self._input_tokens = 0
        self._stop: StopReason | None = None
        self._open: dict[int, _OpenBlock] = {}
        self._completed_calls = 0
        self._call_ids: set[str] = set()  # every tool_use id of this response, its own or ours
        self._ignored: set[int] = set()
        self._model = ""
        self._cache_read = 0
        self._cache_write = 0
        self._frame = ""
        self._frame_strict: bool | None = None
        self._container: dict[str, str] | None = None
        self._folder = NoticeFolder()

    @property
    def done(self) -> bool:
        return self._done

    def feed(self, frame: SseFrame) -> list[StreamEvent]:
        if self._done or frame.event not in _KNOWN_EVENTS:
            return []
        payload = decode_json_object(frame.data)
        if payload is None:
            if frame.at_eof:  # the body ended inside this event: a cut frame, finish() decides
                return []
            return self._folder.admit([notice(Messages.UNDECODABLE_EVENT, self._scrub(frame.data))])
        kind = frame.event
        if kind == "content_block_delta" and self._started:
            # The event nearly every one of a long answer is: a text delta to the open text block, out as it is.
            delta, index = payload.get("delta"), payload.get("index")
            if type(delta) is dict and type(index) is int and delta.get("type") == "text_delta":
                text = delta.get("text")
                if type(text) is str and type(self._open.get(index)) is _OpenText:
                    return [TextDelta(text=text)] if text else []
        elif kind == "message":
            kind = text_or_empty(payload.get("type"))
        out: list[StreamEvent] = []
        self._frame, self._frame_strict = frame.data, None
        try:
            self._dispatch(kind, payload, out)
        except _Undecodable:
            out.append(notice(Messages.UNDECODABLE_EVENT, self._scrub(frame.data)))
        if not self._started and any(not is_terminal(event) for event in out):
            self._started = True
            out.insert(0, MessageStart(model=self._model))
        return self._folder.admit(out)

    def finish(self) -> list[StreamEvent]:
        """End of body: after a ``message_delta`` with a stop reason the stream is complete; else a failure."""
        if self._done:
            return []
        if self._stop is not None:
            out: list[StreamEvent] = []
            self._dispatch("message_stop", {}, out)
            return self._folder.admit(out)
        self._done = True
        return self._folder.admit(
            [StreamError(code=ProtocolErrorCode.MALFORMED_STREAM, message=Messages.INCOMPLETE_STREAM)]
        )

    def _dispatch(self, kind: str, payload: Mapping[str, Any], out: list[StreamEvent]) -> None:
        if kind == "message_start":
            self._message_start(payload, out)
        elif kind == "content_block_start":
            block = payload.get("content_block")
            if not isinstance(block, dict):
                raise _Undecodable
            self._open_block(_index(payload), block, out)
        elif kind == "content_block_delta":
            self._block_delta(payload, out)
        elif kind == "content_block_stop":
            self._close_block(_index(payload), out)
        elif kind == "message_delta":
            self._message_delta(payload, out)
        elif kind == "message_stop":
            self._start(out)
            for index in sorted(self._open):
                block = self._open[index]
                if isinstance(block, _OpenCall):
                    out.append(unreadable_call(block.id, block.name, Messages.UNFINISHED_CALL))
                elif isinstance(block, _OpenServer):
                    self._finish_server(block, out)  # the SDK keeps an unstopped block in the message too
            self._open.clear()
            if self._container is not None:
                _marker(CONTAINER_MARKER, self._container, out)
            out.append(MessageStop(stop_reason=effective_stop(self._stop, self._completed_calls)))
            self._done = True
        elif kind == "error":
            self._error(payload, out)

    def _start(self, out: list[StreamEvent]) -> None:
        """``MessageStart`` goes out with the first content, so an error before any content can be retried."""
        if not self._started:
            self._started = True
            out.append(MessageStart(model=self._model))

    def _message_start(self, payload: Mapping[str, Any], out: list[StreamEvent]) -> None:
        message = payload.get("message")
        if not isinstance(message, dict):
            raise _Undecodable
        if self._started:
            return
        model = message.get("model")
        usage = message.get("usage")
        if isinstance(usage, dict):
            self._input_tokens = _input_tokens(usage) or 0
            self._cache_usage(usage)
        self._model = model if isinstance(model, str) else ""
        self._remember_container(message.get("container"))
        if self._message_seen:
            return
        self._message_seen = True
        content = message.get("content")
        if content is None:
            return
        if not isinstance(content, list):
            out.append(notice(Messages.UNDECODABLE_EVENT, self._scrub(compact_json(content) or "")))
            return
        # Blocks the message already holds are part of the response, in order, at indices 0..n-1 (the
        # SDK's snapshot starts from them and appends each later block); each maps as if it had streamed
        # whole in a content_block_start and its stop.
        for index, block in enumerate(content):
            try:
                if not isinstance(block, dict):
                    raise _Undecodable
                self._open_block(index, block, out)
            except _Undecodable:
                out.append(notice(Messages.UNDECODABLE_EVENT, self._scrub(compact_json(block) or "")))
                continue
            self._close_block(index, out)

    def _cache_usage(self, usage: Mapping[str, Any]) -> None:
        read = non_negative_int(usage.get("cache_read_input_tokens"))
        write = non_negative_int(usage.get("cache_creation_input_tokens"))
        self._cache_read = self._cache_read if read is None else read
        self._cache_write = self._cache_write if write is None else write

    def _strict_frame(self) -> bool:
        """Whether the current frame is strict JSON (no duplicate keys), checked once and only when asked.

        The frame decoder keeps the last of two equal keys; a tool input read from it is only trusted when
        the whole frame has none, so no two readers of the same arguments can disagree on them.
        """
        if self._frame_strict is None:
            try:
                loads_strict_json(self._frame)
            except ValueError:
                self._frame_strict = False
            else:
                self._frame_strict = True
        return self._frame_strict

    def _open_block(self, index: int, block: Mapping[str, Any], out: list[StreamEvent]) -> None:
        kind = block.get("type")
        if not isinstance(kind, str) or not kind or kind in _REQUEST_ONLY or index in self._open:
            raise _Undecodable
        if kind == "tool_use":
            name = block.get("name")
            if not (isinstance(name, str) and name):
                raise _Undecodable
            call_id = self._call_id(block.get("id"), index)
            self._start(out)
            call = self._open_call(call_id, name, block.get("input"))
            caller = block.get("caller")
            if isinstance(caller, dict) and compact_json(caller) is not None:
                call.caller = caller
            self._open[index] = call
            out.append(ToolCallStart(id=call_id, name=name))
        elif kind == "text":
            text = block.get("text", "")
            if not isinstance(text, str):
                raise _Undecodable
            self._start(out)
            self._open[index] = _OpenText()
            if text:
                out.append(TextDelta(text=text))
        elif kind == "thinking":
            text, signature = block.get("thinking", ""), block.get("signature", "")
            if not isinstance(text, str) or not isinstance(signature, str):
                raise _Undecodable
            self._start(out)
            self._open[index] = _OpenThinking([text] if text else [], signature)
            if text:
                out.append(ThinkingDelta(text=text))
        elif kind == "redacted_thinking":
            data = block.get("data")
            if not isinstance(data, str):
                raise _Undecodable
            self._start(out)
            self._ignored.add(index)
            out.append(ThinkingComplete(block=RedactedThinkingBlock(data=data)))
        else:
            # Any other type is kept too, as the SDK keeps it: the API takes its own blocks back, and some
            # must come back in place (a ``fallback`` marks where thinking verification chains split).
            self._open[index] = _OpenServer(dict(block), known=kind in SERVER_BLOCKS)

    def _call_id(self, given: Any, index: int) -> str:
        """The block's own id, or one of ours when it sent none usable (empty, null, missing, not a string).

        Ours is ``toolu_<index>``, suffixed ``_<n>`` while an earlier block of this response holds it, so the
        call gets a record and its tool_result like any other (the reducer renames an id the session holds).
        """
        call_id = given if isinstance(given, str) and given else ""
        if not call_id:
            call_id, attempt = f"toolu_{index}", 0
            while call_id in self._call_ids:
                attempt += 1
                call_id = f"toolu_{index}_{attempt}"
        self._call_ids.add(call_id)
        return call_id

    def _remember_container(self, container: Any) -> None:
        if isinstance(container, dict) and isinstance(container.get("id"), str) and container["id"]:
            expires = container.get("expires_at")
            self._container = {"id": container["id"], **({"expires_at": expires} if isinstance(expires, str) else {})}

    def _open_call(self, call_id: str, name: str, start: JsonValue) -> _OpenCall:
        """The call, with the input its start carried (tools called from code execution send it whole).

        As in the SDK, that input stands until a non-empty ``input_json_delta`` arrives; the deltas then
        replace it. A start input that is not an object is kept as the SDK keeps it (the SDK builds the
        block without validation), so the tool's input check refuses it and the model is told, rather
        than the call running with ``{}``; only null (or none at all) means no arguments.
        """
        if start is None or start == {}:
            return _OpenCall(call_id, name)
        if compact_json(start) is None:
            return _OpenCall(call_id, name, start_error=f"{Messages.BAD_TOOL_ARGUMENTS}: not representable as JSON")
        if not self._strict_frame():
            return _OpenCall(call_id, name, start_error=f"{Messages.BAD_TOOL_ARGUMENTS}: duplicate object key")
        return _OpenCall(call_id, name, start=start)

    def _close_block(self, index: int, out: list[StreamEvent]) -> None:
        block = self._open.pop(index, None)
        if isinstance(block, _OpenCall):
            self._completed_calls += 1
            if block.start_error is not None and not "".join(block.fragments).strip():
                out.append(unreadable_call(block.id, block.name, block.start_error))
            else:
                out.append(finish_tool_call(block.id, block.name, block.fragments, default=block.start))
            if block.caller is not None:
                _marker(CALLER_MARKER, {"tool_use_id": block.id, "caller": block.caller}, out)
        elif isinstance(block, _OpenThinking):
            thinking = ThinkingBlock(thinking="".join(block.parts), signature=block.signature)
            out.append(ThinkingComplete(block=thinking))
        elif isinstance(block, _OpenServer):
            self._finish_server(block, out)

    def _finish_server(self, block: _OpenServer, out: list[StreamEvent]) -> None:
        """The whole block as one ``ProviderBlockComplete``; never a call of ours, nothing runs for it.

        An unknown block that a delta of an unknown kind changed is left out: the copy held is not the
        server's block any more, and a stale copy sent back could be refused or misread.
        """
        if block.stale:
            return
        data = block.block
        text = "".join(block.fragments)
        if text.strip():
            try:
                data = {**data, "input": loads_strict_json(text)}
            except ValueError:
                # Never dropped silently: kept with the input it started with, and the person is told.
                out.append(notice(SERVER_INPUT_UNREADABLE, self._scrub(text)))
        compact = compact_json(data)
        if compact is None:
            out.append(notice(BLOCK_NOT_JSON, block.kind))
            return
        self._start(out)
        out.append(ProviderBlockComplete(block=ProviderBlock(wire=_WIRE_NAME, kind=block.kind, data=compact)))

    def _block_delta(self, payload: Mapping[str, Any], out: list[StreamEvent]) -> None:
        index = _index(payload)
        delta = payload.get("delta")
        if not isinstance(delta, dict):
            raise _Undecodable
        kind = text_or_empty(delta.get("type"))
        block = self._open.get(index)
        if kind == "text_delta" and type(block) is _OpenText:
            # The delta nearly every event of a long answer is: its text goes straight out.
            text = delta.get("text")
            if type(text) is not str:
                raise _Undecodable
            if text:
                if not self._started:
                    self._start(out)
                out.append(TextDelta(text=text))
            return
        targets = _DELTA_TARGETS.get(kind)
        if isinstance(block, _OpenServer) and not block.known:
            block.stale = True  # no delta is known to apply to a type this mapper does not know
            return
        if targets is None or (block is None and index in self._ignored):
            return  # a delta kind newer than this mapper, or one for a block kept whole at its start
        if block is None:
            self._unaddressed_delta(kind, delta, out)
        elif block.kind not in targets:
            raise _Undecodable  # a delta of the wrong kind for the block it addresses
        elif isinstance(block, _OpenText):
            self._text_delta(delta, out)  # a citations_delta is read and left: citations are not kept
        elif isinstance(block, _OpenThinking):
            field = "thinking" if kind == "thinking_delta" else "signature"
            piece = delta.get(field)
            if not isinstance(piece, str):
                raise _Undecodable
            if field == "thinking":
                block.parts.append(piece)
                if piece:
                    out.append(ThinkingDelta(text=piece))
            else:
                block.signature = piece  # one signature per block, as documented; the SDK keeps the last
        elif kind == "input_json_delta":
            fragment = delta.get("partial_json")
            if not isinstance(fragment, str):
                raise _Undecodable
            if fragment:
                block.fragments.append(fragment)
                if isinstance(block, _OpenCall):
                    out.append(ToolCallInputDelta(id=block.id, partial_json=fragment))
        elif isinstance(block, _OpenServer):
            _compaction_delta(block, delta)

    def _unaddressed_delta(self, kind: str, delta: Mapping[str, Any], out: list[StreamEvent]) -> None:
        """A delta for an index with no open block: text still streams; arguments are an orphan notice."""
        if kind == "text_delta":
            self._text_delta(delta, out)
        elif kind == "input_json_delta":
            fragment = delta.get("partial_json")
            if not isinstance(fragment, str):
                raise _Undecodable
            out.append(notice(Messages.ORPHAN_ARGUMENTS, self._scrub(fragment)))
        elif kind != "citations_delta":
            raise _Undecodable

    def _text_delta(self, delta: Mapping[str, Any], out: list[StreamEvent]) -> None:
        if delta.get("type") != "text_delta":
            return
        text = delta.get("text")
        if not isinstance(text, str):
            raise _Undecodable
        if text:
            self._start(out)
            out.append(TextDelta(text=text))

    def _message_delta(self, payload: Mapping[str, Any], out: list[StreamEvent]) -> None:
        delta = payload.get("delta")
        usage = payload.get("usage")
        if not isinstance(delta, dict) or (usage is not None and not isinstance(usage, dict)):
            raise _Undecodable
        reason = delta.get("stop_reason")
        if isinstance(reason, str):
            self._stop = STOP_REASONS.get(reason, StopReason.OTHER)
        self._remember_container(delta.get("container"))
        if isinstance(usage, dict):
            self._start(out)
            input_tokens = _input_tokens(usage)
            self._cache_usage(usage)
            out.append(
                Usage(
                    input_tokens=self._input_tokens if input_tokens is None else input_tokens,
                    output_tokens=non_negative_int(usage.get("output_tokens")) or 0,
                    cache_read_input_tokens=self._cache_read,
                    cache_creation_input_tokens=self._cache_write,
                )
            )

    def _error(self, payload: Mapping[str, Any], out: list[StreamEvent]) -> None:
        error = payload.get("error")
        if not isinstance(error, dict):
            raise _Undecodable
        kind, message = text_or_empty(error.get("type")), text_or_empty(error.get("message"))
        rate_limited = kind == "rate_limit_error"
        if rate_limited:
            text = Messages.STREAM_RATE_LIMITED
        elif kind in _TRANSIENT_ERRORS and not self._started:
            text = Messages.SERVER_ERROR  # before any content, an overload is retried like HTTP 529
        else:
            text = Messages.STREAM_PROVIDER_ERROR
        out.append(
            StreamError(
                code=ProtocolErrorCode.RATE_LIMITED if rate_limited else ProtocolErrorCode.HTTP_STATUS,
                message=text,
                provider_detail=self._scrub(message or kind) or None,
            )
        )
        self._done = True
