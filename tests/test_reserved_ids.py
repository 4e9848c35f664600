"""Reserved ids (issue 49): several adds in one response each preview the id they will really get, and their runs
add exactly those, whatever the person decides on the other cards and in whatever order the calls run."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import aclosing
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from trioloop.durable.store import MemoryJournalStore
from trioloop.machine.canonical import input_digest
from trioloop.machine.preview import EntityChange, Preview, preview_call
from trioloop.machine.reducer import (
    ApproveBatch,
    ApproveCall,
    CallSettled,
    CallStatus,
    DenyCall,
    Phase,
    StartCall,
    Submit,
    TurnInput,
    TurnState,
    reduce_turn,
)
from trioloop.machine.reservations import IdClaim, IdRefused, Reservation
from trioloop.machine.tools import ClaimingCall, PreparedCall, RegisteredTool, ToolOutcome, create_tool_registry
from trioloop.machine.transaction import Committed, Refused, UndoHistory, commit_tool_outcome
from trioloop.protocol import MessageStart, MessageStop, ToolCallComplete
from trioloop.providers.scripted import ScriptedCall, ScriptedProvider, ScriptStep
from trioloop.runtime.session import Session
from trioloop.runtime.tools import ToolExecutionContext
from trioloop.threatmodel import THREAT_MODEL, ThreatModel, load_thf
from trioloop.threatmodel.registry import create_ai_tool_registry

PAYMENT = Path(__file__).resolve().parent.parent / "examples" / "payment.thf"
REGISTRY = create_ai_tool_registry()
SECTIONS = ("elements", "data_flows", "trust_boundaries", "threats")


def add_input(kind: str, n: int, given: str | None = None) -> dict[str, Any]:
    """A valid add of ``kind`` on the payment model (``given``: the id the input names)."""
    entity: dict[str, Any]
    if kind == "add_threat":
        entity = {"title": f"Threat {n}", "category": "Spoofing", "severity": "high", "element": "card-vault"}
        key = "threat"
    elif kind == "add_element":
        entity, key = {"type": "process", "name": f"Element {n}"}, "element"
    elif kind == "add_data_flow":
        entity, key = {"source": "browser", "target": "api-gateway", "name": f"Flow {n}"}, "data_flow"
    else:
        entity, key = {"name": f"Boundary {n}", "contains": []}, "trust_boundary"
    if given is not None:
        entity["id"] = given
    return {key: entity}


@pytest.fixture(scope="module")
def payment() -> ThreatModel:
    return load_thf(PAYMENT)


def fold(inputs: Iterable[TurnInput], state: TurnState | None = None) -> TurnState:
    state = state or TurnState.idle()
    for item in inputs:
        state = reduce_turn(state, item)
    return state


def response(*calls: tuple[str, dict[str, Any]]) -> list[TurnInput]:
    """The inputs of a turn whose first response asks for ``calls`` (named c1, c2...), up to the review."""
    return [
        Submit(turn_id="t", text="go", tool_set=REGISTRY, now_ms=0),
        MessageStart(model="m"),
        *(ToolCallComplete(id=f"c{n}", name=name, input=raw) for n, (name, raw) in enumerate(calls, 1)),
        MessageStop(stop_reason="tool_use"),
    ]


def card_preview(state: TurnState, call_id: str, document: ThreatModel) -> Preview:
    call = state.call(call_id)
    assert call is not None and call.prepared is not None
    preview = preview_call(call.prepared, document)
    assert preview is not None
    return preview


def card_ids(state: TurnState, document: ThreatModel, calls: Iterable[str] | None = None) -> dict[str, str | None]:
    """What each card of the step (of ``calls``) says its call adds: the new entity's id, or None when it would
    fail."""
    shown: dict[str, str | None] = {}
    for call_id in calls if calls is not None else (c.id for c in state.current_calls):
        preview = card_preview(state, call_id, document)
        shown[call_id] = None if preview.failure is not None else _only(preview.added).id
    return shown


def _only(added: Sequence[EntityChange]) -> EntityChange:
    assert len(added) == 1, added
    return added[0]


def _ids(document: ThreatModel) -> set[tuple[str, str]]:
    return {(section, entity_id) for section in SECTIONS for entity_id in document.ids(section)}


@attrs.define
class Ran:
    state: TurnState
    document: ThreatModel
    created: dict[str, str] = attrs.field(factory=dict)
    sections: dict[str, str] = attrs.field(factory=dict)
    failed: dict[str, str] = attrs.field(factory=dict)


def run_calls(state: TurnState, document: ThreatModel, order: Iterable[str]) -> Ran:
    """Start, run and commit each approved call of ``order`` as the runner does (one change at a time, each from the
    document the previous one left); what each one added, by call."""
    ran = Ran(state=state, document=document)
    history: UndoHistory[ThreatModel] = UndoHistory()
    for call_id in order:
        ran.state = reduce_turn(ran.state, StartCall(call_id=call_id, now_ms=1))
        call = ran.state.call(call_id)
        assert call is not None and call.status is CallStatus.RUNNING and call.prepared is not None
        tool = ran.state.tool_set.get(call.tool_name)
        assert tool is not None and call.prepared.invoke is not None
        before = ran.document
        outcome = call.prepared.invoke(ToolExecutionContext(document=before))
        assert isinstance(outcome, ToolOutcome)
        committed = commit_tool_outcome(before, before, outcome, tool, history, turn_id="t", kind=THREAT_MODEL)
        changed = isinstance(committed, Committed)
        if isinstance(committed, Committed):
            ran.document, history = committed.document, committed.history
            for section, new in _ids(ran.document) - _ids(before):  # none for a delete
                ran.created[call_id] = new
                ran.sections[call_id] = section
            settled: ToolOutcome[ThreatModel] = ToolOutcome.success(committed.result)
        else:
            assert isinstance(committed, Refused)
            ran.failed[call_id] = committed.result
            settled = ToolOutcome.failure(committed.result)
        ran.state = reduce_turn(
            ran.state, CallSettled(call_id=call_id, outcome=settled, now_ms=2, changed_document=changed)
        )
    return ran


SEVEN = [("add_threat", add_input("add_threat", n)) for n in range(1, 8)]
THREAT_8_TO_14 = {f"c{n}": f"threat-{n + 7}" for n in range(1, 8)}


def test_seven_adds_in_one_response_preview_seven_ids_and_become_exactly_those(payment: ThreatModel) -> None:
    state = fold(response(*SEVEN))
    assert state.phase is Phase.AWAITING_APPROVAL
    assert card_ids(state, payment) == THREAT_8_TO_14
    assert card_preview(state, "c2", payment).lines() == ("Adds threat threat-9 (Threat 2)",)
    state = reduce_turn(state, ApproveBatch(call_ids=tuple(THREAT_8_TO_14)))
    ran = run_calls(state, payment, THREAT_8_TO_14)
    assert ran.created == THREAT_8_TO_14 and ran.failed == {}
    results = {c.id: c.result for c in ran.state.current_calls}
    assert results["c7"] == 'Added threat "Threat 7" (Spoofing, high) with id "threat-14".'


def test_a_denied_card_leaves_every_other_card_its_id(payment: ThreatModel) -> None:
    state = fold(response(*SEVEN))
    shown = card_ids(state, payment)
    state = reduce_turn(state, DenyCall(call_id="c2", reason="not this one"))
    rest = [f"c{n}" for n in (1, 3, 4, 5, 6, 7)]
    for call_id in rest:
        state = reduce_turn(state, ApproveCall(call_id=call_id))
    ran = run_calls(state, payment, rest)
    assert ran.created == {call_id: shown[call_id] for call_id in rest}
    assert "threat-9" not in ran.document.ids("threats")  # the denied card's id stays unused
    assert card_ids(ran.state, payment) == shown  # a card still says what it said


def test_approved_and_run_in_reverse_order_the_ids_are_the_same(payment: ThreatModel) -> None:
    state = fold(response(*SEVEN))
    card_ids(state, payment)  # the cards are shown
    backwards = [f"c{n}" for n in range(7, 0, -1)]
    for call_id in backwards:
        state = reduce_turn(state, ApproveCall(call_id=call_id))
    assert run_calls(state, payment, backwards).created == THREAT_8_TO_14


def test_each_kind_reserves_within_its_own_namespace(payment: ThreatModel) -> None:
    kinds = ["add_threat", "add_element", "add_data_flow", "add_trust_boundary"] * 2
    state = fold(response(*((kind, add_input(kind, n)) for n, kind in enumerate(kinds))))
    expected = dict(
        zip(
            [f"c{n}" for n in range(1, 9)],
            ["threat-8", "comp-1", "flow-13", "boundary-3", "threat-9", "comp-2", "flow-14", "boundary-4"],
            strict=True,
        )
    )
    assert card_ids(state, payment) == expected
    state = reduce_turn(state, ApproveBatch(call_ids=tuple(expected)))
    assert run_calls(state, payment, reversed(list(expected))).created == expected


def test_without_a_face_the_ids_count_from_the_document_the_response_began_on(payment: ThreatModel) -> None:
    # No card was previewed, and a delete of the highest threat runs first: the adds still get the ids a card
    # would have shown, kept when the response's first change started.
    state = fold(response(("delete_threat", {"id": "threat-7"}), *SEVEN[:2]))
    state = fold([ApproveCall(call_id="c1"), ApproveBatch(call_ids=("c2", "c3"))], state)
    ran = run_calls(state, payment, ["c1", "c2", "c3"])
    assert ran.created == {"c2": "threat-8", "c3": "threat-9"}
    shown = fold(response(("delete_threat", {"id": "threat-7"}), *SEVEN[:2]))  # what cards would have said
    assert [_only(card_preview(shown, c, payment).added).id for c in ("c2", "c3")] == ["threat-8", "threat-9"]


def test_an_edited_card_keeps_its_reserved_id(payment: ThreatModel) -> None:
    state = fold(response(*SEVEN[:3]))
    shown = card_ids(state, payment)
    edited = add_input("add_threat", 2)
    edited["threat"]["title"] = "Renamed by the reviewer"
    state = fold([ApproveCall(call_id="c2", edited_input=edited), ApproveBatch(call_ids=("c1", "c3"))], state)
    call = state.call("c2")
    assert call is not None and call.edits == (("threat.title", "Threat 2", "Renamed by the reviewer"),)
    assert card_preview(state, "c2", payment).lines() == ("Adds threat threat-9 (Renamed by the reviewer)",)
    assert card_ids(state, payment) == shown
    ran = run_calls(state, payment, ["c3", "c2", "c1"])
    assert ran.created == shown
    threat = ran.document.find("threats", "threat-9")
    assert threat is not None and threat.title == "Renamed by the reviewer"  # type: ignore[union-attr]


def test_an_edit_that_names_an_id_takes_it_and_the_others_keep_theirs(payment: ThreatModel) -> None:
    state = fold(response(*SEVEN[:3]))
    shown = card_ids(state, payment)
    state = reduce_turn(state, ApproveCall(call_id="c1", edited_input=add_input("add_threat", 1, given="threat-50")))
    assert card_ids(state, payment) == {**shown, "c1": "threat-50"}
    state = reduce_turn(state, ApproveBatch(call_ids=("c2", "c3")))
    assert run_calls(state, payment, ["c1", "c2", "c3"]).created == {**shown, "c1": "threat-50"}


def test_an_id_the_model_names_is_skipped_by_the_reservations_after_it(payment: ThreatModel) -> None:
    state = fold(response(("add_threat", add_input("add_threat", 1, given="threat-8")), SEVEN[1]))
    assert card_ids(state, payment) == {"c1": "threat-8", "c2": "threat-9"}


def test_an_id_the_model_names_after_another_card_reserved_it_is_refused_whatever_is_decided(
    payment: ThreatModel,
) -> None:
    state = fold(response(SEVEN[0], ("add_threat", add_input("add_threat", 2, given="threat-8"))))
    preview = card_preview(state, "c2", payment)
    assert preview.failure is not None and '"threat-8"' in preview.failure and "earlier add" in preview.failure
    # Even with the first card denied, the second does what its card said: nothing.
    state = fold([DenyCall(call_id="c1"), ApproveCall(call_id="c2")], state)
    ran = run_calls(state, payment, ["c2"])
    assert ran.created == {} and "earlier add" in ran.failed["c2"]


def test_an_id_taken_by_the_time_the_call_runs_fails_the_call_and_says_so(payment: ThreatModel) -> None:
    state = fold(response(*SEVEN[:2]))
    assert card_ids(state, payment) == {"c1": "threat-8", "c2": "threat-9"}
    state = reduce_turn(state, ApproveBatch(call_ids=("c1", "c2")))
    # The document changes under the step: someone else's threat-9 arrives before c2 runs.
    tool = REGISTRY.get("add_threat")
    assert tool is not None
    elsewhere = tool.prepare(add_input("add_threat", 99, given="threat-9"))
    assert isinstance(elsewhere, PreparedCall) and elsewhere.invoke is not None
    changed = elsewhere.invoke(ToolExecutionContext(document=payment))
    assert isinstance(changed, ToolOutcome) and changed.document is not None
    ran = run_calls(state, changed.document, ["c1", "c2"])
    assert ran.created == {"c1": "threat-8"}
    assert ran.failed["c2"].startswith('Cannot add threat: the id "threat-9" its card showed is now used by a threat')
    assert card_preview(ran.state, "c2", changed.document).failure == ran.failed["c2"]


def test_a_response_resumed_after_part_of_it_ran_refuses_rather_than_renumbers(payment: ThreatModel) -> None:
    inputs = [*response(*SEVEN[:3]), ApproveBatch(call_ids=("c1", "c2", "c3"))]
    live = fold(inputs)
    assert card_ids(live, payment) == {"c1": "threat-8", "c2": "threat-9", "c3": "threat-10"}
    ran = run_calls(live, payment, ["c1"])
    # Another process replays what was journaled: its step kept no base, and part of the step changed the document.
    started, settled = StartCall(call_id="c1", now_ms=1), ran.state.calls[0]
    assert settled.status is CallStatus.SUCCEEDED
    replayed = fold(
        [
            *inputs,
            started,
            CallSettled(
                call_id="c1", outcome=ToolOutcome.success(settled.result or ""), now_ms=2, changed_document=True
            ),
        ]
    )
    for call_id in ("c2", "c3"):
        failure = card_preview(replayed, call_id, ran.document).failure
        assert failure is not None and "can no longer be kept" in failure
    after = run_calls(replayed, ran.document, ["c2", "c3"])
    assert after.created == {} and after.document is ran.document
    assert all("can no longer be kept" in text for text in after.failed.values())
    # In the live process the base was kept: the same calls add what their cards said.
    assert run_calls(ran.state, ran.document, ["c2", "c3"]).created == {"c2": "threat-9", "c3": "threat-10"}


def test_replay_reproduces_the_reservations_and_the_previews(payment: ThreatModel) -> None:
    kinds = ["add_threat", "add_element", "add_threat", "add_data_flow"]
    inputs = [*response(*((kind, add_input(kind, n)) for n, kind in enumerate(kinds))), DenyCall(call_id="c3")]
    live, again = fold(inputs), fold(inputs)
    assert attrs.evolve(again, draft=None) == attrs.evolve(live, draft=None)
    assert [c.prepared.reservations for c in again.current_calls if c.prepared] == [
        c.prepared.reservations for c in live.current_calls if c.prepared
    ]
    assert card_ids(again, payment) == card_ids(live, payment)


# -- the same through a session with a journal -----------------------------------------------------------


async def wait_for_review(session: Session[ThreatModel]) -> None:
    async with aclosing(session.states()) as states:
        async for state in states:
            if session.busy and state.phase is Phase.AWAITING_APPROVAL:
                return


async def open_payment(store: MemoryJournalStore, provider: ScriptedProvider) -> Session[ThreatModel]:
    return await Session.open(
        store, "s1", kind=THREAT_MODEL, provider=provider, document=load_thf(PAYMENT), model="m", tools=REGISTRY
    )


async def test_a_review_taken_up_from_the_journal_shows_and_adds_the_same_ids() -> None:
    store = MemoryJournalStore()
    seven = tuple(ScriptedCall(id=f"c{n}", name=name, input=raw) for n, (name, raw) in enumerate(SEVEN, 1))
    steps = [ScriptStep(tool_calls=seven), ScriptStep(text="Done.")]
    async with ScriptedProvider(steps) as provider:
        async with await open_payment(store, provider) as session, trio.open_nursery() as nursery:
            nursery.start_soon(session.send, "add seven threats")
            await wait_for_review(session)
            assert session.state is not None
            shown = card_ids(session.state, session.document)
            assert shown == THREAT_8_TO_14
            assert session.deny("c2")
            await trio.testing.wait_all_tasks_blocked()
            assert await session.suspend() is not None

        reopened = await open_payment(store, provider)
        assert reopened.state is not None and card_ids(reopened.state, reopened.document) == shown
        async with reopened:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(reopened.continue_turn)
                await trio.testing.wait_all_tasks_blocked()
                assert reopened.approve_batch(("c7", "c6", "c5", "c4", "c3", "c1"))
            added = reopened.document.ids("threats") - load_thf(PAYMENT).ids("threats")
            assert added == {shown[c] for c in shown if c != "c2"}


# -- any adds, any decisions, any order ---------------------------------------------------------------------

KINDS = ("add_threat", "add_element", "add_data_flow", "add_trust_boundary")
NAMED = ("threat-9", "threat-3", "comp-1", "comp-2", "flow-13", "rel-1", "boundary-3", "grp-core", "own-id")


def _renamed(raw: dict[str, Any], given: str | None) -> dict[str, Any]:
    """An add's input with the id it names changed (None: it names none)."""
    ((key, entity),) = raw.items()
    entity = {name: value for name, value in entity.items() if name != "id"}
    return {key: entity if given is None else {**entity, "id": given}}


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_every_added_id_is_the_one_its_card_showed(data: st.DataObject) -> None:
    payment = load_thf(PAYMENT)
    kinds = data.draw(st.lists(st.sampled_from(KINDS), min_size=1, max_size=9), label="kinds")
    if data.draw(st.booleans(), label="the response also deletes the highest threat"):
        kinds.insert(data.draw(st.integers(0, len(kinds)), label="where"), "delete_threat")
    named = data.draw(st.lists(st.none() | st.sampled_from(NAMED), min_size=len(kinds), max_size=len(kinds)))
    calls = [
        ("delete_threat", {"id": "threat-7"}) if kind == "delete_threat" else (kind, add_input(kind, n, given))
        for n, (kind, given) in enumerate(zip(kinds, named, strict=True))
    ]
    state = fold(response(*calls))
    ids = [f"c{n}" for n in range(1, len(calls) + 1)]
    adds = [call_id for call_id, (kind, _) in zip(ids, calls, strict=True) if kind != "delete_threat"]
    decisions = data.draw(
        st.lists(st.sampled_from(("approve", "deny", "edit", "rename")), min_size=len(ids), max_size=len(ids))
    )
    previewed_first = data.draw(st.booleans(), label="a face shows the cards before the decisions")
    before = card_ids(state, payment, adds) if previewed_first else None
    approved, renamed = [], set()
    for call_id, decision, (kind, raw) in zip(ids, decisions, calls, strict=True):
        if decision == "deny":
            state = reduce_turn(state, DenyCall(call_id=call_id))
            continue
        if decision == "edit" and kind != "delete_threat":
            ((key, entity),) = raw.items()
            edited = {key: {**entity, "name" if "name" in entity else "title": "Edited"}}
            state = reduce_turn(state, ApproveCall(call_id=call_id, edited_input=edited))
        elif decision == "rename" and kind != "delete_threat":
            given = data.draw(st.none() | st.sampled_from(NAMED), label=f"{call_id} renamed to")
            state = reduce_turn(state, ApproveCall(call_id=call_id, edited_input=_renamed(raw, given)))
            renamed.add(call_id)
        else:
            state = reduce_turn(state, ApproveCall(call_id=call_id))
        approved.append(call_id)
    order = data.draw(st.permutations(approved), label="run order")
    shown = card_ids(state, payment, adds) if previewed_first else None
    if before is not None and shown is not None:
        # Decisions on other cards (and edits that keep the id a card names) never change a card's id.
        assert {c: shown[c] for c in adds if c not in renamed} == {c: before[c] for c in adds if c not in renamed}
    ran = run_calls(state, payment, order)
    shown = shown if shown is not None else card_ids(ran.state, payment, adds)  # a face that looks only afterwards
    approved_adds = [call_id for call_id in approved if call_id in shown]
    assert {c: ran.created[c] for c in approved_adds if c in ran.created} == {
        c: shown[c] for c in approved_adds if shown[c] is not None
    }
    assert {c for c in approved_adds if c in ran.failed} == {c for c in approved_adds if shown[c] is None}
    added = {(ran.sections[call_id], new) for call_id, new in ran.created.items()}
    assert len(added) == len(ran.created)  # no id twice in a section


# -- a second document type, through the public interfaces only -------------------------------------------

Notes = tuple[tuple[str, str], ...]  # (id, text) lines


@attrs.frozen
class NoteIds:
    """n-1, n-2...: one past the note count, past every earlier claim of the step."""

    def base(self, document: Notes) -> int:
        return len(document)

    def assign(self, base: int | None, claims: tuple[IdClaim, ...]) -> str | IdRefused:
        reserved = sum(1 for claim in claims if claim.given is None)
        return claims[-1].given or f"n-{(base or 0) + reserved}"


NOTE_IDS = NoteIds()


def _note_call(text: str, reservations: tuple[Reservation, ...]) -> ClaimingCall[Notes]:
    def new_id(document: Notes) -> str | IdRefused:
        return reservations[0].resolve(document) if reservations else f"n-{len(document) + 1}"

    def invoke(ctx: Any) -> ToolOutcome[Notes]:
        assigned = new_id(ctx.document)
        if isinstance(assigned, IdRefused) or any(note_id == assigned for note_id, _ in ctx.document):
            return ToolOutcome.failure("that id is gone")
        return ToolOutcome.success(f"added {assigned}", document=(*ctx.document, (assigned, text)))

    async def run(ctx: Any) -> ToolOutcome[Notes]:
        return invoke(ctx)

    def preview(document: Notes) -> Preview:
        assigned = new_id(document)
        if isinstance(assigned, IdRefused):
            return Preview(failure=assigned.reason)
        return Preview(added=(EntityChange(kind="note", id=assigned, name=text),))

    return ClaimingCall(
        summary=f"Add a note: {text}",
        input_digest=input_digest({"text": text}),
        run=run,
        preview=preview,
        invoke=invoke,
        claims=(IdClaim(scheme=NOTE_IDS, key="note"),),
        reservations=reservations,
        with_ids=lambda made: _note_call(text, made),
    )


ADD_NOTE: RegisteredTool[Notes] = RegisteredTool(
    name="add_note",
    description="Add a note.",
    effect="mutate",
    destructive=False,
    json_schema={"type": "object"},
    prepare_fn=lambda raw: _note_call(str(raw["text"]), ()),
)


def test_a_second_document_type_reserves_its_ids_the_same_way() -> None:
    registry = create_tool_registry([ADD_NOTE])
    state = fold(
        [
            Submit(turn_id="t", text="go", tool_set=registry, now_ms=0),
            MessageStart(model="m"),
            *(ToolCallComplete(id=f"c{n}", name="add_note", input={"text": f"note {n}"}) for n in (1, 2, 3)),
            MessageStop(stop_reason="tool_use"),
        ]
    )
    document: Notes = (("n-1", "old"),)
    shown = {}
    for call in state.current_calls:
        assert call.prepared is not None
        preview = preview_call(call.prepared, document)
        assert preview is not None
        shown[call.id] = _only(preview.added).id
    assert shown == {"c1": "n-2", "c2": "n-3", "c3": "n-4"}
    state = fold([DenyCall(call_id="c2"), ApproveCall(call_id="c3"), ApproveCall(call_id="c1")], state)
    for call_id in ("c3", "c1"):
        state = reduce_turn(state, StartCall(call_id=call_id, now_ms=1))
        call = state.call(call_id)
        assert call is not None and call.prepared is not None
        outcome = trio.run(call.prepared.run, ToolExecutionContext(document=document))
        assert outcome.ok and outcome.document is not None
        document = outcome.document
        state = reduce_turn(state, CallSettled(call_id=call_id, outcome=outcome, now_ms=2, changed_document=True))
    assert document == (("n-1", "old"), ("n-4", "note 3"), ("n-2", "note 1"))


def test_with_prepared_is_evolve_of_the_prepared_call_alone(payment: ThreatModel) -> None:
    state = fold(response(*SEVEN[:2]))
    first, second = state.current_calls
    assert first.prepared is not None and second.prepared is not None
    swapped = first.with_prepared(second.prepared)
    assert swapped == attrs.evolve(first, prepared=second.prepared) and swapped.prepared is second.prepared
    assert first.prepared is not second.prepared  # the record it was made from is unchanged
