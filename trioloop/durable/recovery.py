"""What a reopened live turn must do first, before anything runs: `recovery_inputs` settles a call that was
running as failed (never run again), revokes a call whose tool now prepares another digest, and asks a request
that was in flight again."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from trioloop.machine.inputs import CallSettled, Retry, Revoke, TurnInput
from trioloop.machine.state import CallStatus, Phase, TurnState
from trioloop.machine.tools import ToolOutcome
from trioloop.protocol.events import StreamError

__all__ = ["INTERRUPTED_CALL_TEXT", "recovery_inputs"]

#: What the model and the card read for a call that was running when its process died.
INTERRUPTED_CALL_TEXT: Final = (
    "Interrupted: the session stopped while this call was running. It may have run, partly or wholly, with "
    "effects outside the document; it was not run again and its result is unknown."
)


def recovery_inputs(live: TurnState, card_digests: Mapping[str, str], *, now_ms: int) -> list[TurnInput]:
    """What a reopened live turn takes first, before anything runs: each call that was ``running`` settles
    failed as interrupted (never run again); each undecided or approved call whose re-prepared digest is
    not the one its card showed is revoked; a turn that was waiting for the model asks again, as a retry."""
    inputs: list[TurnInput] = []
    for call in live.current_calls:
        if call.status is CallStatus.RUNNING:
            outcome: ToolOutcome[Any] = ToolOutcome.failure(INTERRUPTED_CALL_TEXT)
            inputs.append(CallSettled(call_id=call.id, outcome=outcome, now_ms=now_ms))
        elif call.status in (CallStatus.PENDING, CallStatus.APPROVED):
            shown = card_digests.get(call.id)
            if shown is not None and shown != call.input_digest:
                detail = (
                    f"the card showed digest {shown[:12]}, the tool now prepares {call.input_digest[:12] or 'nothing'}"
                )
                inputs.append(Revoke(call_id=call.id, detail=detail))
    interrupted = StreamError(code="transport", message="The session was interrupted while the model was answering.")
    if live.phase is Phase.REQUESTING and live.budget.retries_used < live.limits.max_retries_per_turn:
        # Counted as a retry while the budget allows; past it the request is still asked again (the turn
        # cannot go on otherwise), uncounted.
        inputs.append(Retry(now_ms=now_ms, failure=interrupted, wait_ms=0))
    elif live.phase is Phase.STREAMING:
        # Not written by a live session (a response is journaled whole, once it ended); a journal that ends
        # mid-response all the same ends its turn as failed rather than waiting on a stream that is gone.
        inputs.append(interrupted)
    return inputs
