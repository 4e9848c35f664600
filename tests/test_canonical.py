import json
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trioloop.loop.canonical import canonical_json, input_digest

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)


def shuffled(value: object, rng: random.Random) -> object:
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {k: shuffled(v, rng) for k, v in items}
    if isinstance(value, list):
        return [shuffled(v, rng) for v in value]
    return value


@given(json_values, st.integers(0, 2**32))
def test_canonical_form_is_stable_under_key_reordering(value: object, seed: int) -> None:
    other = shuffled(value, random.Random(seed))
    assert canonical_json(other) == canonical_json(value)
    assert input_digest(other) == input_digest(value)


@given(json_values)
def test_canonical_json_parses_back_to_an_equal_value(value: object) -> None:
    assert json.loads(canonical_json(value)) == value


@given(json_values)
def test_canonical_json_is_idempotent(value: object) -> None:
    text = canonical_json(value)
    assert canonical_json(json.loads(text)) == text


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1.0, "1"),
        (-0.0, "0"),
        (1e21, "1e+21"),
        (1e20, "100000000000000000000"),
        (1.5e-7, "1.5e-7"),
        (0.000001, "0.000001"),
        (123.456, "123.456"),
        ({"b": 1, "a": [True, None]}, '{"a":[true,null],"b":1}'),
        ('\u2028\n"', '"\u2028\\n\\""'),
        ({"\uffff": 1, "\U0001f600": 2}, '{"\U0001f600":2,"\uffff":1}'),  # UTF-16 order: surrogates < U+FFFF
    ],
)
def test_rfc8785_examples(value: object, expected: str) -> None:
    assert canonical_json(value) == expected


def test_non_finite_numbers_are_refused() -> None:
    with pytest.raises(ValueError):
        canonical_json(float("nan"))
    with pytest.raises(ValueError):
        canonical_json({"x": float("inf")})


def test_different_values_give_different_digests() -> None:
    assert input_digest({"id": "web-app"}) != input_digest({"id": "payments-db"})
    assert len(input_digest({})) == 64
