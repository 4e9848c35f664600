"""Misbehaving tools: each fault is contained to its own call and reported to the model.

A tool that raises, returns garbage, proposes an invalid document, hangs, swallows ``trio.Cancelled``
or mutates what it was handed must fail only its own call (a sibling call in the same iteration
still succeeds), leave the live document as it was, and reach the model as a structured error result
in the next request. A tool gets a detached copy of the document, so even
``object.__setattr__`` on it cannot reach the live document or the undo snapshot.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import attrs
import pytest
import trio
import trio.testing
from torture_support import PAYMENT, payment, record

from trioloop.machine.limits import TurnLimits
from trioloop.machine.reducer import CallStatus, Outcome, Phase, TurnState
from trioloop.machine.tools import RegisteredTool, ToolOutcome, create_tool_registry
from trioloop.machine.transaction import undo_turn
from trioloop.protocol import assert_tool_pairing
from trioloop.providers.scripted import ScriptedCall, ScriptedProvider, ScriptStep
from trioloop.runtime.controls import TurnControls
from trioloop.runtime.runner import TurnRequest, Workspace, run_turn
from trioloop.runtime.session import Session
from trioloop.runtime.tool_calls import TOOL_CANCEL_GRACE_S
from trioloop.runtime.tools import ToolExecutionContext, define_executable_tool
from trioloop.threatmodel import THREAT_MODEL, Element, Threat, ThreatModel, dump_thf, load_thf, threat_model_session

FAILED_RUNNING = "The tool failed while running ({})."
NOT_AN_OUTCOME = "The tool returned something that is not a tool outcome."
NOT_A_DOCUMENT = (
    "The tool returned a document that is not a threat model (got {}, expected ThreatModel); nothing changed."
)
INVALID = "The change was not applied because the document would be invalid: "
NOT_TEXT = "The tool returned a result that is not text, so the call failed and its result was discarded."
READ_MUTATED = "A read-only tool returned a document change; it was refused and nothing changed."
INTERRUPTED = "Not run to completion: the turn ended while this call was running; its result was discarded."
DEADLINE_MS = 30_000


@attrs.frozen(kw_only=True)
class Free:
    payload: Any = None


Run = Callable[[Free, ToolExecutionContext], Any]


def tool(name: str, run: Run, *, effect: Any = "mutate") -> RegisteredTool:
    return define_executable_tool(
        name=name,
        description=f"{name} (torture)",
        effect=effect,
        destructive=False,
        input_type=Free,
        run=run,
        summarize=lambda inp: name,
    )


def sibling() -> RegisteredTool:
    def run(inp: Free, ctx: ToolExecutionContext) -> ToolOutcome:
        return ToolOutcome.success("sibling fine")

    return tool("sibling", run, effect="read")


def with_threat(document: ThreatModel, **fields: Any) -> ThreatModel:
    values = {"id": "t-new", "title": "New", "category": "Tampering", "severity": "low", "element": "psp"} | fields
    return attrs.evolve(document, threats=(*document.threats, Threat(**values)))


def approve_all(state: TurnState, controls: TurnControls) -> None:
    if state.phase is Phase.AWAITING_APPROVAL:
        for call in state.current_calls:
            if call.status is CallStatus.PENDING:
                controls.approve(call.id)


def results_of(body: Any) -> dict[str, tuple[str, bool]]:
    """The tool results an Anthropic-shaped request body carries, by call id."""
    found = {}
    for message in body["messages"]:
        if isinstance(message["content"], list):
            for block in message["content"]:
                if block.get("type") == "tool_result":
                    found[block["tool_use_id"]] = (block["content"], block["is_error"])
    return found


@attrs.frozen
class TurnResult:
    """What one turn left behind: its final state, the request bodies the model got, the workspace."""

    final: TurnState
    requests: tuple[Any, ...]
    workspace: Workspace
    elapsed: float


async def one_turn(
    bad: RegisteredTool,
    *,
    steps: list[ScriptStep] | None = None,
    on_state: Callable[[TurnState, TurnControls], None] = approve_all,
    document: ThreatModel | None = None,
) -> TurnResult:
    """A turn where the model calls ``bad`` and a well-behaved read tool side by side, then answers."""
    steps = steps or [
        ScriptStep(tool_calls=(ScriptedCall(id="bad", name=bad.name, input={}), ScriptedCall(id="ok", name="sibling"))),
        ScriptStep(text="Understood."),
    ]
    workspace = Workspace(document=document or payment(), kind=THREAT_MODEL)
    controls = TurnControls()
    request = TurnRequest(
        text="go",
        turn_id="turn-1",
        model="scripted-1",
        registry=create_tool_registry([bad, sibling()]),
        limits=TurnLimits(turn_deadline_ms=DEADLINE_MS),
    )
    start = trio.current_time()
    # The tool nursery outlives the turn, as a Session's does: a tool that will not stop is abandoned by
    # the turn (which returns at once) and cancelled again and awaited when this nursery closes.
    async with ScriptedProvider(steps) as provider, trio.open_nursery() as tool_nursery:
        final = await run_turn(
            request,
            workspace,
            provider,
            tool_nursery=tool_nursery,
            controls=controls,
            on_state=lambda s: on_state(s, controls),
        )
        elapsed = trio.current_time() - start
        tool_nursery.cancel_scope.cancel()
    assert final.is_settled and assert_tool_pairing(final.messages) == ()
    return TurnResult(final, provider.requests, workspace, elapsed)


def garbage_cases() -> dict[str, tuple[Run, str]]:
    """Tool bodies that fail in some way, and the exact error text the model must get for each."""

    def raising(exc: BaseException) -> Run:
        def run(inp: Free, ctx: ToolExecutionContext) -> Any:
            raise exc

        return run

    def returning(value: Callable[[ThreatModel], Any]) -> Run:
        async def run(inp: Free, ctx: ToolExecutionContext) -> Any:
            await trio.lowlevel.checkpoint()
            return value(ctx.document)

        return run

    element = Element(id="e", type="process", name="E")
    return {
        "raises ValueError": (raising(ValueError("internal detail /etc/secret")), FAILED_RUNNING.format("ValueError")),
        "raises KeyError": (raising(KeyError("x")), FAILED_RUNNING.format("KeyError")),
        "raises ExceptionGroup": (
            raising(ExceptionGroup("two", [ValueError("a"), TypeError("b")])),
            FAILED_RUNNING.format("ExceptionGroup"),
        ),
        "raises RecursionError": (raising(RecursionError("deep")), FAILED_RUNNING.format("RecursionError")),
        "returns None": (returning(lambda d: None), NOT_AN_OUTCOME),
        "returns a str": (returning(lambda d: "done"), NOT_AN_OUTCOME),
        "returns a dict": (returning(lambda d: {"ok": True, "result": "x"}), NOT_AN_OUTCOME),
        "returns the document": (returning(lambda d: d), NOT_AN_OUTCOME),
        "document is a dict": (
            returning(lambda d: ToolOutcome.success("x", document=cast(Any, {"version": "1.0"}))),
            NOT_A_DOCUMENT.format("dict"),
        ),
        "document is an Element": (
            returning(lambda d: ToolOutcome.success("x", document=cast(Any, element))),
            NOT_A_DOCUMENT.format("Element"),
        ),
        "elements hold junk": (
            returning(lambda d: ToolOutcome.success("x", document=attrs.evolve(d, elements=cast(Any, ("junk",))))),
            INVALID,
        ),
        "version 2.0": (
            returning(lambda d: ToolOutcome.success("x", document=attrs.evolve(d, version="2.0"))),
            INVALID,
        ),
        "version not text": (
            returning(lambda d: ToolOutcome.success("x", document=attrs.evolve(d, version=cast(Any, 2)))),
            INVALID,
        ),
        "dangling reference": (
            returning(lambda d: ToolOutcome.success("x", document=with_threat(d, element="no-such-element"))),
            INVALID,
        ),
        "duplicate id": (
            returning(lambda d: ToolOutcome.success("x", document=with_threat(d, id=d.threats[0].id))),
            INVALID,
        ),
        "threat targets nothing": (
            returning(lambda d: ToolOutcome.success("x", document=with_threat(d, element=None))),
            INVALID,
        ),
        "extra holds an object": (
            returning(lambda d: ToolOutcome.success("x", document=attrs.evolve(d, extra={"x": object()}))),
            INVALID,
        ),
        "self-containing list": (
            returning(lambda d: ToolOutcome.success("x", document=attrs.evolve(d, extra={"x": _loop()}))),
            FAILED_RUNNING.format("RecursionError"),
        ),
        "reports failure": (returning(lambda d: ToolOutcome.failure("could not do it")), "could not do it"),
    }


def _loop() -> list[Any]:
    value: list[Any] = []
    value.append(value)
    return value


CASES = garbage_cases()


@pytest.mark.parametrize("case", sorted(CASES))
async def test_a_failing_tool_fails_only_its_call(case: str) -> None:
    run, expected = CASES[case]
    result = await one_turn(tool("bad", run))
    final = result.final
    assert final.outcome is Outcome.COMPLETED
    bad, ok = final.call("bad"), final.call("ok")
    assert bad is not None and bad.status is CallStatus.FAILED and bad.is_error
    assert ok is not None and ok.status is CallStatus.SUCCEEDED
    assert result.workspace.document is payment() and result.workspace.undo.entries == ()
    content, is_error = results_of(result.requests[1])["bad"]
    assert is_error and (content == expected if expected != INVALID else content.startswith(INVALID))
    assert results_of(result.requests[1])["ok"] == ("sibling fine", False)
    assert "/etc/secret" not in content
    record(f"tool fault: {case}", tried=1, held=1)


def test_the_case_list_is_not_trivially_small() -> None:
    assert len(CASES) >= 15


async def test_a_read_tool_proposing_a_document_is_refused() -> None:
    def run(inp: Free, ctx: ToolExecutionContext) -> ToolOutcome:
        return ToolOutcome.success("sneaky", document=with_threat(ctx.document))

    result = await one_turn(tool("bad", run, effect="read"))
    assert results_of(result.requests[1])["bad"] == (READ_MUTATED, True)
    assert result.workspace.document is payment()
    record("tool fault: read tool returns a document", tried=1, held=1)


# --- outcomes whose fields are the wrong types ----------------------------------------------------


class Text(str):
    """A str subclass: equal to text, but not exactly ``str``."""


ODD_OUTCOMES = {
    "int result": lambda: ToolOutcome(ok=True, result=cast(Any, 123)),
    "bytes result": lambda: ToolOutcome(ok=True, result=cast(Any, b"done")),
    "None result": lambda: ToolOutcome(ok=False, result=cast(Any, None)),
    "str-subclass result": lambda: ToolOutcome(ok=True, result=Text("done")),
}


@pytest.mark.parametrize("case", sorted(ODD_OUTCOMES))
async def test_an_outcome_with_a_non_text_result_is_contained(
    case: str, autojump_clock: trio.testing.MockClock
) -> None:
    def run(inp: Free, ctx: ToolExecutionContext) -> ToolOutcome:
        return ODD_OUTCOMES[case]()

    result = await one_turn(tool("bad", run))
    assert result.final.outcome is Outcome.COMPLETED  # not stuck running until the deadline
    bad = result.final.call("bad")
    assert bad is not None and bad.status is CallStatus.FAILED
    assert results_of(result.requests[1])["bad"] in ((NOT_AN_OUTCOME, True), (NOT_TEXT, True))
    assert result.workspace.document is payment()
    record("tool fault: ToolOutcome whose result is not exactly str", tried=1, held=1)


async def test_a_committed_change_is_never_reported_as_discarded(autojump_clock: trio.testing.MockClock) -> None:
    def run(inp: Free, ctx: ToolExecutionContext) -> ToolOutcome:
        return ToolOutcome(ok=True, result=b"bytes", document=with_threat(ctx.document))  # type: ignore[arg-type]

    result = await one_turn(tool("bad", run))
    bad = result.final.call("bad")
    assert bad is not None
    committed = result.workspace.document is not payment()
    record(
        "tool fault: committed change reported as discarded",
        tried=1,
        held=0 if committed and bad.status is not CallStatus.SUCCEEDED else 1,
    )
    # Either nothing was committed, or the state says the call succeeded: never a silent change.
    assert not committed or bad.status is CallStatus.SUCCEEDED


# --- hangs and swallowed cancellation -------------------------------------------------------------


async def test_a_hanging_tool_is_cut_at_the_deadline(autojump_clock: trio.testing.MockClock) -> None:
    saw: list[bool] = []

    async def run(inp: Free, ctx: ToolExecutionContext) -> ToolOutcome:
        try:
            await trio.sleep_forever()
        finally:
            saw.append(ctx.cancelled)
        raise AssertionError("unreachable")

    result = await one_turn(tool("bad", run))
    assert result.final.outcome is Outcome.BOUNDED and saw == [True]
    assert result.elapsed == pytest.approx(DEADLINE_MS / 1000)
    assert result.final.call("bad") is not None and result.final.call("bad").status is CallStatus.DENIED  # type: ignore[union-attr]
    assert result.final.call("ok") is not None and result.final.call("ok").status is CallStatus.SUCCEEDED  # type: ignore[union-attr]
    assert result.workspace.document is payment()
    record("tool fault: hangs until the deadline", tried=1, held=1)


def bad_tool_session(provider: ScriptedProvider, run: Run) -> Session[ThreatModel]:
    """A session over the example document offering only ``bad``, with the short test deadline."""
    return threat_model_session(
        document=payment(),
        provider=provider,
        model="scripted-1",
        tools=create_tool_registry([tool("bad", run)]),
        limits=TurnLimits(turn_deadline_ms=DEADLINE_MS),
    )


async def send_approving_bad(session: Session[ThreatModel], text: str) -> TurnState:
    """One turn whose reviewer approves the call ``bad`` as soon as its card is shown."""

    async def review() -> None:
        async for state in session.states():
            if state.phase is Phase.AWAITING_APPROVAL:
                session.approve("bad")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(review)
        final = await session.send(text)
        nursery.cancel_scope.cancel()
    return final


async def test_the_next_turn_is_told_the_hung_call_was_interrupted(autojump_clock: trio.testing.MockClock) -> None:
    async def run(inp: Free, ctx: ToolExecutionContext) -> ToolOutcome:
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    steps = [ScriptStep(tool_calls=(ScriptedCall(id="bad", name="bad"),)), ScriptStep(text="Sorry.")]
    async with ScriptedProvider(steps) as provider, bad_tool_session(provider, run) as session:
        first = await send_approving_bad(session, "go")
        second = await session.send("what happened?")
    assert first.outcome is Outcome.BOUNDED and second.outcome is Outcome.COMPLETED
    assert results_of(provider.requests[1])["bad"] == (INTERRUPTED, True)
    record("tool fault: hung call reported in the next turn", tried=1, held=1)


@pytest.mark.parametrize("how", ["stop", "deadline"])
async def test_a_tool_swallowing_cancel_once_is_never_committed(
    how: str, autojump_clock: trio.testing.MockClock
) -> None:
    async def run(inp: Free, ctx: ToolExecutionContext) -> ToolOutcome:
        try:  # noqa: SIM105 -- the point is a tool that swallows the cancellation
            await trio.sleep_forever()
        except trio.Cancelled:
            pass
        return ToolOutcome.success("changed anyway", document=with_threat(ctx.document))

    def stop_when_running(state: TurnState, controls: TurnControls) -> None:
        approve_all(state, controls)
        if how == "stop" and any(c.status is CallStatus.RUNNING and c.id == "bad" for c in state.calls):
            controls.stop()

    result = await one_turn(tool("bad", run), on_state=stop_when_running)
    assert result.final.outcome is (Outcome.CANCELLED if how == "stop" else Outcome.BOUNDED)
    assert result.workspace.document is payment() and result.workspace.undo.entries == ()
    record(f"tool fault: swallows Cancelled once ({how})", tried=1, held=1)


GRACE_S = TOOL_CANCEL_GRACE_S


async def test_a_tool_that_keeps_working_after_cancel_is_abandoned(autojump_clock: trio.testing.MockClock) -> None:
    async def run(inp: Free, ctx: ToolExecutionContext) -> ToolOutcome:
        try:  # noqa: SIM105 -- swallows the cancellation and carries on for an hour
            await trio.sleep_forever()
        except trio.Cancelled:
            pass
        with trio.CancelScope(shield=True):
            await trio.sleep(3600)
        return ToolOutcome.success("late", document=with_threat(ctx.document))

    result = await one_turn(tool("bad", run))
    assert result.workspace.document is payment()
    late = result.elapsed - DEADLINE_MS / 1000
    record(
        "tool fault: keeps working after Cancelled",
        tried=1,
        held=int(late <= GRACE_S),
        note=f"returned {late:.0f} s after the deadline",
    )
    assert late == pytest.approx(GRACE_S)  # abandoned exactly when the grace ran out, not when it chose


async def test_an_abandoned_tool_is_cancelled_again_and_awaited_when_the_session_closes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    events: list[tuple[str, float]] = []

    async def run(inp: Free, ctx: ToolExecutionContext) -> ToolOutcome:
        try:  # swallows the turn's cancellation, then works on, shielded, for ten minutes
            await trio.sleep_forever()
        except trio.Cancelled:
            events.append(("first cancel", trio.current_time()))
        with trio.CancelScope(shield=True):
            await trio.sleep(600)
        try:
            await trio.sleep_forever()  # the session's close cancels it again here
        finally:
            events.append(("ended", trio.current_time()))
        raise AssertionError("unreachable")

    steps = [ScriptStep(tool_calls=(ScriptedCall(id="bad", name="bad"),)), ScriptStep(text="ok")]
    start = trio.current_time()
    async with ScriptedProvider(steps) as provider:
        session = bad_tool_session(provider, run)
        async with session:
            final = await send_approving_bad(session, "go")
            returned = trio.current_time() - start
            assert events == [("first cancel", DEADLINE_MS / 1000)]  # abandoned, still running
        closed = trio.current_time() - start
    assert final.outcome is Outcome.BOUNDED and session.document is payment()
    assert returned == pytest.approx(DEADLINE_MS / 1000 + GRACE_S)
    # The session's close waited for the tool: its shielded work, then the second cancellation.
    assert [name for name, _ in events] == ["first cancel", "ended"]
    assert closed == pytest.approx(DEADLINE_MS / 1000 + 600) and events[1][1] == pytest.approx(closed)
    record("tool fault: abandoned tool cancelled again and awaited at session close", tried=1, held=1)


@pytest.mark.parametrize("exc", [KeyboardInterrupt, ValueError])
async def test_only_an_exception_is_contained_to_its_call(exc: type[BaseException]) -> None:
    async def run(inp: Free, ctx: ToolExecutionContext) -> ToolOutcome:
        await trio.lowlevel.checkpoint()
        raise exc("boom")

    if exc is ValueError:
        result = await one_turn(tool("bad", run))
        bad = result.final.call("bad")
        assert bad is not None and bad.status is CallStatus.FAILED and "ValueError" in (bad.result or "")
        return
    with pytest.raises(BaseExceptionGroup) as caught:  # Trio's nurseries carry it out, as Trio intends
        await one_turn(tool("bad", run))
    assert caught.group_contains(KeyboardInterrupt)


# --- tools that mutate what they were handed -------------------------------------------------------


def mutator(name: str, change: Callable[[ThreatModel, Free], None]) -> RegisteredTool:
    def run(inp: Free, ctx: ToolExecutionContext) -> ToolOutcome:
        try:
            change(ctx.document, inp)
        except Exception as exc:  # a refused mutation is the behavior we want
            return ToolOutcome.failure(f"refused: {type(exc).__name__}")
        return ToolOutcome.success("looked")

    return tool(name, run, effect="read")


def _setattr_field(document: ThreatModel, inp: Free) -> None:
    document.version = "6.6"  # type: ignore[misc]


def _setattr_entity(document: ThreatModel, inp: Free) -> None:
    document.threats[0].title = "pwned"  # type: ignore[misc]


FROZEN = {
    "assign a field": _setattr_field,
    "assign an entity field": _setattr_entity,
    "append to a section": lambda d, i: cast(Any, d.threats).append(None),
}


@pytest.mark.parametrize("case", sorted(FROZEN))
async def test_frozen_parts_of_the_document_refuse_mutation(case: str) -> None:
    pre = payment()
    before = dump_thf(pre)
    result = await one_turn(mutator("bad", FROZEN[case]))
    assert results_of(result.requests[1])["bad"][0].startswith("refused: ")
    assert result.workspace.document is pre and dump_thf(pre) == before
    record(f"tool mutates its document: {case}", tried=1, held=1)


def _extra_top(document: ThreatModel, inp: Free) -> None:
    document.extra["injected"] = True  # type: ignore[index]


def _extra_metadata(document: ThreatModel, inp: Free) -> None:
    document.metadata.extra["injected"] = True  # type: ignore[index]


def _extra_entity(document: ThreatModel, inp: Free) -> None:
    document.elements[0].extra["injected"] = True  # type: ignore[index]


def _object_setattr(document: ThreatModel, inp: Free) -> None:
    object.__setattr__(document.metadata, "title", "pwned")


MUTABLE = {
    "extra dict (top level)": _extra_top,
    "extra dict (metadata)": _extra_metadata,
    "extra dict (entity)": _extra_entity,
    "object.__setattr__": _object_setattr,
}


@pytest.mark.parametrize("case", sorted(MUTABLE))
async def test_a_read_tool_cannot_change_the_live_document(case: str) -> None:
    # The document is deeply immutable and the tool shares the live snapshot: the write itself must fail.
    document = load_thf(PAYMENT)  # a private copy: any corruption stays in this test
    before = dump_thf(document)
    result = await one_turn(mutator("bad", MUTABLE[case]), document=document)
    refused = results_of(result.requests[1])["bad"][0]
    changed = dump_thf(result.workspace.document) != before or dump_thf(document) != before
    record(f"tool mutates its document: {case}", tried=1, held=int(not changed and refused.startswith("refused: ")))
    assert refused in ("refused: TypeError", "refused: FrozenInstanceError"), refused
    assert not changed


async def test_undo_restores_the_pre_turn_document_even_after_an_in_place_change() -> None:
    pre = load_thf(PAYMENT)  # a private copy: any corruption stays in this test
    before = dump_thf(pre)

    def add(inp: Free, ctx: ToolExecutionContext) -> ToolOutcome:
        return ToolOutcome.success("added", document=with_threat(ctx.document))

    steps = [
        ScriptStep(tool_calls=(ScriptedCall(id="add", name="adder"),)),
        ScriptStep(tool_calls=(ScriptedCall(id="bad", name="bad"),)),
        ScriptStep(text="ok"),
    ]
    bad = mutator("bad", _extra_metadata)
    workspace = Workspace(document=pre, kind=THREAT_MODEL)
    controls = TurnControls()
    request = TurnRequest(
        text="go", turn_id="turn-1", model="scripted-1", registry=create_tool_registry([tool("adder", add), bad])
    )
    async with ScriptedProvider(steps) as provider:
        await run_turn(request, workspace, provider, controls=controls, on_state=lambda s: approve_all(s, controls))
    undone = undo_turn(workspace.undo, workspace.document, "turn-1")
    assert undone is not None
    record("undo after an in-place change", tried=1, held=int(dump_thf(undone[0]) == before))
    assert dump_thf(undone[0]) == before


async def test_a_tool_mutating_its_input_cannot_rewrite_history() -> None:
    def run(inp: Free, ctx: ToolExecutionContext) -> ToolOutcome:
        if isinstance(inp.payload, dict):
            inp.payload["injected"] = "by the tool"
        return ToolOutcome.success("ok")

    steps = [
        ScriptStep(tool_calls=(ScriptedCall(id="bad", name="bad", input={"payload": {"x": 1}}),)),
        ScriptStep(text="ok"),
    ]
    result = await one_turn(tool("bad", run, effect="read"), steps=steps)
    sent = [
        block["input"]
        for message in result.requests[1]["messages"]
        if isinstance(message["content"], list)
        for block in message["content"]
        if block.get("type") == "tool_use"
    ]
    record("tool mutates its own input", tried=1, held=int(sent == [{"payload": {"x": 1}}]))
    assert sent == [{"payload": {"x": 1}}]
