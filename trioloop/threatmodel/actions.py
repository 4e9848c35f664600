"""The twelve graph edits as pure functions from (model, action) to a new model or a failure.

An edit never mutates its input and, applied to a valid model, either fails with a message that says
what was missing (so a model can correct its next call) or returns a model that validates: deletes
cascade to everything that would otherwise dangle. New ids are deterministic: the next `comp-N`,
`flow-N`, `boundary-N` or `threat-N` after the highest trailing number already used in that section,
skipping any id that would collide. (Several adds of one response each get the id their card reserved:
`trioloop.threatmodel.new_ids`.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Final, TypeVar

import attrs

from trioloop.threatmodel.action_inputs import (
    AddDataFlow,
    AddElement,
    AddThreat,
    AddTrustBoundary,
    DeleteDataFlow,
    DeleteElement,
    DeleteThreat,
    DeleteTrustBoundary,
    GraphAction,
    MitigationInput,
    PositionInput,
    SizeInput,
    UpdateDataFlow,
    UpdateElement,
    UpdateThreat,
    UpdateTrustBoundary,
)
from trioloop.threatmodel.errors import quote
from trioloop.threatmodel.model import (
    DataFlow,
    Element,
    Mitigation,
    Position,
    Size,
    Threat,
    ThreatModel,
    TrustBoundary,
)
from trioloop.threatmodel.new_ids import highest_number

__all__ = ["ActionFailure", "AppliedAction", "apply_action", "apply_action_with_report", "next_id"]

E = TypeVar("E", Element, DataFlow, TrustBoundary, Threat)


@attrs.frozen(kw_only=True)
class ActionFailure:
    """An edit that could not be applied; `message` says what was missing or wrong, in one line."""

    message: str


@attrs.frozen(kw_only=True)
class AppliedAction:
    """A successful edit: the new model and a one-line report of what changed."""

    model: ThreatModel
    report: str


def apply_action(model: ThreatModel, action: GraphAction) -> ThreatModel | ActionFailure:
    """Apply one graph edit; the input model is never changed."""
    result = apply_action_with_report(model, action)
    return result.model if isinstance(result, AppliedAction) else result


def apply_action_with_report(model: ThreatModel, action: GraphAction) -> AppliedAction | ActionFailure:
    """Like `apply_action`, also saying what changed (the new id, what a delete took with it)."""
    handler = _HANDLERS.get(type(action))
    if handler is None:
        return ActionFailure(message=f"unknown action type {type(action).__name__}")
    return handler(model, action)


def next_id(prefix: str, section_ids: Iterable[str], taken: Iterable[str] = ()) -> str:
    """`<prefix>-N` for N one past the largest trailing `-<digits>` in `section_ids`, avoiding `taken`."""
    ids = set(section_ids)
    avoid = ids | set(taken)
    number = highest_number(ids) + 1
    while f"{prefix}-{number}" in avoid:
        number += 1
    return f"{prefix}-{number}"


# ---------------------------------------------------------------------------------------------
# Shared pieces


def _fail(verb: str, noun: str, reason: str) -> ActionFailure:
    return ActionFailure(message=f"Cannot {verb} {noun}: {reason}.")


def _missing(noun: str, entity_id: str) -> str:
    return f"no {noun} with id {quote(entity_id)}"


def _index(entities: tuple[E, ...], entity_id: str) -> int | None:
    for index, entity in enumerate(entities):
        if entity.id == entity_id:
            return index
    return None


def _replace_at(entities: tuple[E, ...], index: int, new: E) -> tuple[E, ...]:
    items = list(entities)
    items[index] = new
    return tuple(items)


def _clearable(value: str | None) -> str | None:
    """An update's optional text: None is handled by the caller, "" clears the field."""
    return value or None


def _position(value: PositionInput) -> Position:
    return Position(x=float(value.x), y=float(value.y))


def _size(value: SizeInput) -> Size:
    return Size(width=float(value.width), height=float(value.height))


def _mitigation(value: MitigationInput, previous: Mitigation | None) -> Mitigation:
    extra = previous.extra if previous is not None else {}
    return Mitigation(status=value.status, description=value.description, extra=extra)


def _changes(updates: Any, convert: dict[str, Callable[[Any], Any]]) -> dict[str, Any]:
    """The fields an `*Updates` value sets, converted to model values."""
    changes: dict[str, Any] = {}
    for field in attrs.fields(type(updates)):
        value = getattr(updates, field.name)
        if value is not None:
            changes[field.name] = convert.get(field.name, lambda v: v)(value)
    return changes


def _plural(count: int, noun: str, plural: str | None = None) -> str:
    return f"{count} {noun if count == 1 else plural or noun + 's'}"


def _check_new_id(noun: str, new_id: str, owners: Iterable[tuple[str, frozenset[str]]]) -> ActionFailure | None:
    for owner, ids in owners:
        if new_id in ids:
            return _fail("add", noun, f"the id {quote(new_id)} is already used by {owner}")
    return None


# ---------------------------------------------------------------------------------------------
# Elements


def _element_refs(model: ThreatModel, verb: str, layer: str | None, group: str | None) -> ActionFailure | None:
    if layer is not None and layer not in model.ids("layers"):
        return _fail(verb, "element", _missing("layer", layer))
    if group is not None and group not in model.ids("groups"):
        return _fail(verb, "element", _missing("group", group))
    return None


def _add_element(model: ThreatModel, action: AddElement) -> AppliedAction | ActionFailure:
    new = action.element
    element_ids = model.ids("elements")
    group_ids = model.ids("groups")
    if new.id is not None:
        failure = _check_new_id("element", new.id, (("an element", element_ids), ("a group", group_ids)))
        if failure is not None:
            return failure
    failure = _element_refs(model, "add", new.layer, new.group)
    if failure is not None:
        return failure
    element_id = new.id if new.id is not None else next_id("comp", element_ids, group_ids)
    element = Element(
        id=element_id,
        type=new.type,
        name=new.name,
        trust_zone=new.trust_zone,
        subtype=new.subtype,
        icon=new.icon,
        description=new.description,
        technologies=tuple(new.technologies),
        layer=new.layer,
        group=new.group,
        position=_position(new.position) if new.position is not None else None,
        tags=tuple(new.tags),
        stores=tuple(new.stores),
        encryption=new.encryption,
    )
    report = f"Added element {quote(new.name)} ({quote(new.type)}) with id {quote(element_id)}."
    return AppliedAction(model=attrs.evolve(model, elements=(*model.elements, element)), report=report)


_ELEMENT_CONVERT: Final[dict[str, Callable[[Any], Any]]] = {
    **{name: _clearable for name in ("trust_zone", "subtype", "icon", "description", "layer", "group", "encryption")},
    "position": _position,
    **{name: tuple for name in ("technologies", "tags", "stores")},
}


def _update_element(model: ThreatModel, action: UpdateElement) -> AppliedAction | ActionFailure:
    index = _index(model.elements, action.id)
    if index is None:
        return _fail("update", "element", _missing("element", action.id))
    changes = _changes(action.updates, _ELEMENT_CONVERT)
    if not changes:
        return _fail("update", "element", "updates sets no field")
    element = attrs.evolve(model.elements[index], **changes)
    failure = _element_refs(model, "update", element.layer, element.group)
    if failure is not None:
        return failure
    report = f"Updated element {quote(action.id)}: {', '.join(changes)}."
    return AppliedAction(model=attrs.evolve(model, elements=_replace_at(model.elements, index, element)), report=report)


def _delete_element(model: ThreatModel, action: DeleteElement) -> AppliedAction | ActionFailure:
    gone = action.id
    if _index(model.elements, gone) is None:
        return _fail("delete", "element", _missing("element", gone))
    flows = tuple(f for f in model.data_flows if gone not in (f.source, f.target))
    removed_flows = model.ids("data_flows") - {f.id for f in flows}
    threats = tuple(t for t in model.threats if t.element != gone and t.flow not in removed_flows)
    relationships = tuple(r for r in model.relationships if gone not in (r.source, r.target))
    boundaries = []
    memberships = 0
    for boundary in model.trust_boundaries:
        if gone in boundary.contains:
            memberships += 1
            boundary = attrs.evolve(boundary, contains=tuple(m for m in boundary.contains if m != gone))
        boundaries.append(boundary)
    new_model = attrs.evolve(
        model,
        elements=tuple(e for e in model.elements if e.id != gone),
        data_flows=flows,
        threats=threats,
        relationships=relationships,
        trust_boundaries=tuple(boundaries),
    )
    parts = [
        _plural(len(model.data_flows) - len(flows), "data flow"),
        _plural(len(model.threats) - len(threats), "threat"),
        _plural(len(model.relationships) - len(relationships), "relationship"),
    ]
    report = (
        f"Deleted element {quote(gone)} with {', '.join(parts)}; "
        f"removed it from {_plural(memberships, 'trust boundary', 'trust boundaries')}."
    )
    return AppliedAction(model=new_model, report=report)


# ---------------------------------------------------------------------------------------------
# Data flows


def _endpoints(model: ThreatModel, verb: str, source: str, target: str) -> ActionFailure | None:
    element_ids = model.ids("elements")
    missing = [end for end in dict.fromkeys((source, target)) if end not in element_ids]
    if not missing:
        return None
    shown = " and ".join(quote(end) for end in missing)
    verb_form = "does" if len(missing) == 1 else "do"
    noun = "endpoint" if len(missing) == 1 else "endpoints"
    return _fail(verb, "data flow", f"{noun} {shown} {verb_form} not exist (no element with that id)")


def _add_data_flow(model: ThreatModel, action: AddDataFlow) -> AppliedAction | ActionFailure:
    new = action.data_flow
    flow_ids = model.ids("data_flows")
    relationship_ids = model.ids("relationships")
    if new.id is not None:
        failure = _check_new_id("data flow", new.id, (("a data flow", flow_ids), ("a relationship", relationship_ids)))
        if failure is not None:
            return failure
    failure = _endpoints(model, "add", new.source, new.target)
    if failure is not None:
        return failure
    flow_id = new.id if new.id is not None else next_id("flow", flow_ids, relationship_ids)
    number = new.flow_number
    if number is None:
        number = max((f.flow_number or 0 for f in model.data_flows), default=0) + 1
    flow = DataFlow(
        id=flow_id,
        source=new.source,
        target=new.target,
        name=new.name,
        protocol=new.protocol,
        data=tuple(new.data),
        authenticated=new.authenticated,
        encrypted=new.encrypted,
        flow_number=number,
    )
    report = f"Added data flow {quote(flow_id)} from {quote(new.source)} to {quote(new.target)}."
    return AppliedAction(model=attrs.evolve(model, data_flows=(*model.data_flows, flow)), report=report)


_FLOW_CONVERT: Final[dict[str, Callable[[Any], Any]]] = {"name": _clearable, "protocol": _clearable, "data": tuple}


def _update_data_flow(model: ThreatModel, action: UpdateDataFlow) -> AppliedAction | ActionFailure:
    index = _index(model.data_flows, action.id)
    if index is None:
        return _fail("update", "data flow", _missing("data flow", action.id))
    changes = _changes(action.updates, _FLOW_CONVERT)
    if not changes:
        return _fail("update", "data flow", "updates sets no field")
    flow = attrs.evolve(model.data_flows[index], **changes)
    failure = _endpoints(model, "update", flow.source, flow.target)
    if failure is not None:
        return failure
    report = f"Updated data flow {quote(action.id)}: {', '.join(changes)}."
    return AppliedAction(
        model=attrs.evolve(model, data_flows=_replace_at(model.data_flows, index, flow)), report=report
    )


def _delete_data_flow(model: ThreatModel, action: DeleteDataFlow) -> AppliedAction | ActionFailure:
    if _index(model.data_flows, action.id) is None:
        return _fail("delete", "data flow", _missing("data flow", action.id))
    threats = tuple(t for t in model.threats if t.flow != action.id)
    new_model = attrs.evolve(model, data_flows=tuple(f for f in model.data_flows if f.id != action.id), threats=threats)
    removed = _plural(len(model.threats) - len(threats), "threat")
    return AppliedAction(model=new_model, report=f"Deleted data flow {quote(action.id)} with {removed}.")


# ---------------------------------------------------------------------------------------------
# Trust boundaries


def _members(model: ThreatModel, verb: str, contains: Iterable[str]) -> tuple[str, ...] | ActionFailure:
    element_ids = model.ids("elements")
    members = tuple(dict.fromkeys(contains))
    for member in members:
        if member not in element_ids:
            return _fail(
                verb, "trust boundary", f"contains lists {quote(member)}, but there is no element with that id"
            )
    return members


def _add_trust_boundary(model: ThreatModel, action: AddTrustBoundary) -> AppliedAction | ActionFailure:
    new = action.trust_boundary
    boundary_ids = model.ids("trust_boundaries")
    group_ids = model.ids("groups")
    if new.id is not None:
        failure = _check_new_id("trust boundary", new.id, (("a trust boundary", boundary_ids), ("a group", group_ids)))
        if failure is not None:
            return failure
    members = _members(model, "add", new.contains)
    if isinstance(members, ActionFailure):
        return members
    boundary_id = new.id if new.id is not None else next_id("boundary", boundary_ids, group_ids)
    boundary = TrustBoundary(
        id=boundary_id,
        name=new.name,
        contains=members,
        position=_position(new.position) if new.position is not None else None,
        size=_size(new.size) if new.size is not None else None,
    )
    report = (
        f"Added trust boundary {quote(new.name)} with id {quote(boundary_id)} and {_plural(len(members), 'member')}."
    )
    new_model = attrs.evolve(model, trust_boundaries=(*model.trust_boundaries, boundary))
    return AppliedAction(model=new_model, report=report)


def _update_trust_boundary(model: ThreatModel, action: UpdateTrustBoundary) -> AppliedAction | ActionFailure:
    index = _index(model.trust_boundaries, action.id)
    if index is None:
        return _fail("update", "trust boundary", _missing("trust boundary", action.id))
    changes = _changes(action.updates, {"position": _position, "size": _size})
    if not changes:
        return _fail("update", "trust boundary", "updates sets no field")
    if "contains" in changes:
        members = _members(model, "update", changes["contains"])
        if isinstance(members, ActionFailure):
            return members
        changes["contains"] = members
    boundary = attrs.evolve(model.trust_boundaries[index], **changes)
    new_model = attrs.evolve(model, trust_boundaries=_replace_at(model.trust_boundaries, index, boundary))
    return AppliedAction(model=new_model, report=f"Updated trust boundary {quote(action.id)}: {', '.join(changes)}.")


def _delete_trust_boundary(model: ThreatModel, action: DeleteTrustBoundary) -> AppliedAction | ActionFailure:
    if _index(model.trust_boundaries, action.id) is None:
        return _fail("delete", "trust boundary", _missing("trust boundary", action.id))
    boundaries = tuple(b for b in model.trust_boundaries if b.id != action.id)
    return AppliedAction(
        model=attrs.evolve(model, trust_boundaries=boundaries), report=f"Deleted trust boundary {quote(action.id)}."
    )


# ---------------------------------------------------------------------------------------------
# Threats


def _threat_targets(model: ThreatModel, verb: str, element: str | None, flow: str | None) -> ActionFailure | None:
    if element is None and flow is None:
        return _fail(verb, "threat", "a threat must target an element or a data flow (give element, flow or both)")
    if element is not None and element not in model.ids("elements"):
        return _fail(verb, "threat", _missing("element", element))
    if flow is not None and flow not in model.ids("data_flows"):
        return _fail(verb, "threat", _missing("data flow", flow))
    return None


def _add_threat(model: ThreatModel, action: AddThreat) -> AppliedAction | ActionFailure:
    new = action.threat
    threat_ids = model.ids("threats")
    if new.id is not None:
        failure = _check_new_id("threat", new.id, (("a threat", threat_ids),))
        if failure is not None:
            return failure
    failure = _threat_targets(model, "add", new.element, new.flow)
    if failure is not None:
        return failure
    threat_id = new.id if new.id is not None else next_id("threat", threat_ids)
    threat = Threat(
        id=threat_id,
        title=new.title,
        category=new.category,
        severity=new.severity,
        element=new.element,
        flow=new.flow,
        description=new.description,
        mitigation=_mitigation(new.mitigation, None) if new.mitigation is not None else None,
    )
    report = f"Added threat {quote(new.title)} ({new.category}, {new.severity}) with id {quote(threat_id)}."
    return AppliedAction(model=attrs.evolve(model, threats=(*model.threats, threat)), report=report)


def _update_threat(model: ThreatModel, action: UpdateThreat) -> AppliedAction | ActionFailure:
    index = _index(model.threats, action.id)
    if index is None:
        return _fail("update", "threat", _missing("threat", action.id))
    old = model.threats[index]
    convert: dict[str, Callable[[Any], Any]] = {
        "element": _clearable,
        "flow": _clearable,
        "description": _clearable,
        "mitigation": lambda value: _mitigation(value, old.mitigation),
    }
    changes = _changes(action.updates, convert)
    if not changes:
        return _fail("update", "threat", "updates sets no field")
    threat = attrs.evolve(old, **changes)
    failure = _threat_targets(model, "update", threat.element, threat.flow)
    if failure is not None:
        return failure
    new_model = attrs.evolve(model, threats=_replace_at(model.threats, index, threat))
    return AppliedAction(model=new_model, report=f"Updated threat {quote(action.id)}: {', '.join(changes)}.")


def _delete_threat(model: ThreatModel, action: DeleteThreat) -> AppliedAction | ActionFailure:
    if _index(model.threats, action.id) is None:
        return _fail("delete", "threat", _missing("threat", action.id))
    threats = tuple(t for t in model.threats if t.id != action.id)
    return AppliedAction(model=attrs.evolve(model, threats=threats), report=f"Deleted threat {quote(action.id)}.")


_HANDLERS: Final[dict[type[Any], Callable[[ThreatModel, Any], AppliedAction | ActionFailure]]] = {
    AddElement: _add_element,
    UpdateElement: _update_element,
    DeleteElement: _delete_element,
    AddDataFlow: _add_data_flow,
    UpdateDataFlow: _update_data_flow,
    DeleteDataFlow: _delete_data_flow,
    AddTrustBoundary: _add_trust_boundary,
    UpdateTrustBoundary: _update_trust_boundary,
    DeleteTrustBoundary: _delete_trust_boundary,
    AddThreat: _add_threat,
    UpdateThreat: _update_threat,
    DeleteThreat: _delete_threat,
}
