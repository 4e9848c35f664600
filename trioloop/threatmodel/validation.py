"""Semantic checks on a ThreatModel: unique ids, references that resolve, acyclic group nesting.

The checks run in SPEC §8 order and the first failure wins, so a given document always reports the
same error. `load_thf` runs them after its shape gate; `validate_threat_model` runs the version and
shape gates on an in-memory model too, so a model it accepts is one `dump_thf` writes and `load_thf`
reads back equal.
"""

from __future__ import annotations

from collections.abc import Iterable

from trioloop.threatmodel.errors import (
    CircularGroupNesting,
    DuplicateId,
    InvalidReference,
    InvalidShape,
    ThfError,
    UnsupportedVersion,
    quote,
)
from trioloop.threatmodel.model import SECTION_NAMES, SUPPORTED_VERSION, Group, ThreatModel
from trioloop.threatmodel.thf_shape import model_from_data, model_to_data

__all__ = ["check_semantics", "validate_threat_model"]


def validate_threat_model(model: ThreatModel) -> ThfError | None:
    """The first rule `model` breaks, or None when it is valid. Never raises."""
    try:
        if not isinstance(model, ThreatModel):
            return InvalidShape(f"expected a ThreatModel, got {type(model).__name__}")
        if model.version != SUPPORTED_VERSION:
            shown = quote(model.version) if isinstance(model.version, str) else "a value that is not text"
            return UnsupportedVersion(f'version {shown} is not supported; the supported version is "1.0"')
        model_from_data(model_to_data(model, strict=True))
        check_semantics(model)
    except ThfError as error:
        return error
    except Exception:  # a hostile in-memory value (e.g. a list that contains itself) must not escape
        return InvalidShape("the model holds a value that cannot be written to a .thf file")
    return None


def check_semantics(model: ThreatModel) -> None:
    """Raise the first DuplicateId, InvalidReference or CircularGroupNesting in `model`."""
    for name in SECTION_NAMES:
        _check_unique(name, (entity.id for entity in model.section(name)))

    element_ids = model.ids("elements")
    boundary_ids = model.ids("trust_boundaries")
    flow_ids = model.ids("data_flows")
    layer_ids = model.ids("layers")
    group_ids = model.ids("groups")

    for group in model.groups:
        if group.id in element_ids:
            raise DuplicateId(f"groups[{quote(group.id)}]: the id is already used by an element")
        if group.id in boundary_ids:
            raise DuplicateId(f"groups[{quote(group.id)}]: the id is already used by a trust boundary")
    for relationship in model.relationships:
        if relationship.id in flow_ids:
            raise DuplicateId(f"relationships[{quote(relationship.id)}]: the id is already used by a data flow")

    for flow in model.data_flows:
        _check_ref("data_flows", flow.id, "from", flow.source, element_ids, "element")
        _check_ref("data_flows", flow.id, "to", flow.target, element_ids, "element")
    for element in model.elements:
        _check_ref("elements", element.id, "layer", element.layer, layer_ids, "layer")
        _check_ref("elements", element.id, "group", element.group, group_ids, "group")
    for group in model.groups:
        _check_ref("groups", group.id, "parent", group.parent, group_ids, "group")
    for relationship in model.relationships:
        _check_ref("relationships", relationship.id, "from", relationship.source, element_ids, "element")
        _check_ref("relationships", relationship.id, "to", relationship.target, element_ids, "element")
    for boundary in model.trust_boundaries:
        for member in boundary.contains:
            _check_ref("trust_boundaries", boundary.id, "contains", member, element_ids, "element")
    for threat in model.threats:
        if threat.element is None and threat.flow is None:
            raise InvalidReference(f"threats[{quote(threat.id)}]: a threat must target an element or a data flow")
        _check_ref("threats", threat.id, "element", threat.element, element_ids, "element")
        _check_ref("threats", threat.id, "flow", threat.flow, flow_ids, "data flow")

    _check_group_nesting(model.groups)


def _check_unique(section: str, ids: Iterable[str]) -> None:
    seen: set[str] = set()
    for entity_id in ids:
        if entity_id in seen:
            raise DuplicateId(f"{section}: the id {quote(entity_id)} is used more than once")
        seen.add(entity_id)


def _check_ref(section: str, owner: str, field: str, ref: str | None, valid: frozenset[str], noun: str) -> None:
    if ref is not None and ref not in valid:
        raise InvalidReference(f"{section}[{quote(owner)}].{field}: no {noun} with id {quote(ref)}")


def _check_group_nesting(groups: tuple[Group, ...]) -> None:
    """Walk each parent chain once (parents are known to exist); report the group that closes a loop."""
    parent_of = {group.id: group.parent for group in groups}
    settled: set[str] = set()
    for group in groups:
        if group.parent == group.id:
            raise CircularGroupNesting(f"groups[{quote(group.id)}]: a group cannot be its own parent")
        path: list[str] = []
        on_path: set[str] = set()
        current: str | None = group.id
        while current is not None and current not in settled:
            if current in on_path:
                raise CircularGroupNesting(f"groups[{quote(current)}]: its parent chain leads back to itself")
            path.append(current)
            on_path.add(current)
            current = parent_of.get(current)
        settled.update(path)
