"""The stream half of the OpenAI Responses wire: SSE events in, ``StreamEvent``s out, sans-IO.

A response streams as output items (a message, a function call, a reasoning item), each opened by
``response.output_item.added``, filled by deltas and closed by ``response.output_item.done``; the stream ends
with ``response.completed``, ``response.incomplete`` or ``response.failed`` (there is no ``[DONE]``). A call
is known by its ``call_id``, which pairs it with its ``function_call_output``; the item's own ``id`` is only
the fallback for a server that sends none, and an item ``id`` two calls share finds neither (their
``call_id`` and ``output_index`` do). Every reasoning item becomes a ``ProviderBlock`` so it goes back
on the next request. The final response object is authoritative: an item the stream never finished is read
from its ``output``. The fields an event may carry are read in ``_responses_items.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final, final

from trioloop.protocol.errors import ProtocolErrorCode
from trioloop.protocol.events import (
    MessageStart,
    MessageStop,
    ProviderBlockComplete,
    StopReason,
    StreamError,
    StreamEvent,
    TextDelta,
    ThinkingDelta,
    ToolCallInputDelta,
    ToolCallStart,
    is_terminal,
)
from trioloop.protocol.messages import ProviderBlock
from trioloop.providers._responses_items import (
    INCOMPLETE_REASONS,
    TRANSIENT_LABELS,
    UNFINISHED_STATUSES,
    OpenCall,
    Undecodable,
    event_item,
    locate,
    parts_text,
    read_usage,
    string_field,
)
from trioloop.providers._responses_request import REASONING_KIND, RESPONSE_KIND, RESPONSES_BLOCK_WIRE
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

__all__ = ["ResponsesStreamMapper"]


@final
class ResponsesStreamMapper:
    """Maps Responses API stream events onto ``StreamEvent``s; one instance per response.

    ``keep_response_id`` (the ``previous_response_id`` option) adds a ``ProviderBlock`` of kind
    ``"response"`` with the response id and the call ids it issued, just before the usage and the stop.
    """

    def __init__(self, *, scrub: Callable[[str], str] | None = None, keep_response_id: bool = False) -> None:
        self._scrub = scrub or no_scrub
        self._keep_response_id = keep_response_id
        self._started = False
        self._done = False
        self._model = ""
        self._response_id = ""
        self._calls: dict[tuple[str, int | str], OpenCall] = {}  # an open call under each of its keys
        self._shared: set[tuple[str, int | str]] = set()  # ids two calls carried: they find neither
        self._givens: dict[str, str] = {}  # the call_id of each function call's item id
        self._handled: set[tuple[str, int | str]] = set()  # items completed or skipped
        self._call_ids: list[str] = []
        self._text_items: set[tuple[str, int | str]] = set()  # items whose text was shown
        self._any_text = False
        self._thinking_items: set[tuple[str, int | str]] = set()  # items whose reasoning text was shown
        self._summary_at: tuple[tuple[str, int | str] | None, int] = (None, 0)
        self._refused = False
        self._folder = NoticeFolder()
        # Read per event: on Python 3.11 an instance field is found faster than a class attribute.
        self._handlers = self._HANDLERS

    @property
    def done(self) -> bool:
        return self._done

    def feed(self, frame: SseFrame) -> list[StreamEvent]:
        if self._done or frame.data.strip() == "[DONE]":  # some compatible servers add it; the end decides
            return []
        payload = decode_json_object(frame.data)
        if payload is None:
            if frame.at_eof:  # the body ended inside this event: a cut frame, finish() decides
                return []
            return self._folder.admit([notice(Messages.UNDECODABLE_EVENT, self._scrub(frame.data))])
        kind = payload.get("type")
        handler = self._handlers.get(kind if isinstance(kind, str) else frame.event)
        if handler is None:
            return []  # an event this mapper has no use for (annotations, built-in tools, keep-alives)
        out: list[StreamEvent] = []
        try:
            handler(self, payload, out)
        except Undecodable:
            out.append(notice(Messages.UNDECODABLE_EVENT, self._scrub(frame.data)))
        if not self._started and any(not is_terminal(event) for event in out):
            self._started = True
            out.insert(0, MessageStart(model=self._model))
        return self._folder.admit(out)

    def finish(self) -> list[StreamEvent]:
        """End of body: a response that never reached a terminal event is a failure, never a short success."""
        if self._done:
            return []
        self._done = True
        return self._folder.admit(
            [StreamError(code=ProtocolErrorCode.MALFORMED_STREAM, message=Messages.INCOMPLETE_STREAM)]
        )

    def _start(self, out: list[StreamEvent]) -> None:
        """``MessageStart`` goes out with the first content, so an error before any content can be retried."""
        if not self._started:
            self._started = True
            out.append(MessageStart(model=self._model))

    # -- lifecycle ---------------------------------------------------------------------------------

    def _lifecycle(self, payload: Mapping[str, Any], out: list[StreamEvent]) -> None:
        response = payload.get("response")
        if not isinstance(response, dict):
            raise Undecodable
        self._remember(response)

    def _remember(self, response: Mapping[str, Any]) -> None:
        if not self._started and not self._model:
            self._model = text_or_empty(response.get("model"))
        self._response_id = text_or_empty(response.get("id")) or self._response_id

    # -- output items ------------------------------------------------------------------------------

    def _keys(self, index: int | None, item_id: str, call_id: str = "") -> list[tuple[str, int | str]]:
        """The keys an output item is found by, surest first: ``call_id``, ``output_index``, then ``id``."""
        keys: list[tuple[str, int | str]] = [("call", call_id), ("index", -1 if index is None else index)]
        return [key for key in [*keys, ("id", item_id)] if key[1] not in ("", -1) and key not in self._shared]

    def _tell_apart(self, item_id: str, given: str) -> None:
        """Calls under one item ``id``, each with its own ``call_id``: from then on the id finds neither."""
        if item_id and given and self._givens.setdefault(item_id, given) != given:
            self._shared.add(("id", item_id))

    def _item_added(self, payload: Mapping[str, Any], out: list[StreamEvent]) -> None:
        index, item = event_item(payload)
        if item.get("type") == "function_call":
            self._open_call(index, item, out)

    def _item_done(self, payload: Mapping[str, Any], out: list[StreamEvent]) -> None:
        index, item = event_item(payload)
        self._complete_item(index, item, out, cut=False)

    def _complete_item(self, index: int | None, item: Mapping[str, Any], out: list[StreamEvent], *, cut: bool) -> None:
        """One finished output item; ``cut``: the response ended early, so a call still streaming is unfinished."""
        kind, item_id, given = item.get("type"), text_or_empty(item.get("id")), text_or_empty(item.get("call_id"))
        self._tell_apart(item_id, given)  # only a function call carries a call_id
        keys = self._keys(index, item_id, given)
        if any(key in self._handled for key in keys):
            return
        if kind == "function_call":
            self._finish_call(keys, index, item, out, cut=cut)
        elif kind == "reasoning":
            self._handled.update(keys)
            self._reasoning_done(keys, item, out)
        elif kind == "message":
            self._handled.update(keys)
            self._message_done(keys, item, out)

    def _open_call(self, index: int | None, item: Mapping[str, Any], out: list[StreamEvent]) -> OpenCall | None:
        item_id, given = text_or_empty(item.get("id")), text_or_empty(item.get("call_id"))
        self._tell_apart(item_id, given)
        if ("call", given) in self._calls or ("call", given) in self._handled:
            self._shared.add(("call", given))  # a repeated call_id: the reducer answers the repeat as a duplicate
        keys = self._keys(index, item_id, given)
        if not keys or any(key in self._calls or key in self._handled for key in keys):
            raise Undecodable
        name = text_or_empty(item.get("name"))
        if not name:
            # Nothing could run it and nothing could answer it by name: said, and its deltas ignored.
            self._handled.update(keys)
            out.append(notice(Messages.UNDECODABLE_EVENT, self._scrub(compact_json(item) or "")[:200]))
            return None
        # The call_id pairs the call with its output; a server that sends none still gets its call answered.
        call_id = given or item_id or f"call_{index}"
        call = OpenCall(call_id, name)
        for key in keys:
            self._calls[key] = call
        self._start(out)
        out.append(ToolCallStart(id=call_id, name=name))
        arguments = item.get("arguments")
        if isinstance(arguments, str) and arguments:
            call.fragments.append(arguments)
            out.append(ToolCallInputDelta(id=call_id, partial_json=arguments))
        return call

    def _find_call(self, keys: list[tuple[str, int | str]]) -> OpenCall | None:
        return next((self._calls[key] for key in keys if key in self._calls), None)

    def _finish_call(
        self,
        keys: list[tuple[str, int | str]],
        index: int | None,
        item: Mapping[str, Any],
        out: list[StreamEvent],
        *,
        cut: bool,
    ) -> None:
        call = self._find_call(keys)
        streamed = call is not None
        if call is None:
            call = self._open_call(index, item, out)  # a server that sends only the finished item
            if call is None:
                return
        for key in [key for key, value in self._calls.items() if value is call]:
            del self._calls[key]
        self._handled.update(keys)
        arguments = item.get("arguments")
        if isinstance(arguments, dict):  # some servers send the arguments as an object
            arguments = compact_json(arguments)
            if arguments is None:  # one with no strict JSON form: answered as unreadable, never run
                out.append(
                    unreadable_call(call.id, call.name, f"{Messages.BAD_TOOL_ARGUMENTS}: not representable as JSON")
                )
                self._call_ids.append(call.id)
                return
        if not isinstance(arguments, str) or not arguments:
            arguments = call.final or "".join(call.fragments)
        if not call.fragments and arguments:
            out.append(ToolCallInputDelta(id=call.id, partial_json=arguments))
        status = text_or_empty(item.get("status"))
        if status in UNFINISHED_STATUSES or (cut and streamed and status != "completed"):
            out.append(unreadable_call(call.id, call.name, Messages.UNFINISHED_CALL))
        else:
            out.append(finish_tool_call(call.id, call.name, [arguments]))
        self._call_ids.append(call.id)

    def _arguments_delta(self, payload: Mapping[str, Any], out: list[StreamEvent]) -> None:
        fragment = string_field(payload, "delta")
        index, item_id = locate(payload)
        keys = self._keys(index, item_id)
        call = self._find_call(keys)
        if call is None:
            if not any(key in self._handled for key in keys):
                out.append(notice(Messages.ORPHAN_ARGUMENTS, self._scrub(fragment)))
        elif fragment:
            call.fragments.append(fragment)
            out.append(ToolCallInputDelta(id=call.id, partial_json=fragment))

    def _arguments_done(self, payload: Mapping[str, Any], out: list[StreamEvent]) -> None:
        arguments = string_field(payload, "arguments")
        index, item_id = locate(payload)
        call = self._find_call(self._keys(index, item_id))
        if call is not None:
            call.final = arguments

    # -- text, refusals, reasoning ----------------------------------------------------------------

    def _text_delta(self, payload: Mapping[str, Any], out: list[StreamEvent]) -> None:
        self._show_text(payload, string_field(payload, "delta"), out)

    def _text_done(self, payload: Mapping[str, Any], out: list[StreamEvent]) -> None:
        """The whole text of a part: shown only when no delta of that item was (a server that sends no deltas)."""
        text = string_field(payload, "text")
        if not self._text_shown(payload):
            self._show_text(payload, text, out)

    def _refusal_delta(self, payload: Mapping[str, Any], out: list[StreamEvent]) -> None:
        # A refusal streams in its own part; it reads like Anthropic's refusal text plus its stop reason.
        self._refused = True
        self._show_text(payload, string_field(payload, "delta"), out)

    def _refusal_done(self, payload: Mapping[str, Any], out: list[StreamEvent]) -> None:
        refusal = string_field(payload, "refusal")
        self._refused = True
        if not self._text_shown(payload):
            self._show_text(payload, refusal, out)

    def _text_shown(self, payload: Mapping[str, Any]) -> bool:
        """Whether deltas of the event's item were shown (any text at all, for an event that names no item)."""
        keys = self._keys(*locate(payload))
        return any(key in self._text_items for key in keys) if keys else self._any_text

    def _show_text(self, payload: Mapping[str, Any], text: str, out: list[StreamEvent]) -> None:
        index, item_id = locate(payload)
        self._text_items.update(self._keys(index, item_id))
        if text:
            self._any_text = True
            self._start(out)
            out.append(TextDelta(text=text))

    def _message_done(self, keys: list[tuple[str, int | str]], item: Mapping[str, Any], out: list[StreamEvent]) -> None:
        """A finished message whose text never streamed (in deltas or parts): its text now."""
        if self._any_text or any(key in self._text_items for key in keys):
            return
        content = item.get("content")
        text = parts_text(content, ("output_text", "refusal"))
        if parts_text(content, ("refusal",)):
            self._refused = True
        if text:
            self._any_text = True
            self._start(out)
            out.append(TextDelta(text=text))

    def _thinking_delta(self, payload: Mapping[str, Any], out: list[StreamEvent]) -> None:
        piece = string_field(payload, "delta")
        index, item_id = locate(payload)
        keys = self._keys(index, item_id)
        summary = non_negative_int(payload.get("summary_index")) or 0
        anchor = keys[0] if keys else None
        if summary and self._summary_at != (anchor, summary):
            piece = "\n\n" + piece  # summary parts are paragraphs of their own
        self._summary_at = (anchor, summary)
        self._thinking_items.update(keys)
        if piece:
            self._start(out)
            out.append(ThinkingDelta(text=piece))

    def _reasoning_done(
        self, keys: list[tuple[str, int | str]], item: Mapping[str, Any], out: list[StreamEvent]
    ) -> None:
        """The whole reasoning item goes into the history as it came (encrypted content and all)."""
        self._start(out)
        if not any(key in self._thinking_items for key in keys):
            text = parts_text(item.get("summary"), ("summary_text",), "\n\n") or parts_text(
                item.get("content"), ("reasoning_text",)
            )
            if text:
                out.append(ThinkingDelta(text=text))
        data = compact_json(item)
        if data is None:  # it could not go back as it came (a float too large for JSON): said, not kept
            out.append(notice(Messages.UNDECODABLE_EVENT, REASONING_KIND))
            return
        out.append(
            ProviderBlockComplete(block=ProviderBlock(wire=RESPONSES_BLOCK_WIRE, kind=REASONING_KIND, data=data))
        )

    # -- the end -----------------------------------------------------------------------------------

    def _completed(self, payload: Mapping[str, Any], out: list[StreamEvent]) -> None:
        self._end(payload, out, incomplete=False)

    def _incomplete(self, payload: Mapping[str, Any], out: list[StreamEvent]) -> None:
        self._end(payload, out, incomplete=True)

    def _end(self, payload: Mapping[str, Any], out: list[StreamEvent], *, incomplete: bool) -> None:
        response = payload.get("response")
        if not isinstance(response, dict):
            raise Undecodable
        self._remember(response)
        self._start(out)
        output = response.get("output")
        for position, item in enumerate(output if isinstance(output, list) else ()):
            if isinstance(item, dict):
                index = non_negative_int(item.get("output_index"))
                try:
                    self._complete_item(position if index is None else index, item, out, cut=incomplete)
                except Undecodable:  # one bad item costs that item, not the end of the response
                    out.append(notice(Messages.UNDECODABLE_EVENT, self._scrub(compact_json(item) or "")[:200]))
        for call in {id(c): c for c in self._calls.values()}.values():  # still open, not in the output
            if incomplete:
                out.append(unreadable_call(call.id, call.name, Messages.UNFINISHED_CALL))
            else:
                out.append(finish_tool_call(call.id, call.name, [call.final or "".join(call.fragments)]))
            self._call_ids.append(call.id)
        self._calls.clear()
        if incomplete:
            details = response.get("incomplete_details")
            reason = text_or_empty(details.get("reason")) if isinstance(details, dict) else ""
            stop = INCOMPLETE_REASONS.get(reason, StopReason.OTHER)
        else:
            stop = StopReason.REFUSAL if self._refused else StopReason.END_TURN
        if self._keep_response_id and self._response_id:
            marker = arguments_json({"id": self._response_id, "call_ids": self._call_ids})  # strings: always JSON
            out.append(
                ProviderBlockComplete(block=ProviderBlock(wire=RESPONSES_BLOCK_WIRE, kind=RESPONSE_KIND, data=marker))
            )
        usage = response.get("usage")
        if isinstance(usage, dict):
            out.append(read_usage(usage))
        elif usage is not None:
            out.append(notice(Messages.UNDECODABLE_EVENT, self._scrub(compact_json(usage) or "")[:200]))
        out.append(MessageStop(stop_reason=effective_stop(stop, len(self._call_ids))))
        self._done = True

    def _failed(self, payload: Mapping[str, Any], out: list[StreamEvent]) -> None:
        response = payload.get("response")
        if not isinstance(response, dict):
            raise Undecodable
        error = response.get("error")
        out.append(self._error(error if isinstance(error, dict) else {}))

    def _error_event(self, payload: Mapping[str, Any], out: list[StreamEvent]) -> None:
        # Documented flat ({"type": "error", "code", "message"}); some servers nest an "error" object.
        error = payload.get("error")
        out.append(self._error(error if isinstance(error, dict) else payload))

    def _error(self, error: Mapping[str, Any]) -> StreamError:
        self._done = True
        kind = text_or_empty(error.get("type"))
        kind = "" if kind == "error" else kind
        code, message = text_or_empty(error.get("code")), text_or_empty(error.get("message"))
        label = f"{kind} {code}".lower()
        rate_limited = "rate_limit" in label or "insufficient_quota" in label
        if rate_limited:
            text = Messages.STREAM_RATE_LIMITED
        elif any(word in label for word in TRANSIENT_LABELS) and not self._started:
            text = Messages.SERVER_ERROR  # before any content, a server error is retried like a 5xx
        else:
            text = Messages.STREAM_PROVIDER_ERROR
        return StreamError(
            code=ProtocolErrorCode.RATE_LIMITED if rate_limited else ProtocolErrorCode.HTTP_STATUS,
            message=text,
            provider_detail=self._scrub(message or code or kind) or None,
        )

    #: The handler of each event type: plain functions of the class, called with the mapper.
    _HANDLERS: Final[Mapping[str, Callable[[ResponsesStreamMapper, Mapping[str, Any], list[StreamEvent]], None]]] = {
        "response.created": _lifecycle,
        "response.in_progress": _lifecycle,
        "response.queued": _lifecycle,
        "response.output_item.added": _item_added,
        "response.output_item.done": _item_done,
        "response.function_call_arguments.delta": _arguments_delta,
        "response.function_call_arguments.done": _arguments_done,
        "response.output_text.delta": _text_delta,
        "response.output_text.done": _text_done,
        "response.refusal.delta": _refusal_delta,
        "response.refusal.done": _refusal_done,
        "response.reasoning_summary_text.delta": _thinking_delta,
        "response.reasoning_text.delta": _thinking_delta,
        "response.completed": _completed,
        "response.incomplete": _incomplete,
        "response.failed": _failed,
        "error": _error_event,
    }
