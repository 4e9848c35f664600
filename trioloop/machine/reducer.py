"""The turn reducer: ``reduce_turn(state, input) -> state``, a pure and total function.

Theory of operation: a turn is a value (`TurnState`) and every fact about it -- a stream event, a
user's approval, a tool finishing -- is an input. The reducer looks the input up in the phase table
(`PHASE_TRANSITIONS`); an input the phase does not admit is dropped (recorded as a violation once the
turn has settled); an admitted one goes to its handler. Handlers are the only writers of phase and
call status, move a status only along `CALL_STATUS_EDGES`, and never read a clock, do I/O or raise.
Authorization is not decided here: grants come from `authorization`, and a call reaches `running`
only through `authorize_start`. An iteration executes only once it is decided (no call pending), so
the order of the reviewer's clicks never changes what runs; an edited approval is prepared here by the
call's own tool, so the grant binds exactly the input that will run. The new ids a step's calls add are
reserved here too, where the calls are prepared (`step_ids`), so a card names the id its run will use.

The handlers are in `on_stream` (stream events) and `on_commands` (the runner's and the person's commands),
built from the shared state changes in `steps`; this module is the table and the one entry point.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from trioloop.machine.calls import Violation
from trioloop.machine.inputs import (
    INPUT_TYPE_KINDS,
    Advance,
    ApproveBatch,
    ApproveCall,
    BeforeRequest,
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
from trioloop.machine.on_answer import on_answer_checked
from trioloop.machine.on_commands import (
    on_advance,
    on_approve_batch,
    on_approve_call,
    on_call_settled,
    on_cancel,
    on_deny_call,
    on_retry,
    on_revoke,
    on_start_call,
    on_submit,
    on_undo_turn,
)
from trioloop.machine.on_rules import on_code_verdict, on_forget_rule
from trioloop.machine.on_spend import on_before_request
from trioloop.machine.on_stream import (
    on_aborted,
    on_block_complete,
    on_informational,
    on_message_start,
    on_message_stop,
    on_stream_error,
    on_stream_notice,
    on_text_delta,
    on_tool_call_complete,
    on_usage,
)
from trioloop.machine.state import (
    CallRecord,
    CallStatus,
    DenialReason,
    Outcome,
    Phase,
    TurnState,
    ViolationRecord,
)
from trioloop.machine.steps import Handler, violate
from trioloop.machine.tables import CALL_STATUS_EDGES, INITIAL_CALL_STATUSES, PHASE_TRANSITIONS
from trioloop.machine.texts import (
    DENY_REASON_MAX,
)

__all__ = [
    "CALL_STATUS_EDGES",
    "DENY_REASON_MAX",
    "INITIAL_CALL_STATUSES",
    "PHASE_TRANSITIONS",
    "Advance",
    "ApproveBatch",
    "ApproveCall",
    "BeforeRequest",
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

_K = InputKind
#: One handler per input kind (`on_stream`, `on_commands`); each receives an input its phase admits.
_HANDLERS: Final[Mapping[InputKind, Handler]] = MappingProxyType(
    {
        _K.SUBMIT: on_submit,
        _K.MESSAGE_START: on_message_start,
        _K.TEXT_DELTA: on_text_delta,
        _K.THINKING_DELTA: on_informational,
        _K.THINKING_COMPLETE: on_block_complete,
        _K.PROVIDER_BLOCK_COMPLETE: on_block_complete,
        _K.TOOL_CALL_START: on_informational,
        _K.TOOL_CALL_INPUT_DELTA: on_informational,
        _K.TOOL_CALL_COMPLETE: on_tool_call_complete,
        _K.USAGE: on_usage,
        _K.MESSAGE_STOP: on_message_stop,
        _K.STREAM_ERROR: on_stream_error,
        _K.STREAM_NOTICE: on_stream_notice,
        _K.ABORTED: on_aborted,
        _K.APPROVE_CALL: on_approve_call,
        _K.APPROVE_BATCH: on_approve_batch,
        _K.DENY_CALL: on_deny_call,
        _K.START_CALL: on_start_call,
        _K.CALL_SETTLED: on_call_settled,
        _K.ADVANCE: on_advance,
        _K.RETRY: on_retry,
        _K.BEFORE_REQUEST: on_before_request,
        _K.CANCEL: on_cancel,
        _K.REVOKE: on_revoke,
        _K.UNDO_TURN: on_undo_turn,
        _K.CODE_VERDICT: on_code_verdict,
        _K.FORGET_RULE: on_forget_rule,
        _K.ANSWER_CHECK: on_answer_checked,
    }
)


#: Input types the reducer takes in without changing the state, in every phase but ``settled`` (where any
#: input is recorded as a violation): a runner may skip them while the turn is live.
NO_STATE_CHANGE: Final[frozenset[type]] = frozenset(
    input_type for input_type, kind in INPUT_TYPE_KINDS.items() if _HANDLERS[kind] is on_informational
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
            return violate(state, Violation.POST_SETTLEMENT_EVENT, None, f"dropped {kind.value} after the turn settled")
        return state
    result = _HANDLERS[kind](state, turn_input)
    if result.phase not in admitted:
        return state  # not reachable while the handlers agree with the table; the table wins
    return result
