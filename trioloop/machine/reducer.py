"""The turn reducer: ``reduce_turn(state, input) -> state``, a pure and total function.

Theory of operation: a turn is a value (`TurnState`) and every fact about it -- a stream event, a
user's approval, a tool finishing -- is an input. The reducer looks the input up in the phase table
(`PHASE_TRANSITIONS`); an input the phase does not admit is dropped (recorded as a violation once the
turn has settled); an admitted one goes to its handler. Handlers are the only writers of phase and
call status, move a status only along `CALL_STATUS_EDGES`, and never read a clock, do I/O or raise.
Authorization is not decided here: grants come from `authorization`, and a call reaches `running`
only through `authorize_start`. An iteration executes only once it is decided (no call pending), so
the order of the reviewer's clicks never changes what runs; an edited approval is prepared here by the
call's own tool, so the grant binds exactly the input that will run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Final, TypeAlias

import attrs

from trioloop.machine.authorization import (
    Denial,
    Grant,
    Violation,
    authorize_start,
    auto_grant_read_only,
    grant_for_batch,
    grant_for_call,
)
from trioloop.machine.card import changed_fields
from trioloop.machine.ids import fresh_call_id
from trioloop.machine.inputs import (
    INPUT_TYPE_KINDS,
    Advance,
    ApproveBatch,
    ApproveCall,
    CallSettled,
    Cancel,
    DenyCall,
    InputKind,
    Retry,
    Revoke,
    StartCall,
    Submit,
    TurnCommand,
    TurnInput,
    UndoTurn,
    classify,
)
from trioloop.machine.limits import Bound, TurnBudget, bound_notice, budget_exhaustion, tool_call_cap
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
from trioloop.machine.tables import CALL_STATUS_EDGES, INITIAL_CALL_STATUSES, PHASE_TRANSITIONS
from trioloop.machine.texts import (
    DENY_REASON_MAX,
    DUPLICATE_NOTICE,
    INTERRUPTED_TEXT,
    LIMIT_NOTICE,
    LIMIT_TEXT,
    NOT_RUN_TEXT,
    NOT_TEXT_RESULT,
    REPLAY_TEXT,
    declined_text,
    duplicate_call_text,
    echo,
    edited_text,
    invalid_edit_text,
    invalid_input_text,
    not_authorized_text,
    retry_notice,
    revoked_text,
    unknown_tool_text,
    unreadable_input_notice,
    unreadable_input_text,
)
from trioloop.machine.tools import PrepareFailure
from trioloop.protocol.events import (
    MessageStart,
    MessageStop,
    ProviderBlockComplete,
    StopReason,
    StreamError,
    TextDelta,
    ThinkingComplete,
    ToolCallComplete,
    Usage,
    usage_sum,
)
from trioloop.protocol.messages import Message, ToolCallBlock, ToolResultBlock

__all__ = [
    "CALL_STATUS_EDGES",
    "DENY_REASON_MAX",
    "INITIAL_CALL_STATUSES",
    "PHASE_TRANSITIONS",
    "Advance",
    "ApproveBatch",
    "ApproveCall",
    "CallRecord",
    "CallSettled",
    "CallStatus",
    "Cancel",
    "DenialReason",
    "DenyCall",
    "InputKind",
    "Outcome",
    "Phase",
    "Retry",
    "Revoke",
    "StartCall",
    "Submit",
    "TurnCommand",
    "TurnInput",
    "TurnState",
    "UndoTurn",
    "ViolationRecord",
    "classify",
    "reduce_turn",
]

# ---------------------------------------------------------------------------------------------
# Small pure helpers


def _violate(state: TurnState, violation: Violation, call_id: str | None, detail: str) -> TurnState:
    record = ViolationRecord(violation=violation, call_id=call_id, detail=detail)
    return state.evolved(violation_log=state.violation_log.append(record))


def _notice(state: TurnState, text: str) -> TurnState:
    return state.evolved(notice_log=state.notice_log.append(text))


def _moved(
    call: CallRecord,
    status: CallStatus,
    *,
    result: str | None = None,
    is_error: bool | None = None,
    denial_reason: DenialReason | None = None,
) -> CallRecord:
    """``call`` in ``status`` (other fields change only when given), or unchanged when the status
    table has no such edge."""
    if status not in CALL_STATUS_EDGES[call.status]:
        return call
    return call.moved_to(status, result=result, is_error=is_error, denial_reason=denial_reason)


def _replace_call(state: TurnState, call: CallRecord, **changes: Any) -> TurnState:
    """``state`` with ``call`` in place of the record of the same id (and ``changes``, in the same copy)."""
    position = state.calls.position(call.id)
    if position is None:
        return state
    return state.evolved(calls=state.calls.replaced(((position, call),)), **changes)


def _add_call(state: TurnState, call: CallRecord, **changes: Any) -> TurnState:
    if call.status not in INITIAL_CALL_STATUSES:
        return state
    return state.evolved(calls=state.calls.append(call), **changes)


def _has_pending(state: TurnState) -> bool:
    # Counted by the call table: a pending call is always one of the current iteration's, since an
    # iteration advances only once every call in it is terminal.
    return state.calls.pending_count > 0


def _closing_draft(state: TurnState) -> tuple[Draft, tuple[Message, ...]] | None:
    """The closed draft and the messages with its message added, or None when no draft is open."""
    draft = state.draft
    if draft is None or not draft.open:
        return None
    closed = draft.closed()
    message = closed.message
    return closed, state.closed_messages if message is None else (*state.closed_messages, message)


def _answer_message(calls: tuple[CallRecord, ...]) -> Message:
    results = tuple(
        ToolResultBlock(
            call_id=c.id,
            content=_result_content(c),
            is_error=c.is_error,
        )
        for c in calls
    )
    return Message(role="user", content=results)


def _result_content(call: CallRecord) -> str:
    content = call.result if call.result is not None else call.summary
    return content if not call.edits else f"{edited_text(call.edits)}\n{content}"


def _settle(
    state: TurnState,
    outcome: Outcome,
    *,
    bound: Bound | None = None,
    error: StreamError | None = None,
    stop_reason: StopReason | None = None,
) -> TurnState:
    """End the turn: every call that did not finish is marked not run, every opened call is answered."""
    # Closing the draft (its message joins the turn's messages, never an empty one), answering every
    # call not yet answered (one user message, in emission order) and the notice, in one copy: settling
    # is on the Stop path and ends every turn.
    reason = DenialReason.LIMIT_EXCEEDED if outcome is Outcome.BOUNDED else DenialReason.TURN_CANCELLED
    calls = tuple(_not_run(c, reason) for c in state.calls)
    changes: dict[str, Any] = {"phase": Phase.SETTLED, "outcome": outcome, "error": error, "calls": calls}
    if stop_reason is not None:
        changes["stop_reason"] = stop_reason
    messages = state.closed_messages
    closing = _closing_draft(state)
    if closing is not None:
        changes["draft"], messages = closing
    pending = calls[state.answered :]
    if pending:
        messages = (*messages, _answer_message(pending))
        changes["answered"] = len(calls)
    changes["closed_messages"] = messages
    if bound is not None:
        changes["notice_log"] = state.notice_log.append(bound_notice(bound))
    return state.evolved(**changes)


def _not_run(call: CallRecord, reason: DenialReason) -> CallRecord:
    if call.is_terminal:
        return call
    text = INTERRUPTED_TEXT if call.status is CallStatus.RUNNING else NOT_RUN_TEXT
    return _moved(call, CallStatus.DENIED, denial_reason=reason, result=text, is_error=True)


# ---------------------------------------------------------------------------------------------
# Handlers, one per input kind. Each receives an input its phase admits (see PHASE_TRANSITIONS).

_Handler: TypeAlias = Callable[[TurnState, Any], TurnState]


def _on_submit(state: TurnState, cmd: Submit) -> TurnState:
    base_ids = frozenset(
        block.id
        for message in cmd.base_messages
        for block in message.content
        if type(block) is ToolCallBlock and type(block.id) is str
    )
    return TurnState(
        turn_id=cmd.turn_id,
        phase=Phase.REQUESTING,
        iteration=1,
        tool_set=cmd.tool_set,
        limits=cmd.limits,
        budget=TurnBudget(iterations_started=1, started_at_ms=cmd.now_ms),
        base_messages=cmd.base_messages,
        closed_messages=(Message.user(cmd.text),),
        base_call_ids=base_ids,
    )


def _on_message_start(state: TurnState, event: MessageStart) -> TurnState:
    if event.model and event.model != state.response_model:
        return state.evolved(phase=Phase.STREAMING, draft=Draft(), response_model=event.model)
    return state.evolved(phase=Phase.STREAMING, draft=Draft())


def _on_text_delta(state: TurnState, event: TextDelta) -> TurnState:
    if not event.text:
        return state
    draft = state.draft or Draft()
    return state.evolved(draft=draft.with_text(event.text))


def _on_informational(state: TurnState, event: object) -> TurnState:
    return state


def _on_block_complete(state: TurnState, event: ThinkingComplete | ProviderBlockComplete) -> TurnState:
    """A thinking or provider block joins the assistant message in stream order (it goes back verbatim)."""
    return state.evolved(draft=(state.draft or Draft()).with_block(event.block))


def _taken(state: TurnState, call_id: str) -> bool:
    return call_id in state.base_call_ids or state.calls.position(call_id) is not None


def _call_identity(state: TurnState, server_id: str) -> tuple[str, bool]:
    """The id the call is known by in this session, and whether it repeats an id of this same message.

    A server's id that is free is kept. One already used by an earlier iteration or turn (servers that
    number calls anew in every response), or empty, is replaced by a fresh id of the same shape, so the
    history sent back pairs exactly and no grant of the earlier call can apply to this one. An id used
    twice in one message is a duplicate: that call gets a fresh id too, and is answered, not run.
    Expected O(1): the first rename of ``server_id`` in an iteration is derived from it and the iteration
    alone (so a repeat finds it), any other from the call's position (so a flood never walks a chain).
    """
    position = state.calls.position(server_id) if server_id else None
    if server_id and position is None and server_id not in state.base_call_ids:
        return server_id, False
    first = state.iteration_first_call
    duplicate = position is not None and position >= first
    salt = f"{state.turn_id}\0{state.iteration}"
    if not duplicate:
        candidate = fresh_call_id(server_id, salt)
        taken_at = state.calls.position(candidate)
        if taken_at is None and candidate not in state.base_call_ids:
            return candidate, False
        duplicate = taken_at is not None and taken_at >= first and bool(server_id)
    attempt = len(state.calls)
    while True:
        candidate = fresh_call_id(server_id, f"{salt}\0{attempt}")
        if not _taken(state, candidate):
            return candidate, duplicate
        attempt += 1


def _failed_unprepared(common: Mapping[str, Any], text: str) -> CallRecord:
    """A call that failed before any tool prepared it, answered with ``text``; a call whose tool is not
    known yet (``common`` has no effect) counts as a mutation, the most careful reading."""
    return CallRecord(
        **{"effect": "mutate", "destructive": False, **common},
        input_digest="",
        summary=text,
        status=CallStatus.FAILED,
        result=text,
        is_error=True,
    )


def _on_tool_call_complete(state: TurnState, event: ToolCallComplete) -> TurnState:
    """SPEC §2: duplicate id, unknown tool, caps, invalid input, sticky denial, read-only policy."""
    name = event.name
    call_id, duplicate = _call_identity(state, event.id)
    # The call's block joins the draft in the same state as its record (every path below adds one).
    draft = (state.draft or Draft()).with_call(ToolCallBlock(id=call_id, name=name, input=event.input))
    common: dict[str, Any] = {"id": call_id, "tool_name": name, "iteration": state.iteration}
    if duplicate:
        record = _failed_unprepared(common, duplicate_call_text(event.id))
        state = _violate(
            _add_call(state, record, draft=draft), Violation.DUPLICATE_CALL_ID, call_id, f"reused {echo(event.id)}"
        )
        return _notice(state, DUPLICATE_NOTICE)

    tool = state.tool_set.get(name)
    if tool is None:
        record = _failed_unprepared(common, unknown_tool_text(name))
        return _violate(_add_call(state, record, draft=draft), Violation.UNKNOWN_TOOL, call_id, record.summary)

    common.update(effect=tool.effect, destructive=tool.destructive)
    if tool_call_cap(state.budget, state.limits, state.current_call_count) is not None:
        first = state.calls.limit_refused_count == 0
        record = CallRecord(
            **common,
            input_digest="",
            summary=f"Not run (limit reached): {name}",
            status=CallStatus.DENIED,
            result=LIMIT_TEXT,
            is_error=True,
            denial_reason=DenialReason.LIMIT_EXCEEDED,
        )
        state = _violate(
            _add_call(state, record, draft=draft), Violation.LIMIT_EXCEEDED, call_id, "tool-call limit reached"
        )
        return _notice(state, LIMIT_NOTICE) if first else state

    if event.input_error is not None:
        record = _failed_unprepared(common, unreadable_input_text(name, event.input_error))
        return _notice(_add_call(state, record, draft=draft), unreadable_input_notice(name))
    prepared = tool.prepare(event.input)
    if isinstance(prepared, PrepareFailure):
        return _add_call(state, _failed_unprepared(common, invalid_input_text(name, prepared)), draft=draft)

    budget = state.budget.spent(tool_calls=1)
    common.update(input_digest=prepared.input_digest, summary=prepared.summary, prepared=prepared)
    if state.denials and Denial(tool_name=name, input_digest=prepared.input_digest) in state.denials:
        record = CallRecord(
            **common,
            status=CallStatus.DENIED,
            denial_reason=DenialReason.USER_DECLINED,
            result=REPLAY_TEXT,
            is_error=True,
        )
        state = _add_call(state, record, draft=draft, budget=budget)
        return _violate(state, Violation.DENIED_REPLAY, call_id, "identical action already declined")
    if tool.effect == "read" and not tool.destructive:
        record = CallRecord(**common, status=CallStatus.APPROVED)
        grant = auto_grant_read_only(tool, record, state.iteration)
        return _add_call(state, record, draft=draft, budget=budget, grants=(*state.grants, grant))
    return _add_call(state, CallRecord(**common, status=CallStatus.PENDING), draft=draft, budget=budget)


def _on_usage(state: TurnState, event: Usage) -> TurnState:
    return state.evolved(usage=usage_sum(state.usage_before_iteration, event))


_CALLS_FOLLOW: Final = frozenset({StopReason.TOOL_USE, StopReason.PAUSE_TURN})


def _on_message_stop(state: TurnState, event: MessageStop) -> TurnState:
    reason = event.stop_reason
    if state.current_call_count and reason in _CALLS_FOLLOW:
        phase = Phase.AWAITING_APPROVAL if _has_pending(state) else Phase.EXECUTING
    elif reason is StopReason.PAUSE_TURN and state.draft is not None and state.draft.message is not None:
        # The server paused its own tools' long turn: the response goes back as it is and the model
        # continues, as the next iteration (an iteration with no call of ours, which the bounds count).
        phase = Phase.EXECUTING
    else:
        # Any other stop, or a tool_use stop with no call: the model is done (a quirk must not loop).
        return _settle(state, Outcome.COMPLETED, stop_reason=reason)  # _settle closes the draft in its one copy
    closing = _closing_draft(state)  # closed in the same copy that moves the phase
    if closing is None:
        return state.evolved(phase=phase, stop_reason=reason)
    return state.evolved(phase=phase, draft=closing[0], closed_messages=closing[1], stop_reason=reason)


def _on_stream_error(state: TurnState, event: StreamError) -> TurnState:
    return _settle(state, Outcome.FAILED, error=event)


def _on_stream_notice(state: TurnState, event: StreamError) -> TurnState:
    return _notice(state, event.message)


def _on_aborted(state: TurnState, event: object) -> TurnState:
    return _settle(state, Outcome.CANCELLED)


def _on_cancel(state: TurnState, cmd: Cancel) -> TurnState:
    if cmd.reason == "deadline":
        return _settle(state, Outcome.BOUNDED, bound=Bound.DEADLINE)
    if cmd.reason == "review_timeout":
        return _settle(state, Outcome.BOUNDED, bound=Bound.REVIEW_TIMEOUT)
    return _settle(state, Outcome.CANCELLED)


def _approve(state: TurnState, grants: tuple[Grant, ...]) -> TurnState:
    if not grants:
        return state
    changes = []
    for grant in grants:
        position = state.calls.position(grant.call_id)
        if position is not None:
            changes.append((position, _moved(state.calls[position], CallStatus.APPROVED)))
    calls = state.calls.replaced(changes)
    state = state.evolved(calls=calls, grants=state.grants + grants)
    # A decided iteration: nothing approved starts while another call of the iteration awaits a
    # decision, so the order of the clicks never changes what runs.
    return state if _has_pending(state) else state.evolved(phase=Phase.EXECUTING)


def _on_approve_call(state: TurnState, cmd: ApproveCall) -> TurnState:
    if cmd.edited_input is not None:
        state, valid = _edit_call(state, cmd.call_id, cmd.edited_input)
        if not valid:
            return state  # an invalid edit approves nothing, not even the model's own input
    grant = grant_for_call(state, cmd.call_id)
    return state if grant is None else _approve(state, (grant,))


def _edit_call(state: TurnState, call_id: str, edited_input: dict[str, Any]) -> tuple[TurnState, bool]:
    """The state with the call's input replaced by the user's edit, prepared by the call's own tool (so
    validation and limits apply), and whether the edit is valid. An invalid edit leaves the call pending,
    with a notice naming its problems; a call that is not awaiting a decision is left as it is."""
    call = state.call(call_id)
    if call is None or call.prepared is None or call.status is not CallStatus.PENDING:
        return state, False
    tool = state.tool_set.get(call.tool_name)
    if tool is None or call.iteration != state.iteration:
        return state, False
    prepared = tool.prepare(edited_input)
    if isinstance(prepared, PrepareFailure):
        return _notice(state, invalid_edit_text(call.tool_name, prepared)), False
    if prepared.input_digest == call.input_digest:
        return state, True  # the "edit" changes nothing: an ordinary approval
    edited = attrs.evolve(
        call,
        input_digest=prepared.input_digest,
        summary=prepared.summary,
        prepared=prepared,
        edits=changed_fields(call.prepared.details, prepared.details),
    )
    return _replace_call(state, edited), True


def _on_approve_batch(state: TurnState, cmd: ApproveBatch) -> TurnState:
    return _approve(state, grant_for_batch(state, cmd.call_ids))


def _on_deny_call(state: TurnState, cmd: DenyCall) -> TurnState:
    call = state.call(cmd.call_id)
    if call is None or call.status is not CallStatus.PENDING:
        return state
    denied = _moved(
        call,
        CallStatus.DENIED,
        denial_reason=DenialReason.USER_DECLINED,
        result=declined_text(cmd.reason),
        is_error=True,
    )
    denial = Denial(tool_name=call.tool_name, input_digest=call.input_digest)
    denials = state.denials if denial in state.denials else (*state.denials, denial)
    state = _replace_call(state, denied).evolved(denials=denials)
    return state if _has_pending(state) else state.evolved(phase=Phase.EXECUTING)


def _on_start_call(state: TurnState, cmd: StartCall) -> TurnState:
    if state.phase is not Phase.EXECUTING:
        # A start before the iteration is executing has no grant to spend yet; the call is left
        # as it is, since it may still run legitimately once the phase allows.
        return _violate(state, Violation.NO_GRANT, cmd.call_id, f"StartCall refused: phase is {state.phase}")
    verdict = authorize_start(state, cmd.call_id)
    if isinstance(verdict, Violation):
        state = _violate(state, verdict, cmd.call_id, f"StartCall refused: {verdict.value}")
        call = state.call(cmd.call_id)
        if call is not None and call.status in (CallStatus.PENDING, CallStatus.APPROVED):
            # Terminal, so the iteration can still end: no runner may wait on a call that cannot start.
            failed = _moved(call, CallStatus.FAILED, result=not_authorized_text(verdict), is_error=True)
            state = _replace_call(state, failed)
        return state
    call = state.call(cmd.call_id)
    if call is None:  # authorize_start found it; kept total all the same
        return state
    grants = list(state.grants)
    # The very grant authorize_start returned (compared by identity: cheaper than attrs' field-wise eq).
    position = next((index for index, grant in enumerate(grants) if grant is verdict), None)
    if position is None:  # authorize_start took it from these grants; kept total all the same
        return state
    grants[position] = verdict.spent()
    return _replace_call(state, _moved(call, CallStatus.RUNNING), grants=tuple(grants))


def _on_call_settled(state: TurnState, cmd: CallSettled) -> TurnState:
    call = state.call(cmd.call_id)
    if state.phase is Phase.EXECUTING and call is not None and call.status is CallStatus.RUNNING:
        ok, result = cmd.outcome.ok, cmd.outcome.result
        if not cmd.outcome.is_text:
            # A tool fault (ToolOutcome does not check its fields): end the call rather than leave
            # it running forever, and never store a non-text result in the history.
            return _replace_call(state, _moved(call, CallStatus.FAILED, result=NOT_TEXT_RESULT, is_error=True))
        status = CallStatus.SUCCEEDED if ok else CallStatus.FAILED
        moved = call.moved_to(status, result=result, is_error=not ok, changed_document=ok and cmd.changed_document)
        return _replace_call(state, moved)
    # Not running: either no grant was ever spent on it, or the run that spent it already settled.
    spent = any(g.call_id == cmd.call_id and g.consumed for g in state.grants)
    violation = Violation.GRANT_ALREADY_CONSUMED if spent else Violation.NO_GRANT
    return _violate(state, violation, cmd.call_id, "CallSettled for a call that is not running")


def _on_advance(state: TurnState, cmd: Advance) -> TurnState:
    if state.calls.pending_count or not all(c.is_terminal for c in state.current_calls):
        return state
    bound = budget_exhaustion(state.budget, state.limits, cmd.now_ms)
    if bound is not None:
        return _settle(state, Outcome.BOUNDED, bound=bound)  # closes the draft and answers the calls too
    # Close the draft, answer the calls, then the next iteration, gathered into one state as in _settle:
    # this runs once per iteration (the draft is dropped, so only its closed message is kept).
    changes: dict[str, Any] = {}
    messages = state.closed_messages
    closing = _closing_draft(state)
    if closing is not None:
        messages = closing[1]
    pending = state.calls[state.answered :]
    if pending:
        messages = (*messages, _answer_message(pending))
        changes["answered"] = len(state.calls)
    budget = state.budget.spent(iterations=1)
    return state.evolved(
        phase=Phase.REQUESTING,
        iteration=state.iteration + 1,
        budget=budget,
        draft=None,
        closed_messages=messages,
        usage_before_iteration=state.usage,
        iteration_first_call=len(state.calls),
        stop_reason=None,
        **changes,
    )


def _on_retry(state: TurnState, cmd: Retry) -> TurnState:
    budget = state.budget.spent(retries=1)
    text = retry_notice(cmd.failure, budget.retries_used, state.limits.max_retries_per_turn, cmd.wait_ms)
    return state.evolved(budget=budget, notice_log=state.notice_log.append(text))


def _on_revoke(state: TurnState, cmd: Revoke) -> TurnState:
    call = state.call(cmd.call_id)
    if call is None or call.status not in (CallStatus.PENDING, CallStatus.APPROVED):
        return state
    failed = _moved(call, CallStatus.FAILED, result=revoked_text(call.tool_name), is_error=True)
    state = _violate(_replace_call(state, failed), Violation.DIGEST_MISMATCH, cmd.call_id, cmd.detail or "tool changed")
    if state.phase is Phase.AWAITING_APPROVAL and not _has_pending(state):
        state = state.evolved(phase=Phase.EXECUTING)
    return state


def _on_undo_turn(state: TurnState, cmd: UndoTurn) -> TurnState:
    # Only calls whose commit changed the document are undone; a read, or an edit that changed nothing,
    # stays succeeded.
    if not any(_undoable(c) for c in state.calls):
        return state
    calls = tuple(_moved(c, CallStatus.UNDONE) if _undoable(c) else c for c in state.calls)
    return state.evolved(calls=calls)


def _undoable(call: CallRecord) -> bool:
    return call.status is CallStatus.SUCCEEDED and call.changed_document


_K = InputKind
_HANDLERS: Final[Mapping[InputKind, _Handler]] = MappingProxyType(
    {
        _K.SUBMIT: _on_submit,
        _K.MESSAGE_START: _on_message_start,
        _K.TEXT_DELTA: _on_text_delta,
        _K.THINKING_DELTA: _on_informational,
        _K.THINKING_COMPLETE: _on_block_complete,
        _K.PROVIDER_BLOCK_COMPLETE: _on_block_complete,
        _K.TOOL_CALL_START: _on_informational,
        _K.TOOL_CALL_INPUT_DELTA: _on_informational,
        _K.TOOL_CALL_COMPLETE: _on_tool_call_complete,
        _K.USAGE: _on_usage,
        _K.MESSAGE_STOP: _on_message_stop,
        _K.STREAM_ERROR: _on_stream_error,
        _K.STREAM_NOTICE: _on_stream_notice,
        _K.ABORTED: _on_aborted,
        _K.APPROVE_CALL: _on_approve_call,
        _K.APPROVE_BATCH: _on_approve_batch,
        _K.DENY_CALL: _on_deny_call,
        _K.START_CALL: _on_start_call,
        _K.CALL_SETTLED: _on_call_settled,
        _K.ADVANCE: _on_advance,
        _K.RETRY: _on_retry,
        _K.CANCEL: _on_cancel,
        _K.REVOKE: _on_revoke,
        _K.UNDO_TURN: _on_undo_turn,
    }
)


#: Input types the reducer takes in without changing the state, in every phase but ``settled`` (where any
#: input is recorded as a violation): a runner may skip them while the turn is live.
NO_STATE_CHANGE: Final[frozenset[type]] = frozenset(
    input_type for input_type, kind in INPUT_TYPE_KINDS.items() if _HANDLERS[kind] is _on_informational
)


def reduce_turn(state: TurnState, turn_input: TurnInput, /) -> TurnState:
    """The next turn state after ``turn_input``. Pure and total: it never raises and never mutates.

    Anything that is not a well-formed turn input leaves the state as it is. In a settled turn every
    input except `UndoTurn` is dropped and recorded once as a ``post_settlement_event`` violation.
    """
    kind = classify(turn_input)
    if kind is None:
        return state
    admitted = PHASE_TRANSITIONS[state.phase].get(kind)
    if admitted is None:
        if state.phase is Phase.SETTLED:
            return _violate(
                state, Violation.POST_SETTLEMENT_EVENT, None, f"dropped {kind.value} after the turn settled"
            )
        return state
    result = _HANDLERS[kind](state, turn_input)
    if result.phase not in admitted:
        return state  # not reachable while the handlers agree with the table; the table wins
    return result
