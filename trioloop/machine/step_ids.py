"""The reducer's part in reserved ids (`trioloop.machine.reservations`): it reserves a call's ids where it prepares
the call, keeps the step's bases when the step's first change starts, and seals the step's reservations once
part of it changed the document.

Each is a function of the turn state alone, so replay does the same. A step that claims no id pays nothing here
but a scan of its own calls when one of its changes starts or commits (a read pays a test of its effect).
A face that shows a person's edit before it is approved binds it the same way as the reducer will:
``reserve_ids(step_calls(state), prepared, call.prepared.reservations)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import partial
from typing import Any, Final

import attrs

from trioloop.machine.calls import CallRecord, CallStatus
from trioloop.machine.reservations import IdClaim, IdScheme, Reservation, StepBase
from trioloop.machine.state import TurnState
from trioloop.machine.tools import InvokeFn, PreparedCall, PrepareFailure, RunFn, ToolOutcome

__all__ = ["keeping_bases", "reserve_ids", "seal_reservations", "step_calls"]

_NOT_BOUND: Final = PrepareFailure(issues=("the tool could not reserve the ids this call adds",))


def step_calls(state: TurnState) -> Sequence[CallRecord]:
    """The calls of the current step (the model's current response), in the order they came."""
    return state.calls[state.iteration_first_call :]


def reserve_ids(
    calls: Iterable[CallRecord], prepared: PreparedCall[Any], keep: tuple[Reservation, ...] = ()
) -> PreparedCall[Any] | PrepareFailure:
    """``prepared`` bound to one reservation per claim, after the claims of ``calls`` (the step's calls so far).

    Each claim of a namespace comes after the longest run of that namespace's claims the step holds (so a claim
    made by an edit comes after every other). ``keep`` holds the reservations of the call an edit prepares again:
    a claim equal to one of them (same namespace, same named id or none) keeps that reservation, so the edited
    call keeps its id.
    """
    if not prepared.claims:
        return prepared
    bind = prepared.with_ids
    if bind is None:
        return _NOT_BOUND
    latest: dict[tuple[IdScheme, str], tuple[IdClaim, ...]] = {}
    step: StepBase | None = None
    for call in calls:
        if call.prepared is None:
            continue
        for reservation in call.prepared.reservations:
            claim = reservation.claim
            namespace = (claim.scheme, claim.key)
            if len(reservation.claims) > len(latest.get(namespace, ())):
                latest[namespace] = reservation.claims
            step = reservation.step
    step = StepBase() if step is None else step
    kept = list(keep)
    made: list[Reservation] = []
    for claim in prepared.claims:
        same = next((r for r in kept if r.claim == claim), None)
        if same is not None:
            kept.remove(same)
            made.append(same)
            continue
        namespace = (claim.scheme, claim.key)
        claims = (*latest.get(namespace, ()), claim)
        latest[namespace] = claims
        made.append(Reservation(claims=claims, step=step))
    reservations = tuple(made)
    try:
        bound = bind(reservations)
    except Exception:  # a tool's bind must not crash the reducer
        return _NOT_BOUND
    if (
        not isinstance(bound, PreparedCall)
        or bound.input_digest != prepared.input_digest
        or bound.reservations != reservations
    ):
        return _NOT_BOUND  # the grant must bind exactly the input and the ids the card shows
    return bound


def keeping_bases(calls: Iterable[CallRecord], call: CallRecord) -> CallRecord:
    """``call`` (a change that starts now) whose run first keeps every base of the step from the document it
    starts on, when the step reserved ids and none of its calls changed the document yet.

    A face keeps the bases when it shows the step's first card; this keeps them in a session no face looks at,
    before anything of the step changes the document, so every reserved id still counts from the same one.
    """
    prepared = call.prepared
    if prepared is None:
        return call
    schemes: list[IdScheme] = []
    step: StepBase | None = None
    for other in calls:
        if other.changed_document:
            return call  # too late: a base not kept yet is not the one the cards counted from
        if other.prepared is None:
            continue
        for reservation in other.prepared.reservations:
            step = reservation.step
            if reservation.claim.scheme not in schemes:
                schemes.append(reservation.claim.scheme)
    if step is None:
        return call
    keep = partial(step.keep, tuple(schemes))
    invoke = prepared.invoke
    keeping = attrs.evolve(
        prepared,
        run=partial(_keeping_run, keep, prepared.run),
        invoke=None if invoke is None else partial(_keeping_invoke, keep, invoke),
    )
    return call.with_prepared(keeping)


def _document_of(ctx: Any) -> Any:
    return ctx.document


async def _keeping_run(keep: Any, run: RunFn[Any], ctx: Any) -> ToolOutcome[Any]:
    keep(_document_of(ctx))
    return await run(ctx)


def _keeping_invoke(keep: Any, invoke: InvokeFn[Any], ctx: Any) -> Any:
    keep(_document_of(ctx))
    return invoke(ctx)


def seal_reservations(state: TurnState) -> TurnState:
    """``state`` with every reservation of the step's calls still to run sealed: part of the step just changed
    the document, so a base not kept by now can no longer be kept."""
    first = state.iteration_first_call
    changes: list[tuple[int, CallRecord]] = []
    for position, call in enumerate(state.calls[first:], first):
        prepared = call.prepared
        if prepared is None or call.status not in _TO_RUN:
            continue
        reservations = prepared.reservations
        if not reservations or reservations[0].sealed:  # a call's reservations are sealed together
            continue
        bind = prepared.with_ids
        sealed = tuple(reservation.sealed_now() for reservation in reservations)
        try:
            bound = None if bind is None else bind(sealed)
        except Exception:
            bound = None
        if not isinstance(bound, PreparedCall) or bound.input_digest != prepared.input_digest:
            continue  # reserve_ids bound it once; a bind that fails now leaves the call as it was
        changes.append((position, call.with_prepared(bound)))
    if not changes:
        return state
    return state.evolved(calls=state.calls.replaced(changes))


_TO_RUN: Final = frozenset({CallStatus.PENDING, CallStatus.APPROVED})
