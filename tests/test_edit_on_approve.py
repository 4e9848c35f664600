"""Edit on approve: the edit is prepared by the call's own tool, the grant binds it, the model is told."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from trioloop.machine.authorization import Violation
from trioloop.machine.canonical import input_digest
from trioloop.machine.reducer import (
    Advance,
    ApproveBatch,
    ApproveCall,
    CallStatus,
    DenyCall,
    Phase,
    StartCall,
    Submit,
    TurnInput,
    TurnState,
    reduce_turn,
)
from trioloop.machine.tool_input import tool_field
from trioloop.machine.tools import ToolOutcome, create_tool_registry
from trioloop.protocol import MessageStart, MessageStop, ToolCallComplete, ToolResultBlock
from trioloop.providers.scripted import ScriptedCall, ScriptedProvider, ScriptStep
from trioloop.runtime.controls import TurnControls
from trioloop.runtime.runner import TurnRequest, Workspace, run_turn
from trioloop.runtime.tools import ToolExecutionContext, define_executable_tool
from trioloop.threatmodel import THREAT_MODEL, load_thf

PAYMENT = Path(__file__).resolve().parent.parent / "examples" / "payment.thf"


@attrs.frozen(kw_only=True)
class Rename:
    id: str = tool_field(min_length=1)
    name: str = tool_field(min_length=1, max_length=40)


def _tool(name: str, destructive: bool = False) -> Any:
    return define_executable_tool(
        name=name,
        description=f"{name} for tests",
        effect="mutate",
        destructive=destructive,
        input_type=Rename,
        run=lambda value, ctx: ToolOutcome.success(f"{name} {value.id} -> {value.name}"),
        summarize=lambda value: f"{name} {value.id} to {value.name}",
    )


REGISTRY = create_tool_registry([_tool("rename"), _tool("purge", destructive=True)])


def run(inputs: list[TurnInput], state: TurnState | None = None) -> TurnState:
    state = state or TurnState.idle()
    for item in inputs:
        state = reduce_turn(state, item)
    return state


def rename(call_id: str, name: str = "Web", tool: str = "rename", target: str = "web") -> ToolCallComplete:
    return ToolCallComplete(id=call_id, name=tool, input={"id": target, "name": name})


def start(*calls: ToolCallComplete) -> TurnState:
    submit = Submit(turn_id="t", text="go", tool_set=REGISTRY, now_ms=0)
    return run([submit, MessageStart(model="m"), *calls, MessageStop(stop_reason="tool_use")])


def results(state: TurnState) -> dict[str, str]:
    return {b.call_id: b.content for m in state.messages for b in m.content if isinstance(b, ToolResultBlock)}


def test_an_edited_approval_binds_the_grant_to_the_edited_input() -> None:
    state = run([ApproveCall(call_id="c1", edited_input={"id": "web", "name": "Storefront"})], start(rename("c1")))
    record = state.call("c1")
    assert record is not None and record.status is CallStatus.APPROVED and state.phase is Phase.EXECUTING
    edited_digest = input_digest({"id": "web", "name": "Storefront"})
    assert record.input_digest == edited_digest and record.prepared is not None
    assert record.prepared.input_digest == edited_digest
    assert [g.input_digest for g in state.grants] == [edited_digest]
    assert record.summary == "rename web to Storefront"
    assert record.edits == (("name", "Web", "Storefront"),)
    # The history still holds what the model sent; the result says what the user changed.
    state = run([StartCall(call_id="c1", now_ms=1)], state)
    assert state.call("c1").status is CallStatus.RUNNING  # type: ignore[union-attr]


def test_the_model_is_told_exactly_which_fields_changed() -> None:
    state = run(
        [ApproveCall(call_id="c1", edited_input={"id": "api", "name": "Store<<<front>>>\u202e"})], start(rename("c1"))
    )
    record = state.call("c1")
    # The card's view of the edit writes the invisible bidi override out instead of hiding it.
    assert record is not None and record.edits == (
        ("id", "web", "api"),
        ("name", "Web", "Store<<<front>>>\\u{202E}"),
    )
    from trioloop.machine.reducer import CallSettled

    state = run(
        [
            StartCall(call_id="c1", now_ms=1),
            CallSettled(call_id="c1", outcome=ToolOutcome.success("renamed"), now_ms=2),
            Advance(now_ms=3),
        ],
        state,
    )
    text = results(state)["c1"]
    assert text == (
        "The user edited this call's input before approving it, so it ran with these changes: "
        '"id": "web" -> "api"; "name": "Web" -> "Store\\\\<\\\\<\\\\<front\\\\>\\\\>\\\\>\\\\\\\\u{202E}".\nrenamed'
    )
    assert "<<<" not in text and "\u202e" not in text


def test_an_invalid_edit_approves_nothing_and_says_why() -> None:
    before = start(rename("c1"))
    state = run([ApproveCall(call_id="c1", edited_input={"id": "web", "name": ""})], before)
    assert state.call("c1") == before.call("c1") and state.grants == () and state.phase is Phase.AWAITING_APPROVAL
    assert "not valid" in state.notices[-1] and "name" in state.notices[-1]
    extra = run([ApproveCall(call_id="c1", edited_input={"id": "web", "name": "x", "admin": True})], before)
    assert extra.grants == () and "admin" in extra.notices[-1]
    too_long = run([ApproveCall(call_id="c1", edited_input={"id": "web", "name": "n" * 41})], before)
    assert too_long.grants == ()  # the tool's limits apply to an edit too


def test_an_unchanged_edit_is_an_ordinary_approval() -> None:
    state = run([ApproveCall(call_id="c1", edited_input={"name": "Web", "id": "web"})], start(rename("c1")))
    assert state == run([ApproveCall(call_id="c1")], start(rename("c1")))


def test_an_edit_never_widens_to_another_call_tool_or_iteration() -> None:
    # Twins: editing c1 grants c1 alone; c2 (the identical call) still needs its own decision.
    state = run([ApproveCall(call_id="c1", edited_input={"id": "web", "name": "X"})], start(rename("c1"), rename("c2")))
    assert [g.call_id for g in state.grants] == ["c1"] and state.call("c2").status is CallStatus.PENDING  # type: ignore[union-attr]
    assert state.phase is Phase.AWAITING_APPROVAL
    # An edit is prepared by the call's own tool: there is no field to name another.
    purge = start(rename("p1", tool="purge"))
    state = run([ApproveCall(call_id="p1", edited_input={"id": "db", "name": "x"})], purge)
    grant = state.grants[0]
    assert (grant.tool_name, grant.call_id) == ("purge", "p1")
    # A call of an earlier iteration cannot be edited into a grant.
    done = run([DenyCall(call_id="c1"), Advance(now_ms=1), MessageStart(model="m")], start(rename("c1")))
    later = run([ApproveCall(call_id="c1", edited_input={"id": "web", "name": "X"})], done)
    assert later.grants == done.grants and later.call("c1") == done.call("c1")
    # An edit of a decided call changes nothing.
    approved = run([ApproveCall(call_id="c1")], start(rename("c1")))
    assert run([ApproveCall(call_id="c1", edited_input={"id": "x", "name": "y"})], approved) == approved


def test_an_edit_matching_a_sticky_denial_is_still_refused_at_start() -> None:
    state = start(rename("c1", name="Bad"), rename("c2", name="Good"))
    state = run([DenyCall(call_id="c1"), ApproveCall(call_id="c2", edited_input={"id": "web", "name": "Bad"})], state)
    state = run([StartCall(call_id="c2", now_ms=1)], state)
    assert state.call("c2").status is CallStatus.FAILED  # type: ignore[union-attr]
    assert state.violations[-1].violation is Violation.DENIED_REPLAY


@settings(max_examples=100, deadline=None)
@given(
    edit=st.dictionaries(
        st.sampled_from(["id", "name", "tool", "call_id", "iteration"]), st.text(max_size=5) | st.integers()
    )
)
def test_no_edit_grants_anything_but_its_own_call_in_this_iteration(edit: dict[str, Any]) -> None:
    before = start(rename("c1"), rename("c2"), rename("d1", tool="purge"))
    state = run([ApproveCall(call_id="c1", edited_input=edit), ApproveBatch(call_ids=())], before)
    for grant in state.grants:
        record = state.call(grant.call_id)
        assert grant.call_id == "c1" and record is not None
        assert (grant.tool_name, grant.input_digest, grant.iteration) == ("rename", record.input_digest, 1)
        assert record.prepared is not None and record.prepared.input_digest == grant.input_digest
    assert {c.id for c in state.calls if c.status is CallStatus.PENDING} >= {"c2", "d1"}


async def test_the_runner_runs_the_edited_input_and_tells_the_model() -> None:
    seen: list[Rename] = []

    async def record(value: Rename, ctx: ToolExecutionContext) -> ToolOutcome:
        seen.append(value)
        await trio.lowlevel.checkpoint()
        return ToolOutcome.success(f"renamed {value.id}")

    tool = define_executable_tool(
        name="rename", description="d", effect="mutate", destructive=False, input_type=Rename, run=record, summarize=str
    )
    steps = [
        ScriptStep(tool_calls=(ScriptedCall(id="c1", name="rename", input={"id": "web", "name": "Web"}),)),
        ScriptStep(text="ok"),
    ]
    controls = TurnControls()

    def observe(state: TurnState) -> None:
        if state.phase is Phase.AWAITING_APPROVAL:
            controls.approve("c1", edited_input={"id": "web", "name": "Edited"})

    request = TurnRequest(text="go", turn_id="t", model="scripted-1", registry=create_tool_registry([tool]))
    async with ScriptedProvider(steps) as provider:
        final = await run_turn(
            request,
            Workspace(document=load_thf(PAYMENT), kind=THREAT_MODEL),
            provider,
            controls=controls,
            on_state=observe,
        )
    assert seen == [Rename(id="web", name="Edited")]
    assert results(final)["c1"].endswith('"name": "Web" -> "Edited".\nrenamed web')
    sent = [b for m in final.messages for b in m.content if getattr(b, "id", None) == "c1"]
    assert sent and sent[0].input == {"id": "web", "name": "Web"}  # type: ignore[union-attr]
