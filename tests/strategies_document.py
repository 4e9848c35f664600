"""Hypothesis strategies for valid ThreatModels and for graph actions against them (reusable by any test).

`threat_models()` only builds models `validate_threat_model` accepts: ids are unique across the
whole document (so no section or cross-section collision), every reference points at an earlier
drawn id, and groups only nest under earlier groups (so nesting is acyclic). `graph_actions(model)`
draws any of the twelve edits, aimed mostly at ids that exist and sometimes at ones that do not.
"""

from __future__ import annotations

import functools
from typing import Any, get_args

from hypothesis import strategies as st

from trioloop.threatmodel import (
    AddDataFlow,
    AddElement,
    AddThreat,
    AddTrustBoundary,
    DataFlow,
    DataFlowUpdates,
    DeleteDataFlow,
    DeleteElement,
    DeleteThreat,
    DeleteTrustBoundary,
    Diagram,
    Element,
    ElementUpdates,
    GraphAction,
    Group,
    Layer,
    Metadata,
    Mitigation,
    MitigationInput,
    NewDataFlow,
    NewElement,
    NewThreat,
    NewTrustBoundary,
    Position,
    PositionInput,
    Relationship,
    Size,
    SizeInput,
    Threat,
    ThreatModel,
    ThreatUpdates,
    TrustBoundary,
    TrustBoundaryUpdates,
    UpdateDataFlow,
    UpdateElement,
    UpdateThreat,
    UpdateTrustBoundary,
    Viewport,
)
from trioloop.threatmodel.action_inputs import MitigationStatusName, SeverityName, StrideCategory
from trioloop.threatmodel.model import MITIGATION_STATUSES, SEVERITIES, STRIDE_CATEGORIES

__all__ = ["graph_actions", "ids", "json_values", "models_with_actions", "texts", "threat_models"]

#: Any text, including control, bidi and non-BMP characters (surrogates excluded: not encodable).
texts = st.text(max_size=8)
ids = st.one_of(
    st.from_regex(r"\A(comp|flow|boundary|threat|g|x)-[0-9]{1,3}\Z"),
    st.text(min_size=1, max_size=10),
)
numbers = st.one_of(st.integers(-10_000, 10_000), st.floats(allow_nan=False, allow_infinity=False, width=64))
json_values: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=8,
)


@functools.cache
def _extra(known: frozenset[str]) -> st.SearchStrategy[dict[str, Any]]:
    # Cached: building a fresh strategy per draw makes hypothesis re-derive its properties every time.
    keys = texts.filter(lambda key: key not in known)
    return st.dictionaries(keys, json_values, max_size=2)


_OPTIONAL: dict[int, tuple[st.SearchStrategy[Any], st.SearchStrategy[Any]]] = {}


def _opt(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    # Keyed by id, holding the strategy itself so the id cannot be reused by another object.
    cached = _OPTIONAL.get(id(strategy))
    if cached is None:
        cached = _OPTIONAL[id(strategy)] = (strategy, st.none() | strategy)
    return cached[1]


_STR_TUPLES = st.lists(texts, max_size=3).map(tuple)


def _str_tuple() -> st.SearchStrategy[tuple[str, ...]]:
    return _STR_TUPLES


# Choices among drawn ids go through cached integer strategies: a fresh sampled_from per draw is slow.
def _choose(draw: st.DrawFn, options: list[str]) -> str:
    return options[draw(st.integers(0, len(options) - 1))]


def _maybe(draw: st.DrawFn, options: list[str]) -> str | None:
    return _choose(draw, options) if options and draw(st.booleans()) else None


def _subset(draw: st.DrawFn, options: list[str]) -> tuple[str, ...]:
    return tuple(_choose(draw, options) for _ in range(draw(st.integers(0, 3)))) if options else ()


positions = st.builds(Position, x=numbers.map(float), y=numbers.map(float))
sizes = st.builds(Size, width=numbers.map(float), height=numbers.map(float))
viewports = st.builds(Viewport, x=numbers.map(float), y=numbers.map(float), zoom=numbers.map(float))
mitigations = st.builds(
    Mitigation,
    status=st.sampled_from(MITIGATION_STATUSES) | texts,
    description=texts,
    extra=_extra(frozenset({"status", "description"})),
)
_THREAT_CATEGORIES = st.sampled_from(STRIDE_CATEGORIES) | texts
_THREAT_SEVERITIES = st.sampled_from(SEVERITIES) | st.sampled_from(["High", "LOW"])
_CREATED = st.none() | st.sampled_from(["2024-01-15", "2024-01-15T10:00:00Z"]) | texts


@st.composite
def threat_models(draw: st.DrawFn, max_per_section: int = 3) -> ThreatModel:
    """A ThreatModel that validates, with every section, optional field and `extra` exercised."""
    n = max_per_section
    counts = [draw(st.integers(0, n)) for _ in range(8)]
    pool = draw(st.lists(ids, min_size=sum(counts), max_size=sum(counts), unique=True))
    chunks = []
    start = 0
    for count in counts:
        chunks.append(pool[start : start + count])
        start += count
    layer_ids, group_ids, element_ids, flow_ids, boundary_ids, threat_ids, relationship_ids, diagram_ids = chunks

    layers = tuple(
        Layer(
            id=i,
            name=draw(texts),
            description=draw(_opt(texts)),
            extra=draw(_extra(frozenset({"id", "name", "description"}))),
        )
        for i in layer_ids
    )
    groups = tuple(
        Group(
            id=i,
            name=draw(texts),
            type=draw(_opt(texts)),
            parent=_maybe(draw, group_ids[:index]),
            description=draw(_opt(texts)),
            extra=draw(_extra(frozenset({"id", "name", "type", "parent", "description"}))),
        )
        for index, i in enumerate(group_ids)
    )
    element_keys = frozenset(
        [
            "id",
            "type",
            "name",
            "trust_zone",
            "subtype",
            "icon",
            "description",
            "technologies",
            "layer",
            "group",
            "position",
            "tags",
            "stores",
            "encryption",
        ]
    )
    elements = tuple(
        Element(
            id=i,
            type=draw(texts),
            name=draw(texts),
            trust_zone=draw(_opt(texts)),
            subtype=draw(_opt(texts)),
            icon=draw(_opt(texts)),
            description=draw(_opt(texts)),
            technologies=draw(_str_tuple()),
            layer=_maybe(draw, layer_ids),
            group=_maybe(draw, group_ids),
            position=draw(_opt(positions)),
            tags=draw(_str_tuple()),
            stores=draw(_str_tuple()),
            encryption=draw(_opt(texts)),
            extra=draw(_extra(element_keys)),
        )
        for i in element_ids
    )
    if not element_ids:
        flow_ids, relationship_ids, boundary_ids = [], [], boundary_ids
    flows = tuple(
        DataFlow(
            id=i,
            source=_choose(draw, element_ids),
            target=_choose(draw, element_ids),
            name=draw(_opt(texts)),
            protocol=draw(_opt(texts)),
            data=draw(_str_tuple()),
            authenticated=draw(st.booleans()),
            encrypted=draw(_opt(st.booleans())),
            flow_number=draw(_opt(st.integers(-5, 10**6))),
            extra=draw(
                _extra(
                    frozenset(
                        ["id", "from", "to", "name", "protocol", "data", "authenticated", "encrypted", "flow_number"]
                    )
                )
            ),
        )
        for i in flow_ids
    )
    boundaries = tuple(
        TrustBoundary(
            id=i,
            name=draw(texts),
            contains=_subset(draw, element_ids),
            position=draw(_opt(positions)),
            size=draw(_opt(sizes)),
            extra=draw(_extra(frozenset({"id", "name", "contains", "position", "size"}))),
        )
        for i in boundary_ids
    )
    threats = []
    if element_ids or flow_ids:
        for i in threat_ids:
            element = _maybe(draw, element_ids)
            flow = _maybe(draw, flow_ids)
            if element is None and flow is None:
                element = element_ids[0] if element_ids else None
                flow = None if element_ids else flow_ids[0]
            threats.append(
                Threat(
                    id=i,
                    title=draw(texts),
                    category=draw(_THREAT_CATEGORIES),
                    severity=draw(_THREAT_SEVERITIES),
                    element=element,
                    flow=flow,
                    description=draw(_opt(texts)),
                    mitigation=draw(_opt(mitigations)),
                    extra=draw(
                        _extra(
                            frozenset(
                                ["id", "title", "category", "element", "flow", "severity", "description", "mitigation"]
                            )
                        )
                    ),
                )
            )
    relationships = tuple(
        Relationship(
            id=i,
            type=draw(texts),
            source=_choose(draw, element_ids),
            target=_choose(draw, element_ids),
            name=draw(_opt(texts)),
            description=draw(_opt(texts)),
            extra=draw(_extra(frozenset({"id", "type", "from", "to", "name", "description"}))),
        )
        for i in relationship_ids
    )
    diagrams = tuple(
        Diagram(
            id=i,
            name=draw(texts),
            kind=draw(_opt(texts)),
            description=draw(_opt(texts)),
            viewport=draw(_opt(viewports)),
            extra=draw(_extra(frozenset({"id", "name", "kind", "description", "viewport"}))),
        )
        for i in diagram_ids
    )
    metadata = Metadata(
        title=draw(_opt(texts)),
        author=draw(_opt(texts)),
        created=draw(_CREATED),
        modified=draw(_opt(texts)),
        description=draw(_opt(texts)),
        threat_analysis_enabled=draw(_opt(st.booleans())),
        extra=draw(
            _extra(frozenset(["title", "author", "created", "modified", "description", "threat_analysis_enabled"]))
        ),
    )
    top_keys = frozenset({"version", "metadata", "elements", "data_flows", "trust_boundaries", "threats"})
    top_keys |= {"layers", "groups", "relationships", "diagrams"}
    return ThreatModel(
        metadata=metadata,
        elements=elements,
        data_flows=flows,
        trust_boundaries=boundaries,
        threats=tuple(threats),
        layers=layers,
        groups=groups,
        relationships=relationships,
        diagrams=diagrams,
        extra=draw(_extra(top_keys)),
    )


# ---------------------------------------------------------------------------------------------
# Actions


def _ref(draw: st.DrawFn, existing: list[str]) -> str:
    """Mostly an existing id, sometimes any id (which may not exist)."""
    if existing and draw(st.integers(0, 3)) > 0:
        return _choose(draw, existing)
    return draw(ids)


def _opt_ref(draw: st.DrawFn, existing: list[str], *, clear: bool = False) -> str | None:
    """None (unchanged), sometimes "" (clear) when `clear`, else `_ref`."""
    pick = draw(st.integers(0, 3))
    if pick == 0:
        return None
    if pick == 1 and clear:
        return ""
    return _ref(draw, existing)


position_inputs = st.builds(PositionInput, x=st.floats(-1e6, 1e6), y=st.floats(-1e6, 1e6))
size_inputs = st.builds(SizeInput, width=st.floats(0, 1e6), height=st.floats(0, 1e6))
mitigation_inputs = st.builds(
    MitigationInput, status=st.sampled_from(get_args(MitigationStatusName)), description=texts
)
categories = st.sampled_from(get_args(StrideCategory))
severities = st.sampled_from(get_args(SeverityName))
non_empty = st.text(min_size=1, max_size=12)


@st.composite
def graph_actions(draw: st.DrawFn, model: ThreatModel) -> GraphAction:
    """Any one of the twelve edits, aimed mostly at ids that exist in `model`."""
    elements = sorted(model.ids("elements"))
    flows = sorted(model.ids("data_flows"))
    boundaries = sorted(model.ids("trust_boundaries"))
    threats = sorted(model.ids("threats"))
    layers = sorted(model.ids("layers"))
    groups = sorted(model.ids("groups"))
    kind = draw(st.integers(0, 11))
    action: GraphAction
    if kind == 0:
        action = AddElement(
            element=NewElement(
                type=draw(non_empty),
                name=draw(non_empty),
                id=_opt_ref(draw, elements + groups),
                trust_zone=draw(_opt(texts)),
                description=draw(_opt(texts)),
                technologies=draw(_str_tuple()),
                layer=_opt_ref(draw, layers),
                group=_opt_ref(draw, groups),
                position=draw(_opt(position_inputs)),
                tags=draw(_str_tuple()),
            )
        )
    elif kind == 1:
        updates = ElementUpdates(
            name=draw(_opt(non_empty)),
            description=draw(_opt(texts)),
            layer=_opt_ref(draw, layers, clear=True),
            group=_opt_ref(draw, groups, clear=True),
            technologies=draw(_opt(_str_tuple())),
            position=draw(_opt(position_inputs)),
        )
        action = UpdateElement(id=_ref(draw, elements), updates=updates)
    elif kind == 2:
        action = DeleteElement(id=_ref(draw, elements))
    elif kind == 3:
        new_flow = NewDataFlow(
            source=_ref(draw, elements),
            target=_ref(draw, elements),
            id=_opt_ref(draw, flows + sorted(model.ids("relationships"))),
            name=draw(_opt(texts)),
            data=draw(_str_tuple()),
            authenticated=draw(st.booleans()),
            encrypted=draw(_opt(st.booleans())),
            flow_number=draw(_opt(st.integers(1, 100))),
        )
        action = AddDataFlow(data_flow=new_flow)
    elif kind == 4:
        flow_updates = DataFlowUpdates(
            source=_opt_ref(draw, elements),
            target=_opt_ref(draw, elements),
            protocol=draw(_opt(texts)),
            authenticated=draw(_opt(st.booleans())),
        )
        action = UpdateDataFlow(id=_ref(draw, flows), updates=flow_updates)
    elif kind == 5:
        action = DeleteDataFlow(id=_ref(draw, flows))
    elif kind == 6:
        new_boundary = NewTrustBoundary(
            name=draw(non_empty),
            id=_opt_ref(draw, boundaries + groups),
            contains=tuple(_ref(draw, elements) for _ in range(draw(st.integers(0, 3)))),
            position=draw(_opt(position_inputs)),
            size=draw(_opt(size_inputs)),
        )
        action = AddTrustBoundary(trust_boundary=new_boundary)
    elif kind == 7:
        boundary_updates = TrustBoundaryUpdates(
            name=draw(_opt(non_empty)),
            contains=None
            if draw(st.booleans())
            else tuple(_ref(draw, elements) for _ in range(draw(st.integers(0, 3)))),
            size=draw(_opt(size_inputs)),
        )
        action = UpdateTrustBoundary(id=_ref(draw, boundaries), updates=boundary_updates)
    elif kind == 8:
        action = DeleteTrustBoundary(id=_ref(draw, boundaries))
    elif kind == 9:
        new_threat = NewThreat(
            title=draw(non_empty),
            category=draw(categories),
            severity=draw(severities),
            id=_opt_ref(draw, threats),
            element=_opt_ref(draw, elements),
            flow=_opt_ref(draw, flows),
            description=draw(_opt(texts)),
            mitigation=draw(_opt(mitigation_inputs)),
        )
        action = AddThreat(threat=new_threat)
    elif kind == 10:
        threat_updates = ThreatUpdates(
            title=draw(_opt(non_empty)),
            severity=draw(_opt(severities)),
            element=_opt_ref(draw, elements, clear=True),
            flow=_opt_ref(draw, flows, clear=True),
            mitigation=draw(_opt(mitigation_inputs)),
        )
        action = UpdateThreat(id=_ref(draw, threats), updates=threat_updates)
    else:
        action = DeleteThreat(id=_ref(draw, threats))
    return action


@st.composite
def models_with_actions(draw: st.DrawFn) -> tuple[ThreatModel, GraphAction]:
    """A valid model and one edit drawn against it."""
    model = draw(threat_models())
    return model, draw(graph_actions(model))
