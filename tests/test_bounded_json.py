"""parse_bounded_json: strict JSON, refused typed, and never more than 8x the text's size in memory.

Memory is measured with tracemalloc: the peak of what the call allocates (the input itself is not
counted), against ``MEMORY_RATIO * len(data) + MEMORY_ALLOWANCE``.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trioloop.durable import bounded_json as _bounded_json
from trioloop.durable.bounded_json import MEMORY_ALLOWANCE, MEMORY_RATIO, parse_bounded_json

MAX_BYTES = 64 * 1024 * 1024


class Refused(ValueError):
    pass


def _parse(data: bytes | bytearray | str, *, max_bytes: int = MAX_BYTES, max_depth: int = 128) -> Any:
    return parse_bounded_json(data, max_bytes=max_bytes, max_depth=max_depth, error=Refused)


def _peak(call: Callable[[], Any]) -> tuple[int, Any]:
    """(bytes allocated at the peak of ``call``, its result or the ValueError it raised)."""
    outer = tracemalloc.is_tracing()
    if not outer:
        tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        try:
            result = call()
        except ValueError as error:
            result = error
        return tracemalloc.get_traced_memory()[1] - start, result
    finally:
        if not outer:
            tracemalloc.stop()


def _bound(data: bytes) -> int:
    return MEMORY_RATIO * len(data) + MEMORY_ALLOWANCE


def _many(item: bytes, count: int, open_: bytes = b"[", close: bytes = b"]") -> bytes:
    return open_ + b",".join([item] * count) + close


# name -> (text, what happens: a phrase of the refusal, or None when it is read)
HOSTILE: dict[str, tuple[bytes, str | None]] = {
    # 2.9 MiB: json.loads alone holds about 70 MiB of dicts for it.
    "a million {}": (_many(b"{}", 1_000_000), "more memory"),
    "a million []": (_many(b"[]", 1_000_000), "more memory"),
    "a million [0]": (_many(b"[0]", 1_000_000), "more memory"),
    "a million floats": (_many(b"1.5", 1_000_000), "more memory"),
    "a million {}, then junk": (_many(b"{}", 1_000_000) + b"x", "more memory"),
    "150,000 one-key objects": (_many(b'{"a":0}', 150_000), "more memory"),
    "50,000 two-key objects": (_many(b'{"a":0,"b":0}', 50_000), "more memory"),
    "100,000 distinct keys": (b"{" + b",".join(b'"%d":0' % i for i in range(100_000)) + b"}", "more memory"),
    "100,000 short strings": (_many(b'"ab"', 100_000), "more memory"),
    "100,000 levels deep": (b"[" * 100_000 + b"]" * 100_000, "not valid JSON"),
    "129 levels deep, around a million {}": (b"[" * 129 + _many(b"{}", 1_000_000) + b"]" * 129, "nests deeper"),
    "huge exponents": (_many(b"1e999999", 30_000), "too large for a float"),
    "an unterminated string of escaped quotes": (b'"' + b'\\"' * 1_000_000, "not valid JSON"),
    # Read: "" and 0 are shared objects (a list slot each), and an int costs under 8 times its digits.
    "50,000 empty strings": (_many(b'""', 50_000), None),
    "50,000 zeros": (_many(b"0", 50_000), None),
    "100,000 ints": (_many(b"1000", 100_000), None),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_text_takes_at_most_eight_times_its_size(name: str) -> None:
    data, reason = HOSTILE[name]
    peak, result = _peak(lambda: _parse(data))
    if reason is None:
        assert result == json.loads(data)
    else:
        assert isinstance(result, Refused), result
        assert reason in str(result)
    assert peak <= _bound(data), f"{name}: {peak / len(data):.1f} times its size"


def test_the_scan_is_linear_and_stops_at_the_budget() -> None:
    # An unterminated string is one token to the end (no rescan from every quote), and a million
    # {} is refused from a count of its brackets: each takes a fraction of a second.
    for data in (b'"' + b'\\"' * 2_000_000, _many(b"{}", 2_000_000), _many(b'{"a":0}', 300_000)):
        began = time.perf_counter()
        with pytest.raises(Refused):
            _parse(data)
        assert time.perf_counter() - began < 1.5


def test_json_loads_alone_would_take_far_more() -> None:
    # What the bound is for: the same million {} costs json.loads about 24 times its size.
    data = HOSTILE["a million {}"][0]
    text = data.decode()
    peak, _ = _peak(lambda: json.loads(text))
    assert peak > 20 * len(data) > 2 * _bound(data)


def _conversation(turns: int, text: str = "café \u2028 \U0001f600") -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for turn in range(turns):
        call = f"toolu_{turn:05d}"
        tool_call = {
            "type": "tool_call",
            "id": call,
            "name": "add_threat",
            "input": {"threat": {"title": f"Spoofed webhook {turn}", "score": 7.5, "tags": ["a", "b"]}},
        }
        messages += [
            {"role": "user", "content": [{"type": "text", "text": f"add threat {turn}, {text}"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "Adding it."}, tool_call]},
            {"role": "user", "content": [{"type": "tool_result", "call_id": call, "content": "ok", "is_error": False}]},
            {"role": "assistant", "content": [{"type": "text", "text": "Done."}]},
        ]
    return messages


DOCUMENT = "".join(f'  - id: threat-{i}\n    title: "Spoofed \\ webhook" \u00e9 {i}\n' for i in range(15_000))
LEGIT = {
    "a conversation, indented": json.dumps({"messages": _conversation(1_000)}, indent=1).encode(),
    "a conversation, compact": json.dumps({"messages": _conversation(300)}, separators=(",", ":")).encode(),
    "a conversation, raw UTF-8": json.dumps(
        {"messages": _conversation(600, "café, 中文")}, ensure_ascii=False
    ).encode(),
    "a document as one string": json.dumps({"document": DOCUMENT, "undo": [DOCUMENT] * 2}).encode(),
    "a document, raw UTF-8": json.dumps({"document": DOCUMENT}, ensure_ascii=False).encode(),
    "a document with an emoji at the end": json.dumps({"document": DOCUMENT + "\U0001f600"}).encode(),
    "big integers": json.dumps([10**4000] * 100).encode(),
    "128 levels deep": b"[" * 128 + b"]" * 128,
}


@pytest.mark.parametrize("name", list(LEGIT))
def test_legitimate_text_is_read_within_eight_times_its_size(name: str) -> None:
    data = LEGIT[name]
    peak, result = _peak(lambda: _parse(data))
    assert not isinstance(result, ValueError), result
    assert result == json.loads(data)
    assert peak <= _bound(data), f"{name}: {peak / len(data):.1f} times its size"


def test_raw_non_ascii_text_is_refused_only_when_reading_it_really_costs_more() -> None:
    # An emoji in every message makes the decoded str 4 bytes a character throughout: the parse
    # would really hold more than the bound, so refusing it is honest (ensure_ascii=True is read).
    data = json.dumps({"messages": _conversation(1_500)}, ensure_ascii=False, separators=(",", ":")).encode()
    text = data.decode()
    real, _ = _peak(lambda: json.loads(text))
    assert real + sys.getsizeof(text) > _bound(data)
    with pytest.raises(Refused, match="more memory"):
        _parse(data)
    escaped = json.dumps({"messages": _conversation(1_500)}, indent=1).encode()
    assert _parse(escaped) == json.loads(data)


def test_a_long_string_full_of_escapes_costs_no_regex_stack() -> None:
    # (?:[^"\\]|\\.)* would hold ~100 bytes of backtracking stack per character: 500 MiB here.
    data = json.dumps(['line "quoted"\n' * 300_000]).encode()
    peak, result = _peak(lambda: _parse(data))
    assert isinstance(result, list)
    assert peak <= 3 * len(data)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"[NaN]", "NaN, which JSON does not have"),
        (b"[Infinity]", "Infinity, which JSON does not have"),
        (b'{"a": -Infinity}', "-Infinity, which JSON does not have"),
        (b"[1e400]", "too large for a float"),
        (b"[-1e400]", "too large for a float"),
        (b'{"a": {"b": 1, "b": 2}}', "repeats a key"),
        (b'[{"a": 1, "\\u0061": 2}]', "repeats a key"),  # the same key, written two ways
        (b"[" * 129 + b"]" * 129, "nests deeper than 128 levels"),
        (b'{"a":' * 129 + b"1" + b"}" * 129, "nests deeper than 128 levels"),
        (b"\xef\xbb\xbf{}", "not valid JSON"),  # a byte order mark
        (b"{} {}", "not valid JSON"),
        (b"[1,]", "not valid JSON"),
        (b"{'a': 1}", "not valid JSON"),
        (b'["\x01"]', "not valid JSON"),  # a raw control character
        (b"[" + b"9" * 5000 + b"]", "not valid JSON"),  # past int's 4,300 digits
        (b"", "not valid JSON"),
        (b'{"a": "\xff"}', "not UTF-8"),
        (b'"\xed\xa0\x80"', "not UTF-8"),  # an encoded surrogate
    ],
)
def test_strict_json_only(data: bytes, reason: str) -> None:
    with pytest.raises(Refused, match=reason):
        _parse(data)


def test_what_is_read() -> None:
    assert _parse(b' {"a": [1, 2.5, -0.0, 1e-400, true, false, null, "\\ud83d\\ude00"]} ') == {
        "a": [1, 2.5, -0.0, 0.0, True, False, None, "\U0001f600"]
    }
    assert _parse(bytearray(b"[1]")) == [1]
    assert _parse('{"é": "\\u00e9"}') == {"é": "é"}
    assert _parse("[" * 128 + "]" * 128, max_depth=128) is not None


def test_size_is_capped_in_utf8_bytes_before_anything_else() -> None:
    with pytest.raises(Refused, match="larger than 9 bytes"):
        _parse(b'["abcdefgh"]' + b"\xff", max_bytes=9)
    assert _parse('"éé"', max_bytes=6) == "éé"  # 6 bytes of UTF-8, 4 characters
    with pytest.raises(Refused, match="larger than 5 bytes"):
        _parse('"éé"', max_bytes=5)


def test_only_the_callers_error_escapes_and_it_never_echoes_the_text() -> None:
    with pytest.raises(Refused, match="must be bytes or text"):
        _parse(123)  # type: ignore[arg-type]
    secret = b'{"token": "sk-secret", "token": 1}'
    with pytest.raises(Refused) as caught:
        _parse(secret)
    assert "sk-secret" not in str(caught.value) and caught.value.__cause__ is None


def test_nesting_past_the_parsers_own_reach_is_still_refused_typed() -> None:
    # Past the Python recursion limit (3.11's C scanner stops there) and past the C recursion limit that
    # 3.12 and later apply to it instead (3.13 lets 9,000 levels through), yet within the memory bound.
    depth = max(sys.getrecursionlimit() + 10, 12_000)
    deep = "[" * depth + "]" * depth
    with pytest.raises(Refused, match="not valid JSON"):
        _parse(deep, max_depth=10**6)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(json_values, st.booleans(), st.sampled_from([None, 1, 2]))
def test_any_json_value_round_trips(value: Any, ascii_only: bool, indent: int | None) -> None:
    text = json.dumps(value, ensure_ascii=ascii_only, indent=indent)
    assert _parse(text.encode()) == value
    assert _parse(text) == value


@settings(max_examples=40, deadline=None)
@given(json_values, st.booleans())
def test_the_price_bounds_what_the_parse_holds(value: Any, ascii_only: bool) -> None:
    # Repeated so the structure, not the parser's fixed state, dominates what is measured.
    text = json.dumps([value] * 300, ensure_ascii=ascii_only)
    _, price = _bounded_json._census(
        text, base=_bounded_json._PARSER, budget=10**12, max_depth=10**6, subject="the text"
    )
    peak, parsed = _peak(lambda: _bounded_json._entries(json.loads(text), 10**6, "the text"))
    assert not isinstance(parsed, ValueError)
    assert peak <= price


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200) | st.text(max_size=100).map(str.encode))
def test_arbitrary_bytes_are_read_or_refused_typed(data: bytes) -> None:
    with contextlib.suppress(Refused):
        _parse(data)
