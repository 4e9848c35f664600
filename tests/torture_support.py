"""Shared pieces of the torture tests: the scale knob, the report recorder, probe tools and providers.

The torture tests try many hostile or badly timed inputs per test; each test records how many it
tried and how many held in the JSON file named by ``TRIOLOOP_TORTURE_REPORT`` (nothing is written
when it is unset), and ``tests/torture_report.py`` renders ``tests/TORTURE.md`` from that file.
``TRIOLOOP_TORTURE_SCALE`` (default 1) multiplies every budget, so ``=100`` runs a hundred times longer.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Final

import attrs
import trio

from trioloop.machine.canonical import input_digest
from trioloop.machine.reducer import CallStatus, Phase, TurnState
from trioloop.machine.tool_input import unstructure_input
from trioloop.machine.tools import RegisteredTool, ToolOutcome
from trioloop.protocol.events import Aborted, StreamEvent, is_terminal
from trioloop.protocol.messages import ToolCallBlock
from trioloop.protocol.provider import send_events
from trioloop.protocol.tools import ChatRequest
from trioloop.providers.anthropic import ANTHROPIC_WIRE
from trioloop.providers.base import WireFormat, WireResponse
from trioloop.providers.sse import SseDecoder
from trioloop.runtime.controls import TurnControls
from trioloop.runtime.tools import ToolExecutionContext, define_executable_tool
from trioloop.threatmodel import Threat, ThreatModel, load_thf

__all__ = [
    "FIXTURES",
    "PAYMENT",
    "SCALE",
    "Note",
    "RunLog",
    "WireReplayProvider",
    "approver",
    "check_stream",
    "evenly",
    "payment",
    "probe_tools",
    "record",
    "response",
    "scaled",
]

TESTS: Final = Path(__file__).resolve().parent
PAYMENT: Final = TESTS.parent / "examples" / "payment.thf"
FIXTURES: Final = TESTS / "fixtures" / "providers"


def _scale() -> int:
    raw = os.environ.get("TRIOLOOP_TORTURE_SCALE", "1")
    try:
        value = int(raw)
    except ValueError:
        return 1
    return max(value, 1)


SCALE: Final = _scale()


def scaled(n: int) -> int:
    """``n`` times the scale knob."""
    return n * SCALE


def evenly(total: int, budget: int) -> list[int]:
    """``budget`` indexes spread evenly over ``range(total)`` (all of them when the budget allows)."""
    if total <= budget:
        return list(range(total))
    step = total / budget
    return sorted({min(total - 1, math.floor(i * step)) for i in range(budget)})


def _current_test() -> str:
    current = os.environ.get("PYTEST_CURRENT_TEST", "")
    return current.rsplit(" ", 1)[0] if current else "?"


def record(category: str, *, tried: int, held: int, note: str = "") -> None:
    """Add one row to the torture report (when ``TRIOLOOP_TORTURE_REPORT`` names a file)."""
    path = os.environ.get("TRIOLOOP_TORTURE_REPORT")
    if not path:
        return
    target = Path(path)
    data: dict[str, Any] = {"scale": SCALE, "records": []}
    if target.exists():
        data = json.loads(target.read_text(encoding="utf-8"))
    data["records"].append({"test": _current_test(), "category": category, "tried": tried, "held": held, "note": note})
    target.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


_PAYMENT_DOCUMENT: ThreatModel | None = None


def payment() -> ThreatModel:
    """The example payment document (loaded once; documents are immutable values)."""
    global _PAYMENT_DOCUMENT
    if _PAYMENT_DOCUMENT is None:
        _PAYMENT_DOCUMENT = load_thf(PAYMENT)
    return _PAYMENT_DOCUMENT


# ---------------------------------------------------------------------------------------------
# Probe tools: each run is logged under the call's ``note`` (the harness makes it the call id), so
# a test can compare what ran with the grants the final state holds.


@attrs.frozen(kw_only=True)
class Note:
    note: str


@attrs.define
class RunLog:
    """What the probe tools did: ``started`` (note, tool, digest) when a run began, ``finished`` notes."""

    started: list[tuple[str, str, str]] = attrs.field(factory=list)
    finished: list[str] = attrs.field(factory=list)


def probe_tools(log: RunLog, *, steps: int = 2, element: str = "psp") -> tuple[RegisteredTool, ...]:
    """``probe_read`` (read), ``probe_add`` (adds threat ``note``) and ``probe_delete`` (destructive).

    Each run passes ``steps`` checkpoints, so a cancellation can land inside it.
    """

    def tool(
        name: str, effect: Any, destructive: bool, change: Callable[[ThreatModel, str], ThreatModel] | None
    ) -> Any:
        async def run(inp: Note, ctx: ToolExecutionContext) -> ToolOutcome:
            log.started.append((inp.note, name, input_digest(unstructure_input(inp))))
            for _ in range(steps):
                await trio.lowlevel.checkpoint()
            log.finished.append(inp.note)
            if change is None:
                return ToolOutcome.success(f"{name} {inp.note} ok")
            return ToolOutcome.success(f"{name} {inp.note} ok", document=change(ctx.document, inp.note))

        return define_executable_tool(
            name=name,
            description=f"{name} probe",
            effect=effect,
            destructive=destructive,
            input_type=Note,
            run=run,
            summarize=lambda inp: f"{name} {inp.note}",
        )

    def add(document: ThreatModel, note: str) -> ThreatModel:
        threat = Threat(id=note, title=note, category="Tampering", severity="low", element=element)
        return attrs.evolve(document, threats=(*document.threats, threat))

    def delete(document: ThreatModel, note: str) -> ThreatModel:
        return attrs.evolve(document, threats=document.threats[1:])

    return (
        tool("probe_read", "read", False, None),
        tool("probe_add", "mutate", False, add),
        tool("probe_delete", "mutate", True, delete),
    )


# ---------------------------------------------------------------------------------------------
# An in-process provider through the real wire code (no socket, so a run's schedule is repeatable).


class WireReplayProvider:
    """Answers each request with the next ``WireResponse``, rendered by a real wire and read back
    through the real ``SseDecoder`` and stream mapper, ``chunk`` bytes per checkpoint.

    It skips only the socket and httpx, so a run is a deterministic sequence of Trio checkpoints.
    """

    def __init__(
        self, responses: Iterable[WireResponse], *, wire: WireFormat = ANTHROPIC_WIRE, chunk: int = 256
    ) -> None:
        self._responses = list(responses)
        self._wire = wire
        self._chunk = chunk
        self.requests: list[ChatRequest] = []

    async def stream(
        self,
        request: ChatRequest,
        send: trio.abc.SendChannel[StreamEvent],
        *,
        cancel_scope: trio.CancelScope | None = None,
    ) -> None:
        scope = cancel_scope or trio.CancelScope()
        sent_terminal = False
        with scope:
            sent_terminal = await self._stream(request, send)
        if scope.cancelled_caught and not sent_terminal:
            await send.send(Aborted())

    async def _stream(self, request: ChatRequest, send: trio.abc.SendChannel[StreamEvent]) -> bool:
        self.requests.append(request)
        response = self._responses.pop(0) if self._responses else WireResponse(model="m", text="script exhausted")
        raw = self._wire.render_stream(response)
        decoder = SseDecoder()
        mapper = self._wire.new_mapper()
        for start in range(0, len(raw), self._chunk):
            await trio.lowlevel.checkpoint()
            # The events of one chunk go on together, as the HTTP transport hands over one read.
            events = [event for frame in decoder.feed(raw[start : start + self._chunk]) for event in mapper.feed(frame)]
            cut = next((index + 1 for index, event in enumerate(events) if is_terminal(event)), None)
            await send_events(send, events[:cut])
            if cut is not None:
                return True
        await send_events(send, mapper.finish())
        return True


def response(text: str = "", calls: Sequence[tuple[str, str, Any]] = (), *, piece: int = 8) -> WireResponse:
    """A model answer: ``text`` then ``calls`` as (id, tool name, input); tool_use when there are calls.

    Text and arguments stream in ``piece``-sized deltas.
    """
    from trioloop.protocol.events import StopReason

    blocks = tuple(ToolCallBlock(id=cid, name=name, input=inp) for cid, name, inp in calls)
    return WireResponse(
        model="scripted-1",
        text=text,
        tool_calls=blocks,
        stop_reason=StopReason.TOOL_USE if blocks else StopReason.END_TURN,
        text_piece=piece,
        arguments_piece=piece,
    )


def approver(deny: frozenset[str] = frozenset(), batch: bool = False) -> Callable[[TurnState, TurnControls], None]:
    """An ``on_state`` reviewer: approves every pending call (one batch click when ``batch``), denies ``deny``."""

    def review(state: TurnState, controls: TurnControls) -> None:
        if state.phase is not Phase.AWAITING_APPROVAL:
            return
        pending = [c for c in state.current_calls if c.status is CallStatus.PENDING]
        if batch:
            controls.approve_batch(tuple(c.id for c in pending))
        for call in pending:
            if call.id in deny:
                controls.deny(call.id)
            elif not batch or call.destructive:
                controls.approve(call.id)

    return review


# ---------------------------------------------------------------------------------------------
# The stream contract, checked on any bytes (shared by the hypothesis fuzz test and the atheris target).


def check_stream(wire: WireFormat, chunks: Sequence[bytes]) -> list[StreamEvent]:
    """Decode and map ``chunks`` sans-IO and assert the stream contract; return the events.

    Exactly one terminal event, last; every earlier ``StreamError`` is a ``malformed_stream`` notice;
    every event is well-formed; and the events do not depend on how the bytes were split.
    """
    from trioloop.protocol.errors import ProtocolErrorCode
    from trioloop.protocol.events import (
        MessageStart,
        MessageStop,
        ProviderBlockComplete,
        StreamError,
        TextDelta,
        ThinkingComplete,
        ThinkingDelta,
        ToolCallComplete,
        ToolCallInputDelta,
        ToolCallStart,
        Usage,
    )
    from trioloop.protocol.messages import RedactedThinkingBlock, ThinkingBlock
    from trioloop.providers.base import map_chunks

    events = map_chunks(wire.new_mapper(), chunks)
    assert events and is_terminal(events[-1]), events
    assert sum(is_terminal(e) for e in events) == 1, events
    for event in events:
        if isinstance(event, StreamError):
            assert event.terminal or event.code is ProtocolErrorCode.MALFORMED_STREAM
            assert isinstance(event.message, str) and event.message
            assert event.provider_detail is None or len(event.provider_detail) <= 200
        elif isinstance(event, ToolCallComplete):
            assert isinstance(event.id, str) and event.id and isinstance(event.name, str) and event.name
            json.dumps(event.input, allow_nan=False)  # parsed strictly: plain JSON, no NaN
            assert event.input_error is None or (event.input == {} and event.input_error)
        elif isinstance(event, TextDelta | ThinkingDelta):
            assert isinstance(event.text, str) and event.text
        elif isinstance(event, ThinkingComplete):
            assert isinstance(event.block, ThinkingBlock | RedactedThinkingBlock), event
        elif isinstance(event, ProviderBlockComplete):
            # A block sent back verbatim: always one JSON object, never a call of ours.
            assert isinstance(json.loads(event.block.data), dict) and event.block.wire and event.block.kind, event
        elif isinstance(event, ToolCallStart | ToolCallInputDelta):
            assert isinstance(event.id, str) and event.id
        elif isinstance(event, Usage):
            assert event.input_tokens >= 0 and event.output_tokens >= 0
        else:
            assert isinstance(event, MessageStart | MessageStop), event
    # One MessageStart at most, before anything but error notices.
    starts = [i for i, e in enumerate(events) if isinstance(e, MessageStart)]
    assert len(starts) <= 1
    first = next((i for i, e in enumerate(events) if not isinstance(e, StreamError)), None)
    assert first is None or starts == [first], events
    whole = map_chunks(wire.new_mapper(), [b"".join(chunks)])
    assert whole == events, (whole, events)
    return events
