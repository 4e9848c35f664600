"""The reducer's token and cost bounds: a request checked before it is sent, and a turn settled by a bound.

Before each request the runner says what it will ask (`BeforeRequest`: the preflight estimate of its input and
the output it reserves); a request that would pass a bound of the turn or of the session is not sent, and the
turn settles ``bounded`` with the figures in its notice. After a response its usage is already counted
(`on_usage`); a response that passed a bound ends the turn before its tool calls run (`on_message_stop`), and
`on_advance` checks again at every iteration boundary. Every comparison is `spend_overrun`'s.
"""

from __future__ import annotations

from trioloop.machine.inputs import BeforeRequest
from trioloop.machine.limits import Bound, Overrun, bound_notice, overrun_notice, spend_overrun
from trioloop.machine.state import Outcome, TurnState
from trioloop.machine.steps import settle
from trioloop.machine.texts import answer_bound_notice
from trioloop.protocol.events import StopReason

__all__ = ["bounded", "on_before_request", "overrun_after_response"]


def on_before_request(state: TurnState, cmd: BeforeRequest) -> TurnState:
    over = spend_overrun(
        state.usage,
        state.limits,
        state.spending,
        next_input_tokens=cmd.input_tokens,
        next_output_tokens=cmd.output_tokens,
    )
    return state if over is None else _settled_by(state, over)


def overrun_after_response(state: TurnState, stop_reason: StopReason) -> TurnState | None:
    """The turn settled by the bound its last response passed (its calls not run), or None if none was passed."""
    over = spend_overrun(state.usage, state.limits, state.spending)
    return None if over is None else _settled_by(state, over, stop_reason=stop_reason)


def bounded(state: TurnState, bound: Bound) -> TurnState:
    """The turn settled by ``bound`` (as `budget_exhaustion` named it), a token or cost bound with its figures."""
    if bound in (Bound.TOKENS, Bound.COST):
        over = spend_overrun(state.usage, state.limits, state.spending)
        if over is not None:
            return _settled_by(state, over)
    if bound is Bound.OUTPUT_RETRIES:  # a typed answer asked for too often: the notice names its last problem
        notice = answer_bound_notice(bound_notice(bound), state.output_error)
        return settle(state, Outcome.BOUNDED, bound=bound, notice=notice)
    return settle(state, Outcome.BOUNDED, bound=bound)


def _settled_by(state: TurnState, over: Overrun, *, stop_reason: StopReason | None = None) -> TurnState:
    return settle(state, Outcome.BOUNDED, bound=over.bound, notice=overrun_notice(over), stop_reason=stop_reason)
