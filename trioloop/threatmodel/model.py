"""The in-memory threat model: frozen attrs values for a `.thf` document.

Every class is immutable (`attrs.frozen`, keyword-only, slotted); lists are tuples and keys this
module does not know are kept in `extra` so that load -> dump -> load loses nothing. Optional scalars
default to None. This module only describes shapes; parsing lives in `thf`, checks in `validation`.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import Any, Final

import attrs

__all__ = [
    "MITIGATION_STATUSES",
    "SECTION_NAMES",
    "SEVERITIES",
    "STRIDE_CATEGORIES",
    "SUPPORTED_VERSION",
    "DataFlow",
    "Diagram",
    "Element",
    "Group",
    "Layer",
    "Metadata",
    "Mitigation",
    "Position",
    "Relationship",
    "Size",
    "Threat",
    "ThreatModel",
    "TrustBoundary",
    "Viewport",
    "detached_copy",
]

SUPPORTED_VERSION: Final = "1.0"

#: The eight list sections of a document, in the order they are validated and written.
SECTION_NAMES: Final = (
    "elements",
    "data_flows",
    "trust_boundaries",
    "threats",
    "layers",
    "groups",
    "relationships",
    "diagrams",
)

STRIDE_CATEGORIES: Final = (
    "Spoofing",
    "Tampering",
    "Repudiation",
    "Information Disclosure",
    "Denial of Service",
    "Elevation of Privilege",
)

#: Lowercase severity levels. A threat stores its severity verbatim (e.g. "High"); compare lowercased.
SEVERITIES: Final = ("critical", "high", "medium", "low", "info")

MITIGATION_STATUSES: Final = ("not_started", "in_progress", "mitigated", "accepted", "transferred")


def _plain_copy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: _plain_copy(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain_copy(item) for item in value]
    return value


def _extra_converter(value: Mapping[str, Any] | None) -> dict[str, Any]:
    """Deep-copy `extra` into plain dicts and lists we own.

    The copy detaches the value from the caller's objects, and turning tuples into lists makes an
    in-memory value equal to what the same data reads back as from YAML.
    """
    return {} if value is None else {key: _plain_copy(item) for key, item in value.items()}


def _extra() -> Any:
    # extra is left out of hashing (a dict is unhashable) but kept in equality.
    return attrs.field(factory=dict, converter=_extra_converter, hash=False)


@attrs.frozen(kw_only=True)
class Position:
    """A canvas position."""

    x: float
    y: float


@attrs.frozen(kw_only=True)
class Size:
    """A canvas size."""

    width: float
    height: float


@attrs.frozen(kw_only=True)
class Viewport:
    """A diagram's saved pan and zoom."""

    x: float
    y: float
    zoom: float


@attrs.frozen(kw_only=True)
class Mitigation:
    """How a threat is being handled; `status` is normally one of MITIGATION_STATUSES."""

    status: str
    description: str
    extra: Mapping[str, Any] = _extra()


@attrs.frozen(kw_only=True)
class Metadata:
    """Document metadata. `threat_analysis_enabled` is tri-state: None means never set."""

    title: str | None = None
    author: str | None = None
    created: str | None = None
    modified: str | None = None
    description: str | None = None
    threat_analysis_enabled: bool | None = None
    extra: Mapping[str, Any] = _extra()


@attrs.frozen(kw_only=True)
class Element:
    """A component on the diagram (process, data store, external entity, ...)."""

    id: str
    type: str
    name: str
    trust_zone: str | None = None
    subtype: str | None = None
    icon: str | None = None
    description: str | None = None
    technologies: tuple[str, ...] = ()
    layer: str | None = None
    group: str | None = None
    position: Position | None = None
    tags: tuple[str, ...] = ()
    stores: tuple[str, ...] = ()
    encryption: str | None = None
    extra: Mapping[str, Any] = _extra()


@attrs.frozen(kw_only=True)
class DataFlow:
    """A directed flow of data between two elements (YAML keys `from` / `to`)."""

    id: str
    source: str
    target: str
    name: str | None = None
    protocol: str | None = None
    data: tuple[str, ...] = ()
    authenticated: bool = False
    encrypted: bool | None = None
    flow_number: int | None = None
    extra: Mapping[str, Any] = _extra()


@attrs.frozen(kw_only=True)
class TrustBoundary:
    """A named region; `contains` lists element ids."""

    id: str
    name: str
    contains: tuple[str, ...] = ()
    position: Position | None = None
    size: Size | None = None
    extra: Mapping[str, Any] = _extra()


@attrs.frozen(kw_only=True)
class Threat:
    """A threat against an element and/or a data flow; a valid threat targets at least one."""

    id: str
    title: str
    category: str
    severity: str
    element: str | None = None
    flow: str | None = None
    description: str | None = None
    mitigation: Mitigation | None = None
    extra: Mapping[str, Any] = _extra()


@attrs.frozen(kw_only=True)
class Layer:
    """An architectural layer elements can belong to."""

    id: str
    name: str
    description: str | None = None
    extra: Mapping[str, Any] = _extra()


@attrs.frozen(kw_only=True)
class Group:
    """A grouping of elements; groups nest through `parent` and must not form a cycle."""

    id: str
    name: str
    type: str | None = None
    parent: str | None = None
    description: str | None = None
    extra: Mapping[str, Any] = _extra()


@attrs.frozen(kw_only=True)
class Relationship:
    """A non-data relationship between two elements (YAML keys `from` / `to`)."""

    id: str
    type: str
    source: str
    target: str
    name: str | None = None
    description: str | None = None
    extra: Mapping[str, Any] = _extra()


@attrs.frozen(kw_only=True)
class Diagram:
    """A saved view of the model."""

    id: str
    name: str
    kind: str | None = None
    description: str | None = None
    viewport: Viewport | None = None
    extra: Mapping[str, Any] = _extra()


Entity = Element | DataFlow | TrustBoundary | Threat | Layer | Group | Relationship | Diagram


@attrs.frozen(kw_only=True)
class ThreatModel:
    """A whole `.thf` document. `extra` holds unknown top-level keys (including unknown sections)."""

    version: str = SUPPORTED_VERSION
    metadata: Metadata = attrs.field(factory=Metadata)
    elements: tuple[Element, ...] = ()
    data_flows: tuple[DataFlow, ...] = ()
    trust_boundaries: tuple[TrustBoundary, ...] = ()
    threats: tuple[Threat, ...] = ()
    layers: tuple[Layer, ...] = ()
    groups: tuple[Group, ...] = ()
    relationships: tuple[Relationship, ...] = ()
    diagrams: tuple[Diagram, ...] = ()
    extra: Mapping[str, Any] = _extra()

    def section(self, name: str) -> tuple[Entity, ...]:
        """The entities of section `name` (one of SECTION_NAMES); KeyError for any other name."""
        if name not in SECTION_NAMES:
            raise KeyError(name)
        result: tuple[Entity, ...] = getattr(self, name)
        return result

    def find(self, section: str, entity_id: str) -> Entity | None:
        """The first entity with `entity_id` in `section`, or None."""
        for entity in self.section(section):
            if entity.id == entity_id:
                return entity
        return None

    def ids(self, section: str) -> frozenset[str]:
        """All ids present in `section`."""
        return frozenset(entity.id for entity in self.section(section))


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def detached_copy(model: ThreatModel) -> ThreatModel:
    """An equal document that shares no object with ``model``.

    Frozen attrs stop ordinary assignment, but not ``object.__setattr__`` or a write into an ``extra``
    dict; a tool is handed a detached copy, so whatever it does to it can reach neither the live
    document nor the undo snapshot. Faster than ``copy.deepcopy`` because it knows the shapes.
    """
    copied: ThreatModel = _detached(model)
    return copied


#: Values that are immutable all the way down: a copy may share them.
_SCALARS: frozenset[type] = frozenset({str, int, float, bool, type(None)})


def _detached(value: Any) -> Any:
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is tuple:
        items = [_detached(item) for item in value]
        # A tuple whose items all came back as themselves holds nothing mutable: share it (fewer
        # objects to build, and to free when the tool is done with its copy).
        return value if all(map(operator.is_, items, value)) else tuple(items)
    if kind is list:
        return [_detached(item) for item in value]
    if kind is set:
        return {_detached(item) for item in value}
    if isinstance(value, Mapping):
        return {key: _detached(item) for key, item in value.items()}
    names = _FIELD_NAMES.get(kind)
    if names is None:
        if not attrs.has(kind):
            return value  # another immutable scalar (a YAML date, bytes): nothing to detach
        names = _FIELD_NAMES[kind] = tuple(field.name for field in attrs.fields(kind))
    fresh = object.__new__(kind)
    for name in names:
        item = getattr(value, name)
        object.__setattr__(fresh, name, item if type(item) in _SCALARS else _detached(item))
    return fresh
