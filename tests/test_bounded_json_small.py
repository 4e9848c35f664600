"""Short texts are read without the census (`SMALL_TEXT_BYTES`): the same values and the same refusals, in the
same words, and still within the memory budget whatever they hold."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from strategies_document import json_values
from test_bounded_json import _bound, _peak

from trioloop.durable import bounded_json
from trioloop.durable.bounded_json import SMALL_TEXT_BYTES, parse_bounded_json


def _read(text: str | bytes, *, small: bool, max_depth: int = 8) -> Any:
    saved = bounded_json.SMALL_TEXT_BYTES
    bounded_json.SMALL_TEXT_BYTES = saved if small else -1  # type: ignore[misc]
    try:
        return parse_bounded_json(text, max_bytes=1 << 20, max_depth=max_depth, error=ValueError)
    except ValueError as exc:
        return ("refused", str(exc))
    finally:
        bounded_json.SMALL_TEXT_BYTES = saved  # type: ignore[misc]


_JSONISH = st.text(alphabet='{}[]":,\\ \t\n0123456789.eE+-truefalsnNIiy\u00e9\U0001f600ab', max_size=60)


def _mutated(draw: st.DrawFn) -> str:
    text = json.dumps(draw(json_values), ensure_ascii=draw(st.booleans()))
    if draw(st.booleans()) and text:
        at = draw(st.integers(0, len(text) - 1))
        text = text[:at] + draw(_JSONISH) + text[at + draw(st.integers(0, 3)) :]
    return text


@settings(max_examples=400, deadline=None)
@given(st.one_of(_JSONISH, st.composite(_mutated)()), st.integers(1, 6))
@example('{"a":1,"a":2}', 4)
@example('{"a":"x\\":","a":2}', 4)
@example('{"a":{"b":"]","b":1}}', 4)
@example("[[[[[[[[1]]]]]]]]", 4)
@example("[NaN]", 4)
@example("[1e999]", 4)
@example('"\\ud800"', 4)
@example("[" * 3000 + "]" * 3000, 4)
def test_the_short_path_reads_and_refuses_exactly_as_the_census_does(text: str, max_depth: int) -> None:
    fast, slow = _read(text, small=True, max_depth=max_depth), _read(text, small=False, max_depth=max_depth)
    assert fast == slow
    assert type(fast) is type(slow)


def _worst(item: bytes) -> bytes:
    count = (SMALL_TEXT_BYTES - 2) // (len(item) + 1)
    return b"[" + b",".join([item] * count) + b"]"


@pytest.mark.parametrize("item", [b"{}", b"[]", b'{"a":0}', b'"ab"', b"1.5", b'["\\u00e9"]', b"[[[]]]"])
def test_a_short_text_of_any_shape_stays_within_the_budget(item: bytes) -> None:
    data = _worst(item)
    assert len(data) <= SMALL_TEXT_BYTES
    peak, result = _peak(lambda: parse_bounded_json(data, max_bytes=len(data), max_depth=8, error=ValueError))
    assert not isinstance(result, ValueError)
    assert peak <= _bound(data)
