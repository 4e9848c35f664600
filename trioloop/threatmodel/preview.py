"""Dry-run previews of the twelve graph edits: the action is pure, so the preview applies it to the
document as it stands and names every entity the result adds, changes (field by field) or removes.

A delete's cascade (the flows, threats, relationships and memberships it takes with it) therefore shows
on the card entity by entity. An edit the document would refuse, or whose result would fail validation,
previews as that failure: the card shows what will really happen. Nothing here runs a tool or touches
the document it is given.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any, Final

import attrs

from trioloop.machine.card import input_details
from trioloop.machine.preview import EntityChange, FieldChange, Preview
from trioloop.threatmodel.action_inputs import GraphAction
from trioloop.threatmodel.actions import ActionFailure, apply_action
from trioloop.threatmodel.model import SECTION_NAMES, ThreatModel
from trioloop.threatmodel.validation import validate_threat_model

__all__ = ["diff_models", "graph_preview"]

_KIND: Final = {
    "elements": "element",
    "data_flows": "data flow",
    "trust_boundaries": "trust boundary",
    "threats": "threat",
    "layers": "layer",
    "groups": "group",
    "relationships": "relationship",
    "diagrams": "diagram",
}


def _plain(value: Any) -> Any:
    """An attrs value as JSON-shaped data (mappings, lists, scalars), for field-by-field comparison."""
    if attrs.has(type(value)):
        return {field.name: _plain(getattr(value, field.name)) for field in attrs.fields(type(value))}
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if value is None or isinstance(value, str | bool | int):
        return value
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else str(value)
    if isinstance(value, datetime.date | datetime.datetime):
        return value.isoformat()
    return str(value)


def _details(entity: Any) -> tuple[tuple[str, str], ...]:
    # A list of plain values is one field: "contains: [a, b] -> [a]" reads better than index shifts.
    return input_details(_plain(entity), inline_lists=True)


def _name(entity: Any) -> str:
    for attribute in ("name", "title"):
        value = getattr(entity, attribute, None)
        if isinstance(value, str):
            return value
    return ""


def _entry(kind: str, entity: Any, *, before: bool) -> EntityChange:
    details = _details(entity)
    fields = tuple(
        FieldChange(field=path, before=value, after=None)
        if before
        else FieldChange(field=path, before=None, after=value)
        for path, value in details
    )
    return EntityChange(kind=kind, id=str(getattr(entity, "id", kind)), name=_name(entity), fields=fields)


def _changed(kind: str, entity_id: str, old: Any, new: Any) -> EntityChange:
    before = dict(_details(old))
    after = _details(new)
    fields = [
        FieldChange(field=path, before=before.get(path), after=value)
        for path, value in after
        if before.get(path) != value
    ]
    seen = {path for path, _ in after}
    fields.extend(
        FieldChange(field=path, before=value, after=None) for path, value in before.items() if path not in seen
    )
    return EntityChange(kind=kind, id=entity_id, name=_name(new), fields=tuple(fields))


def diff_models(before: ThreatModel, after: ThreatModel) -> Preview:
    """Every entity ``after`` adds, changes or removes relative to ``before``, section by section, in
    document order (plus the metadata, the version and unknown top-level keys when they differ)."""
    added: list[EntityChange] = []
    changed: list[EntityChange] = []
    removed: list[EntityChange] = []
    for section in SECTION_NAMES:
        old_section, new_section = before.section(section), after.section(section)
        if old_section == new_section:
            continue
        kind = _KIND[section]
        old_by_id = {e.id: e for e in reversed(old_section)}
        new_by_id = {e.id: e for e in reversed(new_section)}
        for entity in new_section:
            previous = old_by_id.get(entity.id)
            if previous is None:
                added.append(_entry(kind, entity, before=False))
            elif previous != entity and new_by_id[entity.id] is entity:
                changed.append(_changed(kind, entity.id, previous, entity))
        removed.extend(_entry(kind, e, before=True) for e in old_section if e.id not in new_by_id)
    for field in ("version", "metadata", "extra"):
        old, new = getattr(before, field), getattr(after, field)
        if old != new:
            changed.append(_changed(field, field, {field: old}, {field: new}))
    return Preview(added=tuple(added), changed=tuple(changed), removed=tuple(removed))


def graph_preview(document: ThreatModel, action: GraphAction) -> Preview:
    """What applying ``action`` to ``document`` would do, or why it would be refused."""
    result = apply_action(document, action)
    if isinstance(result, ActionFailure):
        return Preview(failure=result.message)
    problem = validate_threat_model(result)
    if problem is not None:
        return Preview(failure=f"the edited document would not be valid: {problem}")
    return diff_models(document, result)
