"""The state changes every handler of the reducer is built from: a violation or a notice recorded, a call
moved along its status table, added or replaced, the draft closed, the iteration's calls answered, the turn
settled. Each returns a new state (or record); none reads a clock, does I/O or raises.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeAlias

from trioloop.machine.calls import Violation
from trioloop.machine.limits import Bound, bound_notice
from trioloop.machine.rules import Decider
from trioloop.machine.state import (
    CallRecord,
    CallStatus,
    DenialReason,
    Draft,
    Outcome,
    Phase,
    TurnState,
    ViolationRecord,
)
from trioloop.machine.tables import CALL_STATUS_EDGES, INITIAL_CALL_STATUSES
from trioloop.machine.texts import (
    INTERRUPTED_TEXT,
    NOT_RUN_TEXT,
    edited_text,
)
from trioloop.protocol.events import (
    StopReason,
    StreamError,
)
from trioloop.protocol.messages import Message, ToolResultBlock

__all__ = [
    "Handler",
    "add_call",
    "answer_message",
    "closing_draft",
    "has_pending",
    "moved_along",
    "not_run",
    "replace_call",
    "result_content",
    "settle",
    "violate",
    "with_notice",
]


def violate(state: TurnState, violation: Violation, call_id: str | None, detail: str) -> TurnState:
    record = ViolationRecord(violation=violation, call_id=call_id, detail=detail)
    return state.evolved(violation_log=state.violation_log.append(record))


def with_notice(state: TurnState, text: str) -> TurnState:
    return state.evolved(notice_log=state.notice_log.append(text))


def moved_along(
    call: CallRecord,
    status: CallStatus,
    *,
    result: str | None = None,
    is_error: bool | None = None,
    denial_reason: DenialReason | None = None,
    decided_by: Decider | None = None,
) -> CallRecord:
    """``call`` in ``status`` (other fields change only when given), or unchanged when the status
    table has no such edge."""
    if status not in CALL_STATUS_EDGES[call.status]:
        return call
    return call.moved_to(status, result=result, is_error=is_error, denial_reason=denial_reason, decided_by=decided_by)


def replace_call(state: TurnState, call: CallRecord, **changes: Any) -> TurnState:
    """``state`` with ``call`` in place of the record of the same id (and ``changes``, in the same copy)."""
    position = state.calls.position(call.id)
    if position is None:
        return state
    return state.evolved(calls=state.calls.replaced(((position, call),)), **changes)


def add_call(state: TurnState, call: CallRecord, **changes: Any) -> TurnState:
    if call.status not in INITIAL_CALL_STATUSES:
        return state
    return state.evolved(calls=state.calls.append(call), **changes)


def has_pending(state: TurnState) -> bool:
    # Counted by the call table: a pending call is always one of the current iteration's, since an
    # iteration advances only once every call in it is terminal.
    return state.calls.pending_count > 0


def closing_draft(state: TurnState) -> tuple[Draft, tuple[Message, ...]] | None:
    """The closed draft and the messages with its message added, or None when no draft is open."""
    draft = state.draft
    if draft is None or not draft.open:
        return None
    closed = draft.closed()
    message = closed.message
    return closed, state.closed_messages if message is None else (*state.closed_messages, message)


def answer_message(calls: tuple[CallRecord, ...]) -> Message:
    results = tuple(
        ToolResultBlock(
            call_id=c.id,
            content=result_content(c),
            is_error=c.is_error,
        )
        for c in calls
    )
    return Message(role="user", content=results)


def result_content(call: CallRecord) -> str:
    content = call.result if call.result is not None else call.summary
    return content if not call.edits else f"{edited_text(call.edits)}\n{content}"


def settle(
    state: TurnState,
    outcome: Outcome,
    *,
    bound: Bound | None = None,
    error: StreamError | None = None,
    stop_reason: StopReason | None = None,
    notice: str | None = None,
) -> TurnState:
    """End the turn: every call that did not finish is marked not run, every opened call is answered.

    A ``bound`` adds its notice (``notice``, when given: a token or cost bound's, with its figures)."""
    # Closing the draft (its message joins the turn's messages, never an empty one), answering every
    # call not yet answered (one user message, in emission order) and the notice, in one copy: settling
    # is on the Stop path and ends every turn.
    reason = DenialReason.LIMIT_EXCEEDED if outcome is Outcome.BOUNDED else DenialReason.TURN_CANCELLED
    calls = tuple(not_run(c, reason) for c in state.calls)
    changes: dict[str, Any] = {"phase": Phase.SETTLED, "outcome": outcome, "error": error, "calls": calls}
    if stop_reason is not None:
        changes["stop_reason"] = stop_reason
    messages = state.closed_messages
    closing = closing_draft(state)
    if closing is not None:
        changes["draft"], messages = closing
    pending = calls[state.answered :]
    if pending:
        messages = (*messages, answer_message(pending))
        changes["answered"] = len(calls)
    changes["closed_messages"] = messages
    if bound is not None:
        changes["bound"] = bound
        changes["notice_log"] = state.notice_log.append(bound_notice(bound) if notice is None else notice)
    return state.evolved(**changes)


def not_run(call: CallRecord, reason: DenialReason) -> CallRecord:
    if call.is_terminal:
        return call
    text = INTERRUPTED_TEXT if call.status is CallStatus.RUNNING else NOT_RUN_TEXT
    return moved_along(call, CallStatus.DENIED, denial_reason=reason, result=text, is_error=True)


Handler: TypeAlias = Callable[[TurnState, Any], TurnState]
