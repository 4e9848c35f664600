"""RFC 8785 (JCS) canonical JSON and the input digest that binds a grant to one exact input.

Conformance: for every JSON value RFC 8785 defines (I-JSON: integers within +/-(2**53 - 1), finite
floats, strings of Unicode scalar values) `canonical_json` gives the RFC's text, byte for byte;
``tests/test_canonical.py`` checks that against the ``rfc8785`` package over arbitrary values.

Two extensions, because a model's JSON can carry values I-JSON excludes and a digest must exist
for every input a tool can receive:

* An integer outside +/-(2**53 - 1) (a Python ``int``, exact however large) is written as its exact
  decimal digits, as ``json.dumps`` writes it. RFC 8785 leaves such integers undefined (the
  ``rfc8785`` package refuses them); ours keeps every distinct integer distinct. Its text equals a
  float's only when the float's RFC 8785 form has the same digits (``2**60`` and ``float(2**60)``).
* A string holding a lone surrogate (``json.loads`` accepts ``"\\ud800"``) is written as such and
  hashed as its UTF-8 bytes with surrogates passed through (``surrogatepass``).

A fast path serializes through the stdlib's C encoder (sorted keys, no whitespace) when that is the
RFC's text: no floats anywhere, and no key holding a character at or above U+D800 (below it, the
UTF-16 order RFC 8785 sorts by is the code point order ``sort_keys`` uses). Otherwise the pure
encoder below runs.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from typing import Any

__all__ = ["canonical_json", "input_digest"]

_EXACT_INTEGER = 2**53
_FAST = json.JSONEncoder(ensure_ascii=False, allow_nan=False, sort_keys=True, separators=(",", ":"))


def _not_json(value: object) -> object:
    raise TypeError(f"not a JSON value: {type(value).__name__}")


def _c_encoder() -> Callable[[Any, int], Any] | None:
    """The C encoder behind ``_FAST``, made once: ``JSONEncoder.encode`` builds a new one per call, which
    costs more than encoding a tool input. No cycle markers: the fast path only takes values in which no
    container appears twice. None where CPython's ``_json`` accelerator is missing."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return None
    try:
        encoder: Callable[[Any, int], Any] = make(
            None, _not_json, json.encoder.encode_basestring, None, ":", ",", True, False, False
        )
    except TypeError:  # a CPython whose accelerator takes other arguments: use the public encoder
        return None
    return encoder


_C_ENCODE = _c_encoder()


def _encode_fast(value: Any) -> str:
    if _C_ENCODE is None or not isinstance(value, dict | list | tuple):
        return _FAST.encode(value)
    return "".join(_C_ENCODE(value, 0))


def _number(value: float) -> str:
    """ECMAScript Number::toString (ECMA-262 7.1.12.1), as RFC 8785 section 3.2.2.3 requires."""
    if not math.isfinite(value):
        raise ValueError("canonical JSON has no representation for NaN or infinity")
    if value == 0:
        return "0"
    if value.is_integer() and abs(value) < _EXACT_INTEGER:
        return str(int(value))  # exact, and the shortest form too: every digit is significant
    # repr gives the shortest digits that round-trip (what ECMAScript uses); only the layout differs.
    sign = "-" if value < 0 else ""
    mantissa, _, exponent = repr(abs(value)).partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = whole + fraction
    significant = digits.lstrip("0")
    # value = 0.<significant> x 10**point
    point = int(exponent or "0") + len(whole) - (len(digits) - len(significant))
    significant = significant.rstrip("0")
    count = len(significant)
    if count <= point <= 21:
        return f"{sign}{significant}{'0' * (point - count)}"
    if 0 < point <= 21:
        return f"{sign}{significant[:point]}.{significant[point:]}"
    if -6 < point <= 0:
        return f"{sign}0.{'0' * -point}{significant}"
    power = point - 1
    body = significant[0] + ("." + significant[1:] if count > 1 else "")
    return f"{sign}{body}e{'+' if power > 0 else '-'}{abs(power)}"


def _encode(value: Any, out: list[str]) -> None:
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, int):
        out.append(int.__repr__(value))
    elif isinstance(value, float):
        out.append(_number(value))
    elif isinstance(value, str):
        out.append(json.dumps(value, ensure_ascii=False))
    elif isinstance(value, dict):
        items = sorted(value.items(), key=lambda kv: _utf16_key(kv[0]))
        out.append("{")
        for index, (key, item) in enumerate(items):
            if index:
                out.append(",")
            out.append(json.dumps(key, ensure_ascii=False))
            out.append(":")
            _encode(item, out)
        out.append("}")
    elif isinstance(value, list | tuple):
        out.append("[")
        for index, item in enumerate(value):
            if index:
                out.append(",")
            _encode(item, out)
        out.append("]")
    else:
        raise TypeError(f"not a JSON value: {type(value).__name__}")


def _utf16_key(key: object) -> bytes:
    if not isinstance(key, str):
        raise TypeError("JSON object keys must be strings")
    return key.encode("utf-16-be", "surrogatepass")


_PLAIN_SCALARS = frozenset({str, int, bool, type(None)})


def _fast_path_applies(value: Any) -> bool:
    """True when the C encoder's text is the RFC's: exact JSON types, no float, keys below U+D800."""
    stack = [value]
    seen: set[int] = set()
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind in _PLAIN_SCALARS:
            continue
        if id(item) in seen:
            return False  # shared or cyclic: the pure encoder decides (a cycle fails there)
        seen.add(id(item))
        if kind is dict:
            for key in item:
                if type(key) is not str or not (key.isascii() or max(key, default="") < "\ud800"):
                    return False
            stack.extend(item.values())
        elif kind is list or kind is tuple:
            stack.extend(item)
        else:
            return False  # a float, a subclass, or not JSON at all: the pure encoder decides
    return True


def canonical_json(value: Any) -> str:
    """Serialize a JSON value per RFC 8785: sorted keys (by UTF-16 code units), no whitespace,
    ECMAScript number formatting. Equal values give equal text whatever their key order."""
    if _fast_path_applies(value):
        return _encode_fast(value)
    out: list[str] = []
    _encode(value, out)
    return "".join(out)


def input_digest(value: Any) -> str:
    """SHA-256 (hex) over the canonical JSON of ``value`` in UTF-8 (lone surrogates passed through)."""
    return canonical_digest(canonical_json(value))


def canonical_digest(text: str) -> str:
    """`input_digest` of the value whose canonical JSON is ``text`` (for a caller that has the text already)."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
