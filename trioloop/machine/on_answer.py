"""The reducer's handlers for a typed answer (`trioloop.machine.answers`): each call of the final tool, the end
of a response that gave (or did not give) the answer, and the request that asks for it again.

Rules, in order:
- A call of the final tool runs nothing and is never reviewed: its check (`AnswerChecked`, fed just before it)
  decides it. An invalid one fails with every problem named by its path (the model reads them next iteration);
  a valid one is held (approved) until its response ends.
- A response whose only calls are the final tool's, one of them valid, completes the turn at once: the first
  valid call gives ``output`` (later ones are told they were not taken), and no further request is made.
- A valid final call beside calls of other tools is not taken: those calls are reviewed and run as always, and
  the model answers again once it has their results (an answer must not predate what it reports). This asks
  nothing again of the answer's shape, so it is no output retry; the turn's other bounds still apply.
- A response with final calls that all failed their checks, or a reply with no call at all (a server that ignores
  the tool choice), is an output retry: the next request carries the problems (or, after a text reply, a
  one-line reminder to call the final tool). One more than ``max_output_retries`` settles the turn bounded at
  the iteration's end, naming the last problem, with no output.
"""

from __future__ import annotations

from typing import Any

from trioloop.machine.answers import AnswerChecked, AnswerSpec
from trioloop.machine.calls import CallTable
from trioloop.machine.canonical import input_digest
from trioloop.machine.state import CallRecord, CallStatus, Draft, Outcome, Phase, TurnState
from trioloop.machine.steps import add_call, closing_draft, moved_along, settle
from trioloop.machine.texts import (
    ANSWER_TAKEN_TEXT,
    answer_not_alone_text,
    answer_nudge_text,
    extra_answer_text,
    invalid_answer_text,
    unchecked_answer_text,
    unreadable_input_text,
)
from trioloop.machine.tools import PrepareFailure
from trioloop.protocol.events import MessageStop, StopReason, ToolCallComplete
from trioloop.protocol.messages import Message, ToolCallBlock

__all__ = ["answer_call", "answer_nudge_message", "answer_stop", "on_answer_checked"]

_ANSWER_SUMMARY = "Final answer"


def on_answer_checked(state: TurnState, check: AnswerChecked) -> TurnState:
    """Hold the check for the final call it was made for (ignored in a turn that asks for no typed answer)."""
    if state.answer is None or check.tool_name != state.answer.tool_name:
        return state
    return state.evolved(answer_check=check)


def answer_call(state: TurnState, spec: AnswerSpec, event: ToolCallComplete, call_id: str, draft: Draft) -> TurnState:
    """A call of the final tool, known as ``call_id``: held approved when its check found it valid, failed with
    what the model must fix otherwise. Either way it runs nothing."""
    name = event.name
    check = state.answer_check
    common: dict[str, Any] = {
        "id": call_id,
        "tool_name": name,
        "iteration": state.iteration,
        "effect": "read",
        "destructive": False,
    }
    problem: str | None
    if event.input_error is not None:
        problem = unreadable_input_text(name, event.input_error)
    elif check is None or check.call_id != event.id or check.tool_name != name:
        problem = unchecked_answer_text(name)
    elif check.issues:
        problem = invalid_answer_text(name, PrepareFailure(issues=check.issues))
    else:
        problem = None
    if problem is not None:
        failed = CallRecord(
            **common, input_digest="", summary=problem, status=CallStatus.FAILED, result=problem, is_error=True
        )
        return add_call(state, failed, draft=draft, answer_check=None, output_error=problem)
    held = CallRecord(
        **common, input_digest=input_digest(event.input), summary=_ANSWER_SUMMARY, status=CallStatus.APPROVED
    )
    return add_call(state, held, draft=draft, answer_check=None)


def _call_input(draft: Draft | None, call_id: str) -> Any:
    if draft is None:
        return None
    for block in draft.blocks:
        if type(block) is ToolCallBlock and block.id == call_id:
            return block.input
    return None


def _replaced(state: TurnState, records: list[CallRecord]) -> CallTable:
    changes = tuple((p, r) for r in records if (p := state.calls.position(r.id)) is not None)
    return state.calls.replaced(changes)


def answer_stop(state: TurnState, spec: AnswerSpec, event: MessageStop) -> tuple[TurnState, bool]:
    """The response ended: the turn completed with its answer (True), or the state with the response's final calls
    decided and any output retry counted, for `on_message_stop` to go on with (False)."""
    calls = state.current_calls
    finals = [c for c in calls if c.tool_name == spec.tool_name]
    held = [c for c in finals if c.status is CallStatus.APPROVED]
    alone = len(finals) == len(calls)
    if held and alone:
        taken, extra = held[0], extra_answer_text(spec.tool_name)
        output = spec.output_of(_call_input(state.draft, taken.id))
        moved = [moved_along(taken, CallStatus.SUCCEEDED, result=ANSWER_TAKEN_TEXT)]
        moved += [moved_along(c, CallStatus.FAILED, result=extra, is_error=True) for c in held[1:]]
        state = state.evolved(calls=_replaced(state, moved), output=output, output_call=taken.id, output_error="")
        return settle(state, Outcome.COMPLETED, stop_reason=event.stop_reason), True
    if held:  # beside calls of other tools: not taken, and no output retry (see the module docstring)
        text = answer_not_alone_text(spec.tool_name)
        moved = [moved_along(c, CallStatus.FAILED, result=text, is_error=True) for c in held]
        return state.evolved(calls=_replaced(state, moved)), False
    if finals:  # every answer failed its checks: asked for again, its problems in the call results
        return state.evolved(budget=state.budget.spent(output_retries=1)), False
    if calls or event.stop_reason is StopReason.PAUSE_TURN:
        return state, False  # other tools at work, or a server's paused turn: not an answer yet
    # A reply with no call: the answer is asked for again, as the next iteration.
    closing = closing_draft(state)
    changes_now: dict[str, Any] = {}
    if closing is not None:
        changes_now = {"draft": closing[0], "closed_messages": closing[1]}
    return state.evolved(
        phase=Phase.EXECUTING,
        stop_reason=event.stop_reason,
        budget=state.budget.spent(output_retries=1),
        answer_nudge=True,
        output_error=answer_nudge_text(spec.tool_name),
        **changes_now,
    ), True


def answer_nudge_message(state: TurnState) -> Message | None:
    """The reminder the next request ends with after a reply that gave no answer, or None."""
    if not state.answer_nudge or state.answer is None:
        return None
    return Message.user(answer_nudge_text(state.answer.tool_name))
