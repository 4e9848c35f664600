import hashlib
import json
import random

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from trioloop.machine import canonical
from trioloop.machine.canonical import canonical_json, input_digest

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


def _as_doubles(value: object) -> object:
    """The value as RFC 8785 sees it: every number an IEEE double."""
    if isinstance(value, dict):
        return {k: _as_doubles(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_doubles(v) for v in value]
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return value


@given(json_values)
def test_canonical_json_parses_back_to_an_equal_value(value: object) -> None:
    # An integral float at or above 2**53 is written in its shortest ECMAScript form (4.081293495242753e16
    # -> 40812934952427530), which parses back as an int with the same double value, not the same int.
    assert _as_doubles(json.loads(canonical_json(value))) == _as_doubles(value)


# Every value RFC 8785 defines: I-JSON integers, any finite double, strings of Unicode scalar values.
_scalar_text = st.text(st.characters(exclude_categories=["Cs"]))
i_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53) + 1, 2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.floats(min_value=2.0**53, max_value=1e22).map(float.__round__).map(float)
    | _scalar_text,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(_scalar_text, inner, max_size=5),
    max_leaves=30,
)


@settings(max_examples=300)
@given(i_json_values)
def test_canonical_json_is_byte_identical_to_the_rfc8785_package(value: object) -> None:
    assert canonical_json(value).encode("utf-8") == rfc8785.dumps(value)  # type: ignore[arg-type]


@settings(max_examples=300)
@given(st.floats(allow_nan=False, allow_infinity=False))
def test_every_finite_double_is_formatted_as_rfc8785_formats_it(value: float) -> None:
    assert canonical_json(value).encode("utf-8") == rfc8785.dumps(value)


@given(st.dictionaries(_scalar_text, st.integers(-(2**53) + 1, 2**53 - 1) | _scalar_text | st.none(), max_size=6))
def test_the_fast_path_gives_the_pure_encoders_text(value: dict[str, object]) -> None:
    # Keys with characters at or above U+D800 leave the fast path; the others take it.
    out: list[str] = []
    canonical._encode(value, out)
    assert canonical_json(value) == "".join(out)


_no_float_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1) | _scalar_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_scalar_text, inner, max_size=4),
    max_leaves=20,
)


@given(_no_float_json)
def test_the_reused_c_encoder_gives_the_pure_encoders_text_at_any_depth(value: object) -> None:
    # The fast path keeps one C encoder for every call (no cycle markers: it only takes values in which no
    # container appears twice); nested lists, objects, booleans and null must come out as RFC 8785 has them.
    assert canonical._C_ENCODE is not None  # CPython: the accelerated encoder is the one in use
    out: list[str] = []
    canonical._encode(value, out)
    assert canonical_json(value) == "".join(out)


def test_a_value_holding_one_list_twice_leaves_the_fast_path_and_still_encodes() -> None:
    shared = [1, 2]
    assert not canonical._fast_path_applies({"a": shared, "b": shared})
    assert canonical_json({"a": shared, "b": shared}) == '{"a":[1,2],"b":[1,2]}'


def test_integral_doubles_at_or_above_2_to_the_53_use_the_ecmascript_form() -> None:
    assert canonical_json(4.081293495242753e16) == "40812934952427530"
    assert canonical_json(2.0**53) == "9007199254740992"
    assert canonical_json([-1e21, 1e-7, 5e-324]) == "[-1e+21,1e-7,5e-324]"


@pytest.mark.parametrize("big", [2**53, -(2**53), 2**64 + 1, -(10**40) - 7])
def test_integers_outside_i_json_have_a_defined_digest(big: int) -> None:
    # Defined as their exact decimal digits (rfc8785 refuses them), so distinct integers stay distinct.
    with pytest.raises(rfc8785.IntegerDomainError):
        rfc8785.dumps(big)
    assert canonical_json({"n": big}) == f'{{"n":{big}}}'
    expected = hashlib.sha256(f'{{"n":{big}}}'.encode()).hexdigest()
    assert input_digest({"n": big}) == expected
    assert input_digest({"n": big}) != input_digest({"n": big + 1})
    assert canonical_json({"n": big, "f": 0.5}) == f'{{"f":0.5,"n":{big}}}'  # the pure encoder agrees


def test_lone_surrogates_are_hashed_with_surrogates_passed_through() -> None:
    text = json.loads('"\\ud800"')
    assert canonical_json(text) == '"\ud800"'
    assert input_digest(text) == hashlib.sha256(b'"\xed\xa0\x80"').hexdigest()


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
