"""The turn's transition tables, as data: which inputs each phase admits and where they may lead,
and which call-status edges exist.

`reduce_turn` consults both: an input a phase does not list is dropped before any handler runs, a
handler result whose phase the table does not list is discarded, and a call status changes only
along an edge listed here. Tests walk every phase against every input kind and every status pair.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from trioloop.machine.inputs import InputKind
from trioloop.machine.state import CallStatus, Phase

__all__ = ["CALL_STATUS_EDGES", "INITIAL_CALL_STATUSES", "PHASE_TRANSITIONS"]

_P = Phase
_K = InputKind

_SETTLE: Final = frozenset({_P.SETTLED})


def _stay(phase: Phase) -> frozenset[Phase]:
    return frozenset({phase})


def _live(phase: Phase, extra: Mapping[InputKind, frozenset[Phase]]) -> Mapping[InputKind, frozenset[Phase]]:
    """Rows every live phase shares: usage is recorded, a stop or abort settles, and a start or
    settle report that cannot apply is recorded as a violation without leaving the phase."""
    shared = {
        _K.USAGE: _stay(phase),
        _K.ABORTED: _SETTLE,
        _K.CANCEL: _SETTLE,
        _K.START_CALL: _stay(phase),
        _K.CALL_SETTLED: _stay(phase),
        _K.FORGET_RULE: _stay(phase),
    }
    return MappingProxyType({**shared, **extra})


PHASE_TRANSITIONS: Final[Mapping[Phase, Mapping[InputKind, frozenset[Phase]]]] = MappingProxyType(
    {
        _P.IDLE: MappingProxyType({_K.SUBMIT: frozenset({_P.REQUESTING})}),
        _P.REQUESTING: _live(
            _P.REQUESTING,
            {
                _K.MESSAGE_START: frozenset({_P.STREAMING}),
                _K.STREAM_ERROR: _SETTLE,
                _K.STREAM_NOTICE: _stay(_P.REQUESTING),
                _K.RETRY: _stay(_P.REQUESTING),
                _K.BEFORE_REQUEST: frozenset({_P.REQUESTING, _P.SETTLED}),
            },
        ),
        _P.STREAMING: _live(
            _P.STREAMING,
            {
                _K.TEXT_DELTA: _stay(_P.STREAMING),
                _K.THINKING_DELTA: _stay(_P.STREAMING),
                _K.THINKING_COMPLETE: _stay(_P.STREAMING),
                _K.PROVIDER_BLOCK_COMPLETE: _stay(_P.STREAMING),
                _K.TOOL_CALL_START: _stay(_P.STREAMING),
                _K.TOOL_CALL_INPUT_DELTA: _stay(_P.STREAMING),
                _K.TOOL_CALL_COMPLETE: _stay(_P.STREAMING),
                _K.CODE_VERDICT: _stay(_P.STREAMING),
                _K.ANSWER_CHECK: _stay(_P.STREAMING),
                _K.MESSAGE_STOP: frozenset({_P.AWAITING_APPROVAL, _P.EXECUTING, _P.SETTLED}),
                _K.STREAM_ERROR: _SETTLE,
                _K.STREAM_NOTICE: _stay(_P.STREAMING),
            },
        ),
        _P.AWAITING_APPROVAL: _live(
            _P.AWAITING_APPROVAL,
            {
                _K.APPROVE_CALL: frozenset({_P.AWAITING_APPROVAL, _P.EXECUTING}),
                _K.APPROVE_BATCH: frozenset({_P.AWAITING_APPROVAL, _P.EXECUTING}),
                _K.DENY_CALL: frozenset({_P.AWAITING_APPROVAL, _P.EXECUTING}),
                _K.REVOKE: frozenset({_P.AWAITING_APPROVAL, _P.EXECUTING}),
            },
        ),
        _P.EXECUTING: _live(
            _P.EXECUTING,
            {
                _K.APPROVE_CALL: _stay(_P.EXECUTING),
                _K.APPROVE_BATCH: _stay(_P.EXECUTING),
                _K.DENY_CALL: _stay(_P.EXECUTING),
                _K.REVOKE: _stay(_P.EXECUTING),
                _K.ADVANCE: frozenset({_P.EXECUTING, _P.REQUESTING, _P.SETTLED}),
            },
        ),
        # Settled is terminal: only UndoTurn is admitted; the reducer records every other input as a
        # post_settlement_event violation.
        _P.SETTLED: MappingProxyType({_K.UNDO_TURN: _stay(_P.SETTLED)}),
    }
)

_S = CallStatus

#: The statuses a call record may be created with (by `ToolCallComplete`).
INITIAL_CALL_STATUSES: Final = frozenset({_S.PENDING, _S.APPROVED, _S.FAILED, _S.DENIED})

#: Status -> the statuses it may move to. Terminal statuses move nowhere except succeeded -> undone.
CALL_STATUS_EDGES: Final[Mapping[CallStatus, frozenset[CallStatus]]] = MappingProxyType(
    {
        # approved by the user; declined, or not run at settle. (A start is refused while any call of
        # the iteration is pending, so a pending call never fails a start.)
        # (A revoked call -- its tool changed before it ran -- fails from pending or approved.)
        _S.PENDING: frozenset({_S.APPROVED, _S.DENIED, _S.FAILED}),
        # (A typed answer's final call, held approved while its response streams, succeeds without running
        # when the response ends with it alone: it changes nothing; with other calls beside it, it fails.)
        _S.APPROVED: frozenset({_S.RUNNING, _S.SUCCEEDED, _S.DENIED, _S.FAILED}),
        # settled by the runner; at a cancel its value is discarded and it is marked not run.
        _S.RUNNING: frozenset({_S.SUCCEEDED, _S.FAILED, _S.DENIED}),
        _S.SUCCEEDED: frozenset({_S.UNDONE}),
        _S.FAILED: frozenset(),
        _S.DENIED: frozenset(),
        _S.UNDONE: frozenset(),
    }
)
