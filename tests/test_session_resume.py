"""A session saved to a file and resumed: the same conversation, document and undo history, turn ids that
continue, and hostile or broken files refused with a typed error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from trioloop import (
    CallStatus,
    Outcome,
    Phase,
    ScriptedProvider,
    Session,
    ToolExecutionContext,
    ToolOutcome,
    define_document_kind,
    function_tool,
)
from trioloop.durable.session_file import SessionFileError
from trioloop.providers.scripted import ScriptedCall, ScriptStep
from trioloop.threatmodel import THREAT_MODEL, ThreatModel, create_ai_tool_registry, load_thf

PAYMENT = Path(__file__).resolve().parent.parent / "examples" / "payment.thf"


def add_threat(cid: str, title: str) -> ScriptStep:
    threat = {"title": title, "category": "Spoofing", "severity": "medium", "element": "psp"}
    return ScriptStep(tool_calls=(ScriptedCall(id=cid, name="add_threat", input={"threat": threat}),))


async def approve_pending(session: Session[ThreatModel]) -> None:
    async for state in session.states():
        if state.phase is Phase.AWAITING_APPROVAL:
            for call in state.current_calls:
                if call.status is CallStatus.PENDING:
                    session.approve(call.id)


async def send(session: Session[ThreatModel], text: str) -> None:
    async with trio.open_nursery() as ui:
        ui.start_soon(approve_pending, session)
        assert (await session.send(text)).outcome is Outcome.COMPLETED
        ui.cancel_scope.cancel()


async def test_a_resumed_session_continues_the_conversation_and_undoes_the_last_turn(tmp_path: Path) -> None:
    original = load_thf(PAYMENT)
    path = tmp_path / "work.session.json"
    steps = [add_threat("a", "First"), ScriptStep(text="Added."), add_threat("b", "Second"), ScriptStep(text="Ok.")]
    async with ScriptedProvider(steps) as provider:
        async with Session(
            document=original, kind=THREAT_MODEL, provider=provider, model="scripted-1", tools=create_ai_tool_registry()
        ) as session:
            await send(session, "add the first")
            after_first = session.document
            await send(session, "add the second")
            session.save(path)
            saved_history, saved_document = session.history, session.document

        # A new process would start here: only the file carries the session over.
        resumed = Session.resume(path, kind=THREAT_MODEL, provider=provider, tools=create_ai_tool_registry())
        assert resumed.history == saved_history and resumed.document == saved_document
        assert resumed.model == "scripted-1" and resumed.undo_availability().undoable
        assert resumed.undo_last_turn() and resumed.document == after_first  # the second turn, undone
        assert not resumed.undo_last_turn()
    assert [e.turn_id for e in resumed.undo_history.entries] == ["turn-1"]


async def test_turn_ids_continue_after_the_saved_ones(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    steps = [add_threat("a", "First"), ScriptStep(text="Added."), add_threat("b", "Again"), ScriptStep(text="Ok.")]
    async with ScriptedProvider(steps) as provider:
        async with Session(
            document=load_thf(PAYMENT), kind=THREAT_MODEL, provider=provider, model="m", tools=create_ai_tool_registry()
        ) as first:
            await send(first, "one")
            first.save(path)
        async with Session.resume(
            path, kind=THREAT_MODEL, provider=provider, model="scripted-1", tools=create_ai_tool_registry()
        ) as second:
            await send(second, "two")
            assert [e.turn_id for e in second.undo_history.entries] == ["turn-1", "turn-2"]
            assert second.undo_last_turn() and len(second.document.threats) == len(load_thf(PAYMENT).threats) + 1


def test_a_kind_without_a_text_form_cannot_be_saved(tmp_path: Path) -> None:
    session = Session(document=[1], kind=define_document_kind("list"), provider=None, model="m")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="no text form"):
        session.save(tmp_path / "x.json")
    assert not (tmp_path / "x.json").exists()


async def test_a_str_kind_with_dump_and_load_round_trips(tmp_path: Path) -> None:
    note = define_document_kind("note", dump=lambda text: text, load=lambda text: text)

    @function_tool
    async def shout(ctx: ToolExecutionContext[str]) -> ToolOutcome[str]:
        """Upper-case the note."""
        return ToolOutcome.success("done", document=ctx.document.upper())

    path = tmp_path / "note.json"
    steps = [ScriptStep(tool_calls=[ScriptedCall(id="s", name="shout")]), ScriptStep(text="ok")]
    async with ScriptedProvider(steps) as provider:
        async with Session(document="hi", kind=note, provider=provider, model="m", tools=[shout]) as session:
            async with trio.open_nursery() as ui:

                async def review() -> None:
                    async for state in session.states():
                        if state.phase is Phase.AWAITING_APPROVAL:
                            session.approve("s")

                ui.start_soon(review)
                await session.send("shout")
                ui.cancel_scope.cancel()
            session.save(path)
        resumed = Session.resume(path, kind=note, provider=provider, tools=[shout])
    assert resumed.document == "HI" and resumed.undo_last_turn() and resumed.document == "hi"


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda v: v.update(document="version: '9.9'\n"), "document"),
        (lambda v: v.update(document="a: &a [*a, *a]\n" * 3), "document"),
        (lambda v: v.update(turn_count=-1), "turn_count"),
        (lambda v: v.update(extra=1), "unknown key"),
        (lambda v: v.update(format="something else"), "not a trioloop session file"),
        (lambda v: v["undo"].append({"turn_id": "turn-1", "document": v["document"]}), "turn"),
    ],
)
async def test_broken_or_hostile_files_are_refused(tmp_path: Path, mutate: object, message: str) -> None:
    path = tmp_path / "s.json"
    session = Session(document=load_thf(PAYMENT), kind=THREAT_MODEL, provider=None, model="m")  # type: ignore[arg-type]
    session.save(path)
    value = json.loads(path.read_text())
    value["undo"] = [{"turn_id": "turn-1", "document": value["document"]}]
    mutate(value)  # type: ignore[operator]
    path.write_text(json.dumps(value))
    with pytest.raises(SessionFileError, match=message):
        Session.resume(path, kind=THREAT_MODEL, provider=None)  # type: ignore[arg-type]


def test_an_oversized_file_is_refused_without_reading_it_all(tmp_path: Path) -> None:
    path = tmp_path / "big.json"
    path.write_bytes(b" " * 5000)
    with pytest.raises(SessionFileError, match="larger than 1000 bytes"):
        Session.resume(path, kind=THREAT_MODEL, provider=None, max_bytes=1000)  # type: ignore[arg-type]
    with pytest.raises(SessionFileError, match="could not be read"):
        Session.resume(tmp_path / "missing.json", kind=THREAT_MODEL, provider=None)  # type: ignore[arg-type]


async def test_a_file_whose_undo_ids_run_ahead_of_its_turn_count_never_reuses_an_id(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    session = Session(document=load_thf(PAYMENT), kind=THREAT_MODEL, provider=None, model="m")  # type: ignore[arg-type]
    session.save(path)
    value = json.loads(path.read_text())
    value["undo"] = [{"turn_id": "turn-7", "document": value["document"]}]
    value["last_turn_id"], value["turn_count"] = "turn-7", 1
    path.write_text(json.dumps(value))
    steps = [add_threat("a", "First"), ScriptStep(text="Added.")]
    async with (
        ScriptedProvider(steps) as provider,
        Session.resume(
            path, kind=THREAT_MODEL, provider=provider, model="scripted-1", tools=create_ai_tool_registry()
        ) as resumed,
    ):
        await send(resumed, "one")
    assert [e.turn_id for e in resumed.undo_history.entries] == ["turn-7", "turn-8"]
