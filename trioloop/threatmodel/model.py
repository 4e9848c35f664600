"""The in-memory threat model: frozen attrs values for a `.thf` document.

Every class is immutable all the way down (`attrs.frozen`, keyword-only, and sealed: even
``object.__setattr__`` raises); lists are tuples and keys this module does not know are kept in
`extra`, a FrozenDict, so that load -> dump -> load loses nothing and a tool can share the document. Optional scalars
default to None. This module only describes shapes; parsing lives in `thf`, checks in `validation`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, NoReturn, final

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
    "FrozenDict",
    "FrozenList",
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


@final
class FrozenDict(dict[str, Any]):
    """A read-only ``dict``: what `extra` holds at every level, so a document is immutable all the way down.

    It is a ``dict`` (equal to a plain dict with the same items, written by YAML and JSON as a mapping),
    but every mutating method raises ``TypeError``. Nested mappings are FrozenDicts and sequences
    FrozenLists, so a value built in memory equals the same data read back from a file (and plain data).
    """

    __slots__ = ()

    def _refuse(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError("a document's extra data is read-only; build a new value instead")

    __setitem__ = __delitem__ = __ior__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(frozenset(self.items()))

    def __copy__(self) -> FrozenDict:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> FrozenDict:
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenDict, (dict(self),))

    def __repr__(self) -> str:
        return f"FrozenDict({dict.__repr__(self)})"


@final
class FrozenList(list[Any]):
    """A read-only ``list``, for the sequences inside `extra`: equal to a plain list, refusing every change."""

    __slots__ = ()

    def _refuse(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError("a document's extra data is read-only; build a new value instead")

    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse
    append = clear = extend = insert = pop = remove = reverse = sort = _refuse

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(self))

    def __copy__(self) -> FrozenList:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> FrozenList:
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenList, (list(self),))

    def __repr__(self) -> str:
        return f"FrozenList({list.__repr__(self)})"


_EMPTY: Final = FrozenDict()


def _frozen(value: Any) -> Any:
    kind = type(value)
    if kind in _SCALARS or kind is FrozenDict or kind is FrozenList:
        return value
    if isinstance(value, Mapping):
        return FrozenDict({key: _frozen(item) for key, item in value.items()})
    if isinstance(value, list | tuple):
        return FrozenList([_frozen(item) for item in value])
    if isinstance(value, set | frozenset):
        return frozenset(value)  # not data a .thf file holds (validation refuses it), but not writable either
    return value  # another value (a YAML date, bytes): not data a .thf file holds; validation refuses it


def _extra_converter(value: Mapping[str, Any] | None) -> FrozenDict:
    """`extra` as a FrozenDict of frozen values, detached from the caller's objects (shared when already frozen)."""
    if value is None or (not value and isinstance(value, Mapping)):
        return _EMPTY
    frozen: FrozenDict = _frozen(value)
    return frozen


def _extra() -> Any:
    # extra is left out of hashing (kept out as when it was a plain dict) but kept in equality.
    return attrs.field(factory=FrozenDict, converter=_extra_converter, hash=False)


def _tuple() -> Any:
    # A list given for a sequence field becomes a tuple: no section or list of text can be appended to.
    return attrs.field(default=(), converter=tuple)


@final
class _Sealed:
    """Set on each model class for each field: ``object.__setattr__`` and ``object.__delattr__`` raise.

    The model classes keep their values in the instance ``__dict__`` (attrs writes it directly in
    ``__init__``); a data descriptor with no ``__get__`` leaves reads to that dict at full speed and
    turns the one write a frozen attrs class does not stop, ``object.__setattr__``, into an error.
    """

    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __set__(self, instance: object, value: object) -> NoReturn:
        raise attrs.exceptions.FrozenInstanceError()

    def __delete__(self, instance: object) -> NoReturn:
        raise attrs.exceptions.FrozenInstanceError()


@attrs.frozen(kw_only=True, slots=False)
class Position:
    """A canvas position."""

    x: float
    y: float


@attrs.frozen(kw_only=True, slots=False)
class Size:
    """A canvas size."""

    width: float
    height: float


@attrs.frozen(kw_only=True, slots=False)
class Viewport:
    """A diagram's saved pan and zoom."""

    x: float
    y: float
    zoom: float


@attrs.frozen(kw_only=True, slots=False)
class Mitigation:
    """How a threat is being handled; `status` is normally one of MITIGATION_STATUSES."""

    status: str
    description: str
    extra: Mapping[str, Any] = _extra()


@attrs.frozen(kw_only=True, slots=False)
class Metadata:
    """Document metadata. `threat_analysis_enabled` is tri-state: None means never set."""

    title: str | None = None
    author: str | None = None
    created: str | None = None
    modified: str | None = None
    description: str | None = None
    threat_analysis_enabled: bool | None = None
    extra: Mapping[str, Any] = _extra()


@attrs.frozen(kw_only=True, slots=False)
class Element:
    """A component on the diagram (process, data store, external entity, ...)."""

    id: str
    type: str
    name: str
    trust_zone: str | None = None
    subtype: str | None = None
    icon: str | None = None
    description: str | None = None
    technologies: tuple[str, ...] = _tuple()
    layer: str | None = None
    group: str | None = None
    position: Position | None = None
    tags: tuple[str, ...] = _tuple()
    stores: tuple[str, ...] = _tuple()
    encryption: str | None = None
    extra: Mapping[str, Any] = _extra()


@attrs.frozen(kw_only=True, slots=False)
class DataFlow:
    """A directed flow of data between two elements (YAML keys `from` / `to`)."""

    id: str
    source: str
    target: str
    name: str | None = None
    protocol: str | None = None
    data: tuple[str, ...] = _tuple()
    authenticated: bool = False
    encrypted: bool | None = None
    flow_number: int | None = None
    extra: Mapping[str, Any] = _extra()


@attrs.frozen(kw_only=True, slots=False)
class TrustBoundary:
    """A named region; `contains` lists element ids."""

    id: str
    name: str
    contains: tuple[str, ...] = _tuple()
    position: Position | None = None
    size: Size | None = None
    extra: Mapping[str, Any] = _extra()


@attrs.frozen(kw_only=True, slots=False)
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


@attrs.frozen(kw_only=True, slots=False)
class Layer:
    """An architectural layer elements can belong to."""

    id: str
    name: str
    description: str | None = None
    extra: Mapping[str, Any] = _extra()


@attrs.frozen(kw_only=True, slots=False)
class Group:
    """A grouping of elements; groups nest through `parent` and must not form a cycle."""

    id: str
    name: str
    type: str | None = None
    parent: str | None = None
    description: str | None = None
    extra: Mapping[str, Any] = _extra()


@attrs.frozen(kw_only=True, slots=False)
class Relationship:
    """A non-data relationship between two elements (YAML keys `from` / `to`)."""

    id: str
    type: str
    source: str
    target: str
    name: str | None = None
    description: str | None = None
    extra: Mapping[str, Any] = _extra()


@attrs.frozen(kw_only=True, slots=False)
class Diagram:
    """A saved view of the model."""

    id: str
    name: str
    kind: str | None = None
    description: str | None = None
    viewport: Viewport | None = None
    extra: Mapping[str, Any] = _extra()


Entity = Element | DataFlow | TrustBoundary | Threat | Layer | Group | Relationship | Diagram


@attrs.frozen(kw_only=True, slots=False)
class ThreatModel:
    """A whole `.thf` document. `extra` holds unknown top-level keys (including unknown sections)."""

    version: str = SUPPORTED_VERSION
    metadata: Metadata = attrs.field(factory=Metadata)
    elements: tuple[Element, ...] = _tuple()
    data_flows: tuple[DataFlow, ...] = _tuple()
    trust_boundaries: tuple[TrustBoundary, ...] = _tuple()
    threats: tuple[Threat, ...] = _tuple()
    layers: tuple[Layer, ...] = _tuple()
    groups: tuple[Group, ...] = _tuple()
    relationships: tuple[Relationship, ...] = _tuple()
    diagrams: tuple[Diagram, ...] = _tuple()
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


_MODEL_CLASSES: Final[tuple[type, ...]] = (
    Position,
    Size,
    Viewport,
    Mitigation,
    Metadata,
    Element,
    DataFlow,
    TrustBoundary,
    Threat,
    Layer,
    Group,
    Relationship,
    Diagram,
    ThreatModel,
)
for _cls in _MODEL_CLASSES:
    for _field in attrs.fields(_cls):
        setattr(_cls, _field.name, _Sealed(_field.name))

#: Values that are immutable all the way down.
_SCALARS: frozenset[type] = frozenset({str, int, float, bool, type(None)})


def detached_copy(model: ThreatModel) -> ThreatModel:
    """A document equal to ``model`` that nothing a tool does to it can change: ``model`` itself.

    The document is deeply immutable: every class refuses ``object.__setattr__``, every sequence is a
    tuple and every ``extra`` a FrozenDict of frozen values (FrozenDicts, FrozenLists, scalars), so a
    tool can share the live snapshot (no copy to make or free) and a write into it raises instead of
    leaking into the live document or the undo history. What no Python object can stop
    (``vars(entity)[...] = ...``, ``dict.__setitem__`` on a FrozenDict, ctypes) is deliberate
    sabotage, not a tool's mistake.
    """
    return model
