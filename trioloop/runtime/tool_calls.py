"""Tool execution: starting what the reducer moved to ``running``, each run in its own cancel scope, and settling
it (the outcome checked, committed to the workspace, reported to the reducer) unless the call is no longer wanted.

Reads run concurrently; mutations one at a time, each from the document as the previous one left it. An ``async``
tool is a child task of the tool nursery the caller owns (the `Session` passes its own), so a tool that ignores
cancellation can be abandoned after a bounded grace without leaving the structured-concurrency tree. A plain
``def`` tool has no checkpoint to be cancelled at, so it runs in place, in the consumer, where its call starts.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any, Generic, TypeVar

import trio

from trioloop.machine.document import DocumentKind
from trioloop.machine.inputs import CallSettled, StartCall
from trioloop.machine.state import CallRecord, CallStatus
from trioloop.machine.texts import NOT_TEXT_RESULT
from trioloop.machine.tools import PreparedCall, RegisteredTool, ToolOutcome
from trioloop.machine.transaction import Committed, Refused, commit_tool_outcome
from trioloop.runtime.asking import OpenQuestions
from trioloop.runtime.clock import TurnClock, now_ms
from trioloop.runtime.inbox import TurnInbox, TurnView
from trioloop.runtime.journaling import TurnJournal
from trioloop.runtime.person import PersonWaits
from trioloop.runtime.progress import CallProgress
from trioloop.runtime.scopes import TurnScopes
from trioloop.runtime.tools import ToolExecutionContext
from trioloop.runtime.workspace import TOOL_CANCEL_GRACE_S, TurnRequest, Workspace

__all__ = ["NOT_AN_OUTCOME", "TOOL_CANCELLED_ITSELF", "TOOL_CANCEL_GRACE_S", "ToolCalls"]
NOT_AN_OUTCOME = "The tool returned something that is not a tool outcome."
TOOL_CANCELLED_ITSELF = "The tool cancelled its own run; nothing it returned was used."

D = TypeVar("D")


def _discard(pending: Awaitable[object]) -> None:
    """Drop a tool's run that never started: a coroutine is closed (none of its code ran, and none will)."""
    close = getattr(pending, "close", None)
    if close is not None:
        close()


def _failed_while_running(exc: Exception) -> ToolOutcome[Any]:
    return ToolOutcome.failure(f"The tool failed while running ({type(exc).__name__}).")


def _checked_outcome(produced: object, snapshot: D, kind: DocumentKind[D]) -> ToolOutcome[D]:
    """What a tool returned, or a failure naming the fault: only a well-formed outcome may be committed.

    A proposed document must be of the live document's own type; anything else is named, not committed.
    Never raises (a tool's object could misbehave when inspected): the call then fails as not an outcome.
    """
    try:
        return _checked(produced, snapshot, kind)
    except Exception:
        return ToolOutcome.failure(NOT_AN_OUTCOME)


def _checked(produced: object, snapshot: D, kind: DocumentKind[D]) -> ToolOutcome[D]:
    if not isinstance(produced, ToolOutcome):
        return ToolOutcome.failure(NOT_AN_OUTCOME)
    if not produced.is_text:
        return ToolOutcome.failure(NOT_TEXT_RESULT)
    proposed = produced.document
    if proposed is not None and not isinstance(proposed, type(snapshot)):
        return ToolOutcome.failure(
            f"The tool returned a document that is not a {kind.name} "
            f"(got {type(proposed).__name__}, expected {type(snapshot).__name__}); nothing changed."
        )
    checked: ToolOutcome[D] = produced
    return checked


class ToolCalls(Generic[D]):
    """The turn's tool runs: which calls were started and how many async ones still run.

    Given the consumer (`TurnView`: its state, its own inputs, its journal sync), the workspace the calls commit
    to, the nursery async tools run in, and the turn's parts a run reports to: its inbox (a settlement from a
    tool's task), its scopes (each run's own, and whether the turn is settling), each call's progress, the open
    questions, the person (a call's questions and sampling), the clock (each run's deadline), the journal (the
    fence checked before each start) and ``stop`` (the turn stopped when the fence fails)."""

    def __init__(
        self,
        turn: TurnView,
        *,
        nursery: trio.Nursery,
        workspace: Workspace[D],
        request: TurnRequest[D],
        inbox: TurnInbox,
        scopes: TurnScopes,
        progress: CallProgress,
        asking: OpenQuestions,
        person: PersonWaits,
        clock: TurnClock,
        journal: TurnJournal | None,
        stop: Callable[[], object],
    ) -> None:
        self.turn = turn
        self.nursery = nursery
        self.workspace = workspace
        self.turn_id = request.turn_id
        self.grace_s = request.tool_cancel_grace_s
        self.inbox = inbox
        self.scopes = scopes
        self.progress = progress
        self.asking = asking
        self.person = person
        self.clock = clock
        self.journal = journal
        self.stop = stop
        self.started: set[str] = set()
        self.running = 0
        self.idle = trio.Event()
        self.idle.set()

    async def start_approved(self, current: Sequence[CallRecord]) -> None:
        """Start the approved calls of ``current`` (the iteration's calls in the state as it is now)."""
        turn = self.turn
        # Reads run concurrently; mutations run one at a time, each from the document as the previous
        # one left it, so two approved edits never race into a document_changed refusal.
        mutating = any(c.status is CallStatus.RUNNING and c.effect == "mutate" for c in current)
        starting: list[tuple[CallRecord, PreparedCall[Any]]] = []
        snapshot = self.workspace.document
        for call in current:
            if call.status is not CallStatus.APPROVED or call.id in self.started:
                continue
            if call.effect == "mutate":
                if mutating:
                    continue
                mutating = True
            self.started.add(call.id)
            turn.apply(StartCall(call_id=call.id, now_ms=now_ms()))
            started = turn.state.call(call.id)
            if started is None or started.status is not CallStatus.RUNNING or started.prepared is None:
                continue  # the reducer refused it (recorded as a violation, call made terminal)
            starting.append((started, started.prepared))
        if not starting:
            return
        journal = self.journal
        if journal is not None:
            # Every start (and what led to it: the approvals) is durable before any of these tools runs, in
            # one append: a crash never runs a tool twice.
            await turn.sync()
        epoch = None if journal is None else journal.epoch
        kind = self.workspace.kind
        for call, prepared in starting:
            tool = turn.state.tool_set.get(call.tool_name)
            if tool is None:  # unreachable: the reducer checked the frozen tool set
                continue
            # The tool's own scope carries the turn deadline, so at the deadline (as on Stop) the
            # tool sees its own scope cancelled, not just a Cancelled from further out.
            if self.scopes.turn_cancelled:
                continue  # Stop or the deadline came first: none of the tool's code runs; the settle ends the call
            if journal is not None and not journal.fenced():
                self.stop()  # the lease may be another process's now: nothing more runs under it
                continue
            scope = trio.CancelScope(deadline=self.clock.scope_deadline)
            # The tool gets a private copy, made when it first reads ctx.document (or the snapshot
            # itself when the kind is immutable): nothing it does to it can reach the live document or
            # the undo snapshot that undo restores.
            progress = partial(self.report_progress, call.id)
            ask, sample = (
                partial(self.person.ask, call.id, call.tool_name),
                partial(self.person.sample, call.id, call.tool_name),
            )
            if kind.immutable:
                context = ToolExecutionContext(
                    document=snapshot, cancel_scope=scope, on_progress=progress, on_ask=ask, on_sample=sample
                )
                context.fencing_epoch = epoch
            else:
                context = ToolExecutionContext.deferred(
                    partial(kind.private_copy, snapshot),
                    cancel_scope=scope,
                    on_progress=progress,
                    on_ask=ask,
                    on_sample=sample,
                )
                context.fencing_epoch = epoch
            invoke = prepared.invoke
            if invoke is None:
                pending: Awaitable[object] = prepared.run(context)
            else:
                # A plain ``def`` tool runs here and now, as it would in a task of its own (no checkpoint
                # can come between its start and its end either way): no spawn, no scheduler pass, and
                # its settlement goes straight to the reducer, as the one consumer's own input.
                try:
                    produced = invoke(context)
                except Exception as exc:
                    produced = _failed_while_running(exc)
                if not inspect.isawaitable(produced):
                    outcome = _checked_outcome(produced, snapshot, kind)
                    self.finish(call.id, tool, snapshot, scope, outcome, report=turn.apply)
                    continue
                pending = produced
            self.scopes.work.add(scope)
            if self.running == 0:
                self.idle = trio.Event()  # set again when the last running tool ends
            self.running += 1
            # A child of the tool nursery, not of the turn: a tool that swallows Cancelled and keeps
            # going is abandoned after a bounded grace (``await_tools``) instead of holding the turn,
            # and the nursery's owner cancels and awaits it when it closes.
            self.nursery.start_soon(
                self.task, call.id, tool, pending, snapshot, scope, name=f"trioloop tool {tool.name}"
            )

    async def task(
        self,
        call_id: str,
        tool: RegisteredTool[D],
        pending: Awaitable[object],
        snapshot: D,
        scope: trio.CancelScope,
    ) -> None:
        try:
            # The tool's first step runs in this step of its task, with no checkpoint before it: what decides whether
            # it may start is checked here, not only where the task was spawned (a scheduler pass, or a process
            # frozen for a while, may come in between). Stop or the deadline since: none of the tool's code runs.
            # The lease lost meanwhile (by the holder's own clock): nothing more runs under it, and the turn stops.
            journal = self.journal
            if scope.cancel_called or self.scopes.turn_cancelled or (journal is not None and not journal.fenced()):
                _discard(pending)
                if journal is not None and journal.error is not None:
                    self.stop()
                return
            outcome: ToolOutcome[D] | None = None
            with scope:
                try:
                    produced = await pending
                except Exception as exc:  # contained to this call (Cancelled is not an Exception), reported
                    produced = _failed_while_running(exc)
                outcome = _checked_outcome(produced, snapshot, self.workspace.kind)
            self.finish(call_id, tool, snapshot, scope, outcome, report=self.inbox.put)
        finally:
            self.scopes.work.discard(scope)
            self.running -= 1
            if self.running == 0:
                self.idle.set()

    def finish(
        self,
        call_id: str,
        tool: RegisteredTool[D],
        snapshot: D,
        scope: trio.CancelScope,
        outcome: ToolOutcome[D] | None,
        *,
        report: Callable[[CallSettled], object],
    ) -> None:
        """Commit a tool's outcome and ``report`` the settlement, unless the call is no longer wanted.

        Commit and report happen with no checkpoint in between, so no cancellation can split them. A
        fault in the commit is reported as the call's failure.
        """
        if self.scopes.settling or self.scopes.turn_cancelled or self.turn.state.is_settled:
            return  # Stop, the deadline or the end of the turn: whatever it returned is discarded, never committed
        if scope.cancel_called or outcome is None:
            # The tool cancelled its own scope: the call fails (nothing it returned is used) and the turn
            # goes on, rather than waiting for its deadline on a call that will never settle.
            outcome = ToolOutcome.failure(TOOL_CANCELLED_ITSELF)
        try:
            settled = self.commit(call_id, tool, snapshot, outcome)
        except Exception as exc:  # a tool must never crash the turn: report it as this call's failure
            failure: ToolOutcome[D] = ToolOutcome.failure(f"The tool could not be settled ({type(exc).__name__}).")
            settled = CallSettled(call_id=call_id, outcome=failure, now_ms=now_ms())
        self.progress.calls.pop(call_id, None)
        self.asking.end(call_id)
        report(settled)

    def commit(self, call_id: str, tool: RegisteredTool[D], snapshot: D, outcome: ToolOutcome[D]) -> CallSettled:
        """Commit ``outcome`` to the workspace (if it proposes a valid change) and say how the call settled."""
        workspace = self.workspace
        committed = commit_tool_outcome(
            workspace.document,
            snapshot,
            outcome,
            tool,
            workspace.undo,
            turn_id=self.turn_id,
            kind=workspace.kind,
        )
        settled: ToolOutcome[D]
        changed = isinstance(committed, Committed)
        if isinstance(committed, Committed):
            workspace.document = committed.document
            workspace.undo = committed.history
            settled = ToolOutcome.success(committed.result)
        elif isinstance(committed, Refused):
            settled = ToolOutcome.failure(committed.result)
        else:
            settled = ToolOutcome.success(committed.result)
        return CallSettled(call_id=call_id, outcome=settled, now_ms=now_ms(), changed_document=changed)

    async def cancel_all(self) -> None:
        """Cancel every tool still running and wait for them to unwind, for at most the grace period.

        Shielded, so it also runs when the turn is being cancelled from outside. A tool still running
        after the grace is abandoned: the turn's scopes say it is settling, so its value can never be committed.
        """
        self.scopes.settling = True
        self.asking.end()
        self.scopes.cancel_work()
        if self.running:
            with trio.CancelScope(shield=True, deadline=trio.current_time() + self.grace_s):
                await self.idle.wait()

    def report_progress(self, call_id: str, progress: float, total: float | None, message: str) -> None:
        """A running call's progress report, kept while the turn takes input (a late one is dropped)."""
        if not self.inbox.closed:
            self.progress.report(call_id, progress, total, message)
