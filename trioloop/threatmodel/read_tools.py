"""The four read tools: document summary, one entity, a filtered page of a section, and the catalog.

Each is a pure function of the document snapshot in its context (the catalog tool, of the static catalog):
no store, clock, environment or I/O, and never a document in the outcome. Results keep document order
(catalog: declaration order) and obey the bounds in `read_result`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any, Final

from trioloop.machine.tools import RegisteredTool, ToolOutcome
from trioloop.machine.untrusted_text import quote_untrusted, sanitize_scalar
from trioloop.runtime.tools import ToolExecutionContext, define_executable_tool
from trioloop.threatmodel.catalog import CatalogEntry, search_catalog
from trioloop.threatmodel.model import (
    MITIGATION_STATUSES,
    SECTION_NAMES,
    SEVERITIES,
    STRIDE_CATEGORIES,
    DataFlow,
    Diagram,
    Element,
    Entity,
    Group,
    Relationship,
    Threat,
    ThreatModel,
    TrustBoundary,
)
from trioloop.threatmodel.read_inputs import (
    FILTER_ORDER,
    FILTER_TESTS,
    FILTERS_BY_KIND,
    PAGE_NOTE,
    UNTRUSTED_NOTE,
    DocumentSummaryInput,
    GetEntityInput,
    SearchCatalogInput,
    SearchEntitiesInput,
    SectionKind,
    mitigation_status,
)
from trioloop.tools.read_result import (
    ECHO_MAX_CODE_POINTS,
    READ_RESULT_MAX_BYTES,
    SCALAR_MAX_CODE_POINTS,
    EntityProjection,
    encode_payload,
    entity_too_large,
    invalid_filter,
    offset_out_of_range,
    paginate_encoded,
    read_success,
    read_success_encoded,
    unknown_id,
)

__all__ = [
    "FILTERS_BY_KIND",
    "FILTER_ORDER",
    "GET_DOCUMENT_SUMMARY",
    "GET_ENTITY",
    "READ_TOOLS",
    "SEARCH_COMPONENT_CATALOG",
    "SEARCH_ENTITIES",
    "DocumentSummaryInput",
    "GetEntityInput",
    "SearchCatalogInput",
    "SearchEntitiesInput",
    "SectionKind",
]


# ---------------------------------------------------------------------------------------------
# Projections


def _compact(entity: Entity) -> EntityProjection:
    """The fields a search result shows: enough to pick an entity and call get_entity."""
    p = EntityProjection()
    p.scalar("id", entity.id)
    if isinstance(entity, Element):
        p.scalar("name", entity.name)
        p.scalar("type", entity.type)
        p.scalar("trust_zone", entity.trust_zone)
        p.scalar("layer", entity.layer)
        p.scalar("group", entity.group)
    elif isinstance(entity, DataFlow):
        p.scalar("name", entity.name)
        p.scalar("source", entity.source)
        p.scalar("target", entity.target)
        p.scalar("protocol", entity.protocol)
        p.value("authenticated", entity.authenticated)
        p.value("encrypted", entity.encrypted)
    elif isinstance(entity, TrustBoundary):
        p.scalar("name", entity.name)
        p.value("contains_count", len(entity.contains))
    elif isinstance(entity, Threat):
        p.scalar("title", entity.title)
        p.scalar("category", entity.category)
        p.scalar("severity", entity.severity)
        p.scalar("element", entity.element)
        p.scalar("flow", entity.flow)
        p.scalar("mitigation_status", mitigation_status(entity))
    elif isinstance(entity, Group):
        p.scalar("name", entity.name)
        p.scalar("type", entity.type)
        p.scalar("parent", entity.parent)
    elif isinstance(entity, Relationship):
        p.scalar("type", entity.type)
        p.scalar("source", entity.source)
        p.scalar("target", entity.target)
        p.scalar("name", entity.name)
    elif isinstance(entity, Diagram):
        p.scalar("name", entity.name)
        p.scalar("kind", entity.kind)
    else:
        p.scalar("name", entity.name)
    return p


def _full(entity: Entity, document: ThreatModel) -> EntityProjection:
    """The compact fields plus descriptions, lists and the ids of related entities."""
    p = _compact(entity)
    if isinstance(entity, Element):
        p.scalar("subtype", entity.subtype)
        p.scalar("icon", entity.icon)
        p.scalar("encryption", entity.encryption)
        p.text("description", entity.description)
        p.strings("technologies", entity.technologies)
        p.strings("tags", entity.tags)
        p.strings("stores", entity.stores)
        p.strings("incoming_flow_ids", [f.id for f in document.data_flows if f.target == entity.id])
        p.strings("outgoing_flow_ids", [f.id for f in document.data_flows if f.source == entity.id])
        p.strings("trust_boundary_ids", [b.id for b in document.trust_boundaries if entity.id in b.contains])
        p.strings("threat_ids", [t.id for t in document.threats if t.element == entity.id])
    elif isinstance(entity, DataFlow):
        p.value("flow_number", entity.flow_number)
        p.strings("data", entity.data)
        p.strings("threat_ids", [t.id for t in document.threats if t.flow == entity.id])
    elif isinstance(entity, TrustBoundary):
        p.strings("contains", entity.contains)
    elif isinstance(entity, Threat):
        p.text("description", entity.description)
        if entity.mitigation is not None:
            p.text("mitigation_description", entity.mitigation.description)
    else:
        p.text("description", entity.description)
    return p


def _catalog_entry(entry: CatalogEntry) -> Mapping[str, Any]:
    p = EntityProjection()
    p.scalar("id", entry.id)
    p.scalar("label", entry.label)
    p.scalar("category", entry.category.value)
    p.scalar("provider", entry.provider.value)
    p.scalar("stride_role", entry.stride_role)
    p.value("deprecated", entry.deprecated)
    p.scalar("replaced_by", entry.replaced_by)
    p.strings("aliases", entry.aliases)
    p.strings("keywords", entry.keywords)
    variants = []
    for variant in entry.variants:
        v = EntityProjection()
        v.scalar("id", variant.id)
        v.scalar("label", variant.label)
        v.scalar("provider", variant.provider.value)
        variants.append(v.build())
    p.objects("variants", variants)
    return p.build()


# ---------------------------------------------------------------------------------------------
# get_document_summary


def _buckets(key: str, names: Iterable[str], values: Iterable[str]) -> list[dict[str, Any]]:
    """Counts per name in a fixed order, zero buckets kept; values matching no name count as "other"."""
    by_fold = {name.casefold(): name for name in names}
    counts = Counter(by_fold.get(value.casefold(), "other") for value in values)
    buckets = [{key: name, "count": counts[name]} for name in by_fold.values()]
    if counts["other"]:
        buckets.append({key: "other", "count": counts["other"]})
    return buckets


def _summary(document: ThreatModel) -> dict[str, Any]:
    meta = document.metadata
    p = EntityProjection()
    for field in ("title", "author", "created", "modified", "description"):
        p.scalar(field, getattr(meta, field))
    metadata = {**p.build(), "threat_analysis_enabled": meta.threat_analysis_enabled}
    version, version_cut = sanitize_scalar(document.version, SCALAR_MAX_CODE_POINTS)
    threats = document.threats
    payload: dict[str, Any] = {
        "version": version,
        "metadata": metadata,
        "counts": {name: len(document.section(name)) for name in SECTION_NAMES},
        "threats_by_severity": _buckets("severity", SEVERITIES, (t.severity for t in threats)),
        "threats_by_category": _buckets("category", STRIDE_CATEGORIES, (t.category for t in threats)),
        "threats_by_mitigation_status": _buckets(
            "status", (*MITIGATION_STATUSES, "none"), (mitigation_status(t) for t in threats)
        ),
    }
    if version_cut:
        payload["truncated"] = True
    return payload


def _run_summary(_: DocumentSummaryInput, ctx: ToolExecutionContext[ThreatModel]) -> ToolOutcome[ThreatModel]:
    return read_success(GET_DOCUMENT_SUMMARY, _summary(ctx.document))


# ---------------------------------------------------------------------------------------------
# get_entity and search_entities


def _run_get_entity(request: GetEntityInput, ctx: ToolExecutionContext[ThreatModel]) -> ToolOutcome[ThreatModel]:
    document = ctx.document
    entity = document.find(request.kind, request.id)
    if entity is None:
        return unknown_id(request.kind, request.id, len(document.section(request.kind)))
    encoded = encode_payload(GET_ENTITY, {"kind": request.kind, "entity": _full(entity, document).build()})
    if encoded.size > READ_RESULT_MAX_BYTES:
        return entity_too_large(request.kind, request.id, encoded.size)
    return read_success_encoded(encoded)


def _set_filters(request: SearchEntitiesInput) -> list[tuple[str, Any]]:
    return [(name, getattr(request, name)) for name in FILTER_ORDER if getattr(request, name) is not None]


def _run_search_entities(
    request: SearchEntitiesInput, ctx: ToolExecutionContext[ThreatModel]
) -> ToolOutcome[ThreatModel]:
    kind = request.kind
    applicable = FILTERS_BY_KIND[kind]
    filters = _set_filters(request)
    for name, _ in filters:
        if name not in applicable:
            return invalid_filter(name, kind, applicable)
    matches = tuple(
        entity
        for entity in ctx.document.section(kind)
        if all(FILTER_TESTS[name](entity, value) for name, value in filters)
    )
    if matches and request.offset >= len(matches):
        return offset_out_of_range(kind, request.offset, len(matches))
    encoded = paginate_encoded(
        matches,
        offset=request.offset,
        limit=request.limit,
        envelope={"tool": SEARCH_ENTITIES, "kind": kind},
        project=lambda entity: _compact(entity).build(),
    )
    return read_success_encoded(encoded)


# ---------------------------------------------------------------------------------------------
# search_component_catalog


def _run_search_catalog(request: SearchCatalogInput, _: ToolExecutionContext[ThreatModel]) -> ToolOutcome[ThreatModel]:
    entries = search_catalog(
        request.query or "",
        category=request.category,
        provider=request.provider,
        include_deprecated=request.include_deprecated,
    )
    if entries and request.offset >= len(entries):
        return offset_out_of_range("components", request.offset, len(entries))
    encoded = paginate_encoded(
        entries,
        offset=request.offset,
        limit=request.limit,
        envelope={"tool": SEARCH_COMPONENT_CATALOG},
        project=_catalog_entry,
    )
    return read_success_encoded(encoded)


def _summarize_search_catalog(request: SearchCatalogInput) -> str:
    if request.query is None or not request.query.strip():
        return "Search the component catalog."
    return f"Search the component catalog for {quote_untrusted(request.query, ECHO_MAX_CODE_POINTS)}."


def _summarize_search_entities(request: SearchEntitiesInput) -> str:
    filters = [name for name, _ in _set_filters(request)]
    by = f" filtered by {', '.join(filters)}" if filters else ""
    return f'Search the "{request.kind}" entities{by}.'


# ---------------------------------------------------------------------------------------------
# The tools

GET_DOCUMENT_SUMMARY: Final = "get_document_summary"
GET_ENTITY: Final = "get_entity"
SEARCH_ENTITIES: Final = "search_entities"
SEARCH_COMPONENT_CATALOG: Final = "search_component_catalog"

READ_TOOLS: Final[tuple[RegisteredTool[ThreatModel], ...]] = (
    define_executable_tool(
        name=GET_DOCUMENT_SUMMARY,
        description=(
            "Summarize the open threat model: version, metadata, how many entities each section holds, and "
            "threat counts by severity, STRIDE category and mitigation status. Start here. " + UNTRUSTED_NOTE
        ),
        effect="read",
        destructive=False,
        input_type=DocumentSummaryInput,
        run=_run_summary,
        summarize=lambda _: "Read the document summary.",
    ),
    define_executable_tool(
        name=GET_ENTITY,
        description=(
            "Read one entity in full by its section (kind) and exact id, including its description and the "
            "ids of related flows, boundaries and threats. Long text ends in '…' and the entity then has "
            '"truncated": true; a list longer than 10 shows the first 10 and reports <field>_total. ' + UNTRUSTED_NOTE
        ),
        effect="read",
        destructive=False,
        input_type=GetEntityInput,
        run=_run_get_entity,
        summarize=lambda r: f'Read the "{r.kind}" entity {quote_untrusted(r.id, ECHO_MAX_CODE_POINTS)}.',
    ),
    define_executable_tool(
        name=SEARCH_ENTITIES,
        description=(
            "List the entities of one section (kind), optionally filtered; all filters given must match. "
            "Each filter applies only to some kinds (see each field); a filter that does not apply is an "
            "error naming the ones that do. Results are compact and in document order; call get_entity for the "
            "full entity. " + PAGE_NOTE + " " + UNTRUSTED_NOTE
        ),
        effect="read",
        destructive=False,
        input_type=SearchEntitiesInput,
        run=_run_search_entities,
        summarize=_summarize_search_entities,
    ),
    define_executable_tool(
        name=SEARCH_COMPONENT_CATALOG,
        description=(
            "Search the catalog of component types an element can be (its `type` is normally a catalog id), "
            "by words, category and cloud provider. Deprecated entries are hidden unless include_deprecated "
            "is true. Results are in catalog order. " + PAGE_NOTE + " " + UNTRUSTED_NOTE
        ),
        effect="read",
        destructive=False,
        input_type=SearchCatalogInput,
        run=_run_search_catalog,
        summarize=_summarize_search_catalog,
    ),
)
