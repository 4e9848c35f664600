"""Grants: the only thing that lets a tool call run, and the only code that makes or checks one.

A grant binds one call id, tool name, input digest and iteration, and is spent by one start. It is
made only by `grant_for_call` / `grant_for_batch` (a user's click), `auto_grant_read_only` (the
read-only policy) or `grant_by_policy` (a rule's or a ``needs_approval`` function's allow, never for a
destructive call); nothing here reads message text, tool results or document content, so no bytes
from a model or a document have a path to a grant. `authorize_start` is the one gate to `running`.
The values themselves sit below the state that holds them (`Grant` and `Denial` in `grants`, `Violation` in
`calls`) and are named here too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trioloop.machine.calls import CallRecord, CallStatus, Violation
from trioloop.machine.grants import Denial, Grant
from trioloop.machine.rules import DeciderKind, Verdict

if TYPE_CHECKING:
    from trioloop.machine.state import TurnState
    from trioloop.machine.tools import RegisteredTool

__all__ = [
    "Denial",
    "Grant",
    "Violation",
    "authorize_start",
    "auto_grant_read_only",
    "grant_by_policy",
    "grant_for_batch",
    "grant_for_call",
]


def grant_for_call(state: TurnState, call_id: str) -> Grant | None:
    """A grant for one pending, prepared call of the current iteration, or None.

    A single approval may grant a destructive call: the user saw that one call.
    """
    call = state.call(call_id)
    if call is None or call.status is not CallStatus.PENDING or call.prepared is None:
        return None
    if call.iteration != state.iteration or state.tool_set.get(call.tool_name) is None:
        return None
    return Grant(
        call_id=call.id,
        tool_name=call.tool_name,
        input_digest=call.input_digest,
        iteration=state.iteration,
    )


def grant_for_batch(state: TurnState, call_ids: tuple[str, ...]) -> tuple[Grant, ...]:
    """Grants for the listed calls that are pending and not destructive, in the order they were emitted.

    ``call_ids`` must be the explicit tuple captured when the user clicked: a predicate or a live
    collection would also approve calls that arrived after the click, so anything else is refused.
    """
    if type(call_ids) is not tuple:
        raise TypeError(f"grant_for_batch needs a tuple of call ids, got {type(call_ids).__name__}")
    if not all(type(call_id) is str for call_id in call_ids):
        raise TypeError("grant_for_batch needs a tuple of str call ids")
    listed = frozenset(call_ids)
    grants = []
    for call in state.calls:
        if call.id in listed and not call.destructive:
            grant = grant_for_call(state, call.id)
            if grant is not None:
                grants.append(grant)
    return tuple(grants)


def auto_grant_read_only(tool: RegisteredTool[Any], call: CallRecord, iteration: int) -> Grant:
    """The read-only policy's grant; raises ValueError for a mutating or destructive tool."""
    if tool.effect != "read":
        raise ValueError(f'auto_grant_read_only refuses the mutating tool "{tool.name}".')
    if tool.destructive:
        raise ValueError(f'auto_grant_read_only refuses the destructive tool "{tool.name}".')
    if call.tool_name != tool.name:
        raise ValueError(f'auto_grant_read_only: call "{call.id}" is not a call of "{tool.name}".')
    return Grant(call_id=call.id, tool_name=tool.name, input_digest=call.input_digest, iteration=iteration)


def grant_by_policy(tool: RegisteredTool[Any], call: CallRecord, iteration: int) -> Grant:
    """The grant of a call no person reviewed: the read-only policy's, or a rule's or a ``needs_approval``
    function's allow (``call.decided_by``). Raises ValueError for a destructive call, whoever allowed it, for a
    mutating call the read-only policy named, and for a call nothing allowed."""
    decider = call.decided_by
    if decider is None or decider.verdict is not Verdict.ALLOW or decider.kind is DeciderKind.PERSON:
        raise ValueError(f'grant_by_policy: nothing allowed call "{call.id}".')
    if decider.kind is DeciderKind.READ_ONLY_POLICY:
        return auto_grant_read_only(tool, call, iteration)
    if tool.destructive or call.destructive:
        raise ValueError(f'grant_by_policy refuses the destructive tool "{tool.name}": it gets its own card.')
    if call.tool_name != tool.name:
        raise ValueError(f'grant_by_policy: call "{call.id}" is not a call of "{tool.name}".')
    return Grant(call_id=call.id, tool_name=tool.name, input_digest=call.input_digest, iteration=iteration)


def authorize_start(state: TurnState, call_id: str) -> Grant | Violation:
    """The grant that lets ``call_id`` start now, or the first reason it may not. Never mutates.

    Order: call exists, tool in the turn's tool set, no sticky denial, grant exists, grant matches
    the call's tool and input (and the prepared run is the one the digest names), grant and call
    belong to the current iteration, grant unspent and call still approved.
    """
    call = state.call(call_id)
    if call is None:
        return Violation.NO_GRANT
    if state.tool_set.get(call.tool_name) is None:
        return Violation.UNKNOWN_TOOL
    if state.denials and Denial(tool_name=call.tool_name, input_digest=call.input_digest) in state.denials:
        return Violation.DENIED_REPLAY
    grant = next((g for g in state.grants if g.call_id == call.id), None)
    if grant is None:
        return Violation.NO_GRANT
    if (
        grant.tool_name != call.tool_name
        or grant.input_digest != call.input_digest
        or call.prepared is None
        or call.prepared.input_digest != call.input_digest
    ):
        return Violation.DIGEST_MISMATCH
    if grant.iteration != state.iteration or call.iteration != state.iteration:
        return Violation.FOREIGN_ITERATION
    if grant.consumed or call.status is not CallStatus.APPROVED:
        return Violation.GRANT_ALREADY_CONSUMED
    return grant
