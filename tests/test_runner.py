"""The Trio runner over real loopback HTTP: full turns, Stop, deadlines, concurrency, retries, undo."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from trioloop.machine.document import define_document_kind
from trioloop.machine.limits import TurnLimits
from trioloop.machine.reducer import CallStatus, Outcome, Phase, TurnState
from trioloop.machine.tools import ToolOutcome, ToolRegistry, create_tool_registry
from trioloop.machine.transaction import turn_undo_availability, undo_turn
from trioloop.protocol import assert_tool_pairing, flatten_text
from trioloop.providers.scripted import ScriptedCall, ScriptedProvider, ScriptStep
from trioloop.runtime.controls import TurnControls
from trioloop.runtime.runner import TurnRequest, Workspace, run_turn
from trioloop.runtime.tool_calls import TOOL_CANCELLED_ITSELF
from trioloop.runtime.tools import ToolExecutionContext, define_executable_tool
from trioloop.threatmodel import THREAT_MODEL, ThreatModel, create_ai_tool_registry, load_thf

PAYMENT = Path(__file__).resolve().parent.parent / "examples" / "payment.thf"


@pytest.fixture
def document() -> ThreatModel:
    return load_thf(PAYMENT)


@attrs.frozen(kw_only=True)
class Nothing:
    note: str = ""


class Probe:
    """Records what custom tools saw, so tests can assert on cancellation and concurrency."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.finished: list[str] = []
        self.saw_cancel: list[bool] = []
        self.running = 0
        self.max_running = 0
        self.on_start: Callable[[], object] | None = None  # called once a tool's code is running


def sleepy_tool(name: str, probe: Probe, seconds: float, *, effect: Any = "read", rename_to: str | None = None) -> Any:
    async def run(inp: Nothing, ctx: ToolExecutionContext) -> ToolOutcome:
        probe.started.append(name)
        if probe.on_start is not None:
            probe.on_start()
        probe.running += 1
        probe.max_running = max(probe.max_running, probe.running)
        try:
            await trio.sleep(seconds)
        except trio.Cancelled:
            probe.saw_cancel.append(ctx.cancelled)
            raise
        finally:
            probe.running -= 1
        probe.finished.append(name)
        if rename_to is None:
            return ToolOutcome.success(f"{name} done")
        metadata = attrs.evolve(ctx.document.metadata, title=rename_to)
        return ToolOutcome.success("renamed", document=attrs.evolve(ctx.document, metadata=metadata))

    return plain_tool(name, run, effect=effect)


def plain_tool(
    name: str,
    run: Callable[[Nothing, ToolExecutionContext], ToolOutcome | Awaitable[ToolOutcome]],
    *,
    effect: Any = "read",
) -> Any:
    return define_executable_tool(
        name=name,
        description=f"{name} for tests",
        effect=effect,
        destructive=False,
        input_type=Nothing,
        run=run,
        summarize=lambda inp: f"{name} {inp.note}",
    )


def request(text: str, registry: ToolRegistry, **limits: Any) -> TurnRequest:
    return TurnRequest(text=text, turn_id="turn-1", model="scripted-1", registry=registry, limits=TurnLimits(**limits))


async def drive(
    steps: list[ScriptStep],
    workspace: Workspace,
    registry: ToolRegistry,
    on_state: Callable[[TurnState, TurnControls], Awaitable[None] | None] | None = None,
    **limits: Any,
) -> tuple[TurnState, ScriptedProvider]:
    controls = TurnControls()
    states: list[TurnState] = []

    def observe(state: TurnState) -> None:
        states.append(state)
        if on_state is not None:
            on_state(state, controls)

    async with ScriptedProvider(steps) as provider:
        final = await run_turn(
            request("go", registry, **limits), workspace, provider, controls=controls, on_state=observe
        )
    assert final.is_settled
    assert assert_tool_pairing(final.messages) == ()
    return final, provider


def approve_all(state: TurnState, controls: TurnControls) -> None:
    if state.phase is Phase.AWAITING_APPROVAL:
        for call in state.current_calls:
            if call.status is CallStatus.PENDING:
                controls.approve(call.id)


async def test_two_iteration_turn_over_loopback_commits_and_sends_results(document: ThreatModel) -> None:
    workspace = Workspace(document=document, kind=THREAT_MODEL)
    steps = [
        ScriptStep(
            text="Adding a threat.",
            tool_calls=(
                ScriptedCall(id="c1", name="get_entity", input={"kind": "elements", "id": "card-vault"}),
                ScriptedCall(
                    id="c2",
                    name="add_threat",
                    input={
                        "threat": {
                            "title": "Vault keys stolen",
                            "category": "Information Disclosure",
                            "severity": "high",
                            "element": "card-vault",
                        }
                    },
                ),
            ),
        ),
        ScriptStep(text="Done: one threat added."),
    ]
    final, provider = await drive(steps, workspace, create_ai_tool_registry(), approve_all)
    assert final.outcome is Outcome.COMPLETED
    assert [c.status for c in final.calls] == [CallStatus.SUCCEEDED, CallStatus.SUCCEEDED]
    assert len(workspace.document.threats) == len(document.threats) + 1
    assert len(workspace.undo.entries) == 1
    # The second request carried both tool results back to the model.
    second = provider.requests[1]
    assert isinstance(second, dict)
    results = [
        block
        for message in second["messages"]
        if isinstance(message["content"], list)
        for block in message["content"]
        if block.get("type") == "tool_result"
    ]
    assert {r["tool_use_id"] for r in results} == {"c1", "c2"}
    undone = undo_turn(workspace.undo, workspace.document, "turn-1")
    assert undone is not None and undone[0] == document


async def test_read_only_turn_never_pauses(document: ThreatModel) -> None:
    workspace = Workspace(document=document, kind=THREAT_MODEL)
    phases: list[Phase] = []
    steps = [
        ScriptStep(tool_calls=(ScriptedCall(id="r1", name="get_document_summary", input={}),)),
        ScriptStep(text="Looks fine."),
    ]
    final, _ = await drive(steps, workspace, create_ai_tool_registry(), lambda s, c: phases.append(s.phase))
    assert Phase.AWAITING_APPROVAL not in phases
    assert final.outcome is Outcome.COMPLETED and final.calls[0].status is CallStatus.SUCCEEDED
    assert workspace.document is document and workspace.undo.entries == ()


async def test_reads_run_concurrently(document: ThreatModel) -> None:
    probe = Probe()
    registry = create_tool_registry([sleepy_tool("slow_a", probe, 0.05), sleepy_tool("slow_b", probe, 0.05)])
    steps = [
        ScriptStep(tool_calls=(ScriptedCall(id="a", name="slow_a"), ScriptedCall(id="b", name="slow_b"))),
        ScriptStep(text="ok"),
    ]
    final, _ = await drive(steps, Workspace(document=document, kind=THREAT_MODEL), registry)
    assert final.outcome is Outcome.COMPLETED
    assert probe.max_running == 2


async def test_mutations_run_one_at_a_time_so_both_commit(document: ThreatModel) -> None:
    probe = Probe()
    registry = create_tool_registry(
        [
            sleepy_tool("retitle_a", probe, 0.01, effect="mutate", rename_to="A"),
            sleepy_tool("retitle_b", probe, 0.01, effect="mutate", rename_to="B"),
        ]
    )
    steps = [
        ScriptStep(tool_calls=(ScriptedCall(id="a", name="retitle_a"), ScriptedCall(id="b", name="retitle_b"))),
        ScriptStep(text="ok"),
    ]
    workspace = Workspace(document=document, kind=THREAT_MODEL)
    final, _ = await drive(steps, workspace, registry, approve_all)
    assert probe.max_running == 1 and probe.started == ["retitle_a", "retitle_b"]
    assert [c.status for c in final.calls] == [CallStatus.SUCCEEDED, CallStatus.SUCCEEDED]
    assert workspace.document.metadata.title == "B"
    assert len(workspace.undo.entries) == 1  # one undo entry per turn, however many commits


async def test_stop_during_stream_keeps_partial_text(document: ThreatModel) -> None:
    steps = [ScriptStep(text="x" * 400, chunk_size=10, delay_between_chunks=0.01)]

    def stop_midway(state: TurnState, controls: TurnControls) -> None:
        if len(state.streaming_text) >= 50:
            controls.stop()

    final, _ = await drive(
        steps, Workspace(document=document, kind=THREAT_MODEL), create_ai_tool_registry(), stop_midway
    )
    assert final.outcome is Outcome.CANCELLED
    kept = [flatten_text(m) for m in final.messages if m.role == "assistant"]
    assert kept and 50 <= len(kept[-1]) < 400 and set(kept[-1]) == {"x"}


async def test_stop_during_approval_denies_pending_calls(document: ThreatModel) -> None:
    workspace = Workspace(document=document, kind=THREAT_MODEL)
    steps = [ScriptStep(tool_calls=(ScriptedCall(id="d", name="delete_element", input={"id": "psp"}),))]

    def stop_on_review(state: TurnState, controls: TurnControls) -> None:
        if state.phase is Phase.AWAITING_APPROVAL:
            controls.stop()

    final, _ = await drive(steps, workspace, create_ai_tool_registry(), stop_on_review)
    assert final.outcome is Outcome.CANCELLED
    assert final.calls[0].status is CallStatus.DENIED
    assert workspace.document is document


async def test_stop_during_running_tool_discards_its_value(document: ThreatModel) -> None:
    probe = Probe()
    registry = create_tool_registry([sleepy_tool("retitle", probe, 0.2, effect="mutate", rename_to="hacked")])
    workspace = Workspace(document=document, kind=THREAT_MODEL)

    def approve_then_stop_once_running(state: TurnState, controls: TurnControls) -> None:
        approve_all(state, controls)
        probe.on_start = controls.stop

    steps = [ScriptStep(tool_calls=(ScriptedCall(id="t", name="retitle"),))]
    final, _ = await drive(steps, workspace, registry, approve_then_stop_once_running)
    assert final.outcome is Outcome.CANCELLED
    assert probe.started == ["retitle"]
    assert probe.saw_cancel == [True]  # the tool saw its own scope cancelled
    assert probe.finished == []
    assert workspace.document is document and workspace.undo.entries == ()
    assert final.calls[0].status is CallStatus.DENIED


@pytest.mark.parametrize("plain", [True, False], ids=["def", "async def"])
async def test_stop_as_a_call_starts_runs_none_of_its_code(document: ThreatModel, plain: bool) -> None:
    # Stop lands when the call has just turned running (its StartCall state is published): the runner
    # still starts nothing of the tool, whether it is a plain function or a coroutine.
    ran: list[str] = []

    def plain_run(inp: Nothing, ctx: ToolExecutionContext) -> ToolOutcome:
        ran.append("plain")
        return ToolOutcome.success("ran")

    async def async_run(inp: Nothing, ctx: ToolExecutionContext) -> ToolOutcome:
        ran.append("async")
        await trio.lowlevel.checkpoint()
        return ToolOutcome.success("ran")

    registry = create_tool_registry([plain_tool("act", plain_run if plain else async_run, effect="mutate")])

    def approve_then_stop(state: TurnState, controls: TurnControls) -> None:
        approve_all(state, controls)
        if any(c.status is CallStatus.RUNNING for c in state.calls):
            controls.stop()

    workspace = Workspace(document=document, kind=THREAT_MODEL)
    final, _ = await drive(
        [ScriptStep(tool_calls=(ScriptedCall(id="t", name="act"),))], workspace, registry, approve_then_stop
    )
    assert final.outcome is Outcome.CANCELLED
    assert ran == []
    assert final.calls[0].status is CallStatus.DENIED
    assert workspace.document is document and workspace.undo.entries == ()


async def test_tool_that_ignores_cancel_and_returns_a_document_is_not_committed(document: ThreatModel) -> None:
    @attrs.frozen
    class In:
        pass

    async def stubborn(inp: In, ctx: ToolExecutionContext) -> ToolOutcome:
        try:  # noqa: SIM105 -- the point is a tool that swallows the cancellation
            await trio.sleep(10)
        except trio.Cancelled:
            pass  # swallows the cancellation and returns a change anyway
        return ToolOutcome.success("x", document=attrs.evolve(ctx.document, version="1.0"))

    tool = define_executable_tool(
        name="stubborn", description="", effect="mutate", destructive=False, input_type=In, run=stubborn, summarize=str
    )
    workspace = Workspace(document=document, kind=THREAT_MODEL)

    def approve_then_stop(state: TurnState, controls: TurnControls) -> None:
        approve_all(state, controls)
        if any(c.status is CallStatus.RUNNING for c in state.calls):
            controls.stop()

    steps = [ScriptStep(tool_calls=(ScriptedCall(id="t", name="stubborn"),))]
    final, _ = await drive(steps, workspace, create_tool_registry([tool]), approve_then_stop)
    assert final.outcome is Outcome.CANCELLED
    assert workspace.document is document and workspace.undo.entries == ()


async def test_deadline_cuts_a_stalled_stream(document: ThreatModel, autojump_clock: trio.testing.MockClock) -> None:
    steps = [ScriptStep(text="hello there", stall_after_bytes=200)]
    start = trio.current_time()
    final, _ = await drive(
        steps, Workspace(document=document, kind=THREAT_MODEL), create_ai_tool_registry(), turn_deadline_ms=5_000
    )
    assert final.outcome is Outcome.BOUNDED
    assert trio.current_time() - start == pytest.approx(5.0, abs=0.01)
    assert final.notices


async def test_deadline_cuts_a_sleeping_tool(document: ThreatModel, autojump_clock: trio.testing.MockClock) -> None:
    probe = Probe()
    registry = create_tool_registry([sleepy_tool("nap", probe, 3600)])
    steps = [ScriptStep(tool_calls=(ScriptedCall(id="n", name="nap"),))]
    start = trio.current_time()
    final, _ = await drive(steps, Workspace(document=document, kind=THREAT_MODEL), registry, turn_deadline_ms=2_000)
    assert final.outcome is Outcome.BOUNDED
    assert trio.current_time() - start == pytest.approx(2.0, abs=0.01)
    assert probe.saw_cancel == [True] and final.calls[0].status is CallStatus.DENIED


async def test_transient_failures_before_first_event_are_retried_within_budget(
    document: ThreatModel, autojump_clock: trio.testing.MockClock
) -> None:
    # One counter: each request is one attempt (the provider does not retry under a turn), and the turn
    # retries up to max_retries_per_turn, telling the person each time.
    busy = [ScriptStep(status=503)] * 3
    final, provider = await drive(
        [*busy, ScriptStep(text="recovered")],
        Workspace(document=document, kind=THREAT_MODEL),
        create_ai_tool_registry(),
    )
    assert final.outcome is Outcome.COMPLETED and "recovered" in str(final.messages[-1])
    assert len(provider.requests) == 4 and final.budget.retries_used == 3
    assert [n for n in final.notices if "retry" in n] == [
        "HTTP 503, retry 1 of 3 in 0.5 s",
        "HTTP 503, retry 2 of 3 in 1 s",
        "HTTP 503, retry 3 of 3 in 2 s",
    ]


async def test_a_server_that_always_fails_gets_at_most_four_requests_a_turn(
    document: ThreatModel, autojump_clock: trio.testing.MockClock
) -> None:
    final, provider = await drive(
        [ScriptStep(status=529)] * 20, Workspace(document=document, kind=THREAT_MODEL), create_ai_tool_registry()
    )
    assert final.outcome is Outcome.FAILED and len(provider.requests) == 4
    assert final.error is not None and final.error.provider_detail is not None
    assert final.error.provider_detail.startswith("HTTP 529")


async def test_a_retry_after_longer_than_the_turn_fails_now_with_the_servers_words(
    document: ThreatModel, autojump_clock: trio.testing.MockClock
) -> None:
    start = trio.current_time()
    final, provider = await drive(
        [ScriptStep(status=429, retry_after=100_000), ScriptStep(text="never")],
        Workspace(document=document, kind=THREAT_MODEL),
        create_ai_tool_registry(),
    )
    assert final.outcome is Outcome.FAILED and len(provider.requests) == 1
    assert final.error is not None and final.error.code == "rate_limited" and final.error.retry_after == 600.0
    assert trio.current_time() - start < 1


async def test_a_retry_after_hint_lengthens_the_wait(
    document: ThreatModel, autojump_clock: trio.testing.MockClock
) -> None:
    start = trio.current_time()
    final, provider = await drive(
        [ScriptStep(status=429, retry_after=7), ScriptStep(text="ok")],
        Workspace(document=document, kind=THREAT_MODEL),
        create_ai_tool_registry(),
    )
    assert final.outcome is Outcome.COMPLETED and len(provider.requests) == 2
    assert trio.current_time() - start >= 7
    assert "HTTP 429, retry 1 of 3 in 7 s" in final.notices


async def test_retry_budget_is_held(document: ThreatModel, autojump_clock: trio.testing.MockClock) -> None:
    final, _ = await drive(
        [ScriptStep(status=429, retry_after=1)] * 40,
        Workspace(document=document, kind=THREAT_MODEL),
        create_ai_tool_registry(),
        max_retries_per_turn=2,
    )
    assert final.outcome is Outcome.FAILED
    assert final.budget.retries_used == 2
    assert final.error is not None and final.error.code == "rate_limited"


async def test_failure_after_first_text_is_not_retried(document: ThreatModel) -> None:
    steps = [ScriptStep(text="partial answer", disconnect_after_bytes=400), ScriptStep(text="should not be used")]
    final, provider = await drive(steps, Workspace(document=document, kind=THREAT_MODEL), create_ai_tool_registry())
    assert final.outcome is Outcome.FAILED
    assert len(provider.requests) == 1
    assert final.budget.retries_used == 0


async def test_bounded_turn_keeps_commits_and_one_undo_reverts_them(document: ThreatModel) -> None:
    workspace = Workspace(document=document, kind=THREAT_MODEL)

    def add(cid: str, title: str) -> ScriptStep:
        threat = {"title": title, "category": "Tampering", "severity": "low", "element": "psp"}
        return ScriptStep(tool_calls=(ScriptedCall(id=cid, name="add_threat", input={"threat": threat}),))

    final, _ = await drive(
        [add("a", "First"), add("b", "Second"), add("c", "Third")],
        workspace,
        create_ai_tool_registry(),
        approve_all,
        max_iterations=2,
    )
    assert final.outcome is Outcome.BOUNDED
    assert [c.status for c in final.calls] == [CallStatus.SUCCEEDED, CallStatus.SUCCEEDED]
    assert len(workspace.document.threats) == len(document.threats) + 2
    assert turn_undo_availability(workspace.undo, "turn-1").undoable
    undone = undo_turn(workspace.undo, workspace.document, "turn-1")
    assert undone is not None
    restored, history = undone
    assert restored == document and history.entries == ()


async def test_outer_cancellation_still_settles(document: ThreatModel) -> None:
    states: list[TurnState] = []
    async with ScriptedProvider([ScriptStep(text="slow", stall_after_bytes=100)]) as provider:
        with trio.move_on_after(0.2):
            await run_turn(
                request("go", create_ai_tool_registry()),
                Workspace(document=document, kind=THREAT_MODEL),
                provider,
                on_state=states.append,
            )
    assert states[-1].is_settled and states[-1].outcome is Outcome.CANCELLED


@pytest.mark.parametrize("immutable", [False, True])
async def test_a_tool_that_never_reads_the_document_costs_no_copy(document: ThreatModel, immutable: bool) -> None:
    copies: list[ThreatModel] = []

    def counting(model: ThreatModel) -> ThreatModel:
        copies.append(attrs.evolve(model))
        return copies[-1]

    # A mutable kind copies on a tool's first read; an immutable one (the threat model's own) never copies.
    kind = THREAT_MODEL if immutable else define_document_kind("threat model", copy_with=counting)

    async def ignore(inp: Nothing, ctx: ToolExecutionContext) -> ToolOutcome:
        await trio.lowlevel.checkpoint()
        return ToolOutcome.success("did not look")

    async def look(inp: Nothing, ctx: ToolExecutionContext) -> ToolOutcome:
        first = ctx.document
        await trio.lowlevel.checkpoint()
        assert ctx.document is first  # one copy per call, however often it reads
        return ToolOutcome.success(f"looked at {first.metadata.title}")

    registry = create_tool_registry([plain_tool("ignore", ignore), plain_tool("look", look)])
    steps = [
        ScriptStep(tool_calls=(ScriptedCall(id="i", name="ignore"), ScriptedCall(id="l", name="look"))),
        ScriptStep(text="ok"),
    ]
    final, _ = await drive(steps, Workspace(document=document, kind=kind), registry)
    assert [c.result for c in final.calls] == ["did not look", f"looked at {document.metadata.title}"]
    if immutable:
        assert copies == []
    else:
        assert len(copies) == 1 and copies[0] == document and copies[0] is not document


async def test_a_late_first_read_still_sees_the_document_as_the_call_started(document: ThreatModel) -> None:
    # The copy is made on the first read, but of the snapshot taken when the call started: a commit
    # by a concurrent mutation in between does not leak into it.
    workspace = Workspace(document=document, kind=THREAT_MODEL)
    probe = Probe()

    renamed = trio.Event()

    async def late(inp: Nothing, ctx: ToolExecutionContext) -> ToolOutcome:
        await renamed.wait()  # until the rename below has committed
        return ToolOutcome.success(f"saw {ctx.document.metadata.title}")

    def observe(state: TurnState, controls: TurnControls) -> None:
        approve_all(state, controls)
        if state.call("m") is not None and state.call("m").status is CallStatus.SUCCEEDED:  # type: ignore[union-attr]
            assert workspace.document is not document
            renamed.set()

    registry = create_tool_registry(
        [sleepy_tool("retitle", probe, 0.0, effect="mutate", rename_to="Renamed"), plain_tool("late", late)]
    )
    steps = [
        ScriptStep(tool_calls=(ScriptedCall(id="m", name="retitle"), ScriptedCall(id="r", name="late"))),
        ScriptStep(text="ok"),
    ]
    final, _ = await drive(steps, workspace, registry, observe)
    assert workspace.document.metadata.title == "Renamed" != document.metadata.title
    assert [c.status for c in final.calls] == [CallStatus.SUCCEEDED, CallStatus.SUCCEEDED]
    assert final.calls[1].result == f"saw {document.metadata.title}"


class _ToolTasks(trio.abc.Instrument):
    """Names the tool tasks the runner spawns."""

    def __init__(self) -> None:
        self.spawned: list[str] = []

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        if task.name.startswith("trioloop tool "):
            self.spawned.append(task.name.removeprefix("trioloop tool "))


def _retitle(title: str, log: list[str]) -> Callable[[Nothing, ToolExecutionContext], ToolOutcome]:
    def run(inp: Nothing, ctx: ToolExecutionContext) -> ToolOutcome:
        log.append(f"{title} saw {ctx.document.metadata.title}")
        metadata = attrs.evolve(ctx.document.metadata, title=title)
        return ToolOutcome.success(f"now {title}", document=attrs.evolve(ctx.document, metadata=metadata))

    return run


async def test_a_plain_def_tool_runs_in_place_and_an_async_one_in_a_task_of_its_own(document: ThreatModel) -> None:
    # A tool that returns without awaiting settles where the runner starts it (no task, no scheduler pass);
    # an async one still gets its own task. Mutations of either kind run one at a time, in order, each
    # from the document the previous one left, and all of it is one undo step.
    log: list[str] = []

    async def retitle_async(inp: Nothing, ctx: ToolExecutionContext) -> ToolOutcome:
        await trio.lowlevel.checkpoint()
        return _retitle("B", log)(inp, ctx)

    def read(inp: Nothing, ctx: ToolExecutionContext) -> ToolOutcome:
        return ToolOutcome.success(f"read {ctx.document.metadata.title}")

    def broken(inp: Nothing, ctx: ToolExecutionContext) -> ToolOutcome:
        raise LookupError("no such thing")

    registry = create_tool_registry(
        [
            plain_tool("a", _retitle("A", log), effect="mutate"),
            plain_tool("b", retitle_async, effect="mutate"),
            plain_tool("c", _retitle("C", log), effect="mutate"),
            plain_tool("read", read),
            plain_tool("broken", broken),
            plain_tool("odd", lambda inp, ctx: "not an outcome", effect="mutate"),  # type: ignore[arg-type, return-value]
        ]
    )
    calls = tuple(ScriptedCall(id=name, name=name) for name in ("a", "b", "c", "read", "broken", "odd"))
    workspace = Workspace(document=document, kind=THREAT_MODEL)
    tasks = _ToolTasks()
    trio.lowlevel.add_instrument(tasks)
    try:
        final, _ = await drive([ScriptStep(tool_calls=calls), ScriptStep(text="ok")], workspace, registry, approve_all)
    finally:
        trio.lowlevel.remove_instrument(tasks)
    assert tasks.spawned == ["b"]
    original = document.metadata.title
    assert log == [f"A saw {original}", "B saw A", "C saw B"]
    assert workspace.document.metadata.title == "C"
    by_id = {c.id: c for c in final.calls}
    assert [by_id[i].status for i in ("a", "b", "c", "read")] == [CallStatus.SUCCEEDED] * 4
    assert by_id["read"].result in {f"read {original}", "read A"}  # reads run beside the first mutation
    assert by_id["broken"].status is CallStatus.FAILED
    assert by_id["broken"].result == "The tool failed while running (LookupError)."
    assert (
        by_id["odd"].status is CallStatus.FAILED
        and by_id["odd"].result == "The tool returned something that is not a tool outcome."
    )
    assert len(workspace.undo.entries) == 1
    undone = undo_turn(workspace.undo, workspace.document, "turn-1")
    assert undone is not None and undone[0] == document


@pytest.mark.parametrize("plain", [True, False], ids=["def", "async def"])
async def test_a_tool_that_cancels_its_own_scope_fails_its_call_and_the_turn_goes_on(
    document: ThreatModel, plain: bool, autojump_clock: trio.testing.MockClock
) -> None:
    # Nothing it returned is used, and the turn does not wait for its deadline on a call that cannot settle.
    def plain_run(inp: Nothing, ctx: ToolExecutionContext) -> ToolOutcome:
        ctx.cancel_scope.cancel()
        return ToolOutcome.success(
            "renamed", document=attrs.evolve(ctx.document, metadata=attrs.evolve(ctx.document.metadata, title="x"))
        )

    async def async_run(inp: Nothing, ctx: ToolExecutionContext) -> ToolOutcome:
        ctx.cancel_scope.cancel()
        await trio.sleep(1)
        raise AssertionError("unreachable: its own scope is cancelled")

    registry = create_tool_registry([plain_tool("act", plain_run if plain else async_run, effect="mutate")])
    workspace = Workspace(document=document, kind=THREAT_MODEL)
    started = trio.current_time()
    steps = [ScriptStep(tool_calls=(ScriptedCall(id="t", name="act"),)), ScriptStep(text="ok")]
    final, _ = await drive(steps, workspace, registry, approve_all)
    assert final.outcome is Outcome.COMPLETED
    assert final.calls[0].status is CallStatus.FAILED
    assert final.calls[0].result == TOOL_CANCELLED_ITSELF
    assert workspace.document is document and workspace.undo.entries == ()
    assert trio.current_time() - started < 1  # not bounded by the turn deadline


class _Slippery:
    """A proposed "document" that raises when asked what it is."""

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        raise RuntimeError("ask me not")


@pytest.mark.parametrize("plain", [True, False], ids=["def", "async def"])
async def test_an_outcome_that_raises_when_inspected_fails_only_its_call(document: ThreatModel, plain: bool) -> None:
    def plain_run(inp: Nothing, ctx: ToolExecutionContext) -> ToolOutcome:
        return ToolOutcome.success("done", document=_Slippery())

    async def async_run(inp: Nothing, ctx: ToolExecutionContext) -> ToolOutcome:
        await trio.lowlevel.checkpoint()
        return plain_run(inp, ctx)

    registry = create_tool_registry([plain_tool("act", plain_run if plain else async_run, effect="mutate")])
    workspace = Workspace(document=document, kind=THREAT_MODEL)
    steps = [ScriptStep(tool_calls=(ScriptedCall(id="t", name="act"),)), ScriptStep(text="ok")]
    final, _ = await drive(steps, workspace, registry, approve_all)
    assert final.outcome is Outcome.COMPLETED
    assert final.calls[0].status is CallStatus.FAILED
    assert final.calls[0].result == "The tool returned something that is not a tool outcome."
    assert workspace.document is document


class _SlowTeardownProvider:
    """Sends the start of an answer, then stalls; on cancellation it takes ``teardown_s`` (shielded) to unwind,
    as an HTTP response that must be closed does. Notes when the teardown ended."""

    def __init__(self, teardown_s: float, stall_s: float = math.inf) -> None:
        self.teardown_s = teardown_s
        self.stall_s = stall_s
        self.teardown_ended: float | None = None

    async def stream(self, request: Any, send: Any, *, cancel_scope: Any = None) -> None:
        from trioloop.protocol.events import MessageStart, TextDelta

        await send.send(MessageStart(model="scripted-1"))
        await send.send(TextDelta(text="partial"))
        try:
            await trio.sleep(self.stall_s)
        finally:
            with trio.CancelScope(shield=True):
                await trio.sleep(self.teardown_s)
            self.teardown_ended = trio.current_time()


@pytest.mark.parametrize("how", ["deadline", "stop"])
async def test_settled_is_published_before_the_request_unwinds_and_run_turn_waits_for_it(
    document: ThreatModel, autojump_clock: trio.testing.MockClock, how: str
) -> None:
    """The settled state does not wait for the request task's teardown (it cannot touch the workspace);
    ``run_turn`` still returns only after that task has ended. The deadline counts from the call."""
    provider = _SlowTeardownProvider(teardown_s=3.0)
    controls = TurnControls()
    settled_at: list[float] = []

    def observe(state: TurnState) -> None:
        if state.is_settled:
            settled_at.append(trio.current_time())
        elif how == "stop" and state.streaming_text:
            controls.stop()

    start = trio.current_time()
    final = await run_turn(
        request("go", create_ai_tool_registry(), turn_deadline_ms=2_000),
        Workspace(document=document, kind=THREAT_MODEL),
        provider,  # type: ignore[arg-type]
        controls=controls,
        on_state=observe,
    )
    returned = trio.current_time()
    cut = start + (2.0 if how == "deadline" else 0.0)
    assert final.outcome is (Outcome.BOUNDED if how == "deadline" else Outcome.CANCELLED)
    assert settled_at == [pytest.approx(cut, abs=1e-6)]
    assert provider.teardown_ended == pytest.approx(cut + 3.0, abs=1e-6)
    assert returned >= provider.teardown_ended
    assert [flatten_text(m) for m in final.messages if m.role == "assistant"] == ["partial"]
    assert not controls.approve("anything") and not controls.stop()  # settled: the controls do nothing


async def test_a_cancellation_from_outside_settles_at_once_and_run_turn_still_waits_for_the_request(
    document: ThreatModel, autojump_clock: trio.testing.MockClock
) -> None:
    """A scope outside the turn reaches the consumer and the request task together: the settled state is
    published at the cut, and ``run_turn`` gives the cancellation back only once the request has unwound."""
    provider = _SlowTeardownProvider(teardown_s=3.0)
    states: list[TurnState] = []
    settled_at: list[float] = []

    def observe(state: TurnState) -> None:
        states.append(state)
        if state.is_settled:
            settled_at.append(trio.current_time())

    start = trio.current_time()
    with trio.move_on_after(1.0) as outer:
        await run_turn(
            request("go", create_ai_tool_registry(), turn_deadline_ms=60_000),
            Workspace(document=document, kind=THREAT_MODEL),
            provider,  # type: ignore[arg-type]
            on_state=observe,
        )
    assert outer.cancelled_caught
    assert states[-1].outcome is Outcome.CANCELLED and settled_at == [pytest.approx(start + 1.0, abs=1e-6)]
    assert provider.teardown_ended == pytest.approx(start + 4.0, abs=1e-6)
    assert trio.current_time() >= provider.teardown_ended  # no task of the turn outlives run_turn


async def test_a_failing_observer_still_ends_the_request(
    document: ThreatModel, autojump_clock: trio.testing.MockClock
) -> None:
    """The request task runs outside the turn's scope (it is cancelled after the turn settles), so every
    way out of the consumer must cancel it: here an observer's bug ends the turn mid-stream."""
    provider = _SlowTeardownProvider(teardown_s=1.0, stall_s=3600.0)
    raised: list[str] = []

    def observe(state: TurnState) -> None:
        if state.streaming_text and not raised:
            raised.append(state.streaming_text)
            raise RuntimeError("observer bug")

    start = trio.current_time()
    with pytest.RaisesGroup(pytest.RaisesExc(RuntimeError, match="observer bug"), flatten_subgroups=True):
        await run_turn(
            request("go", create_ai_tool_registry()),
            Workspace(document=document, kind=THREAT_MODEL),
            provider,  # type: ignore[arg-type]
            on_state=observe,
        )
    # cancelled at once, then its 1 s teardown; left running, it would have stalled for an hour first
    assert raised == ["partial"] and provider.teardown_ended == pytest.approx(start + 1.0, abs=1e-6)


async def test_the_provider_sees_the_turns_deadline_and_is_cancelled_after_the_settle(
    document: ThreatModel, autojump_clock: trio.testing.MockClock
) -> None:
    """Outside the turn's scope, the request still carries the turn's deadline (plus a small backstop
    grace) as its own, so a provider that reads ``current_effective_deadline`` sees it."""
    seen: list[float] = []
    provider = _SlowTeardownProvider(teardown_s=0.0)
    stream = provider.stream

    async def recording(request: Any, send: Any, *, cancel_scope: Any = None) -> None:
        seen.append(trio.current_effective_deadline())
        await stream(request, send, cancel_scope=cancel_scope)

    provider.stream = recording  # type: ignore[method-assign]
    start = trio.current_time()
    final = await run_turn(
        request("go", create_ai_tool_registry(), turn_deadline_ms=2_000),
        Workspace(document=document, kind=THREAT_MODEL),
        provider,  # type: ignore[arg-type]
    )
    assert final.outcome is Outcome.BOUNDED
    assert seen == [pytest.approx(start + 2.0 + 0.25, abs=1e-6)]
    assert provider.teardown_ended == pytest.approx(start + 2.0, abs=1e-6)  # cancelled by the consumer, not later
