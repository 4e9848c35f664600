"""Typed answers: ``Session.send(text, output=T)`` over the three wires, each over real HTTP (the scripted provider's
loopback server): the final tool offered with a required tool choice, a valid answer settling the turn at once,
an invalid one fed back by path and asked for again within ``max_output_retries``, a text reply nudged, the final
tool beside a reviewed mutation, non-attrs types, a journal reopened to the same answer, and the reducer's rules.
"""

from __future__ import annotations

import json
from contextlib import aclosing
from typing import Any, Literal

import attrs
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trioloop import (
    CallStatus,
    MemoryJournalStore,
    Outcome,
    Phase,
    ScriptedProvider,
    Session,
    ToolExecutionContext,
    ToolOutcome,
    TurnLimits,
    define_document_kind,
    function_tool,
    tool_field,
)
from trioloop.durable.journal import decode_entries
from trioloop.machine.answers import AnswerChecked, AnswerSpec
from trioloop.machine.inputs import Submit
from trioloop.machine.limits import Bound
from trioloop.machine.reducer import reduce_turn
from trioloop.machine.state import TurnState
from trioloop.machine.tool_input import unstructure_input
from trioloop.machine.tools import create_tool_registry
from trioloop.protocol import MessageStart, MessageStop, ToolCallComplete, assert_tool_pairing
from trioloop.providers.scripted import ScriptedCall, ScriptStep, WireName
from trioloop.runtime.answers import answer_form

WIRES: tuple[WireName, ...] = ("anthropic", "openai", "openai-responses")
NOTE = define_document_kind("note", dump=lambda text: text, load=lambda text: text)


@attrs.frozen
class Forecast:
    city: str
    celsius: int = tool_field(minimum=-90, maximum=60)
    tags: list[str] = attrs.field(factory=list)


@function_tool(summary="Append {line!r}")
async def append_line(ctx: ToolExecutionContext[str], line: str) -> ToolOutcome[str]:
    """Append one line to the note."""
    return ToolOutcome.success("Appended.", document=f"{ctx.document}{line}\n")


GOOD = {"city": "Oslo", "celsius": 4, "tags": ["rain"]}
BAD = {"city": "Oslo", "celsius": 99}


def final(call_id: str, answer: Any, name: str = "final_answer") -> ScriptedCall:
    return ScriptedCall(id=call_id, name=name, input=answer)


def session(provider: ScriptedProvider, **options: Any) -> Session[str]:
    return Session(
        document="# note\n", kind=NOTE, provider=provider, model="scripted-1", tools=[append_line], **options
    )


def tool_choice(wire: WireName, body: Any) -> Any:
    return body.get("tool_choice")


REQUIRED = {"anthropic": {"type": "any"}, "openai": "required", "openai-responses": "required"}


def offered(wire: WireName, body: Any) -> dict[str, Any]:
    """The tools a request body offered, by name, as {name: schema}."""
    out = {}
    for tool in body.get("tools", []):
        if wire == "anthropic":
            out[tool["name"]] = tool["input_schema"]
        elif wire == "openai":
            out[tool["function"]["name"]] = tool["function"]["parameters"]
        else:
            out[tool["name"]] = tool["parameters"]
    return out


class Streamed:
    def __init__(self) -> None:
        self.texts: list[str] = []

    def on_state(self, state: TurnState) -> None:
        self.texts.append(state.streaming_text)


# -- over the three wires ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("wire", WIRES)
async def test_a_valid_answer_settles_the_turn_at_once_with_the_typed_value(wire: WireName) -> None:
    steps = [ScriptStep(text="Looking it up.", tool_calls=[final("a1", GOOD)])]
    async with ScriptedProvider(steps, wire=wire) as provider, session(provider) as s:
        streamed = Streamed()
        s.observe(streamed)
        state = await s.send("Weather in Oslo?", output=Forecast)
        assert state.outcome is Outcome.COMPLETED and state.has_output
        assert state.output == GOOD
        assert s.output_as(Forecast) == Forecast(city="Oslo", celsius=4, tags=["rain"])
        assert len(provider.requests) == 1  # no request after the answer
        body = provider.requests[0]
        assert tool_choice(wire, body) == REQUIRED[wire]
        tools = offered(wire, body)
        assert list(tools) == ["append_line", "final_answer"]
        assert tools["final_answer"]["properties"]["celsius"] == {"type": "integer", "minimum": -90, "maximum": 60}
        call = state.call("a1")
        assert call is not None and call.status is CallStatus.SUCCEEDED and not call.is_error
        assert call.effect == "read" and not call.destructive and not state.grants  # never a card, never run
        assert "Looking it up." in streamed.texts  # the text still streamed
        assert_tool_pairing(state.messages)


@pytest.mark.parametrize("wire", WIRES)
async def test_an_invalid_answer_is_fed_back_by_path_and_asked_for_again(wire: WireName) -> None:
    steps = [ScriptStep(tool_calls=[final("a1", BAD)]), ScriptStep(tool_calls=[final("a2", GOOD)])]
    async with ScriptedProvider(steps, wire=wire) as provider, session(provider) as s:
        state = await s.send("Weather?", output=Forecast)
        assert state.outcome is Outcome.COMPLETED and s.output_as(Forecast) == Forecast("Oslo", 4, ["rain"])
        assert state.budget.output_retries_used == 1 and state.iteration == 2
        told = json.dumps(provider.requests[1])  # what the model read the second time
        assert "celsius: must be <= 60" in told
        first = state.call("a1")
        assert first is not None and first.status is CallStatus.FAILED and first.is_error


@pytest.mark.parametrize("wire", WIRES)
async def test_invalid_answers_past_the_limit_settle_bounded_with_the_last_problem_and_no_value(
    wire: WireName,
) -> None:
    worse = {"city": 7, "celsius": 4, "wind": 3}
    steps = [ScriptStep(tool_calls=[final("a1", BAD)]), ScriptStep(tool_calls=[final("a2", worse)])]
    limits = TurnLimits(max_output_retries=1)
    async with ScriptedProvider(steps, wire=wire) as provider, session(provider, limits=limits) as s:
        state = await s.send("Weather?", output=Forecast)
        assert state.outcome is Outcome.BOUNDED and state.bound is Bound.OUTPUT_RETRIES
        assert not state.has_output and state.output is None and s.output_as(Forecast) is None
        assert "wind: 'wind' is not an accepted key" in state.output_error  # the last problem, not the first
        assert "wind: 'wind' is not an accepted key" in state.notices[-1] and "celsius" not in state.notices[-1]
        assert len(provider.requests) == 2
        assert_tool_pairing(state.messages)


@pytest.mark.parametrize("wire", WIRES)
async def test_a_text_reply_is_nudged_once_as_an_iteration_then_answered(wire: WireName) -> None:
    steps = [ScriptStep(text="It is cold in Oslo."), ScriptStep(tool_calls=[final("a1", GOOD)])]
    async with ScriptedProvider(steps, wire=wire) as provider, session(provider) as s:
        state = await s.send("Weather?", output=Forecast)
        assert state.outcome is Outcome.COMPLETED and state.output == GOOD
        assert state.iteration == 2 and state.budget.output_retries_used == 1
        second = json.dumps(provider.requests[1])
        assert "It is cold in Oslo." in second and 'by calling the \\"final_answer\\" tool' in second
        assert_tool_pairing(state.messages)


@pytest.mark.parametrize("wire", WIRES)
async def test_the_final_tool_beside_a_mutation_waits_for_its_review_and_result(wire: WireName) -> None:
    steps = [
        ScriptStep(tool_calls=[ScriptedCall(id="m1", name="append_line", input={"line": "- rain"}), final("a1", GOOD)]),
        ScriptStep(tool_calls=[final("a2", GOOD)]),
    ]
    async with ScriptedProvider(steps, wire=wire) as provider, session(provider) as s, trio.open_nursery() as ui:
        reviewed: list[str] = []

        async def review() -> None:
            async with aclosing(s.states()) as states:
                async for state in states:
                    if state.phase is Phase.AWAITING_APPROVAL:
                        pending = [c for c in state.current_calls if c.status is CallStatus.PENDING]
                        reviewed.extend(c.tool_name for c in pending)
                        for c in pending:
                            s.approve(c.id)

        ui.start_soon(review)
        state = await s.send("Note the rain and give the forecast.", output=Forecast)
        ui.cancel_scope.cancel()
    assert reviewed == ["append_line"]  # the mutation had its card; the final tool never has one
    assert s.document == "# note\n- rain\n"
    first = state.call("a1")
    assert first is not None and first.status is CallStatus.FAILED and "Not taken" in (first.result or "")
    assert state.outcome is Outcome.COMPLETED and state.output_call == "a2" and state.output == GOOD
    assert state.budget.output_retries_used == 0  # not a failure of the answer's shape


async def test_a_denied_mutation_beside_the_answer_never_runs_and_the_answer_comes_after() -> None:
    steps = [
        ScriptStep(tool_calls=[final("a1", GOOD), ScriptedCall(id="m1", name="append_line", input={"line": "x"})]),
        ScriptStep(tool_calls=[final("a2", GOOD)]),
    ]
    async with ScriptedProvider(steps) as provider, session(provider) as s, trio.open_nursery() as ui:

        async def deny() -> None:
            async with aclosing(s.states()) as states:
                async for state in states:
                    if state.phase is Phase.AWAITING_APPROVAL:
                        s.deny("m1", "no")

        ui.start_soon(deny)
        state = await s.send("Go.", output=Forecast)
        ui.cancel_scope.cancel()
    assert s.document == "# note\n"
    assert state.call("m1").status is CallStatus.DENIED  # type: ignore[union-attr]
    assert state.output_call == "a2"


@pytest.mark.parametrize(
    ("output", "good", "bad", "problem"),
    [
        (list[int], [1, 2, 3], ["x"], "value[0]: expected an integer, got string"),
        (Literal["yes", "no"], "yes", "maybe", "value: must be one of 'yes', 'no'"),
    ],
)
async def test_a_type_that_is_not_an_attrs_class_is_wrapped_as_value(
    output: Any, good: Any, bad: Any, problem: str
) -> None:
    steps = [
        ScriptStep(tool_calls=[final("a1", {"value": bad})]),
        ScriptStep(tool_calls=[final("a2", {"value": good})]),
    ]
    async with ScriptedProvider(steps, wire="openai") as provider, session(provider) as s:
        state = await s.send("Answer.", output=output)
        schema = offered("openai", provider.requests[0])["final_answer"]
        assert schema["required"] == ["value"] and schema["additionalProperties"] is False
        assert problem in json.dumps(provider.requests[1])
        assert state.output == good and s.output_as(output) == good


async def test_the_final_tool_never_takes_a_session_tool_name_and_can_be_renamed() -> None:
    steps = [ScriptStep(tool_calls=[final("a1", {"value": 3}, name="report")])]
    async with ScriptedProvider(steps) as provider, session(provider) as s:
        with pytest.raises(ValueError, match="append_line"):
            await s.send("x", output=int, output_tool="append_line")
        state = await s.send("How many?", output=int, output_tool="report")
        assert state.output == 3 and s.output_as(int) == 3


async def test_without_output_the_request_and_journal_are_as_before() -> None:
    store = MemoryJournalStore()
    async with ScriptedProvider([ScriptStep(text="Hi.")]) as provider:
        async with await Session.open(
            store, "s", kind=NOTE, provider=provider, model="m", tools=[append_line], document="# n\n"
        ) as s:
            state = await s.send("Hello.")
        assert state.output is None and not state.has_output and state.answer is None
        assert "tool_choice" not in provider.requests[0]  # type: ignore[operator]
        submit = next(e for e in decode_entries(await store.read("s")) if e.kind == "submit")
        assert "answer" not in submit.data and "max_output_retries" not in submit.data["limits"]


# -- durable ------------------------------------------------------------------------------------------------------


async def test_a_reopened_journal_shows_the_same_answer_without_asking_the_model() -> None:
    store = MemoryJournalStore()
    steps = [ScriptStep(tool_calls=[final("a1", BAD)]), ScriptStep(text="There.", tool_calls=[final("a2", GOOD)])]
    options: dict[str, Any] = {"kind": NOTE, "model": "m", "tools": [append_line]}
    async with ScriptedProvider(steps) as provider:
        async with await Session.open(store, "s", provider=provider, document="# n\n", **options) as s:
            live = await s.send("Weather?", output=Forecast)
        asked = len(provider.requests)
        entries = decode_entries(await store.read("s"))
        submit = next(e for e in entries if e.kind == "submit")
        assert submit.data["answer"]["tool"] == "final_answer"
        checks = [
            event
            for e in entries
            if e.kind == "stream"
            for event in e.data["events"]
            if event.get("type") == "answer_check"
        ]
        assert [c["call_id"] for c in checks] == ["a1", "a2"] and checks[0]["issues"] and not checks[1]["issues"]
        async with await Session.open(store, "s", provider=provider, **options) as reopened:
            state = reopened.state
            assert state is not None and state.output == live.output == GOOD
            assert reopened.output_as(Forecast) == Forecast("Oslo", 4, ["rain"])
            assert [(c.id, c.status) for c in state.calls] == [(c.id, c.status) for c in live.calls]
            assert state.output_error == live.output_error and state.budget == live.budget
        assert len(provider.requests) == asked


# -- hypothesis: whatever the instance, the model's unstructured copy comes back equal ------------------------------

forecasts = st.builds(
    Forecast,
    city=st.text(max_size=20),
    celsius=st.integers(-90, 60),
    tags=st.lists(st.text(max_size=8), max_size=3),
)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(forecast=forecasts)
def test_any_instance_sent_by_the_model_is_the_turns_output(forecast: Forecast) -> None:
    async def main() -> Forecast | None:
        steps = [ScriptStep(tool_calls=[final("a1", unstructure_input(forecast))])]
        async with ScriptedProvider(steps) as provider, session(provider) as s:
            await s.send("Forecast.", output=Forecast)
            return s.output_as(Forecast)

    assert trio.run(main) == forecast


# -- the reducer alone --------------------------------------------------------------------------------------------

SPEC = answer_form(Forecast).spec


def _submitted(**limits: Any) -> TurnState:
    submit = Submit(
        turn_id="t",
        text="q",
        tool_set=create_tool_registry(),
        limits=TurnLimits(**limits),
        now_ms=0,
        answer=SPEC,
    )
    return reduce_turn(reduce_turn(TurnState.idle(), submit), MessageStart(model="m"))


def test_a_final_call_nobody_checked_is_not_taken() -> None:
    state = reduce_turn(_submitted(), ToolCallComplete(id="a1", name="final_answer", input=GOOD))
    state = reduce_turn(state, MessageStop(stop_reason="tool_use"))
    assert not state.has_output and state.phase is Phase.EXECUTING
    assert "could not be checked" in (state.call("a1").result or "")  # type: ignore[union-attr]


def test_a_check_for_another_call_or_a_turn_without_answer_changes_nothing() -> None:
    state = reduce_turn(_submitted(), AnswerChecked(call_id="zz", tool_name="final_answer"))
    state = reduce_turn(state, ToolCallComplete(id="a1", name="final_answer", input=GOOD))
    assert state.call("a1").status is CallStatus.FAILED  # type: ignore[union-attr]
    plain = reduce_turn(TurnState.idle(), Submit(turn_id="t", text="q", tool_set=create_tool_registry(), now_ms=0))
    assert reduce_turn(plain, AnswerChecked(call_id="a1", tool_name="final_answer")) is plain


def test_only_the_first_of_two_valid_answers_is_taken() -> None:
    state = _submitted()
    for call_id, answer in (("a1", GOOD), ("a2", {**GOOD, "city": "Bergen"})):
        state = reduce_turn(state, AnswerChecked(call_id=call_id, tool_name="final_answer"))
        state = reduce_turn(state, ToolCallComplete(id=call_id, name="final_answer", input=answer))
    state = reduce_turn(state, MessageStop(stop_reason="end_turn"))  # "stop" with calls, as some servers say
    assert state.outcome is Outcome.COMPLETED and state.output == GOOD
    assert "earlier" in (state.call("a2").result or "")  # type: ignore[union-attr]
    assert_tool_pairing(state.messages)


def test_the_spec_round_trips_through_its_json() -> None:
    assert AnswerSpec.from_json(SPEC.to_json()).to_json() == SPEC.to_json()
    with pytest.raises(ValueError):
        AnswerSpec.from_json({"tool": "x"})
    with pytest.raises(ValueError):
        AnswerChecked.from_json({"call_id": "a", "tool_name": "b", "issues": [1]})


def test_each_mapper_says_a_tool_is_required_only_when_asked_and_anthropic_not_with_thinking() -> None:
    from trioloop.protocol.tools import ChatRequest, ToolDefinition
    from trioloop.providers._responses_request import build_responses_body
    from trioloop.providers.anthropic import AnthropicRequestOptions, build_anthropic_body
    from trioloop.providers.openai import build_openai_body

    tool = ToolDefinition(name="t", description="d", json_schema={"type": "object"})
    asked = ChatRequest(model="m", tools=(tool,), tool_choice="required")
    plain = ChatRequest(model="m", tools=(tool,))
    assert build_anthropic_body(asked)["tool_choice"] == {"type": "any"}
    assert build_openai_body(asked)["tool_choice"] == "required"
    assert build_responses_body(asked)["tool_choice"] == "required"
    for build in (build_anthropic_body, build_openai_body, build_responses_body):
        assert "tool_choice" not in build(plain)  # type: ignore[operator]
    thinking = AnthropicRequestOptions(thinking_budget_tokens=2048)
    assert "tool_choice" not in build_anthropic_body(asked, thinking)  # refused with thinking: the nudge asks instead
    with pytest.raises(ValueError):
        ChatRequest(model="m", tool_choice="any")  # type: ignore[arg-type]


async def test_a_turn_suspended_in_review_is_continued_elsewhere_with_its_type() -> None:
    store = MemoryJournalStore()
    steps = [
        ScriptStep(tool_calls=[ScriptedCall(id="m1", name="append_line", input={"line": "- rain"})]),
        ScriptStep(tool_calls=[final("a1", GOOD)]),
    ]
    options: dict[str, Any] = {"kind": NOTE, "model": "m", "tools": [append_line]}
    async with ScriptedProvider(steps) as provider:
        opened = await Session.open(store, "s", provider=provider, document="", **options)
        async with opened as s, trio.open_nursery() as nursery:
            nursery.start_soon(lambda: s.send("Note it, then the forecast.", output=Forecast))
            async with aclosing(s.states()) as states:  # type: ignore[type-var]
                async for state in states:
                    if s.busy and state.phase is Phase.AWAITING_APPROVAL:
                        break
            await s.suspend()
        async with await Session.open(store, "s", provider=provider, **options) as reopened:
            assert reopened.suspended and reopened.state is not None and reopened.state.answer is not None
            reopened.approve("m1")
            state = await reopened.continue_turn(output=Forecast)
            assert state.outcome is Outcome.COMPLETED and reopened.output_as(Forecast) == Forecast("Oslo", 4, ["rain"])
            assert reopened.document == "- rain\n"
            assert tool_choice("anthropic", provider.requests[-1]) == {"type": "any"}  # still asked for
