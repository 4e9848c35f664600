"""The reducer's handlers for commands: a turn submitted, the person's decisions (approve, approve with an
edit, approve a batch, deny), a call started and settled, the next iteration, a retry, a cancel, a revoke,
an undo.
"""

from __future__ import annotations

from typing import Any

import attrs

from trioloop.machine.authorization import authorize_start, grant_for_batch, grant_for_call
from trioloop.machine.calls import Violation
from trioloop.machine.card import changed_fields
from trioloop.machine.grants import Denial, Grant
from trioloop.machine.inputs import (
    Advance,
    ApproveBatch,
    ApproveCall,
    CallSettled,
    Cancel,
    DenyCall,
    Retry,
    Revoke,
    StartCall,
    Submit,
    UndoTurn,
)
from trioloop.machine.limits import Bound, TurnBudget, budget_exhaustion
from trioloop.machine.on_answer import answer_nudge_message
from trioloop.machine.on_rules import PERSON, PERSON_DENIED, remember
from trioloop.machine.on_spend import bounded
from trioloop.machine.rules import Decider, Verdict
from trioloop.machine.state import (
    CallRecord,
    CallStatus,
    DenialReason,
    Outcome,
    Phase,
    TurnState,
)
from trioloop.machine.step_ids import keeping_bases, reserve_ids, seal_reservations, step_calls
from trioloop.machine.steps import (
    answer_message,
    closing_draft,
    has_pending,
    moved_along,
    replace_call,
    settle,
    violate,
    with_notice,
)
from trioloop.machine.texts import (
    NOT_TEXT_RESULT,
    declined_text,
    invalid_edit_text,
    not_authorized_text,
    retry_notice,
    revoked_text,
)
from trioloop.machine.tools import PrepareFailure
from trioloop.protocol.messages import Message, ToolCallBlock

__all__ = [
    "on_advance",
    "on_approve_batch",
    "on_approve_call",
    "on_call_settled",
    "on_cancel",
    "on_deny_call",
    "on_retry",
    "on_revoke",
    "on_start_call",
    "on_submit",
    "on_undo_turn",
]


def on_submit(state: TurnState, cmd: Submit) -> TurnState:
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
        spending=cmd.spending,
        budget=TurnBudget(iterations_started=1, started_at_ms=cmd.now_ms),
        base_messages=cmd.base_messages,
        closed_messages=(Message.user(cmd.text),),
        base_call_ids=base_ids,
        rules=cmd.rules,
        answer=cmd.answer,
    )


def on_cancel(state: TurnState, cmd: Cancel) -> TurnState:
    if cmd.reason == "deadline":
        return settle(state, Outcome.BOUNDED, bound=Bound.DEADLINE)
    if cmd.reason == "review_timeout":
        return settle(state, Outcome.BOUNDED, bound=Bound.REVIEW_TIMEOUT)
    return settle(state, Outcome.CANCELLED)


def _person(reviewer: str, decider: Decider) -> Decider:
    return decider if not reviewer else attrs.evolve(decider, reviewer=reviewer)


def _seen_elsewhere(state: TurnState, call_id: str, seen_digest: str) -> bool:
    """A decision bound to a card's digest that the call no longer has (or a call that is gone): it decides nothing."""
    if not seen_digest:
        return False
    call = state.call(call_id)
    return call is None or call.input_digest != seen_digest


def _approve(state: TurnState, grants: tuple[Grant, ...], reviewer: str = "") -> TurnState:
    if not grants:
        return state
    decider = _person(reviewer, PERSON)
    changes = []
    for grant in grants:
        position = state.calls.position(grant.call_id)
        if position is not None:
            changes.append((position, moved_along(state.calls[position], CallStatus.APPROVED, decided_by=decider)))
    calls = state.calls.replaced(changes)
    state = state.evolved(calls=calls, grants=state.grants + grants)
    # A decided iteration: nothing approved starts while another call of the iteration awaits a
    # decision, so the order of the clicks never changes what runs.
    return state if has_pending(state) else state.evolved(phase=Phase.EXECUTING)


def on_approve_call(state: TurnState, cmd: ApproveCall) -> TurnState:
    if _seen_elsewhere(state, cmd.call_id, cmd.seen_digest):
        return state
    if cmd.edited_input is not None:
        state, valid = _edit_call(state, cmd.call_id, cmd.edited_input)
        if not valid:
            return state  # an invalid edit approves nothing, not even the model's own input
    grant = grant_for_call(state, cmd.call_id)
    if grant is None:
        return state
    state = _approve(state, (grant,), cmd.reviewer)
    return state if cmd.always is None else remember(state, cmd.call_id, Verdict.ALLOW, cmd.always)


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
        return with_notice(state, invalid_edit_text(call.tool_name, prepared)), False
    if prepared.input_digest == call.input_digest:
        return state, True  # the "edit" changes nothing: an ordinary approval
    if prepared.claims:
        # Prepared again, the call keeps the ids its card reserved (a new claim comes after the step's others).
        prepared = reserve_ids(step_calls(state), prepared, call.prepared.reservations)
        if isinstance(prepared, PrepareFailure):
            return with_notice(state, invalid_edit_text(call.tool_name, prepared)), False
    edited = attrs.evolve(
        call,
        input_digest=prepared.input_digest,
        summary=prepared.summary,
        prepared=prepared,
        edits=changed_fields(call.prepared.details, prepared.details),
    )
    return replace_call(state, edited), True


def on_approve_batch(state: TurnState, cmd: ApproveBatch) -> TurnState:
    return _approve(state, grant_for_batch(state, cmd.call_ids))


def on_deny_call(state: TurnState, cmd: DenyCall) -> TurnState:
    call = state.call(cmd.call_id)
    if call is None or call.status is not CallStatus.PENDING or _seen_elsewhere(state, cmd.call_id, cmd.seen_digest):
        return state
    denied = moved_along(
        call,
        CallStatus.DENIED,
        denial_reason=DenialReason.USER_DECLINED,
        result=declined_text(cmd.reason),
        is_error=True,
        decided_by=_person(cmd.reviewer, PERSON_DENIED),
    )
    denial = Denial(tool_name=call.tool_name, input_digest=call.input_digest)
    denials = state.denials if denial in state.denials else (*state.denials, denial)
    state = replace_call(state, denied).evolved(denials=denials)
    if cmd.always is not None:
        state = remember(state, cmd.call_id, Verdict.DENY, cmd.always, cmd.reason)
    return state if has_pending(state) else state.evolved(phase=Phase.EXECUTING)


def on_start_call(state: TurnState, cmd: StartCall) -> TurnState:
    if state.phase is not Phase.EXECUTING:
        # A start before the iteration is executing has no grant to spend yet; the call is left
        # as it is, since it may still run legitimately once the phase allows.
        return violate(state, Violation.NO_GRANT, cmd.call_id, f"StartCall refused: phase is {state.phase}")
    verdict = authorize_start(state, cmd.call_id)
    if isinstance(verdict, Violation):
        state = violate(state, verdict, cmd.call_id, f"StartCall refused: {verdict.value}")
        call = state.call(cmd.call_id)
        if call is not None and call.status in (CallStatus.PENDING, CallStatus.APPROVED):
            # Terminal, so the iteration can still end: no runner may wait on a call that cannot start.
            failed = moved_along(call, CallStatus.FAILED, result=not_authorized_text(verdict), is_error=True)
            state = replace_call(state, failed)
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
    if call.effect == "mutate":  # a change: it keeps the step's bases first, if the step reserved ids
        return replace_call(
            state, keeping_bases(step_calls(state), moved_along(call, CallStatus.RUNNING)), grants=tuple(grants)
        )
    return replace_call(state, moved_along(call, CallStatus.RUNNING), grants=tuple(grants))


def on_call_settled(state: TurnState, cmd: CallSettled) -> TurnState:
    call = state.call(cmd.call_id)
    if state.phase is Phase.EXECUTING and call is not None and call.status is CallStatus.RUNNING:
        ok, result = cmd.outcome.ok, cmd.outcome.result
        if not cmd.outcome.is_text:
            # A tool fault (ToolOutcome does not check its fields): end the call rather than leave
            # it running forever, and never store a non-text result in the history.
            return replace_call(state, moved_along(call, CallStatus.FAILED, result=NOT_TEXT_RESULT, is_error=True))
        status = CallStatus.SUCCEEDED if ok else CallStatus.FAILED
        moved = call.moved_to(status, result=result, is_error=not ok, changed_document=ok and cmd.changed_document)
        if moved.changed_document:  # part of the step changed the document: its reservations are sealed
            return seal_reservations(replace_call(state, moved))
        return replace_call(state, moved)
    # Not running: either no grant was ever spent on it, or the run that spent it already settled.
    spent = any(g.call_id == cmd.call_id and g.consumed for g in state.grants)
    violation = Violation.GRANT_ALREADY_CONSUMED if spent else Violation.NO_GRANT
    return violate(state, violation, cmd.call_id, "CallSettled for a call that is not running")


def on_advance(state: TurnState, cmd: Advance) -> TurnState:
    if state.calls.pending_count or not all(c.is_terminal for c in state.current_calls):
        return state
    bound = budget_exhaustion(state.budget, state.limits, cmd.now_ms, usage=state.usage, spending=state.spending)
    if bound is not None:
        return bounded(state, bound)  # closes the draft and answers the calls too
    # Close the draft, answer the calls, then the next iteration, gathered into one state as in settle:
    # this runs once per iteration (the draft is dropped, so only its closed message is kept).
    changes: dict[str, Any] = {}
    messages = state.closed_messages
    closing = closing_draft(state)
    if closing is not None:
        messages = closing[1]
    pending = state.calls[state.answered :]
    if pending:
        messages = (*messages, answer_message(pending))
        changes["answered"] = len(state.calls)
    nudge = answer_nudge_message(state)  # a typed answer asked for again after a reply that gave none
    if nudge is not None:
        messages = (*messages, nudge)
        changes["answer_nudge"] = False
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


def on_retry(state: TurnState, cmd: Retry) -> TurnState:
    budget = state.budget.spent(retries=1)
    text = retry_notice(cmd.failure, budget.retries_used, state.limits.max_retries_per_turn, cmd.wait_ms)
    return state.evolved(budget=budget, notice_log=state.notice_log.append(text))


def on_revoke(state: TurnState, cmd: Revoke) -> TurnState:
    call = state.call(cmd.call_id)
    if call is None or call.status not in (CallStatus.PENDING, CallStatus.APPROVED):
        return state
    failed = moved_along(call, CallStatus.FAILED, result=revoked_text(call.tool_name), is_error=True)
    state = violate(replace_call(state, failed), Violation.DIGEST_MISMATCH, cmd.call_id, cmd.detail or "tool changed")
    if state.phase is Phase.AWAITING_APPROVAL and not has_pending(state):
        state = state.evolved(phase=Phase.EXECUTING)
    return state


def on_undo_turn(state: TurnState, cmd: UndoTurn) -> TurnState:
    # Only calls whose commit changed the document are undone; a read, or an edit that changed nothing,
    # stays succeeded.
    if not any(_undoable(c) for c in state.calls):
        return state
    calls = tuple(moved_along(c, CallStatus.UNDONE) if _undoable(c) else c for c in state.calls)
    return state.evolved(calls=calls)


def _undoable(call: CallRecord) -> bool:
    return call.status is CallStatus.SUCCEEDED and call.changed_document
