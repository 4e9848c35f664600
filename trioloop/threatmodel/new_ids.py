"""The ids the four adds give what they add: `THREAT_MODEL_IDS`, the `IdScheme` of comp-N, flow-N, boundary-N and
threat-N, and `reserved_action`, an add carrying the id its reservation gives.

A new id is the next `<prefix>-N` after the highest trailing number in its section, skipping ids taken there or
in the sections that share its namespace (groups for elements and trust boundaries, relationships for data
flows). Several adds of one response each reserve their own (`trioloop.machine.reservations`): the k-th add of
a kind gets the k-th free id after the document's, its card names it, and its run adds exactly it, whatever the
person decides on the other cards and in whatever order they run. An id its card named that is taken by the
time the call runs fails the call, saying so, rather than become another.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, Final, TypeVar, final

import attrs

from trioloop.machine.reservations import IdClaim, IdRefused, Reservation
from trioloop.threatmodel.errors import quote
from trioloop.threatmodel.model import ThreatModel

__all__ = ["THREAT_MODEL_IDS", "ThreatModelIds", "claim_of", "highest_number", "reserved_action"]

A = TypeVar("A")

_TRAILING_NUMBER: Final = re.compile(r"-(\d{1,18})$")


def highest_number(ids: Iterable[str]) -> int:
    """The largest trailing ``-<digits>`` among ``ids`` (0 when none has one)."""
    highest = 0
    for entity_id in ids:
        match = _TRAILING_NUMBER.search(entity_id)
        if match:
            highest = max(highest, int(match.group(1)))
    return highest


@final
@attrs.frozen(kw_only=True)
class _Namespace:
    """Where one kind of add takes its id: its section, its prefix, and the sections whose ids it must avoid."""

    noun: str
    prefix: str
    section: str
    owners: tuple[tuple[str, str], ...]  # (section, how a message names one of its entities)


#: One namespace per add, keyed as the add's input names its entity (``AddThreat.threat``...).
_NAMESPACES: Final[Mapping[str, _Namespace]] = {
    "element": _Namespace(
        noun="element", prefix="comp", section="elements", owners=(("elements", "an element"), ("groups", "a group"))
    ),
    "data_flow": _Namespace(
        noun="data flow",
        prefix="flow",
        section="data_flows",
        owners=(("data_flows", "a data flow"), ("relationships", "a relationship")),
    ),
    "trust_boundary": _Namespace(
        noun="trust boundary",
        prefix="boundary",
        section="trust_boundaries",
        owners=(("trust_boundaries", "a trust boundary"), ("groups", "a group")),
    ),
    "threat": _Namespace(noun="threat", prefix="threat", section="threats", owners=(("threats", "a threat"),)),
}


@final
@attrs.frozen(kw_only=True)
class _Counted:
    """A namespace's ids in one document: the highest trailing number of its section, and every id to avoid."""

    highest: int
    taken: frozenset[str]


@final
class ThreatModelIds:
    """`IdScheme` of the threat model's adds: the next free `<prefix>-N` of each namespace, claim after claim."""

    def base(self, document: ThreatModel) -> Mapping[str, _Counted]:
        """Each namespace's highest number and taken ids in ``document``."""
        counted = {}
        for key, space in _NAMESPACES.items():
            taken = frozenset().union(*(document.ids(section) for section, _ in space.owners))
            counted[key] = _Counted(highest=highest_number(document.ids(space.section)), taken=taken)
        return counted

    def assign(self, base: Mapping[str, _Counted] | None, claims: tuple[IdClaim, ...]) -> str | IdRefused:
        """The id of the last claim: an id it names itself, unless an earlier claim took it; else the next free
        one after the base's and the earlier claims' ids."""
        space = _NAMESPACES[claims[-1].key]
        counted = None if base is None else base[claims[-1].key]
        earlier: set[str] = set()
        number = 0 if counted is None else counted.highest + 1
        assigned = ""
        for claim in claims:
            if claim.given is not None:
                if claim.given in earlier and claim is claims[-1]:
                    return IdRefused(reason=f"the id {quote(claim.given)} is already reserved by an earlier add")
                assigned = claim.given
            elif counted is not None:
                while f"{space.prefix}-{number}" in counted.taken or f"{space.prefix}-{number}" in earlier:
                    number += 1
                assigned = f"{space.prefix}-{number}"
            earlier.add(assigned)
        return assigned

    def __repr__(self) -> str:
        return "THREAT_MODEL_IDS"


#: The one scheme every add of the threat model claims its id in.
THREAT_MODEL_IDS: Final = ThreatModelIds()


def claim_of(key: str, action: Any) -> IdClaim:
    """The id an add (its entity under ``key``) takes: the one its input names, or one to reserve."""
    return IdClaim(scheme=THREAT_MODEL_IDS, key=key, given=getattr(action, key).id)


def _owner(document: ThreatModel, space: _Namespace, entity_id: str) -> str | None:
    for section, owner in space.owners:
        if entity_id in document.ids(section):
            return owner
    return None


def reserved_action(action: A, reservations: tuple[Reservation, ...], document: ThreatModel) -> A | str:
    """``action`` with the id its reservation gives on ``document`` (itself when it has none, a call prepared
    outside a turn, or names its id), or why nothing may be added: text for the model and the card."""
    if not reservations:
        return action
    reservation = reservations[0]
    key = reservation.claim.key
    space = _NAMESPACES[key]
    assigned = reservation.resolve(document)
    if isinstance(assigned, IdRefused):
        again = "without that id" if reservation.claim.given is not None else "to add it under a new id"
        return f"Cannot add {space.noun}: {assigned.reason}, so nothing was added. Call it again {again}."
    if reservation.claim.given is not None:
        return action  # the input names its id: the action checks it against the document
    owner = _owner(document, space, assigned)
    if owner is not None:
        return (
            f"Cannot add {space.noun}: the id {quote(assigned)} its card showed is now used by {owner} (the document "
            "changed after the card was made), so nothing was added. Read the document and call it again."
        )
    entity = getattr(action, key)
    return attrs.evolve(action, **{key: attrs.evolve(entity, id=assigned)})  # type: ignore[misc]
