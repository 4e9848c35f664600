"""The regular expressions of an MCP server's input schema, matched in bounded time.

A server's schema is untrusted, and ``prepare`` (which validates the model's input against it) runs
inside the reducer, on the event loop. With Python's ``re`` a pattern such as ``^(x+x+)+y$`` takes
seconds on a 25-character input and minutes on a 30-character one. The validator built for MCP schemas
therefore matches ``pattern``, ``patternProperties`` and ``additionalProperties`` (which reads
``patternProperties``) with the ``regex`` package, whose matcher takes a timeout, under one time budget
per input. When the budget runs out the input is refused (fail closed), and the issue says why.
``unevaluatedProperties`` beside ``patternProperties`` would be evaluated by jsonschema with ``re``, so a
schema combining them is refused when the tool is loaded.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import time
from collections.abc import Iterator, Mapping
from typing import Any, Final

import jsonschema
import regex
from jsonschema.exceptions import ValidationError
from jsonschema.protocols import Validator

__all__ = [
    "PATTERN_BUDGET_S",
    "PatternTimeout",
    "additional_properties",
    "bounded_validator_class",
    "pattern_budget",
    "uses_unbounded_regex",
]

PATTERN_BUDGET_S: Final = 0.025
"""Time all the pattern matches of one input may take together."""

_deadline: contextvars.ContextVar[float] = contextvars.ContextVar("trioloop_mcp_pattern_deadline")


class PatternTimeout(Exception):
    """The schema's patterns could not be matched within the budget (or a pattern is unusable)."""


@contextlib.contextmanager
def pattern_budget(seconds: float = PATTERN_BUDGET_S) -> Iterator[None]:
    """Give the pattern matches made inside the block ``seconds`` in all."""
    token = _deadline.set(time.monotonic() + seconds)
    try:
        yield
    finally:
        _deadline.reset(token)


def _search(pattern: str, text: str) -> bool:
    remaining = _deadline.get(time.monotonic() + PATTERN_BUDGET_S) - time.monotonic()
    if remaining <= 0:
        raise PatternTimeout("its patterns took too long to check")
    try:
        return regex.search(pattern, text, timeout=remaining) is not None
    except TimeoutError:
        raise PatternTimeout("its patterns took too long to check") from None
    except (regex.error, TypeError, ValueError):
        raise PatternTimeout("one of its patterns cannot be used") from None


def _pattern(validator: Validator, patrn: str, instance: Any, schema: Mapping[str, Any]) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not _search(patrn, instance):
        yield ValidationError(f"{instance!r} does not match {patrn!r}")


# ``validator`` is jsonschema's concrete validator: ``descend`` is not part of its typed protocol.
def _pattern_properties(
    validator: Any, patterns: Mapping[str, Any], instance: Any, schema: Mapping[str, Any]
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if _search(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def additional_properties(
    validator: Any, allowed: Any, instance: Any, schema: Mapping[str, Any]
) -> Iterator[ValidationError]:
    """jsonschema's ``additionalProperties``, with the ``patternProperties`` beside it matched in bounded time."""
    if not validator.is_type(instance, "object"):
        return
    named = schema.get("properties", {})
    patterns = schema.get("patternProperties", {})
    extras = [key for key in instance if key not in named and not any(_search(p, key) for p in patterns)]
    if validator.is_type(allowed, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], allowed, path=extra)
    elif not allowed and extras:
        listed = ", ".join(repr(extra) for extra in sorted(extras))
        if patterns:
            verb = "does" if len(extras) == 1 else "do"
            yield ValidationError(
                f"{listed} {verb} not match any of the regexes: {', '.join(map(repr, sorted(patterns)))}"
            )
        else:
            verb = "was" if len(extras) == 1 else "were"
            yield ValidationError(f"Additional properties are not allowed ({listed} {verb} unexpected)")


@functools.cache
def bounded_validator_class(base: type[Validator]) -> type[Validator]:
    """``base`` (a jsonschema draft's validator) with its regex keywords matched in bounded time."""
    keywords = {
        "pattern": _pattern,
        "patternProperties": _pattern_properties,
        "additionalProperties": additional_properties,
    }
    extended: type[Validator] = jsonschema.validators.extend(base, keywords)  # type: ignore[no-untyped-call]
    return extended


def uses_unbounded_regex(schema: Any) -> bool:
    """Whether ``schema`` has both ``patternProperties`` and ``unevaluatedProperties`` anywhere: jsonschema
    would match the former with ``re`` while evaluating the latter, outside our bound."""
    seen: set[str] = set()
    pending = [schema]
    while pending:
        value = pending.pop()
        if isinstance(value, dict):
            seen.update(key for key in ("patternProperties", "unevaluatedProperties") if key in value)
            pending.extend(value.values())
        elif isinstance(value, list):
            pending.extend(value)
    return len(seen) == 2
