"""The reducer's handlers for stream events: a response's text, its tool calls (each given its own id, checked
against its tool and the caps, prepared with the new ids it adds reserved, and put up for review or
auto-granted), its usage and its end.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from trioloop.machine.authorization import auto_grant_read_only
from trioloop.machine.calls import Violation
from trioloop.machine.grants import Denial
from trioloop.machine.ids import fresh_call_id
from trioloop.machine.limits import tool_call_cap
from trioloop.machine.on_answer import answer_call, answer_stop
from trioloop.machine.on_rules import READ_ONLY_POLICY, admit_call
from trioloop.machine.on_spend import overrun_after_response
from trioloop.machine.state import (
    CallRecord,
    CallStatus,
    DenialReason,
    Draft,
    Outcome,
    Phase,
    TurnState,
)
from trioloop.machine.step_ids import reserve_ids, step_calls
from trioloop.machine.steps import add_call, closing_draft, has_pending, settle, violate, with_notice
from trioloop.machine.texts import (
    DUPLICATE_NOTICE,
    LIMIT_NOTICE,
    LIMIT_TEXT,
    REPLAY_TEXT,
    duplicate_call_text,
    echo,
    invalid_input_text,
    unknown_tool_text,
    unreadable_input_notice,
    unreadable_input_text,
)
from trioloop.machine.tools import ClaimingCall, PreparedCall, PrepareFailure
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
from trioloop.protocol.messages import ToolCallBlock

__all__ = [
    "on_aborted",
    "on_block_complete",
    "on_informational",
    "on_message_start",
    "on_message_stop",
    "on_stream_error",
    "on_stream_notice",
    "on_text_delta",
    "on_tool_call_complete",
    "on_usage",
]


def on_message_start(state: TurnState, event: MessageStart) -> TurnState:
    if event.provider and event.provider != state.answered_by:
        model = event.model or state.response_model
        return state.evolved(phase=Phase.STREAMING, draft=Draft(), response_model=model, answered_by=event.provider)
    if event.model and event.model != state.response_model:
        return state.evolved(phase=Phase.STREAMING, draft=Draft(), response_model=event.model)
    return state.evolved(phase=Phase.STREAMING, draft=Draft())


def on_text_delta(state: TurnState, event: TextDelta) -> TurnState:
    if not event.text:
        return state
    draft = state.draft or Draft()
    return state.evolved(draft=draft.with_text(event.text))


def on_informational(state: TurnState, event: object) -> TurnState:
    return state


def on_block_complete(state: TurnState, event: ThinkingComplete | ProviderBlockComplete) -> TurnState:
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


def on_tool_call_complete(state: TurnState, event: ToolCallComplete) -> TurnState:
    """SPEC §2 and §11: duplicate id, unknown tool, caps, invalid input, sticky denial, then the rules (deny, ask,
    destructive, allow), the read-only policy, the card."""
    name = event.name
    call_id, duplicate = _call_identity(state, event.id)
    # The call's block joins the draft in the same state as its record (every path below adds one).
    draft = (state.draft or Draft()).with_call(ToolCallBlock(id=call_id, name=name, input=event.input))
    common: dict[str, Any] = {"id": call_id, "tool_name": name, "iteration": state.iteration}
    if duplicate:
        record = _failed_unprepared(common, duplicate_call_text(event.id))
        state = violate(
            add_call(state, record, draft=draft), Violation.DUPLICATE_CALL_ID, call_id, f"reused {echo(event.id)}"
        )
        return with_notice(state, DUPLICATE_NOTICE)
    answer = state.answer
    if answer is not None and name == answer.tool_name:  # the final tool: it runs nothing, its check decides
        return answer_call(state, answer, event, call_id, draft)

    tool = state.tool_set.get(name)
    if tool is None:
        record = _failed_unprepared(common, unknown_tool_text(name))
        return violate(add_call(state, record, draft=draft), Violation.UNKNOWN_TOOL, call_id, record.summary)

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
        state = violate(
            add_call(state, record, draft=draft), Violation.LIMIT_EXCEEDED, call_id, "tool-call limit reached"
        )
        return with_notice(state, LIMIT_NOTICE) if first else state

    if event.input_error is not None:
        record = _failed_unprepared(common, unreadable_input_text(name, event.input_error))
        return with_notice(add_call(state, record, draft=draft), unreadable_input_notice(name))
    prepared = tool.prepare(event.input)
    if type(prepared) is not PreparedCall:  # one test on the common path: refused, or adding under new ids
        if type(prepared) is ClaimingCall:
            # The new ids it adds are reserved now, after those of the step's earlier calls: its card names them.
            prepared = reserve_ids(step_calls(state), prepared)
        if isinstance(prepared, PrepareFailure):
            return add_call(state, _failed_unprepared(common, invalid_input_text(name, prepared)), draft=draft)

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
        state = add_call(state, record, draft=draft, budget=budget)
        return violate(state, Violation.DENIED_REPLAY, call_id, "identical action already declined")
    if state.rules.rules or state.code_verdict is not None:
        return admit_call(state, tool, common, prepared, event.id, draft=draft, budget=budget)
    if tool.effect == "read" and not tool.destructive:
        record = CallRecord(**common, status=CallStatus.APPROVED, decided_by=READ_ONLY_POLICY)
        grant = auto_grant_read_only(tool, record, state.iteration)
        return add_call(state, record, draft=draft, budget=budget, grants=(*state.grants, grant))
    return add_call(state, CallRecord(**common, status=CallStatus.PENDING), draft=draft, budget=budget)


def on_usage(state: TurnState, event: Usage) -> TurnState:
    return state.evolved(usage=usage_sum(state.usage_before_iteration, event))


_CALLS_FOLLOW: Final = frozenset({StopReason.TOOL_USE, StopReason.PAUSE_TURN})


def on_message_stop(state: TurnState, event: MessageStop) -> TurnState:
    reason = event.stop_reason
    answer = state.answer
    if answer is not None:
        state, done = answer_stop(state, answer, event)
        if done:
            return state
        if state.current_call_count and reason not in _CALLS_FOLLOW:
            reason = StopReason.TOOL_USE  # a server that says "stop" after the calls a required tool choice forced
    if state.current_call_count and reason in _CALLS_FOLLOW:
        over = overrun_after_response(state, reason)  # a response past a token or cost bound: its calls never run
        if over is not None:
            return over
        phase = Phase.AWAITING_APPROVAL if has_pending(state) else Phase.EXECUTING
    elif reason is StopReason.PAUSE_TURN and state.draft is not None and state.draft.message is not None:
        # The server paused its own tools' long turn: the response goes back as it is and the model
        # continues, as the next iteration (an iteration with no call of ours, which the bounds count).
        phase = Phase.EXECUTING
    else:
        # Any other stop, or a tool_use stop with no call: the model is done (a quirk must not loop).
        return settle(state, Outcome.COMPLETED, stop_reason=reason)  # settle closes the draft in its one copy
    closing = closing_draft(state)  # closed in the same copy that moves the phase
    if closing is None:
        return state.evolved(phase=phase, stop_reason=reason)
    return state.evolved(phase=phase, draft=closing[0], closed_messages=closing[1], stop_reason=reason)


def on_stream_error(state: TurnState, event: StreamError) -> TurnState:
    return settle(state, Outcome.FAILED, error=event)


def on_stream_notice(state: TurnState, event: StreamError) -> TurnState:
    return with_notice(state, event.message)


def on_aborted(state: TurnState, event: object) -> TurnState:
    return settle(state, Outcome.CANCELLED)
