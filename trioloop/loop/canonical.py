"""RFC 8785 (JCS) canonical JSON and the input digest that binds a grant to one exact input."""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

__all__ = ["canonical_json", "input_digest"]


def _number(value: float) -> str:
    if not math.isfinite(value):
        raise ValueError("canonical JSON has no representation for NaN or infinity")
    if value == 0:
        return "0"
    if value.is_integer() and abs(value) < 1e21:
        return str(int(value))
    text = repr(value)
    if "e" not in text:
        return text
    # ECMAScript Number::toString: exponent form only outside [1e-6, 1e21), written "1e+21" / "1.5e-7".
    mantissa, exponent = text.split("e")
    exp = int(exponent)
    digits = mantissa.replace(".", "").replace("-", "").rstrip("0") or "0"
    sign = "-" if value < 0 else ""
    point = exp + 1  # position of the decimal point relative to the digit string
    if -6 < point <= 0:
        return f"{sign}0.{'0' * -point}{digits}"
    if 0 < point <= 21:
        if len(digits) <= point:
            return f"{sign}{digits}{'0' * (point - len(digits))}"
        return f"{sign}{digits[:point]}.{digits[point:]}"
    body = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
    return f"{sign}{body}e{'+' if exp > 0 else '-'}{abs(exp)}"


def _encode(value: Any, out: list[str]) -> None:
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, int):
        out.append(str(value))
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


def canonical_json(value: Any) -> str:
    """Serialize a JSON value per RFC 8785: sorted keys (by UTF-16 code units), no whitespace,
    ECMAScript number formatting. Equal values give equal text whatever their key order."""
    out: list[str] = []
    _encode(value, out)
    return "".join(out)


def input_digest(value: Any) -> str:
    """SHA-256 (hex) over the canonical JSON of ``value``."""
    return hashlib.sha256(canonical_json(value).encode("utf-8", "surrogatepass")).hexdigest()
