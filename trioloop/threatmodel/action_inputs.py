"""The inputs of the twelve graph edits, as attrs classes that double as tool input schemas.

Each class is what one tool accepts; there is no `action` discriminator field, because the tool name
(and the class) already says which edit it is. Field constraints are declared with the same metadata
`trioloop.runtime.tools.tool_field` writes, so the JSON schema a model sees and the validation of
what it sends both come from here; this module only writes that metadata, so `document` does not
import the higher `loop` layer. In every `*Updates` class each field is optional and None means
"leave unchanged"; for optional text fields an empty string clears the field.
"""

from __future__ import annotations

from typing import Any, Final, Literal, TypeAlias

import attrs

__all__ = [
    "ID_MAX",
    "LIST_MAX",
    "NAME_MAX",
    "TEXT_MAX",
    "AddDataFlow",
    "AddElement",
    "AddThreat",
    "AddTrustBoundary",
    "DataFlowUpdates",
    "DeleteDataFlow",
    "DeleteElement",
    "DeleteThreat",
    "DeleteTrustBoundary",
    "ElementUpdates",
    "GraphAction",
    "MitigationInput",
    "MitigationStatusName",
    "NewDataFlow",
    "NewElement",
    "NewThreat",
    "NewTrustBoundary",
    "PositionInput",
    "SeverityName",
    "SizeInput",
    "StrideCategory",
    "ThreatUpdates",
    "TrustBoundaryUpdates",
    "UpdateDataFlow",
    "UpdateElement",
    "UpdateThreat",
    "UpdateTrustBoundary",
]

ID_MAX: Final = 200
NAME_MAX: Final = 200
KIND_MAX: Final = 100
TEXT_MAX: Final = 4000
LIST_MAX: Final = 100
COORD_MAX: Final = 1_000_000.0

StrideCategory: TypeAlias = Literal[
    "Spoofing",
    "Tampering",
    "Repudiation",
    "Information Disclosure",
    "Denial of Service",
    "Elevation of Privilege",
]
SeverityName: TypeAlias = Literal["critical", "high", "medium", "low", "info"]
MitigationStatusName: TypeAlias = Literal["not_started", "in_progress", "mitigated", "accepted", "transferred"]


def _field(
    *,
    default: Any = attrs.NOTHING,
    description: str | None = None,
    min_length: int | None = None,
    max_length: int | None = None,
    minimum: float | None = None,
    maximum: float | None = None,
    max_items: int | None = None,
) -> Any:
    """Same metadata as `tool_field`: the constraints appear in the schema and `prepare` enforces them."""
    rules = {
        "description": description,
        "minLength": min_length,
        "maxLength": max_length,
        "minimum": minimum,
        "maximum": maximum,
        "maxItems": max_items,
    }
    return attrs.field(default=default, metadata={"trioloop": {k: v for k, v in rules.items() if v is not None}})


def _id(description: str) -> Any:
    return _field(description=description, min_length=1, max_length=ID_MAX)


def _opt_id(description: str) -> Any:
    return _field(default=None, description=description, min_length=1, max_length=ID_MAX)


def _opt_ref(description: str) -> Any:
    # Empty string is allowed: in an update it clears the reference.
    return _field(default=None, description=description, max_length=ID_MAX)


def _name(description: str, *, optional: bool = False) -> Any:
    default = None if optional else attrs.NOTHING
    return _field(default=default, description=description, min_length=1, max_length=NAME_MAX)


def _kind(description: str, *, optional: bool = False) -> Any:
    default = None if optional else attrs.NOTHING
    return _field(default=default, description=description, min_length=1, max_length=KIND_MAX)


def _text(description: str, limit: int = TEXT_MAX) -> Any:
    return _field(default=None, description=description, max_length=limit)


def _list(description: str, *, optional: bool) -> Any:
    return _field(default=None if optional else (), description=description, max_items=LIST_MAX)


def _coord(description: str, minimum: float = -COORD_MAX) -> Any:
    return _field(description=description, minimum=minimum, maximum=COORD_MAX)


@attrs.frozen(kw_only=True)
class PositionInput:
    """Tool input: a position on the diagram (x, y); a field left out (null) is not written."""

    x: float = _coord("Horizontal canvas position.")
    y: float = _coord("Vertical canvas position.")


@attrs.frozen(kw_only=True)
class SizeInput:
    """Tool input: a size on the diagram (width, height); a field left out (null) is not written."""

    width: float = _coord("Width on the canvas.", minimum=0)
    height: float = _coord("Height on the canvas.", minimum=0)


@attrs.frozen(kw_only=True)
class MitigationInput:
    """Tool input: a threat's mitigation (status and description); a field left out (null) is not written."""

    status: MitigationStatusName = _field(description="Where the mitigation stands.")  # noqa: RUF009 -- an attrs field, not a default
    description: str = _field(description="What is or will be done.", max_length=TEXT_MAX)


# ---------------------------------------------------------------------------------------------
# Elements


@attrs.frozen(kw_only=True)
class NewElement:
    """Tool input: a new element; a field left out (null) is not written."""

    type: str = _kind("Kind of component, e.g. process, data_store, external_entity.")
    name: str = _name("Display name.")
    id: str | None = _opt_id("Optional id; omit it to get the next free comp-N id.")
    trust_zone: str | None = _text("Trust zone label, e.g. internet, dmz, internal.", NAME_MAX)
    subtype: str | None = _text("Finer kind, e.g. postgres.", KIND_MAX)
    icon: str | None = _text("Icon id.", KIND_MAX)
    description: str | None = _text("What the component does.")
    technologies: tuple[str, ...] = _list("Technologies used.", optional=False)
    layer: str | None = _opt_id("Id of an existing layer.")
    group: str | None = _opt_id("Id of an existing group.")
    position: PositionInput | None = None
    tags: tuple[str, ...] = _list("Free-form tags.", optional=False)
    stores: tuple[str, ...] = _list("Kinds of data a data store holds.", optional=False)
    encryption: str | None = _text("How stored data is encrypted.", NAME_MAX)


@attrs.frozen(kw_only=True)
class ElementUpdates:
    """Tool input: the fields of an element to change; a field left out (null) is not written."""

    type: str | None = _kind("New kind.", optional=True)
    name: str | None = _name("New display name.", optional=True)
    trust_zone: str | None = _text("New trust zone; empty string clears it.", NAME_MAX)
    subtype: str | None = _text("New subtype; empty string clears it.", KIND_MAX)
    icon: str | None = _text("New icon id; empty string clears it.", KIND_MAX)
    description: str | None = _text("New description; empty string clears it.")
    technologies: tuple[str, ...] | None = _list("Replaces the technologies list.", optional=True)
    layer: str | None = _opt_ref("Id of an existing layer; empty string clears it.")
    group: str | None = _opt_ref("Id of an existing group; empty string clears it.")
    position: PositionInput | None = None
    tags: tuple[str, ...] | None = _list("Replaces the tags.", optional=True)
    stores: tuple[str, ...] | None = _list("Replaces the stored data kinds.", optional=True)
    encryption: str | None = _text("New encryption note; empty string clears it.", NAME_MAX)


@attrs.frozen(kw_only=True)
class AddElement:
    """The input of the tool that adds a element (validated before any card is shown)."""

    element: NewElement


@attrs.frozen(kw_only=True)
class UpdateElement:
    """The input of the tool that updates a element (validated before any card is shown)."""

    id: str = _id("Id of the element to change, e.g. comp-3.")
    updates: ElementUpdates


@attrs.frozen(kw_only=True)
class DeleteElement:
    """The input of the tool that deletes a element (validated before any card is shown)."""

    id: str = _id("Id of the element to delete, e.g. comp-3.")


# ---------------------------------------------------------------------------------------------
# Data flows


@attrs.frozen(kw_only=True)
class NewDataFlow:
    """Tool input: a new data flow; a field left out (null) is not written."""

    source: str = _id("Id of the element the data leaves (the YAML 'from').")
    target: str = _id("Id of the element the data reaches (the YAML 'to').")
    id: str | None = _opt_id("Optional id; omit it to get the next free flow-N id.")
    name: str | None = _text("Short label, e.g. Checkout request.", NAME_MAX)
    protocol: str | None = _text("Protocol, e.g. HTTPS, gRPC.", KIND_MAX)
    data: tuple[str, ...] = _list("Data items carried.", optional=False)
    authenticated: bool = False
    encrypted: bool | None = None
    flow_number: int | None = _field(default=None, description="Sequence number; default is the next one.", minimum=1)


@attrs.frozen(kw_only=True)
class DataFlowUpdates:
    """Tool input: the fields of a data flow to change; a field left out (null) is not written."""

    source: str | None = _opt_id("New source element id.")
    target: str | None = _opt_id("New target element id.")
    name: str | None = _text("New label; empty string clears it.", NAME_MAX)
    protocol: str | None = _text("New protocol; empty string clears it.", KIND_MAX)
    data: tuple[str, ...] | None = _list("Replaces the data items.", optional=True)
    authenticated: bool | None = None
    encrypted: bool | None = None
    flow_number: int | None = _field(default=None, description="New sequence number.", minimum=1)


@attrs.frozen(kw_only=True)
class AddDataFlow:
    """The input of the tool that adds a data flow (validated before any card is shown)."""

    data_flow: NewDataFlow


@attrs.frozen(kw_only=True)
class UpdateDataFlow:
    """The input of the tool that updates a data flow (validated before any card is shown)."""

    id: str = _id("Id of the data flow to change, e.g. flow-2.")
    updates: DataFlowUpdates


@attrs.frozen(kw_only=True)
class DeleteDataFlow:
    """The input of the tool that deletes a data flow (validated before any card is shown)."""

    id: str = _id("Id of the data flow to delete, e.g. flow-2.")


# ---------------------------------------------------------------------------------------------
# Trust boundaries


@attrs.frozen(kw_only=True)
class NewTrustBoundary:
    """Tool input: a new trust boundary; a field left out (null) is not written."""

    name: str = _name("Display name, e.g. Corporate network.")
    id: str | None = _opt_id("Optional id; omit it to get the next free boundary-N id.")
    contains: tuple[str, ...] = _list("Ids of the elements inside.", optional=False)
    position: PositionInput | None = None
    size: SizeInput | None = None


@attrs.frozen(kw_only=True)
class TrustBoundaryUpdates:
    """Tool input: the fields of a trust boundary to change; a field left out (null) is not written."""

    name: str | None = _name("New display name.", optional=True)
    contains: tuple[str, ...] | None = _list("Replaces the member element ids.", optional=True)
    position: PositionInput | None = None
    size: SizeInput | None = None


@attrs.frozen(kw_only=True)
class AddTrustBoundary:
    """The input of the tool that adds a trust boundary (validated before any card is shown)."""

    trust_boundary: NewTrustBoundary


@attrs.frozen(kw_only=True)
class UpdateTrustBoundary:
    """The input of the tool that updates a trust boundary (validated before any card is shown)."""

    id: str = _id("Id of the trust boundary to change, e.g. boundary-1.")
    updates: TrustBoundaryUpdates


@attrs.frozen(kw_only=True)
class DeleteTrustBoundary:
    """The input of the tool that deletes a trust boundary (validated before any card is shown)."""

    id: str = _id("Id of the trust boundary to delete, e.g. boundary-1.")


# ---------------------------------------------------------------------------------------------
# Threats


@attrs.frozen(kw_only=True)
class NewThreat:
    """Tool input: a new threat; a field left out (null) is not written."""

    title: str = _name("Short title of the threat.")
    category: StrideCategory = _field(description="STRIDE category.")  # noqa: RUF009 -- an attrs field, not a default
    severity: SeverityName = _field(description="How bad it is.")  # noqa: RUF009 -- an attrs field, not a default
    id: str | None = _opt_id("Optional id; omit it to get the next free threat-N id.")
    element: str | None = _opt_id("Id of the targeted element (give element, flow or both).")
    flow: str | None = _opt_id("Id of the targeted data flow (give element, flow or both).")
    description: str | None = _text("What could happen and how.")
    mitigation: MitigationInput | None = None


@attrs.frozen(kw_only=True)
class ThreatUpdates:
    """Tool input: the fields of a threat to change; a field left out (null) is not written."""

    title: str | None = _name("New title.", optional=True)
    category: StrideCategory | None = None
    severity: SeverityName | None = None
    element: str | None = _opt_ref("New targeted element id; empty string clears it.")
    flow: str | None = _opt_ref("New targeted data flow id; empty string clears it.")
    description: str | None = _text("New description; empty string clears it.")
    mitigation: MitigationInput | None = None


@attrs.frozen(kw_only=True)
class AddThreat:
    """The input of the tool that adds a threat (validated before any card is shown)."""

    threat: NewThreat


@attrs.frozen(kw_only=True)
class UpdateThreat:
    """The input of the tool that updates a threat (validated before any card is shown)."""

    id: str = _id("Id of the threat to change, e.g. threat-4.")
    updates: ThreatUpdates


@attrs.frozen(kw_only=True)
class DeleteThreat:
    """The input of the tool that deletes a threat (validated before any card is shown)."""

    id: str = _id("Id of the threat to delete, e.g. threat-4.")


GraphAction: TypeAlias = (
    AddElement
    | UpdateElement
    | DeleteElement
    | AddDataFlow
    | UpdateDataFlow
    | DeleteDataFlow
    | AddTrustBoundary
    | UpdateTrustBoundary
    | DeleteTrustBoundary
    | AddThreat
    | UpdateThreat
    | DeleteThreat
)
