"""The events of one network read reach the reducer together; consecutive text deltas fold into one step.

Behaviour, not timing: how many batches the transport hands over, how many states an iteration
publishes, and that folding never changes what the reducer decides.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from trioloop.machine.limits import TurnLimits
from trioloop.machine.reducer import Cancel, Phase, Submit, TurnInput, TurnState, reduce_turn
from trioloop.machine.stream_fold import fold_text_deltas
from trioloop.machine.tools import create_tool_registry
from trioloop.protocol import (
    MessageStart,
    MessageStop,
    StopReason,
    StreamError,
    StreamEvent,
    TextDelta,
    ToolCallComplete,
    ToolCallInputDelta,
    ToolCallStart,
    Usage,
)
from trioloop.protocol.provider import send_events
from trioloop.providers import AnthropicProvider
from trioloop.providers._loopback import LoopbackResponse, open_loopback_server, replay
from trioloop.providers.anthropic import ANTHROPIC_WIRE
from trioloop.providers.base import WireResponse
from trioloop.providers.scripted import ScriptedProvider, ScriptStep
from trioloop.runtime.controls import TurnControls
from trioloop.runtime.requests import BATCHES_PER_YIELD
from trioloop.runtime.runner import TurnRequest, Workspace, run_turn
from trioloop.threatmodel import THREAT_MODEL, ThreatModel

# -- folding: a pure function, checked against the reducer --------------------------------------------


def _reduce(inputs: Sequence[TurnInput], state: TurnState) -> TurnState:
    for item in inputs:
        state = reduce_turn(state, item)
    return state


_SUBMITTED = reduce_turn(
    TurnState.idle(),
    Submit(turn_id="t", text="go", base_messages=(), tool_set=create_tool_registry([]), limits=TurnLimits(), now_ms=0),
)

_texts = st.text(max_size=6)
_events = st.lists(
    st.one_of(
        _texts.map(lambda text: TextDelta(text=text)),
        _texts.map(lambda text: TextDelta(text=text)),  # twice as likely: runs of deltas are the point
        st.builds(ToolCallStart, id=st.sampled_from(["a", "b"]), name=st.just("nope")),
        st.builds(ToolCallInputDelta, id=st.sampled_from(["a", "b"]), partial_json=_texts),
        st.builds(ToolCallComplete, id=st.sampled_from(["a", "b"]), name=st.just("nope"), input=st.just({})),
        st.builds(Usage, input_tokens=st.integers(0, 9), output_tokens=st.integers(0, 9)),
        st.just(StreamError(code="malformed_stream", message="one bad frame", terminal=False)),
    ),
    max_size=30,
)
_endings: st.SearchStrategy[list[TurnInput]] = st.sampled_from(
    [
        [MessageStop(stop_reason=StopReason.END_TURN)],
        [MessageStop(stop_reason=StopReason.TOOL_USE)],
        [MessageStop(stop_reason=StopReason.MAX_TOKENS)],
        [Cancel(reason="stop")],
        [],
    ]
)


@settings(max_examples=300, deadline=None)
@given(_events, _endings, st.integers(0, 30))
def test_folding_a_read_never_changes_what_the_reducer_decides(
    events: list[StreamEvent], ending: list[TurnInput], split: int
) -> None:
    # Any prefix of the stream may already have been reduced; the rest arrives as one read.
    started = reduce_turn(_SUBMITTED, MessageStart(model="m"))
    before = _reduce(events[:split], started)
    one_by_one = _reduce(events[split:], before)
    folded = _reduce(fold_text_deltas(events[split:]), before)
    assert folded.draft is not None and one_by_one.draft is not None
    assert folded.draft.plain_text == one_by_one.draft.plain_text
    assert (folded.phase, folded.calls, folded.violations, folded.messages) == (
        one_by_one.phase,
        one_by_one.calls,
        one_by_one.violations,
        one_by_one.messages,
    )
    if ending:  # once the draft is closed, the states are equal outright (an open draft keeps its pieces)
        assert _reduce(ending, folded) == _reduce(ending, one_by_one)


@given(_events)
@settings(max_examples=200, deadline=None)
def test_fold_joins_exactly_the_runs_of_text_deltas(events: list[StreamEvent]) -> None:
    folded = list(fold_text_deltas(events))
    assert [e for e in folded if not isinstance(e, TextDelta)] == [e for e in events if not isinstance(e, TextDelta)]
    assert "".join(e.text for e in folded if isinstance(e, TextDelta)) == "".join(
        e.text for e in events if isinstance(e, TextDelta)
    )
    assert not any(isinstance(a, TextDelta) and isinstance(b, TextDelta) for a, b in itertools.pairwise(folded))
    if not any(isinstance(a, TextDelta) and isinstance(b, TextDelta) for a, b in itertools.pairwise(events)):
        assert fold_text_deltas(events) is events  # nothing to fold: no new list


# -- the transport hands over one batch per network read ------------------------------------------


class _Recorder(trio.abc.SendChannel[StreamEvent]):
    """A batch-taking consumer that remembers how the events arrived."""

    def __init__(self) -> None:
        self.arrivals: list[tuple[StreamEvent, ...]] = []

    async def send(self, value: StreamEvent) -> None:
        await trio.lowlevel.checkpoint()
        self.arrivals.append((value,))

    async def send_batch(self, events: Sequence[StreamEvent]) -> None:
        await trio.lowlevel.checkpoint()
        self.arrivals.append(tuple(events))

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


def _body(text: str) -> bytes:
    return ANTHROPIC_WIRE.render_stream(WireResponse(model="m", text=text, text_piece=4))


@pytest.mark.parametrize("chunk_size", [None, 64])
async def test_the_events_of_one_read_arrive_as_one_batch(
    chunk_size: int | None, autojump_clock: trio.testing.MockClock
) -> None:
    body = _body("x" * 400)  # 100 text deltas
    recorder = _Recorder()
    response = LoopbackResponse(body=body, chunk_size=chunk_size)
    async with open_loopback_server(replay([response])) as server:
        await AnthropicProvider("k", base_url=server.url, retry=None).stream(_request(), recorder)
    events = [event for arrival in recorder.arrivals for event in arrival]
    assert sum(isinstance(e, TextDelta) for e in events) == 100 and isinstance(events[-1], MessageStop)
    if chunk_size is None:
        assert len(recorder.arrivals) == 1  # the whole body came in one read
    else:
        assert 1 < len(recorder.arrivals) <= math.ceil(len(body) / chunk_size)


async def test_a_consumer_without_batches_still_gets_every_event_in_order() -> None:
    send, receive = trio.open_memory_channel[StreamEvent](math.inf)
    events = [TextDelta(text="a"), TextDelta(text="b"), MessageStop(stop_reason=StopReason.END_TURN)]
    await send_events(send, events)
    assert [receive.receive_nowait() for _ in events] == events


def _request() -> Any:
    from trioloop.protocol import ChatRequest, Message

    return ChatRequest(model="claude-sonnet-4-5", messages=(Message.user("hi"),))


# -- the runner: a bounded number of state rebuilds per iteration ------------------------------------


class _OneRead:
    """An in-process provider whose whole answer is one read: ``deltas`` text deltas, handed over together."""

    def __init__(self, deltas: int) -> None:
        self._deltas = deltas

    async def stream(
        self, request: Any, send: trio.abc.SendChannel[StreamEvent], *, cancel_scope: trio.CancelScope | None = None
    ) -> None:
        text = [TextDelta(text="y") for _ in range(self._deltas)]
        await send_events(send, [MessageStart(model="m"), *text, MessageStop(stop_reason=StopReason.END_TURN)])


async def _states_for(deltas: int) -> int:
    seen: list[TurnState] = []
    state = await run_turn(
        TurnRequest(text="go", turn_id="t1", model="m"),
        Workspace(document=ThreatModel(), kind=THREAT_MODEL),
        _OneRead(deltas),
        on_state=seen.append,
    )
    assert state.draft is not None and state.draft.plain_text == "y" * deltas
    return len(seen)


async def test_an_iteration_publishes_the_same_number_of_states_however_many_deltas(
    autojump_clock: trio.testing.MockClock,
) -> None:
    assert await _states_for(1) == await _states_for(10_000)


class _Reads:
    """An in-process provider whose answer comes in ``reads`` network reads of ``per_read`` text deltas each,
    each read handed over as batches of ``per_batch`` (the HTTP chunks one read brought), the provider
    waiting ``gap`` seconds (the network) between reads."""

    def __init__(self, reads: int, per_read: int, per_batch: int = 1, gap: float = 0.01) -> None:
        self._reads, self._per_read, self._per_batch, self._gap = reads, per_read, per_batch, gap

    async def stream(
        self, request: Any, send: trio.abc.SendChannel[StreamEvent], *, cancel_scope: trio.CancelScope | None = None
    ) -> None:
        await send_events(send, [MessageStart(model="m")])
        for read in range(self._reads):
            await trio.sleep(self._gap)  # the socket read: the only wait between reads
            deltas = [TextDelta(text=str(read % 10)) for _ in range(self._per_read)]
            for start in range(0, len(deltas), self._per_batch):
                await send_events(send, deltas[start : start + self._per_batch])
        await send_events(send, [MessageStop(stop_reason=StopReason.END_TURN)])


async def _published(provider: Any, controls: TurnControls | None = None, stop_at: int | None = None) -> Any:
    seen: list[TurnState] = []
    controls = controls or TurnControls()

    def observe(state: TurnState) -> None:
        seen.append(state)
        if stop_at is not None and state.draft is not None and len(state.draft.plain_text) >= stop_at:
            controls.stop()

    state = await run_turn(
        TurnRequest(text="go", turn_id="t1", model="m"),
        Workspace(document=ThreatModel(), kind=THREAT_MODEL),
        provider,
        controls=controls,
        on_state=observe,
    )
    return state, seen


async def test_the_chunks_of_one_read_reach_the_reducer_in_one_wakeup_and_one_state(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Ten reads of 12 one-delta chunks: one published state per read (plus one per forced yield of a provider
    that forwarded BATCHES_PER_YIELD batches without waiting), not one per chunk; the text whole, in order. The last
    read may reach the reducer with the end of the message (the provider sends it without waiting, and Trio's
    scheduling order is random): its text then first shows in the settled state."""
    state, seen = await _published(_Reads(reads=10, per_read=12, per_batch=1))
    assert state.draft is not None and state.draft.plain_text == "".join(str(r) * 12 for r in range(10))
    streaming = [s for s in seen if s.phase is Phase.STREAMING and s.draft is not None and s.draft.plain_text]
    assert {12 * read for read in range(1, 10)} <= {len(s.draft.plain_text) for s in streaming if s.draft}
    assert 9 <= len(streaming) <= 10 + 120 // BATCHES_PER_YIELD  # was 120: one per chunk


async def test_a_provider_that_never_waits_still_yields_every_few_batches(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A whole answer already buffered (one read, 200 chunks): the consumer still runs, and publishes,
    while the provider forwards it, so neither it nor any other task waits for the whole body."""
    state, seen = await _published(_Reads(reads=1, per_read=200, per_batch=1))
    assert state.draft is not None and state.draft.plain_text == "0" * 200
    partial = [s for s in seen if s.draft is not None and 0 < len(s.draft.plain_text) < 200]
    assert 200 // BATCHES_PER_YIELD // 2 <= len(partial) <= 200 // BATCHES_PER_YIELD + 1


async def test_stop_from_an_observer_lands_before_the_next_wakeups_events(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """An observer stops the turn on the first state that shows text: no event of a later wake-up is applied
    (the text the turn ends with is the text that state showed), and that wake-up was applied whole."""
    state, seen = await _published(_Reads(reads=5, per_read=30, per_batch=3), stop_at=1)
    assert state.outcome is not None and state.outcome.value == "cancelled"
    shown = next(s.draft.plain_text for s in seen if s.draft is not None and s.draft.plain_text)
    assert len(shown) % 3 == 0 and len(shown) < 150  # whole batches, and not the whole answer
    assert state.draft is None or state.draft.plain_text in ("", shown)


# -- connection reuse through whole turns --------------------------------------------------------------


async def test_turns_and_their_iterations_share_one_connection(autojump_clock: trio.testing.MockClock) -> None:
    # The tail of each body is read before its terminal event goes on, so neither the next iteration's
    # request nor the settled turn (which cancels the request task) finds the connection still busy.
    from trioloop.providers.scripted import ScriptedCall
    from trioloop.threatmodel.registry import create_ai_tool_registry

    summary = ScriptedCall(id="c1", name="get_document_summary")
    paced: dict[str, Any] = {"chunk_size": 7, "delay_between_chunks": 0.001}  # the body's end comes in last
    steps = [
        ScriptStep(tool_calls=(summary,), **paced),
        ScriptStep(text="one", **paced),
        ScriptStep(text="two", **paced),
        ScriptStep(text="3", **paced),
    ]
    registry = create_ai_tool_registry()
    async with ScriptedProvider(steps) as provider:
        for turn in range(3):
            controls = TurnControls()

            def approve(state: TurnState, controls: TurnControls = controls) -> None:
                if state.phase is Phase.AWAITING_APPROVAL:
                    controls.approve_batch(tuple(c.id for c in state.current_calls))

            state = await run_turn(
                TurnRequest(text="go", turn_id=f"t{turn}", model="scripted-1", registry=registry),
                Workspace(document=ThreatModel(), kind=THREAT_MODEL),
                provider,
                controls=controls,
                on_state=approve,
            )
            assert state.outcome is not None and state.outcome.value == "completed", state.outcome
        assert (len(provider.server.requests), provider.server.connections) == (4, 1)
