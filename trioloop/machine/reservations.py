"""New ids a step's calls reserve, so a card names the id its call will really give what it adds.

A tool whose call creates something under a new id declares one `IdClaim` per id when it prepares the call: the
id its input names (``given``), or None, one to reserve in the namespace ``key`` that its `IdScheme` numbers. The
reducer, where it prepares the step's calls, gives each claim a `Reservation`: every claim of that namespace the
step made so far, in the order its calls came, this one last. That is a function of the turn state alone, so
replay makes the same reservations, and a person's decisions on the other cards never change them.

The id itself is the scheme's: `IdScheme.assign` counts from the document's ids (`IdScheme.base`) past every
earlier claim of the step, so the k-th add of a kind gets the k-th free id. The document it counts from is the
one the step's cards are made on: the step's `StepBase` keeps each scheme's base from the first document it is
asked about (a card's preview, or at the latest the start of the step's first change, see
`trioloop.machine.step_ids`) and never takes another. Once part of the step has changed the document, a base not
kept by then can no longer be taken (the reservation is ``sealed``), and the call says so rather than use an id
its card did not show.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final, Protocol, final

import attrs

__all__ = ["BASE_LOST_TEXT", "IdClaim", "IdRefused", "IdScheme", "Reservation", "StepBase"]

#: Why a sealed reservation whose step kept no base gets no id (the domain says what was not added).
BASE_LOST_TEXT: Final = (
    "the id its card showed can no longer be kept: part of the same response changed the document before that id "
    "was fixed (as when a session resumes in the middle of a response)"
)


@final
@attrs.frozen(kw_only=True)
class IdRefused:
    """Why a claim gets no id: text the model and the card read."""

    reason: str


class IdScheme(Protocol):
    """How a domain numbers the new ids its tools reserve (the threat model's comp-N, flow-N, threat-N...).

    Both methods are pure. A scheme is compared and hashed as it is (a module-level instance, as a rule).
    """

    def base(self, document: Any) -> Any:
        """What the step's reserved ids are counted from: ``document``'s ids, as the scheme needs them."""
        ...

    def assign(self, base: Any, claims: tuple[IdClaim, ...]) -> str | IdRefused:
        """The id the last of ``claims`` gets, after every claim before it, or why it gets none.

        ``claims`` are one namespace's claims of a step, in order; ``base`` is None when every one names its id.
        """
        ...


@final
@attrs.frozen(kw_only=True)
class IdClaim:
    """One new id a prepared call's run takes: the one its input names (``given``), or one reserved (None).

    ``key`` names the namespace (the kind of entity: "threat", "element"...) that ``scheme`` numbers.
    """

    scheme: IdScheme = attrs.field(repr=False)
    key: str
    given: str | None = None


_NOT_KEPT: Final = object()
_UNREADABLE: Final = object()


@final
class StepBase:
    """The base each scheme's ids count from in one step: kept from the first document it is asked about.

    The only value of the machine that changes once made, as a card's details are made on first read: what it
    keeps is a pure function of that first document, and the step's reservations all read the same one. A
    sealed reservation may read it but no longer keep one (`Reservation.resolve`).
    """

    __slots__ = ("_bases",)

    def __init__(self) -> None:
        self._bases: dict[IdScheme, Any] = {}

    def base(self, scheme: IdScheme, document: Any, *, may_keep: bool) -> Any:
        """The scheme's kept base, else (when ``may_keep``) the one ``document`` gives, kept from now on."""
        if scheme in self._bases:
            return self._bases[scheme]
        if not may_keep:
            return _NOT_KEPT
        try:
            base = scheme.base(document)
        except Exception:  # a scheme that cannot read this document keeps nothing; its calls say why
            return _UNREADABLE
        self._bases[scheme] = base
        return base

    def keep(self, schemes: Iterable[IdScheme], document: Any) -> None:
        """Keep each scheme's base from ``document`` unless one is kept already (the start of a step's change)."""
        for scheme in schemes:
            self.base(scheme, document, may_keep=True)

    def __repr__(self) -> str:
        return f"StepBase(kept={len(self._bases)})"


@final
@attrs.frozen(kw_only=True)
class Reservation:
    """The id one claim of a call gets in its step: ``claims`` are the step's claims of its namespace so far, in
    the order made, this one last; every reservation of the step shares one `StepBase`.

    ``sealed`` once part of the step changed the document: the base can then only be read, no longer kept.
    """

    claims: tuple[IdClaim, ...]
    step: StepBase = attrs.field(eq=False, repr=False)
    sealed: bool = False

    @property
    def claim(self) -> IdClaim:
        """This call's own claim."""
        return self.claims[-1]

    def resolve(self, document: Any) -> str | IdRefused:
        """The id this claim gets, counted from the step's base (kept from ``document`` if none is kept yet and
        the reservation is not sealed). Never raises."""
        scheme = self.claim.scheme
        base = None
        if any(claim.given is None for claim in self.claims):
            base = self.step.base(scheme, document, may_keep=not self.sealed)
            if base is _NOT_KEPT:
                return IdRefused(reason=BASE_LOST_TEXT)
            if base is _UNREADABLE:
                return IdRefused(reason="the ids of the document could not be read")
        try:
            assigned = scheme.assign(base, self.claims)
        except Exception as exc:  # a scheme's bug refuses the id; it never crashes a face or a run
            return IdRefused(reason=f"the id could not be assigned ({type(exc).__name__})")
        if isinstance(assigned, IdRefused) or type(assigned) is str:
            return assigned
        return IdRefused(reason="the id could not be assigned")

    def sealed_now(self) -> Reservation:
        """This reservation once part of its step changed the document."""
        return Reservation(claims=self.claims, step=self.step, sealed=True)
