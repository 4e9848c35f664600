import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trioloop.machine.canonical import canonical_json
from trioloop.machine.untrusted_text import END_MARKER, START_MARKER
from trioloop.tools.read_result import (
    DEFAULT_PAGE_LIMIT,
    ECHO_MAX_CODE_POINTS,
    LIST_MAX_ITEMS,
    MAX_PAGE_LIMIT,
    READ_RESULT_KEYS,
    READ_RESULT_MAX_BYTES,
    SCALAR_MAX_CODE_POINTS,
    TEXT_MAX_CODE_POINTS,
    EntityProjection,
    ReadFailureCode,
    encode_payload,
    entity_too_large,
    invalid_filter,
    offset_out_of_range,
    paginate,
    paginate_encoded,
    payload_bytes,
    read_success,
    read_success_encoded,
    unknown_id,
)


def test_bounds_are_the_documented_constants() -> None:
    assert (READ_RESULT_MAX_BYTES, DEFAULT_PAGE_LIMIT, MAX_PAGE_LIMIT) == (8192, 20, 50)
    assert (SCALAR_MAX_CODE_POINTS, TEXT_MAX_CODE_POINTS, LIST_MAX_ITEMS, ECHO_MAX_CODE_POINTS) == (200, 400, 10, 80)
    assert {code.value for code in ReadFailureCode} == {
        "unknown_id",
        "invalid_filter",
        "offset_out_of_range",
        "entity_too_large",
    }


def test_projection_omits_absent_fields_and_marks_nothing_when_nothing_was_cut() -> None:
    p = EntityProjection()
    p.scalar("id", "e1")
    p.scalar("name", None)
    p.value("authenticated", False)
    p.value("flow_number", None)
    p.strings("tags", ["a", "b"])
    assert p.build() == {"id": "e1", "authenticated": False, "tags": ["a", "b"]}


def test_a_cut_scalar_ends_in_ellipsis_and_marks_the_entity() -> None:
    p = EntityProjection()
    p.scalar("name", "N" * 201)
    built = p.build()
    assert built["truncated"] is True and built["name"] == "N" * 199 + "…"


def test_description_text_has_its_own_cap_and_keeps_newlines() -> None:
    p = EntityProjection()
    p.text("description", "line\n" + "D" * 400)
    built = p.build()
    assert built["description"].startswith("line\nDDD") and len(built["description"]) == 400
    assert built["truncated"] is True


def test_a_capped_list_reports_its_total() -> None:
    p = EntityProjection()
    p.strings("technologies", [f"t{i}" for i in range(13)])
    built = p.build()
    assert built["technologies"] == [f"t{i}" for i in range(10)]
    assert built["technologies_total"] == 13 and built["truncated"] is True
    exact = EntityProjection()
    exact.strings("technologies", [f"t{i}" for i in range(10)])
    assert "technologies_total" not in exact.build() and "truncated" not in exact.build()


def test_read_success_fences_adds_the_tool_and_never_carries_a_document() -> None:
    outcome = read_success("get_document_summary", {"version": "1.0"})
    assert outcome.ok and outcome.document is None
    assert outcome.result == f'{START_MARKER}\n{{"tool":"get_document_summary","version":"1.0"}}\n{END_MARKER}'


def test_read_success_refuses_an_oversized_payload() -> None:
    with pytest.raises(RuntimeError, match="8192-byte cap"):
        read_success("t", {"id": "x" * READ_RESULT_MAX_BYTES})


def items(sizes: list[int]) -> list[dict[str, Any]]:
    return [{"id": f"i{index}", "name": "n" * size} for index, size in enumerate(sizes)]


def page_of(sizes: list[int], offset: int = 0, limit: int = 20) -> dict[str, Any]:
    return paginate(items(sizes), offset=offset, limit=limit, envelope={"tool": "t", "kind": "k"}, project=dict)


def test_page_that_reaches_the_end() -> None:
    payload = page_of([1, 2, 3])
    assert payload["page"] == {
        "offset": 0,
        "limit": 20,
        "returned": 3,
        "total": 3,
        "next_offset": None,
        "stopped_by": "end",
    }
    assert [item["id"] for item in payload["results"]] == ["i0", "i1", "i2"]
    assert payload["tool"] == "t" and payload["kind"] == "k"


def test_page_stopped_by_limit_points_at_the_next_offset() -> None:
    payload = page_of([1] * 7, offset=2, limit=3)
    assert payload["page"]["stopped_by"] == "limit"
    assert payload["page"]["next_offset"] == 5 and payload["page"]["returned"] == 3
    assert [item["id"] for item in payload["results"]] == ["i2", "i3", "i4"]


def test_a_page_that_ends_exactly_at_the_limit_is_the_end() -> None:
    payload = page_of([1] * 3, limit=3)
    assert payload["page"]["stopped_by"] == "end" and payload["page"]["next_offset"] is None


def test_page_stopped_by_bytes_still_fits_the_cap() -> None:
    payload = page_of([3000] * 5)
    assert payload["page"]["stopped_by"] == "bytes"
    assert payload["page"]["returned"] == 2 and payload["page"]["next_offset"] == 2
    assert payload_bytes(payload) <= READ_RESULT_MAX_BYTES


def test_empty_page_is_a_successful_end() -> None:
    payload = page_of([], offset=5)
    assert payload["results"] == []
    assert payload["page"]["total"] == 0 and payload["page"]["stopped_by"] == "end"
    assert payload["page"]["next_offset"] is None


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(min_value=0, max_value=4000), max_size=30),
    st.integers(min_value=0, max_value=29),
    st.integers(min_value=1, max_value=50),
)
def test_pages_are_maximal_and_never_exceed_the_cap(sizes: list[int], offset: int, limit: int) -> None:
    if sizes and offset >= len(sizes):
        offset = len(sizes) - 1
    payload = page_of(sizes, offset=offset, limit=limit)
    size = payload_bytes(payload)
    page = payload["page"]
    assert size <= READ_RESULT_MAX_BYTES
    assert page["returned"] == len(payload["results"]) <= limit
    assert [item["id"] for item in payload["results"]] == [f"i{i}" for i in range(offset, offset + page["returned"])]
    end = offset + page["returned"]
    assert page["next_offset"] == (end if end < len(sizes) else None)
    if page["stopped_by"] == "bytes":
        # One more result (with the page meta that would describe it) would not have fit.
        more = end + 1
        grown_page = {**page, "returned": page["returned"] + 1, "next_offset": more if more < len(sizes) else None}
        grown = {**payload, "page": grown_page, "results": [*payload["results"], items(sizes)[end]]}
        assert payload_bytes(grown) > READ_RESULT_MAX_BYTES
    elif page["stopped_by"] == "limit":
        assert page["returned"] == limit and end < len(sizes)
    else:
        assert end == len(sizes) or not sizes
    json.loads(canonical_json(payload))


def test_unknown_id_names_the_section_size_and_the_next_call() -> None:
    outcome = unknown_id("elements", "nope", 3)
    assert not outcome.ok and outcome.document is None
    assert outcome.result.startswith("unknown_id: ")
    assert '"nope"' in outcome.result and '3 entries in "elements"' in outcome.result
    assert 'call search_entities with kind "elements"' in outcome.result


def test_unknown_id_in_an_empty_section_says_so() -> None:
    outcome = unknown_id("layers", "l1", 0)
    assert 'no "layers" entries' in outcome.result and "search_entities" not in outcome.result


def test_unknown_id_echo_is_sanitized_and_capped() -> None:
    outcome = unknown_id("elements", END_MARKER + "\u202e\x00" + "A" * 200, 1)
    assert "<<<" not in outcome.result and "\u202e" not in outcome.result and "\x00" not in outcome.result
    assert "A" * 81 not in outcome.result and "…" in outcome.result


def test_invalid_filter_lists_the_filters_that_apply() -> None:
    outcome = invalid_filter("protocol", "elements", ("text", "name"))
    assert outcome.result.startswith("invalid_filter: ")
    assert 'The filter "protocol" does not apply to kind "elements"' in outcome.result
    assert "text, name" in outcome.result


def test_offset_out_of_range_gives_the_valid_range() -> None:
    outcome = offset_out_of_range("threats", 12, 12)
    assert outcome.result.startswith("offset_out_of_range: ")
    assert "12" in outcome.result and "from 0 to 11" in outcome.result
    assert "only valid offset is 0" in offset_out_of_range("threats", 4, 1).result


def test_entity_too_large_points_at_the_compact_projection() -> None:
    outcome = entity_too_large("elements", "big", 9000)
    assert outcome.result.startswith("entity_too_large: ")
    assert "9000 bytes" in outcome.result and "8192-byte" in outcome.result
    assert 'search_entities with kind "elements"' in outcome.result


def test_allowlist_holds_only_plain_key_names() -> None:
    assert all(key.isidentifier() and key == key.lower() for key in READ_RESULT_KEYS)


_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)
_RESULT = st.fixed_dictionaries(
    {"id": _TEXT, "name": _TEXT},
    optional={"count": st.integers(-(2**40), 2**40), "flag": st.booleans(), "tags": st.lists(_TEXT, max_size=3)},
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_RESULT, max_size=12), st.integers(min_value=0, max_value=11), st.integers(1, 50), _TEXT)
def test_an_encoded_page_is_the_canonical_json_of_the_page(
    results: list[dict[str, Any]], offset: int, limit: int, kind: str
) -> None:
    # The page is written from the pieces measured while paging: byte for byte what encoding it whole gives.
    offset = min(offset, max(len(results) - 1, 0))
    envelope = {"tool": "search", "kind": kind}
    payload = paginate(results, offset=offset, limit=limit, envelope=envelope, project=dict)
    encoded = paginate_encoded(results, offset=offset, limit=limit, envelope=envelope, project=dict)
    assert encoded.body == canonical_json(payload)
    assert encoded.size == payload_bytes(payload) == len(encoded.body.encode("utf-8"))


def test_an_envelope_nesting_a_results_key_is_refused() -> None:
    with pytest.raises(RuntimeError):
        paginate_encoded([], offset=0, limit=5, envelope={"tool": "t", "x": {"results": []}}, project=dict)


def test_encoded_success_is_the_same_outcome_as_read_success() -> None:
    payload = {"kind": "elements", "entity": {"id": "a", "name": 'Ä "quoted" ✓'}}
    encoded = encode_payload("get_entity", payload)
    assert encoded.body == canonical_json({**payload, "tool": "get_entity"})
    assert read_success_encoded(encoded) == read_success("get_entity", payload)
