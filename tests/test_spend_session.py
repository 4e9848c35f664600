"""Token and cost bounds end to end: a `Session` on the scripted provider over real HTTP (loopback SSE through the
real transport and mapper), each answer reporting known usage. A response past a bound ends the turn before its
calls run; a request that would pass one is never sent; a session's bounds count its earlier turns; a cost bound on
a model with no known price is refused before anything is sent; a journaled bounded turn replays to the same state."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest

from trioloop import (
    PRICE_TABLE,
    MemoryJournalStore,
    ModelPrice,
    PriceUnknown,
    ScriptedProvider,
    Session,
    SpendLimits,
    TurnLimits,
)
from trioloop.durable.journal import decode_entries
from trioloop.lowlevel import Bound
from trioloop.machine.reducer import CallStatus, Outcome
from trioloop.providers.scripted import ScriptedCall, ScriptStep
from trioloop.threatmodel import THREAT_MODEL, create_ai_tool_registry, load_thf

PAYMENT = Path(__file__).resolve().parent.parent / "examples" / "payment.thf"


def _read(**usage: int) -> ScriptStep:
    return ScriptStep(
        text="Reading.", tool_calls=(ScriptedCall(id="r1", name="get_document_summary", input={}),), **usage
    )


def _session(provider: ScriptedProvider, model: str = "scripted-1", **options: object) -> Session[object]:
    return Session(
        document=load_thf(PAYMENT),
        kind=THREAT_MODEL,
        provider=provider,
        model=model,
        tools=create_ai_tool_registry(),
        **options,  # type: ignore[arg-type]
    )


async def test_a_response_past_the_token_bound_ends_the_turn_before_its_calls_run() -> None:
    async with (
        ScriptedProvider([_read(input_tokens=30_000, output_tokens=11_200)]) as provider,
        _session(provider, limits=TurnLimits(max_total_tokens=40_000)) as session,
    ):
        state = await session.send("Summarize.")
    assert (state.outcome, state.bound) == (Outcome.BOUNDED, Bound.TOKENS)
    assert state.usage.input_tokens == 30_000 and state.usage.output_tokens == 11_200
    assert state.notices[-1].startswith("This turn stopped at its token bound: 41,200 of 40,000 tokens spent.")
    record = state.call("r1")
    assert record is not None and record.status is CallStatus.DENIED  # never run
    assert len(provider.requests) == 1


async def test_a_request_that_would_pass_the_token_bound_is_not_sent() -> None:
    # The first answer (50,100 tokens) is within the bound of 55,000, so its read runs; the next request (its
    # estimate and the 4,096 output tokens reserved on top of 50,100) would pass it: it is never sent.
    steps = [_read(input_tokens=50_000, output_tokens=100), ScriptStep(text="never asked")]
    async with (
        ScriptedProvider(steps) as provider,
        _session(provider, limits=TurnLimits(max_total_tokens=55_000)) as session,
    ):
        state = await session.send("Summarize.")
    assert (state.outcome, state.bound) == (Outcome.BOUNDED, Bound.TOKENS)
    assert state.notices[-1].startswith("This turn stopped before its next model request: 50,100 tokens spent")
    assert "would pass its token bound of 55,000 tokens" in state.notices[-1]
    record = state.call("r1")
    assert record is not None and record.status is CallStatus.SUCCEEDED  # the read ran; what was done is kept
    assert len(provider.requests) == 1 and provider.steps_left == 1
    assert session.usage.input_tokens == 50_000


async def test_the_cost_bound_at_the_tables_price_with_the_figures_in_the_notice() -> None:
    # claude-haiku-4-5: $1 in, $5 out per million tokens. 8,000 in and 500 out cost $0.0105, past $0.01.
    assert PRICE_TABLE["claude-haiku-4-5"].input_per_mtok == Decimal(1)
    limits = TurnLimits(max_cost_usd=Decimal("0.01"), reserve_output_tokens=200)
    steps = [_read(input_tokens=8_000, output_tokens=500)]
    async with (
        ScriptedProvider(steps, model="claude-haiku-4-5") as provider,
        _session(provider, model="claude-haiku-4-5", limits=limits) as session,
    ):
        state = await session.send("Summarize.")
        assert session.cost_usd == Decimal("0.0105")
    assert (state.outcome, state.bound) == (Outcome.BOUNDED, Bound.COST)
    assert state.notices[-1].startswith(
        "This turn stopped at its cost bound: $0.0105 of $0.01 spent. Prices: trioloop price table, 2026-11."
    )


async def test_an_app_price_counts_for_a_model_the_table_does_not_know() -> None:
    price = ModelPrice(input_per_mtok=Decimal(10), output_per_mtok=Decimal(10), source="our contract")
    limits = TurnLimits(max_cost_usd=Decimal("0.10"), reserve_output_tokens=100)
    steps = [_read(input_tokens=5_000, output_tokens=100), ScriptStep(text="never asked")]
    async with (
        ScriptedProvider(steps) as provider,
        _session(provider, limits=limits, prices={"scripted-1": price}) as session,
    ):
        state = await session.send("Summarize.")
    # The first request (about 5,700 tokens of tools and prompt, 100 reserved) fits $0.10 at $10 a million; $0.051
    # spent, the second (the same and the first exchange) would pass it.
    assert (state.outcome, state.bound) == (Outcome.BOUNDED, Bound.COST)
    assert state.notices[-1].startswith("This turn stopped before its next model request: $0.051 spent")
    assert "Prices: our contract." in state.notices[-1]
    assert len(provider.requests) == 1
    first = provider.requests[0]
    assert isinstance(first, dict) and first["max_tokens"] == 100  # the model may answer with what was reserved


@pytest.mark.parametrize(
    "bounds",
    [
        {"limits": TurnLimits(max_cost_usd=Decimal(1))},
        {"session_limits": SpendLimits(max_cost_usd=Decimal(1))},
    ],
)
async def test_a_cost_bound_on_a_model_with_no_price_is_refused_before_anything_is_sent(
    bounds: dict[str, object],
) -> None:
    async with ScriptedProvider([ScriptStep(text="never asked")]) as provider, _session(provider, **bounds) as session:
        with pytest.raises(PriceUnknown, match="'scripted-1'"):
            await session.send("Summarize.")
        assert session.state is None and session.usage.input_tokens == 0
    assert provider.requests == ()


async def test_a_session_bound_counts_the_turns_before() -> None:
    steps = [ScriptStep(text="First.", input_tokens=6_000, output_tokens=500), ScriptStep(text="never asked")]
    async with (
        ScriptedProvider(steps) as provider,
        _session(provider, session_limits=SpendLimits(max_total_tokens=10_000)) as session,
    ):
        first = await session.send("Hello.")
        assert first.outcome is Outcome.COMPLETED
        second = await session.send("Again.")
    # 6,500 spent by the first turn; the second's request and its 4,096 reserved would pass 10,000.
    assert (second.outcome, second.bound) == (Outcome.BOUNDED, Bound.TOKENS)
    assert second.notices[-1].startswith("This turn stopped before its next model request: 6,500 tokens spent")
    assert "the session's token bound of 10,000 tokens" in second.notices[-1]
    assert len(provider.requests) == 1


async def test_a_bounded_turn_replays_to_the_same_state() -> None:
    store = MemoryJournalStore()
    price = ModelPrice(input_per_mtok=Decimal("2.5"), output_per_mtok=Decimal(10), source="app")
    limits = TurnLimits(max_cost_usd=Decimal("0.10"), reserve_output_tokens=100)
    options = {"kind": THREAT_MODEL, "tools": create_ai_tool_registry(), "signer": None, "witness": None}
    # $0.09 spent by the first answer; the second request (about 6,000 tokens in) would pass $0.10: not sent.
    steps = [_read(input_tokens=32_000, output_tokens=1_000), ScriptStep(text="never asked")]
    async with ScriptedProvider(steps) as provider:
        session = await Session.open(
            store, "s1", provider=provider, document=load_thf(PAYMENT), model="scripted-1", limits=limits, **options
        )
        session.prices = {"scripted-1": price}
        async with session:
            live = await session.send("Summarize.")
        assert (live.outcome, live.bound) == (Outcome.BOUNDED, Bound.COST)
        assert "before its next model request: $0.09 spent" in live.notices[-1]
        kinds = [entry.kind for entry in decode_entries(await store.read("s1"))]
        assert "before_request" in kinds
        reopened = await Session.open(store, "s1", provider=provider, **options)
        async with reopened:
            replayed = reopened.state
            assert replayed is not None
            assert (replayed.outcome, replayed.bound, replayed.notices) == (live.outcome, live.bound, live.notices)
            assert replayed.spending == live.spending and replayed.limits.max_cost_usd == Decimal("0.10")
            assert replayed.calls == live.calls and replayed.usage == live.usage
            assert reopened.usage == session.usage


def test_the_qt_header_shows_the_turns_and_the_sessions_tokens_and_cost() -> None:
    pytest.importorskip("PySide6")
    from trioloop.lowlevel import Spending, Submit, reduce_turn
    from trioloop.machine.reducer import TurnState
    from trioloop.protocol import Usage
    from trioloop.ui._qt_view import usage_line

    price = ModelPrice(input_per_mtok=Decimal(1), output_per_mtok=Decimal(5))
    submit = Submit(
        turn_id="t",
        text="hi",
        tool_set=create_ai_tool_registry(),
        now_ms=0,
        spending=Spending(price=price),
    )
    state = reduce_turn(reduce_turn(TurnState.idle(), submit), Usage(input_tokens=10_000, output_tokens=1_000))
    session = Usage(input_tokens=20_000, output_tokens=2_000)
    assert usage_line(state, session, Decimal("0.03")) == "Turn: 11,000 tokens, $0.015 · Session: 22,000 tokens, $0.03"
    assert usage_line(None, session, None) == "Session: 22,000 tokens"
    assert usage_line(None, Usage(), None) == ""
