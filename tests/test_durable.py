"""Durable sessions: suspend in review and resume elsewhere, replay equals live, crash recovery at most once,
tools that changed, a failing store, leases, and a tampered journal refused."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from contextlib import aclosing
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing

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
from trioloop.durable.journal import VERIFY_IN_THREAD_BYTES, JournalError, decode_entries
from trioloop.durable.replay import INTERRUPTED_CALL_TEXT
from trioloop.durable.store import MemoryJournalStore, SessionLocked, StoredEntry
from trioloop.machine.authorization import Violation
from trioloop.machine.limits import TurnLimits
from trioloop.providers.scripted import ScriptedCall, ScriptStep
from trioloop.runtime.session import SessionBusy, SessionJournalError

NOTE = define_document_kind("note", dump=lambda text: text, load=lambda text: text)
RUNS: list[str] = []


@function_tool
async def append_line(ctx: ToolExecutionContext[str], line: str) -> ToolOutcome[str]:
    """Append one line to the note."""
    RUNS.append(line)
    return ToolOutcome.success(f"appended {line}", document=ctx.document + line + "\n")


@function_tool(effect="read")
def read_note(ctx: ToolExecutionContext[str]) -> ToolOutcome[str]:
    """Read the note."""
    return ToolOutcome.success(ctx.document)


@function_tool
async def append_loud(ctx: ToolExecutionContext[str], line: str, loud: bool = True) -> ToolOutcome[str]:
    """Append one line to the note (a changed tool under the same name)."""
    RUNS.append(line.upper())
    return ToolOutcome.success("appended", document=ctx.document + line.upper() + "\n")


TOOLS = [append_line, read_note]


def calls(*pairs: tuple[str, str]) -> ScriptStep:
    return ScriptStep(
        tool_calls=tuple(ScriptedCall(id=cid, name="append_line", input={"line": line}) for cid, line in pairs)
    )


@pytest.fixture(autouse=True)
def _fresh_runs() -> None:
    RUNS.clear()


async def wait_for_review(session: Session[str]) -> None:
    """Until the running turn waits for the review."""
    async with aclosing(session.states()) as states:
        async for state in states:
            if session.busy and state.phase is Phase.AWAITING_APPROVAL:
                return


async def open_note(store: MemoryJournalStore, provider: ScriptedProvider, **kw: Any) -> Session[str]:
    kw.setdefault("tools", TOOLS)
    new = not await store.read("s1")  # an existing session is taken up from its journal, its document the journal's
    document = "" if new else None
    return await Session.open(store, "s1", kind=NOTE, provider=provider, document=document, model="m", **kw)


def comparable(state: Any) -> Any:
    """A state's fields, the draft (a view of how text was chunked) aside."""
    return attrs.evolve(state, draft=None)


async def test_suspend_in_review_and_continue_in_a_new_session_with_the_same_cards() -> None:
    store = MemoryJournalStore()
    steps = [calls(("a", "one"), ("b", "two")), ScriptStep(text="Done.")]
    async with ScriptedProvider(steps) as provider:
        async with await open_note(store, provider) as session:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(session.send, "add two lines")
                await wait_for_review(session)
                assert session.approve("a")  # one decision made before the suspension
                await trio.testing.wait_all_tasks_blocked()
                suspended = await session.suspend()
            assert suspended is not None and suspended.phase is Phase.AWAITING_APPROVAL
            assert session.suspended and not session.busy and RUNS == []

        # Another process: only the store carries the turn over.
        reopened = await open_note(store, provider)
        assert reopened.suspended and reopened.state is not None
        assert comparable(reopened.state) == comparable(suspended)
        assert [(c.id, c.status, c.input_digest) for c in reopened.state.current_calls] == [
            (c.id, c.status, c.input_digest) for c in suspended.current_calls
        ]
        async with reopened:
            async with trio.open_nursery() as nursery:
                result: list[Any] = []

                async def drive() -> None:
                    result.append(await reopened.continue_turn())

                nursery.start_soon(drive)
                await trio.testing.wait_all_tasks_blocked()  # taken up: in review again, as it was
                assert reopened.busy and reopened.approve("b")
            assert result[0].outcome is Outcome.COMPLETED
            assert RUNS == ["one", "two"] and reopened.document == "one\ntwo\n"
            assert not reopened.suspended
            # The undo of the whole turn still works after the move.
            assert await reopened.undo() and reopened.document == ""

    # Replay of the whole journal equals the live end state.
    again = await open_note(store, provider)
    assert again.document == "" and again.history == reopened.history
    assert again.state is not None and reopened.state is not None
    assert comparable(again.state) == comparable(reopened.state)
    await again.aclose()


async def test_replay_equals_live_after_several_turns() -> None:
    store = MemoryJournalStore()
    steps = [
        calls(("a", "one")),
        ScriptStep(text="First."),
        ScriptStep(tool_calls=(ScriptedCall(id="r", name="read_note"),)),
        calls(("b", "two"), ("c", "three")),
        ScriptStep(text="Second."),
    ]
    async with ScriptedProvider(steps) as provider, await open_note(store, provider) as session:

        async def review() -> None:
            async for state in session.states():
                if state.phase is Phase.AWAITING_APPROVAL:
                    for call in state.current_calls:
                        if call.status is CallStatus.PENDING:
                            if call.id == "c":
                                session.deny(call.id, "not that one")
                            else:
                                session.approve(call.id, {"line": "ONE"} if call.id == "a" else None)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(review)
            assert (await session.send("first")).outcome is Outcome.COMPLETED
            assert (await session.send("second")).outcome is Outcome.COMPLETED
            nursery.cancel_scope.cancel()
        live = (session.state, session.history, session.document, session.undo_history, session._turns.last_turn_id)
    replayed = await open_note(store, provider)
    assert replayed.state is not None and live[0] is not None
    assert comparable(replayed.state) == comparable(live[0])
    assert (replayed.history, replayed.document, replayed.undo_history, replayed._turns.last_turn_id) == live[1:]
    assert replayed.document == "ONE\ntwo\n"
    await replayed.aclose()


async def test_a_call_running_at_a_crash_is_settled_failed_and_never_run_again() -> None:
    store = MemoryJournalStore()
    steps = [calls(("a", "one")), ScriptStep(text="Noted.")]
    async with ScriptedProvider(steps) as provider:
        async with await open_note(store, provider) as session:

            async def review() -> None:
                await wait_for_review(session)
                session.approve("a")

            async with trio.open_nursery() as nursery:
                nursery.start_soon(review)
                await session.send("add")
        entries = store._journals["s1"]
        start = next(i for i, e in enumerate(entries) if b'"kind":"start"' in e.data)
        # The process died right after the start was durable (the tool may or may not have run).
        crashed = MemoryJournalStore()
        crashed._journals["s1"] = through_batch(entries, start)
        RUNS.clear()
        reopened = await open_note(crashed, provider, witness=None)
        assert reopened.suspended and reopened.state is not None
        assert reopened.state.call("a") is not None and reopened.state.call("a").status is CallStatus.RUNNING  # type: ignore[union-attr]
        async with reopened:
            final = await reopened.continue_turn()
        interrupted = final.call("a")
        assert interrupted is not None and interrupted.status is CallStatus.FAILED
        assert interrupted.result == INTERRUPTED_CALL_TEXT
        assert RUNS == []  # at most once: never run again
        assert reopened.document == ""
        assert final.outcome is Outcome.COMPLETED


async def test_a_request_in_flight_at_a_crash_is_asked_again_as_a_retry() -> None:
    store = MemoryJournalStore()
    async with ScriptedProvider([ScriptStep(text="Hello.")]) as provider:
        async with await open_note(store, provider) as session:
            await session.send("hi")
        entries = store._journals["s1"]
        submit = next(i for i, e in enumerate(entries) if b'"kind":"submit"' in e.data)
        crashed = MemoryJournalStore()
        crashed._journals["s1"] = through_batch(entries, submit)
    async with ScriptedProvider([ScriptStep(text="Hello again.")]) as provider:
        reopened = await open_note(crashed, provider, witness=None)
        assert reopened.suspended and reopened.state is not None and reopened.state.phase is Phase.REQUESTING
        async with reopened:
            final = await reopened.continue_turn()
    assert final.outcome is Outcome.COMPLETED and final.budget.retries_used == 1
    assert "interrupted" in final.notices[0]
    assert final.messages[-1].content[0].text == "Hello again."  # type: ignore[union-attr]


async def test_a_call_whose_tool_changed_is_revoked_on_resume() -> None:
    store = MemoryJournalStore()
    async with ScriptedProvider([calls(("a", "one")), ScriptStep(text="Ok.")]) as provider:
        async with await open_note(store, provider) as session, trio.open_nursery() as nursery:
            nursery.start_soon(session.send, "add")
            await wait_for_review(session)
            await session.suspend()
        changed = attrs.evolve(append_loud, name="append_line")
        reopened = await Session.open(store, "s1", kind=NOTE, provider=provider, tools=[changed, read_note])
        async with reopened:
            final = await reopened.continue_turn()
    revoked = final.call("a")
    assert revoked is not None and revoked.status is CallStatus.FAILED and "changed after" in (revoked.result or "")
    assert any(v.violation is Violation.DIGEST_MISMATCH for v in final.violations)
    assert RUNS == [] and reopened.document == ""


async def test_a_failing_store_stops_the_turn_before_the_tool_runs() -> None:
    store = MemoryJournalStore()
    async with ScriptedProvider([calls(("a", "one")), ScriptStep(text="Ok.")]) as provider:
        async with await open_note(store, provider) as session:
            failures: list[BaseException] = []

            async def send() -> None:
                try:
                    await session.send("add")
                except SessionJournalError as exc:  # raised once the turn has settled
                    failures.append(exc)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(send)
                await wait_for_review(session)
                store.fail_appends = True
                session.approve("a")
            assert len(failures) == 1 and "could not be written" in str(failures[0])
            # Nothing after the failed append is shown: the last state published stands, unsettled, nothing run.
            assert session.state is not None and not session.state.is_settled
            assert RUNS == [] and session.document == ""
            with pytest.raises(SessionJournalError):
                await session.send("again")
            store.fail_appends = False
        # The journal holds the turn up to the review: reopened, the approval is not there and nothing ran.
        reopened = await open_note(store, provider)
        assert reopened.suspended and reopened.state is not None
        assert reopened.state.call("a") is not None and reopened.state.call("a").status is CallStatus.PENDING  # type: ignore[union-attr]
        await reopened.aclose()


async def test_a_second_opener_is_refused_while_the_lease_is_held() -> None:
    store = MemoryJournalStore()
    async with ScriptedProvider([]) as provider:
        first = await open_note(store, provider)
        with pytest.raises(SessionLocked):
            await open_note(store, provider)
        await first.aclose()
        second = await open_note(store, provider)
        await second.aclose()


def through_batch(entries: Sequence[StoredEntry], index: int) -> list[StoredEntry]:
    """The entries a crash right after entry ``index`` was durable leaves: whole batches, so up to the seal that
    ended the batch holding it (an append is all or nothing). The copy is opened without the witness, which saw
    the whole run: a real crash never leaves the witness ahead of the journal (it hears of an append once the
    append is durable)."""
    end = next(i for i in range(index, len(entries)) if b'"kind":"seal"' in entries[i].data)
    return list(entries[: end + 1])


def tamper(entries: Sequence[StoredEntry], index: int, old: bytes, new: bytes) -> list[StoredEntry]:
    changed = list(entries)
    changed[index] = StoredEntry(changed[index].seq, changed[index].data.replace(old, new))
    return changed


async def test_a_tampered_journal_is_refused_naming_the_first_bad_entry() -> None:
    store = MemoryJournalStore()
    async with ScriptedProvider([calls(("a", "one")), ScriptStep(text="Ok.")]) as provider:
        async with await open_note(store, provider) as session:

            async def review() -> None:
                await wait_for_review(session)
                session.approve("a")

            async with trio.open_nursery() as nursery:
                nursery.start_soon(review)
                await session.send("add")
        entries = store._journals["s1"]
        approve = next(i for i, e in enumerate(entries) if b'"kind":"approve"' in e.data)
        forged = MemoryJournalStore()
        forged._journals["s1"] = tamper(entries, approve, b'"by":"', b'"by":"mallory')
        with pytest.raises(JournalError) as caught:
            await open_note(forged, provider)
        assert caught.value.seq == approve + 2  # the entry after the forged one no longer matches its hash
        assert decode_entries(forged._journals["s1"])[approve].data["by"].startswith("mallory")


def test_the_example_suspends_in_one_process_and_approves_in_another(tmp_path: Path) -> None:
    example = Path(__file__).resolve().parent.parent / "examples" / "durable_review.py"
    journal = str(tmp_path / "reviews.db")
    first = subprocess.run([sys.executable, str(example), "start", journal], capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    assert "waiting for review" in first.stdout and "Forged PSP webhook" in first.stdout
    second = subprocess.run(
        [sys.executable, str(example), "approve", journal], capture_output=True, text=True, timeout=60
    )
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip() == "completed - 8 threats"
    # A third process finds the turn settled, the threat in the document, nothing left to continue.
    third = subprocess.run(
        [sys.executable, str(example), "approve", journal], capture_output=True, text=True, timeout=60
    )
    assert third.returncode != 0 and "AssertionError" in third.stderr


async def test_suspend_outside_review_is_stop_first() -> None:
    store = MemoryJournalStore()
    running, never = trio.Event(), trio.Event()

    @function_tool
    async def slow(ctx: ToolExecutionContext[str]) -> ToolOutcome[str]:
        """Wait for ever (until cancelled)."""
        RUNS.append("slow")
        running.set()
        await never.wait()
        return ToolOutcome.success("never")

    step = ScriptStep(tool_calls=(ScriptedCall(id="s", name="slow"),))
    async with ScriptedProvider([step]) as provider:
        session = await open_note(store, provider, tools=[slow, read_note])
        async with session, trio.open_nursery() as nursery:
            nursery.start_soon(session.send, "go")
            await wait_for_review(session)
            session.approve("s")
            await running.wait()  # executing: no review to suspend in
            final = await session.suspend()
        assert final is not None and final.outcome is Outcome.CANCELLED and not session.suspended
        assert RUNS == ["slow"]
    reopened = await open_note(store, provider, tools=[slow, read_note])
    assert not reopened.suspended and reopened.state is not None and reopened.state.outcome is Outcome.CANCELLED
    await reopened.aclose()


async def test_suspend_and_continue_in_one_process_without_a_store() -> None:
    steps = [calls(("a", "one")), ScriptStep(text="Ok.")]
    async with (
        ScriptedProvider(steps) as provider,
        Session(document="", kind=NOTE, provider=provider, model="m", tools=TOOLS) as session,
    ):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(session.send, "add")
            await wait_for_review(session)
            await session.suspend()
        assert session.suspended and not session.busy
        with pytest.raises(SessionBusy):
            await session.send("something else")
        assert session.approve("a")  # queued for the suspended turn
        final = await session.continue_turn()
    assert final.outcome is Outcome.COMPLETED and session.document == "one\n" and RUNS == ["one"]


async def test_the_review_timeout_goes_on_from_where_it_stood(autojump_clock: trio.testing.MockClock) -> None:
    store = MemoryJournalStore()
    limits = TurnLimits(review_timeout_ms=10_000)
    async with ScriptedProvider([calls(("a", "one"))]) as provider:
        async with await open_note(store, provider, limits=limits) as session, trio.open_nursery() as nursery:
            nursery.start_soon(session.send, "add")
            await wait_for_review(session)
            await trio.sleep(6)  # the person looked at the card for 6 s, then the app closed
            await session.suspend()
        reopened = await open_note(store, provider, limits=limits)
        async with reopened:
            started = trio.current_time()
            final = await reopened.continue_turn()
            waited = trio.current_time() - started
    assert final.outcome is Outcome.BOUNDED and any("review" in n.lower() for n in final.notices)
    assert 3.9 <= waited <= 4.1  # the 4 s the review had left, not a fresh 10 s
    assert RUNS == []


async def test_the_turn_deadline_goes_on_from_where_it_stood(autojump_clock: trio.testing.MockClock) -> None:
    @function_tool(effect="read")
    async def slow_read(ctx: ToolExecutionContext[str]) -> ToolOutcome[str]:
        """Read slowly (3 s)."""
        await trio.sleep(3)
        return ToolOutcome.success(ctx.document)

    @function_tool
    async def slow_write(ctx: ToolExecutionContext[str], line: str) -> ToolOutcome[str]:
        """Write slowly (3 s)."""
        await trio.sleep(3)
        RUNS.append(line)
        return ToolOutcome.success("written", document=ctx.document + line)

    tools = [slow_read, slow_write]
    limits = TurnLimits(turn_deadline_ms=5_000)
    steps = [
        ScriptStep(tool_calls=(ScriptedCall(id="r", name="slow_read"),)),
        ScriptStep(tool_calls=(ScriptedCall(id="w", name="slow_write", input={"line": "x"}),)),
    ]
    store = MemoryJournalStore()
    async with ScriptedProvider(steps) as provider:
        session = await open_note(store, provider, tools=tools, limits=limits)
        async with session, trio.open_nursery() as nursery:
            nursery.start_soon(session.send, "go")
            await wait_for_review(session)  # 3 s of the 5 s spent reading; the review does not count
            await trio.sleep(60)
            await session.suspend()
        reopened = await open_note(store, provider, tools=tools, limits=limits)
        async with reopened:
            reopened.approve("w")
            started = trio.current_time()
            final = await reopened.continue_turn()
            took = trio.current_time() - started
    # The write needs 3 s; about 2 s of the turn were left: it ends at the deadline, the write not committed.
    assert final.outcome is Outcome.BOUNDED and 1.9 <= took <= 2.2, took
    assert RUNS == [] and reopened.document == ""


async def test_undo_steps_back_several_turns_and_redo_takes_them_back_through_the_journal() -> None:
    store = MemoryJournalStore()
    steps = [calls(("a", "one")), ScriptStep(text="1"), calls(("b", "two")), ScriptStep(text="2")]
    steps += [calls(("c", "three")), ScriptStep(text="3")]
    async with ScriptedProvider(steps) as provider, await open_note(store, provider) as session:

        async def review() -> None:
            async for state in session.states():
                if session.busy and state.phase is Phase.AWAITING_APPROVAL:
                    for call in state.current_calls:
                        if call.status is CallStatus.PENDING:
                            session.approve(call.id)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(review)
            for text in ("first", "second", "third"):
                await session.send(text)
            nursery.cancel_scope.cancel()
        assert session.document == "one\ntwo\nthree\n"
        assert session.undo_step() == "turn-3" and session.undo_step() == "turn-2"
        assert session.document == "one\n"
        assert session.redo_last_undo() == "turn-2" and session.document == "one\ntwo\n"
        assert session.undo_step() == "turn-2" and session.undo_step() == "turn-1" and session.document == ""
        assert session.undo_step() is None
        assert session.redo_last_undo() == "turn-1" and session.document == "one\n"
        live = (session.document, session.undo_history.entries, session.undo_history.redo)
    reopened = await open_note(store, provider)
    assert (reopened.document, reopened.undo_history.entries, reopened.undo_history.redo) == live
    # Redo goes on after reopening, as far as it reached.
    assert reopened.redo_last_undo() == "turn-2" and reopened.redo_last_undo() == "turn-3"
    assert reopened.document == "one\ntwo\nthree\n" and reopened.redo_last_undo() is None
    await reopened.aclose()


async def test_a_long_journal_is_verified_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    # Decoding and verifying a long journal is CPU work (about 0.2 ms per KiB): on the loop it would hold every
    # other session's task, and their deadlines, for as long. It runs in a worker thread; a short one does not.
    import threading

    from trioloop.durable import audit
    from trioloop.durable import journal as journal_module

    threads: list[bool] = []
    verify = journal_module.verify_journal

    def spy(*args: Any, **kwargs: Any) -> Any:
        threads.append(threading.current_thread() is threading.main_thread())
        return verify(*args, **kwargs)

    monkeypatch.setattr(audit, "verify_journal", spy)  # `verify_stored`, which opening a session verifies with
    store = MemoryJournalStore()
    async with ScriptedProvider([ScriptStep(text="Hi.")]) as provider:
        async with await open_note(store, provider) as session:
            await session.send("hi")
        async with await open_note(store, provider, tools=TOOLS):
            pass  # a short journal: on the loop
        long = "x" * VERIFY_IN_THREAD_BYTES
        async with ScriptedProvider([ScriptStep(text="Long.")]) as again, await open_note(store, again) as session:
            await session.send(long)
        async with await open_note(store, provider) as reopened:
            assert reopened.history[-2].content[0].text == long  # type: ignore[union-attr]
    assert threads == [True, True, False]


async def test_a_settled_turn_ends_with_one_append_that_holds_its_snapshot() -> None:
    """The turn's last entries and the session snapshot after it (when one is due) go in one append: the
    snapshot after its own seal, so a journal compacted to start there still verifies."""
    store = MemoryJournalStore()
    read = ScriptStep(tool_calls=(ScriptedCall(id="r1", name="read_note", input={}),))
    steps = [read, ScriptStep(text="Done."), ScriptStep(text="Again.")]
    async with ScriptedProvider(steps) as provider:
        async with await open_note(store, provider, compact=True) as session:
            assert session._journal.journal is not None
            lease = session._journal.journal.lease
            batches: list[list[str]] = []
            append = lease.append

            async def recording(entries: Sequence[StoredEntry]) -> None:
                batches.append([e.kind for e in decode_entries(entries)])
                await append(entries)

            lease.append = recording  # type: ignore[method-assign]
            state = await session.send("read it")
            assert state.outcome is Outcome.COMPLETED
            last = batches[-1]
            assert "settled" in last and last[-3:] == ["seal", "snapshot", "seal"], batches
            assert sum("snapshot" in batch for batch in batches) == 1
            await session.send("and again")  # the snapshot before this turn is where the journal is compacted to
        history = session.history
    reopened = await open_note(store, provider)
    async with reopened:
        assert reopened.history == history and reopened.state is not None and reopened.state.is_settled
        assert reopened.usage == session.usage
        assert (reopened.journal_integrity is not None) and reopened.journal_integrity.first_seq > 1  # compacted
