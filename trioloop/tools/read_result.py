"""Read results: the bounds every read tool obeys, entity projection, byte-bounded pages and failures.

A success is one fenced canonical JSON payload of at most READ_RESULT_MAX_BYTES; nothing is cut without
saying so (a cut string ends in "…" and marks its entity `truncated`, a capped list reports
`<field>_total`, a short page says `stopped_by`). A failure is authored text that starts with its code
and tells the model what to call next; the only untrusted text in it is an echoed value, sanitized.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Literal, TypeAlias, TypeVar, final

from trioloop.machine.canonical import canonical_json
from trioloop.machine.tools import ToolOutcome
from trioloop.machine.untrusted_text import fence_canonical, quote_untrusted, sanitize_scalar

__all__ = [
    "DEFAULT_PAGE_LIMIT",
    "ECHO_MAX_CODE_POINTS",
    "LIST_MAX_ITEMS",
    "MAX_PAGE_LIMIT",
    "READ_RESULT_KEYS",
    "READ_RESULT_MAX_BYTES",
    "SCALAR_MAX_CODE_POINTS",
    "TEXT_MAX_CODE_POINTS",
    "EncodedPayload",
    "EntityProjection",
    "ReadFailureCode",
    "StoppedBy",
    "encode_payload",
    "entity_too_large",
    "invalid_filter",
    "offset_out_of_range",
    "paginate",
    "paginate_encoded",
    "payload_bytes",
    "read_success",
    "read_success_encoded",
    "unknown_id",
]

READ_RESULT_MAX_BYTES: Final = 8192
DEFAULT_PAGE_LIMIT: Final = 20
MAX_PAGE_LIMIT: Final = 50
SCALAR_MAX_CODE_POINTS: Final = 200
TEXT_MAX_CODE_POINTS: Final = 400
LIST_MAX_ITEMS: Final = 10
ECHO_MAX_CODE_POINTS: Final = 80

StoppedBy: TypeAlias = Literal["end", "limit", "bytes"]
T = TypeVar("T")


class ReadFailureCode(enum.StrEnum):
    """The closed set of ways a read can fail; every failure text starts with one of these."""

    UNKNOWN_ID = "unknown_id"
    INVALID_FILTER = "invalid_filter"
    OFFSET_OUT_OF_RANGE = "offset_out_of_range"
    ENTITY_TOO_LARGE = "entity_too_large"


_SECTION_KEYS: Final = (
    "elements",
    "data_flows",
    "trust_boundaries",
    "threats",
    "layers",
    "groups",
    "relationships",
    "diagrams",
)
_CAPPED_LIST_KEYS: Final = (
    "technologies",
    "tags",
    "stores",
    "incoming_flow_ids",
    "outgoing_flow_ids",
    "trust_boundary_ids",
    "threat_ids",
    "data",
    "contains",
    "aliases",
    "keywords",
    "variants",
)

#: Every key any read payload may contain, at any depth. Document text only ever appears as a value.
READ_RESULT_KEYS: Final[frozenset[str]] = frozenset(
    {
        # envelope and page
        "tool",
        "kind",
        "entity",
        "page",
        "results",
        "offset",
        "limit",
        "returned",
        "total",
        "next_offset",
        "stopped_by",
        "truncated",
        # summary
        "version",
        "metadata",
        "title",
        "author",
        "created",
        "modified",
        "description",
        "threat_analysis_enabled",
        "counts",
        "threats_by_severity",
        "threats_by_category",
        "threats_by_mitigation_status",
        "severity",
        "category",
        "status",
        "count",
        *_SECTION_KEYS,
        # entities
        "id",
        "name",
        "type",
        "trust_zone",
        "layer",
        "group",
        "subtype",
        "icon",
        "encryption",
        "source",
        "target",
        "protocol",
        "authenticated",
        "encrypted",
        "flow_number",
        "contains_count",
        "element",
        "flow",
        "mitigation_status",
        "mitigation_description",
        "parent",
        # catalog
        "label",
        "provider",
        "stride_role",
        "deprecated",
        "replaced_by",
        *_CAPPED_LIST_KEYS,
        *(f"{key}_total" for key in _CAPPED_LIST_KEYS),
    }
)


class EntityProjection:
    """Builds one projected entity: every string sanitized and capped, every cut recorded.

    Absent optional fields are left out rather than written as null.
    """

    __slots__ = ("_fields", "_truncated")

    def __init__(self) -> None:
        self._fields: dict[str, Any] = {}
        self._truncated = False

    def scalar(self, key: str, value: str | None) -> None:
        """A one-line string, capped at SCALAR_MAX_CODE_POINTS."""
        if value is not None:
            self._fields[key] = self._clean(value, SCALAR_MAX_CODE_POINTS, allow_newlines=False)

    def text(self, key: str, value: str | None) -> None:
        """Description text: newlines and tabs kept, capped at TEXT_MAX_CODE_POINTS."""
        if value is not None:
            self._fields[key] = self._clean(value, TEXT_MAX_CODE_POINTS, allow_newlines=True)

    def value(self, key: str, value: bool | int | None) -> None:
        """An authored or numeric value that needs no sanitizing."""
        if value is not None:
            self._fields[key] = value

    def strings(self, key: str, values: Sequence[str]) -> None:
        """A list of strings: the first LIST_MAX_ITEMS kept, `<key>_total` added when there were more."""
        self._fields[key] = [
            self._clean(item, SCALAR_MAX_CODE_POINTS, allow_newlines=False) for item in values[:LIST_MAX_ITEMS]
        ]
        self._note_capped(key, len(values))

    def objects(self, key: str, values: Sequence[Mapping[str, Any]]) -> None:
        """A list of already projected objects, capped like `strings`."""
        self._fields[key] = [dict(item) for item in values[:LIST_MAX_ITEMS]]
        self._note_capped(key, len(values))

    def build(self) -> dict[str, Any]:
        if self._truncated:
            return {**self._fields, "truncated": True}
        return dict(self._fields)

    def _note_capped(self, key: str, total: int) -> None:
        if total > LIST_MAX_ITEMS:
            self._fields[f"{key}_total"] = total
            self._truncated = True

    def _clean(self, value: str, cap: int, *, allow_newlines: bool) -> str:
        clean, cut = sanitize_scalar(value, cap, allow_newlines=allow_newlines)
        self._truncated = self._truncated or cut
        return clean


@final
class EncodedPayload:
    """A read payload written once as its canonical JSON line, with that line's size in UTF-8 bytes."""

    __slots__ = ("body", "size")

    def __init__(self, body: str, size: int | None = None) -> None:
        self.body = body
        self.size = len(body.encode("utf-8")) if size is None else size


def payload_bytes(payload: Mapping[str, Any]) -> int:
    """The size the cap is measured in: UTF-8 bytes of the canonical JSON line, markers excluded."""
    return len(canonical_json(dict(payload)).encode("utf-8"))


def encode_payload(tool: str, payload: Mapping[str, Any]) -> EncodedPayload:
    """The payload with `"tool"` added, as canonical JSON: measure it and fence it without encoding again."""
    return EncodedPayload(canonical_json({**payload, "tool": tool}))


def read_success(tool: str, payload: Mapping[str, Any]) -> ToolOutcome[Any]:
    """Fence a payload (adding `"tool"`) as an ok outcome; it never carries a document."""
    return read_success_encoded(encode_payload(tool, payload))


def read_success_encoded(encoded: EncodedPayload) -> ToolOutcome[Any]:
    """``read_success`` for a payload already encoded (by ``encode_payload`` or ``paginate_encoded``)."""
    if encoded.size > READ_RESULT_MAX_BYTES:
        # Every caller bounds its payload first; reaching this is a bug, not a document problem.
        raise RuntimeError(f"read payload of {encoded.size} bytes exceeds the {READ_RESULT_MAX_BYTES}-byte cap")
    return ToolOutcome.success(fence_canonical(encoded.body))


def _page(*, offset: int, limit: int, returned: int, total: int, stopped_by: StoppedBy) -> dict[str, Any]:
    end = offset + returned
    return {
        "offset": offset,
        "limit": limit,
        "returned": returned,
        "total": total,
        "next_offset": end if end < total else None,
        "stopped_by": stopped_by,
    }


def paginate(
    items: Sequence[T],
    *,
    offset: int,
    limit: int,
    envelope: Mapping[str, Any],
    project: Callable[[T], Mapping[str, Any]],
) -> dict[str, Any]:
    """One page of `items` from `offset`: at most `limit` projected results and at most the byte cap.

    `envelope` (including `"tool"`) is measured with the page, so the returned payload as a whole fits.
    The caller has already refused an offset past the end.
    """
    return _paginate(items, offset=offset, limit=limit, envelope=envelope, project=project)[0]


def paginate_encoded(
    items: Sequence[T],
    *,
    offset: int,
    limit: int,
    envelope: Mapping[str, Any],
    project: Callable[[T], Mapping[str, Any]],
) -> EncodedPayload:
    """``paginate``'s page as canonical JSON, each result encoded once (the one it was measured with)."""
    return _paginate(items, offset=offset, limit=limit, envelope=envelope, project=project)[1]


_RESULTS_SLOT: Final = '"results":[]'


def _paginate(
    items: Sequence[T],
    *,
    offset: int,
    limit: int,
    envelope: Mapping[str, Any],
    project: Callable[[T], Mapping[str, Any]],
) -> tuple[dict[str, Any], EncodedPayload]:
    total = len(items)
    results: list[Mapping[str, Any]] = []
    pieces: list[str] = []  # each accepted result's canonical JSON, as measured
    used = 0  # UTF-8 bytes of the accepted results' JSON, without separators
    stopped_by: StoppedBy = "end"
    for index in range(offset, total):
        if len(results) >= limit:
            stopped_by = "limit"
            break
        projected = project(items[index])
        piece_text = canonical_json(dict(projected))
        piece = len(piece_text.encode("utf-8"))
        count = len(results) + 1
        # "bytes" is as long as the longest stop reason, so the real page can only be the same size or smaller.
        trial_page = _page(offset=offset, limit=limit, returned=count, total=total, stopped_by="bytes")
        frame = payload_bytes({**envelope, "page": trial_page, "results": []})
        if frame + used + piece + (count - 1) > READ_RESULT_MAX_BYTES:
            stopped_by = "bytes"
            break
        results.append(projected)
        pieces.append(piece_text)
        used += piece
    page = _page(offset=offset, limit=limit, returned=len(results), total=total, stopped_by=stopped_by)
    payload = {**envelope, "page": page, "results": [dict(item) for item in results]}
    # The whole page is the frame with its empty results array filled in by the pieces already written:
    # in canonical JSON an unescaped '"results":' can only be a key, and the page object has it once
    # (an envelope nesting another "results" key is refused rather than guessed at).
    frame_text = canonical_json({**envelope, "page": page, "results": []})
    if frame_text.count(_RESULTS_SLOT) != 1:
        raise RuntimeError("a page envelope must not nest a results key")
    body = frame_text.replace(_RESULTS_SLOT, '"results":[' + ",".join(pieces) + "]")
    size = len(frame_text.encode("utf-8")) + used + max(len(pieces) - 1, 0)
    return payload, EncodedPayload(body, size)


def _failure(code: ReadFailureCode, message: str) -> ToolOutcome[Any]:
    return ToolOutcome.failure(f"{code.value}: {message}")


def _entries(count: int) -> str:
    return "1 entry" if count == 1 else f"{count} entries"


def unknown_id(kind: str, entity_id: str, section_size: int) -> ToolOutcome[Any]:
    """No entity of `kind` has `entity_id`; says how many exist and how to list them."""
    echo = quote_untrusted(entity_id, ECHO_MAX_CODE_POINTS)
    if section_size == 0:
        hint = f'The document has no "{kind}" entries, so there is nothing to read in that section.'
    else:
        hint = (
            f'The document has {_entries(section_size)} in "{kind}"; call search_entities with kind "{kind}" '
            "to see which ids exist, then retry with one of them."
        )
    return _failure(ReadFailureCode.UNKNOWN_ID, f'No "{kind}" entity has the id {echo}. {hint}')


def invalid_filter(filter_name: str, kind: str, applicable: Sequence[str]) -> ToolOutcome[Any]:
    """A filter was set that `kind` does not support; names the filters it does."""
    return _failure(
        ReadFailureCode.INVALID_FILTER,
        f'The filter "{filter_name}" does not apply to kind "{kind}". Filters for "{kind}": '
        f'{", ".join(applicable)}. Remove "{filter_name}" or search a kind it applies to.',
    )


def offset_out_of_range(kind: str, offset: int, total: int) -> ToolOutcome[Any]:
    """`offset` is at or past the number of matches (only raised when there is at least one match)."""
    valid = "The only valid offset is 0" if total == 1 else f"Use an offset from 0 to {total - 1}"
    return _failure(
        ReadFailureCode.OFFSET_OUT_OF_RANGE,
        f'Offset {offset} is past the end: {total} "{kind}" match. {valid}, or leave offset out to start '
        "at the first match.",
    )


def entity_too_large(kind: str, entity_id: str, size: int) -> ToolOutcome[Any]:
    """The full projection of one entity would exceed the byte cap even after per-field caps."""
    echo = quote_untrusted(entity_id, ECHO_MAX_CODE_POINTS)
    return _failure(
        ReadFailureCode.ENTITY_TOO_LARGE,
        f'The "{kind}" entity {echo} is {size} bytes when projected, over the {READ_RESULT_MAX_BYTES}-byte '
        f'result limit, so it cannot be returned whole. Call search_entities with kind "{kind}" to read its '
        "compact fields instead.",
    )
