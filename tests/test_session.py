"""Session: turns across a conversation, review controls from another task, observers, undo, transcripts."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import trio
import trio.testing

from trioloop.machine.document import define_document_kind
from trioloop.machine.reducer import CallStatus, Outcome, Phase, TurnState
from trioloop.machine.tools import ToolOutcome
from trioloop.machine.transaction import UndoAvailability
from trioloop.protocol import Message, ToolCallBlock, assert_tool_pairing
from trioloop.providers.scripted import ScriptedCall, ScriptedProvider, ScriptStep
from trioloop.runtime.session import Session, SessionBusy, TranscriptError
from trioloop.runtime.tools import ToolExecutionContext
from trioloop.threatmodel import ThreatModel, load_thf, threat_model_session
from trioloop.tools import function_tool

PAYMENT = Path(__file__).resolve().parent.parent / "examples" / "payment.thf"


@pytest.fixture
def document() -> ThreatModel:
    return load_thf(PAYMENT)


def add_threat(cid: str, title: str) -> ScriptStep:
    threat = {"title": title, "category": "Spoofing", "severity": "medium", "element": "psp"}
    return ScriptStep(
        text=f"Proposing {title}.", tool_calls=(ScriptedCall(id=cid, name="add_threat", input={"threat": threat}),)
    )


async def reviewer(session: Session[ThreatModel], decide: str = "approve") -> None:
    """A UI-like task: watches states and answers each pending call through the session."""
    async for state in session.states():
        if state.phase is Phase.AWAITING_APPROVAL:
            for call in state.current_calls:
                if call.status is CallStatus.PENDING:
                    getattr(session, decide)(call.id)


async def send_with_reviewer(session: Session[ThreatModel], text: str, decide: str = "approve") -> TurnState:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reviewer, session, decide)
        state = await session.send(text)
        nursery.cancel_scope.cancel()
    return state


async def test_turns_build_one_pairable_conversation(document: ThreatModel) -> None:
    steps = [add_threat("a", "First"), ScriptStep(text="Added."), ScriptStep(text="Second answer.")]
    async with (
        ScriptedProvider(steps) as provider,
        threat_model_session(document=document, provider=provider, model="scripted-1") as session,
    ):
        first = await send_with_reviewer(session, "add a threat")
        assert first.outcome is Outcome.COMPLETED
        second = await session.send("thanks")
        assert second.outcome is Outcome.COMPLETED
        assert assert_tool_pairing(session.history) == ()
        assert session.history[0].role == "user"
        # The third request carried the whole earlier conversation.
        third = provider.requests[2]
        assert isinstance(third, dict)
        assert any("add a threat" in json.dumps(m) for m in third["messages"])
    assert len(session.document.threats) == len(document.threats) + 1


async def test_second_send_while_busy_is_refused(document: ThreatModel) -> None:
    async with (
        ScriptedProvider([ScriptStep(text="slow", stall_after_bytes=50)]) as provider,
        threat_model_session(document=document, provider=provider, model="scripted-1") as session,
    ):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(session.send, "first")
            await trio.testing.wait_all_tasks_blocked()
            assert session.busy
            with pytest.raises(SessionBusy):
                await session.send("second")
            assert session.stop()
        assert session.state is not None and session.state.outcome is Outcome.CANCELLED
        assert not session.busy


async def test_denial_from_the_ui_task(document: ThreatModel) -> None:
    async with (
        ScriptedProvider([add_threat("a", "Nope"), ScriptStep(text="Understood.")]) as provider,
        threat_model_session(document=document, provider=provider, model="scripted-1") as session,
    ):
        state = await send_with_reviewer(session, "add", decide="deny")
    assert state.calls[0].status is CallStatus.DENIED
    assert session.document is document
    assert session.undo_availability() is not UndoAvailability.UNDOABLE


async def test_slow_observer_sees_latest_state_not_a_backlog(document: ThreatModel) -> None:
    seen: list[TurnState] = []
    caught_up = trio.Event()

    async def slow_observer(session: Session[ThreatModel]) -> None:
        async for state in session.states():
            seen.append(state)
            if state.is_settled:
                caught_up.set()
            await trio.sleep(0.05)  # far slower than the stream

    steps = [ScriptStep(text="y" * 2000, chunk_size=5)]
    async with (
        ScriptedProvider(steps) as provider,
        threat_model_session(document=document, provider=provider, model="scripted-1") as session,
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(slow_observer, session)
        final = await session.send("go")
        with trio.fail_after(10):  # not a fixed 0.1 s: a starved process may wake both sleepers in one batch
            await caught_up.wait()
        nursery.cancel_scope.cancel()
    assert final.outcome is Outcome.COMPLETED
    assert seen[-1] is final  # the observer caught up to the newest state
    assert len(seen) < 100  # it skipped states instead of queueing ~400 of them


async def test_a_states_loop_left_midway_needs_no_closing_and_the_reader_goes_on(document: ThreatModel) -> None:
    # Left by a break, then by a cancel while the reader's task is in its own code (not parked in the reader):
    # nothing is left for Trio to finalize (an unexhausted async generator would be warned of here, and the
    # suite's warnings are errors), and the same reader gives the newest state when asked again.
    steps = [ScriptStep(text="one"), ScriptStep(text="two")]
    async with (
        ScriptedProvider(steps) as provider,
        threat_model_session(document=document, provider=provider, model="scripted-1") as session,
    ):
        first = await session.send("go")
        reader = session.states()
        async for state in reader:
            assert state is first
            break
        with trio.move_on_after(0.05):
            async for _ in reader:
                await trio.sleep(10)  # cancelled here, outside the reader
        second = await session.send("again")
        assert await reader.__anext__() is second
        del reader
        await trio.testing.wait_all_tasks_blocked()


async def test_undo_last_turn_restores_and_is_single_use(document: ThreatModel) -> None:
    async with (
        ScriptedProvider([add_threat("a", "T"), ScriptStep(text="ok")]) as provider,
        threat_model_session(document=document, provider=provider, model="scripted-1") as session,
    ):
        await send_with_reviewer(session, "add")
        assert session.undo_availability().undoable
        assert session.undo_last_turn()
        assert session.document == document
        assert session.state is not None and session.state.calls[0].status is CallStatus.UNDONE
        assert not session.undo_last_turn()
        assert not session.undo_availability().undoable


async def test_undo_is_unavailable_once_a_later_turn_committed(document: ThreatModel) -> None:
    steps = [add_threat("a", "One"), ScriptStep(text="ok"), add_threat("b", "Two"), ScriptStep(text="ok")]
    async with (
        ScriptedProvider(steps) as provider,
        threat_model_session(document=document, provider=provider, model="scripted-1") as session,
    ):
        await send_with_reviewer(session, "first")
        await send_with_reviewer(session, "second")
        assert session.undo_last_turn()  # the second turn
        assert len(session.document.threats) == len(document.threats) + 1


async def test_transcript_round_trip(document: ThreatModel, tmp_path: Path) -> None:
    async with (
        ScriptedProvider([add_threat("a", "T"), ScriptStep(text="ok")]) as provider,
        threat_model_session(document=document, provider=provider, model="scripted-1") as session,
    ):
        await send_with_reviewer(session, "add")
    path = tmp_path / "t.json"
    session.save_transcript(path)
    loaded = Session.load_transcript(path)
    assert loaded == session.history
    assert assert_tool_pairing(loaded) == ()


async def test_a_failed_transcript_save_leaves_the_previous_file(
    document: ThreatModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with (
        ScriptedProvider([add_threat("a", "T"), ScriptStep(text="ok")]) as provider,
        threat_model_session(document=document, provider=provider, model="scripted-1") as session,
    ):
        path = tmp_path / "t.json"
        session.save_transcript(path)
        before = path.read_bytes()
        await send_with_reviewer(session, "add")
    monkeypatch.setattr(os, "replace", lambda *args: (_ for _ in ()).throw(OSError(28, "No space left on device")))
    with pytest.raises(OSError, match="No space"):
        session.save_transcript(path)
    monkeypatch.undo()
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["t.json"]


@pytest.mark.parametrize(
    "content",
    [
        "not json",
        json.dumps({"version": 99, "messages": []}),
        json.dumps({"version": 1, "messages": [{"role": "system", "content": []}]}),
        json.dumps(
            {
                "version": 1,
                "messages": [
                    {"role": "assistant", "content": [{"type": "tool_call", "id": "x", "name": "t", "input": {}}]}
                ],
            }
        ),
    ],
)
def test_bad_transcripts_are_refused(tmp_path: Path, content: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(TranscriptError):
        Session.load_transcript(path)


def test_history_passed_in_is_kept_and_must_be_pairable(document: ThreatModel) -> None:
    history = (Message.user("hi"), Message.assistant("hello"))
    session = threat_model_session(document=document, provider=None, model="m", history=history)  # type: ignore[arg-type]
    assert session.history == history
    open_call = (*history, Message(role="assistant", content=(ToolCallBlock(id="1", name="t"),)))
    with pytest.raises(TranscriptError):
        threat_model_session(document=document, provider=None, model="m", history=open_call)  # type: ignore[arg-type]


@pytest.mark.parametrize("wire", ["anthropic", "openai"])
async def test_a_session_holds_its_providers_connection_for_every_turn(
    document: ThreatModel, wire: str, autojump_clock: trio.testing.MockClock
) -> None:
    """The app never opens the provider: the session holds it, so three turns share one connection,
    and the provider's client is closed when the session block ends."""
    from trioloop.providers import AnthropicProvider, OpenAIProvider
    from trioloop.providers._loopback import LoopbackResponse, open_loopback_server, replay

    body = (Path(__file__).parent / "fixtures" / "providers" / wire / "text_answer.sse").read_bytes()
    async with open_loopback_server(replay([LoopbackResponse(body=body)] * 3), keep_alive=True) as server:
        provider: AnthropicProvider | OpenAIProvider = (
            AnthropicProvider("k", base_url=server.url, retry=None)
            if wire == "anthropic"
            else OpenAIProvider("k", base_url=server.url + "/v1", retry=None)
        )
        async with threat_model_session(document=document, provider=provider, model="fixture-model-1") as session:
            for text in ("one", "two", "three"):
                assert (await session.send(text)).outcome is Outcome.COMPLETED
            client = provider._http.held_client
            assert client is not None and not client.is_closed
        assert provider._http.held_client is None and client.is_closed
        assert (len(server.requests), server.connections) == (3, 1)


async def test_sessions_sharing_one_provider_stream_at_once_on_a_connection_each(document: ThreatModel) -> None:
    """150 sessions share one provider (more than httpx's default pool of 100, 20 kept alive): all 150 first
    answers are held open together, so each needs its own connection, and the second turns reuse them."""
    from trioloop.providers import AnthropicProvider
    from trioloop.providers._loopback import LoopbackRequest, LoopbackResponse, open_loopback_server
    from trioloop.providers.transport import HELD_STREAMS_PER_CLIENT

    sessions = 150
    body = (Path(__file__).parent / "fixtures" / "providers" / "anthropic" / "text_answer.sse").read_bytes()
    everyone_asked = trio.Event()
    asked = 0

    async def handler(request: LoopbackRequest) -> LoopbackResponse:
        nonlocal asked
        asked += 1
        if asked >= sessions:
            everyone_asked.set()
        await everyone_asked.wait()  # no answer ends before every session's first request is in
        return LoopbackResponse(body=body)

    async with open_loopback_server(handler, keep_alive=True) as server:
        provider = AnthropicProvider("k", base_url=server.url, retry=None)

        async def two_turns() -> None:
            async with threat_model_session(document=document, provider=provider, model="fixture-model-1") as s:
                for text in ("one", "two"):
                    assert (await s.send(text)).outcome is Outcome.COMPLETED

        with trio.fail_after(30):
            async with provider:  # the app holds it too, as a host would
                async with trio.open_nursery() as nursery:
                    for _ in range(sessions):
                        nursery.start_soon(two_turns)
                held = provider._http.held
                assert held is not None and held.busy == [0] * len(held.clients)
                # at most HELD_STREAMS_PER_CLIENT streams a client: 150 at once need 5 pools, not one of 150
                assert len(held.clients) == -(-sessions // HELD_STREAMS_PER_CLIENT)
            assert all(client.is_closed for client in held.clients)
        assert (len(server.requests), server.connections) == (2 * sessions, sessions)


NOTE_KIND = define_document_kind("note")


async def test_observers_see_every_published_state_and_a_faulty_one_is_dropped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen: list[TurnState] = []

    class Recorder:
        def on_state(self, state: TurnState) -> None:
            seen.append(state)

    class Broken:
        calls = 0

        def on_state(self, state: TurnState) -> None:
            Broken.calls += 1
            raise RuntimeError("observer bug")

    async with ScriptedProvider([ScriptStep(text="Hello.")]) as provider:
        session = Session(document="", kind=NOTE_KIND, provider=provider, model="m", observers=[Broken()])
        session.observe(Recorder())
        async with session:
            final = await session.send("hi")
    assert final.outcome is Outcome.COMPLETED
    assert seen[-1] is final and seen[0].phase is Phase.REQUESTING
    assert len({id(s) for s in seen}) == len(seen)  # each state once, in order
    assert Broken.calls == 1 and "observer" in caplog.text


@function_tool
async def write_note(ctx: ToolExecutionContext[str], text: str) -> ToolOutcome[str]:
    """Write the note."""
    return ToolOutcome.success("written", document=text)


async def test_a_long_tool_input_is_followed_while_it_streams(autojump_clock: trio.testing.MockClock) -> None:
    long = "x" * 6000
    step = ScriptStep(
        tool_calls=(ScriptedCall(id="w", name="write_note", input={"text": long}),),
        chunk_size=256,
        delay_between_chunks=0.05,
    )
    seen: list[tuple[str, int]] = []
    async with ScriptedProvider([step, ScriptStep(text="ok")]) as provider:
        session = Session(document="", kind=NOTE_KIND, provider=provider, model="m", tools=[write_note])
        async with session, trio.open_nursery() as nursery:

            async def watch() -> None:
                while True:
                    current = session.input_streaming
                    if current is not None and (not seen or seen[-1] != current):
                        seen.append(current)
                    if session.state is not None and session.state.phase is Phase.AWAITING_APPROVAL:
                        session.approve("w")
                    await trio.sleep(0.01)

            nursery.start_soon(watch)
            final = await session.send("write it")
            nursery.cancel_scope.cancel()
    assert final.outcome is Outcome.COMPLETED and session.document == long
    assert len(seen) > 3 and all(name == "write_note" for name, _ in seen)
    sizes = [size for _, size in seen]
    assert sizes == sorted(sizes) and sizes[-1] > 5000  # grows as the input streams
    assert session.input_streaming is None


async def test_a_running_calls_progress_is_visible_until_it_settles() -> None:
    reported, release = trio.Event(), trio.Event()

    @function_tool
    async def copy_files(ctx: ToolExecutionContext[str]) -> ToolOutcome[str]:
        """Copy the files, saying how far it got."""
        ctx.report_progress(3, 10, "copying \u202eb.txt")
        reported.set()
        await release.wait()
        return ToolOutcome.success("copied", document="copied")

    steps = [ScriptStep(tool_calls=(ScriptedCall(id="c", name="copy_files"),)), ScriptStep(text="Done.")]
    async with ScriptedProvider(steps) as provider:
        session = Session(document="", kind=NOTE_KIND, provider=provider, model="m", tools=[copy_files])
        async with session, trio.open_nursery() as nursery:

            async def review() -> None:
                async for state in session.states():
                    if state.phase is Phase.AWAITING_APPROVAL:
                        session.approve("c")

            nursery.start_soon(review)
            settled = trio.Event()

            async def send() -> None:
                await session.send("copy")
                settled.set()

            nursery.start_soon(send)
            await reported.wait()
            assert session.call_progress("c") == (3.0, 10.0, "copying \u202eb.txt")
            from rich.console import Console

            from trioloop.cli.view import TurnView

            line = TurnView(Console(), session, "ask")._progress_line(session.state)  # type: ignore[arg-type]
            assert line is not None and "copy_files: 3 of 10" in line and "\u202e" not in line
            release.set()
            await settled.wait()
            assert session.call_progress("c") is None
            nursery.cancel_scope.cancel()


async def test_approve_batch_covers_calls_already_approved_and_refuses_unknown_or_denied_ones(
    document: ThreatModel,
) -> None:
    # A face's "approve all" over the current calls lists a read the read-only policy already approved (and ran):
    # that call is covered, the batch goes on. An unknown id, or a call decided against, refuses the whole batch.
    threat = {"title": "Replayed webhook", "category": "Spoofing", "severity": "high", "element": "psp"}
    calls = (
        ScriptedCall(id="r1", name="get_document_summary", input={}),
        ScriptedCall(id="m1", name="add_threat", input={"threat": threat}),
        ScriptedCall(id="m2", name="add_threat", input={"threat": {**threat, "title": "Stale nonce"}}),
    )
    steps = [ScriptStep(tool_calls=calls), ScriptStep(text="Done.")]
    async with (
        ScriptedProvider(steps) as provider,
        threat_model_session(document=document, provider=provider, model="scripted-1") as session,
        trio.open_nursery() as nursery,
    ):
        results: dict[str, bool] = {}

        async def approve_all() -> None:
            async for state in session.states():
                if state.phase is Phase.AWAITING_APPROVAL and "batch" not in results:
                    assert {c.id: c.status for c in state.current_calls}["r1"] in (
                        CallStatus.APPROVED,
                        CallStatus.RUNNING,
                        CallStatus.SUCCEEDED,
                    )
                    results["unknown"] = session.approve_batch(["r1", "m1", "nope"])
                    assert session.deny("m2", "not this one")
                    await trio.testing.wait_all_tasks_blocked()
                    results["denied"] = session.approve_batch(["r1", "m1", "m2"])
                    results["batch"] = session.approve_batch([c.id for c in state.current_calls if c.id != "m2"])

        nursery.start_soon(approve_all)
        with trio.fail_after(10):  # the regression left the turn waiting for its review timeout
            final = await session.send("add them")
        nursery.cancel_scope.cancel()
    assert results == {"unknown": False, "denied": False, "batch": True}
    statuses = {c.id: c.status for c in final.calls}
    assert statuses == {"r1": CallStatus.SUCCEEDED, "m1": CallStatus.SUCCEEDED, "m2": CallStatus.DENIED}
