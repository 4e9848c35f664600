"""A server's ``elicitation/create`` as a question for the person, and the person's answer as the server's result.

The requested schema of a form is the flat object MCP allows: string (with ``format``, lengths, ``enum`` with
``enumNames`` or ``oneOf`` of ``const``/``title``), number, integer (with bounds), boolean, and an array of
choices (``items.enum`` or ``items.anyOf``, with ``minItems``/``maxItems``), each with an optional ``default``
that the card shows filled in (SEP-1034). Anything else is refused with an error to the server: the person is
never shown a form that cannot be answered faithfully.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Final

import mcp_types

from trioloop.machine.questions import MAX_FIELDS, Answer, FieldKind, QuestionField
from trioloop.machine.untrusted_text import sanitize_scalar

__all__ = ["UnusableRequest", "elicit_result", "question_parts"]

_log = logging.getLogger("trioloop.mcp")

_FORMATS: Final = frozenset({"email", "uri", "date", "date-time"})


class UnusableRequest(ValueError):
    """A server's request that cannot be shown to the person as asked; the message says why (sanitized)."""


def question_parts(params: mcp_types.ElicitRequestParams) -> dict[str, Any]:
    """``ctx.ask``'s keyword arguments (message, and fields or url) for the server's request."""
    if isinstance(params, mcp_types.ElicitRequestURLParams):
        return {"message": params.message, "url": params.url}
    return {"message": params.message, "fields": _fields(params.requested_schema)}


def _fields(schema: Mapping[str, Any]) -> tuple[QuestionField, ...]:
    if schema.get("type", "object") != "object":
        raise UnusableRequest("the requested schema is not an object")
    properties = schema.get("properties") or {}
    required = schema.get("required") or []
    if not isinstance(properties, Mapping) or not isinstance(required, list):
        raise UnusableRequest("the requested schema's properties or required list is malformed")
    if len(properties) > MAX_FIELDS:
        raise UnusableRequest(f"the form has more than {MAX_FIELDS} fields")
    return tuple(_field(str(name), prop, name in required) for name, prop in properties.items())


def _field(name: str, prop: Any, required: bool) -> QuestionField:
    shown = sanitize_scalar(name, 64)[0]
    if not isinstance(prop, Mapping):
        raise UnusableRequest(f'field "{shown}" is not a schema')
    kind, options = _kind(shown, prop)
    text = prop.get("type") == "string" and kind == "text"
    if kind == "choices":
        low, high = "minItems", "maxItems"
    else:
        low, high = ("minLength", "maxLength") if text else ("minimum", "maximum")
    fmt = prop.get("format", "") if text else ""
    if fmt and fmt not in _FORMATS:
        fmt = ""  # an unknown format is a hint a person can do without; the value is still text
    parts: dict[str, Any] = {
        "name": name,
        "kind": kind,
        "title": prop.get("title", ""),
        "description": prop.get("description", ""),
        "required": required,
        "options": options,
        "minimum": _number(prop.get(low)),
        "maximum": _number(prop.get(high)),
        "format": fmt,
    }
    try:
        return QuestionField(**parts, default=prop.get("default"))
    except ValueError as exc:
        if "default" not in str(exc):
            raise UnusableRequest(f'field "{shown}" cannot be shown ({exc})') from None
    _log.info('MCP elicitation: the default of field "%s" does not fit it and is not shown', shown)
    try:
        return QuestionField(**parts)
    except (TypeError, ValueError) as exc:
        raise UnusableRequest(f'field "{shown}" cannot be shown ({exc})') from None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _kind(shown: str, prop: Mapping[str, Any]) -> tuple[FieldKind, tuple[tuple[str, str], ...]]:
    kind = prop.get("type")
    if kind == "string":
        if "enum" in prop or "oneOf" in prop:
            return "choice", _options(shown, prop)
        return "text", ()
    if kind in ("number", "integer", "boolean"):
        return kind, ()
    if kind == "array":
        items = prop.get("items")
        if isinstance(items, Mapping) and ("enum" in items or "anyOf" in items):
            return "choices", _options(shown, items, key="anyOf")
    raise UnusableRequest(f'field "{shown}" has a type a form cannot ask for ({sanitize_scalar(str(kind), 40)[0]})')


def _options(shown: str, prop: Mapping[str, Any], key: str = "oneOf") -> tuple[tuple[str, str], ...]:
    values = prop.get("enum")
    if isinstance(values, list):
        names = prop.get("enumNames")
        labels = names if isinstance(names, list) and len(names) == len(values) else values
        pairs = list(zip(values, labels, strict=True))
    else:
        choices = prop.get(key)
        if not isinstance(choices, list):
            raise UnusableRequest(f'field "{shown}" has malformed choices')
        pairs = [(c.get("const"), c.get("title", c.get("const"))) for c in choices if isinstance(c, Mapping)]
    if not pairs or not all(isinstance(value, str) for value, _ in pairs):
        raise UnusableRequest(f'field "{shown}" has choices that are not text')
    return tuple((value, str(label)) for value, label in pairs)


def elicit_result(answer: Answer) -> mcp_types.ElicitResult:
    """The person's answer as the server gets it (a form's values only when accepted)."""
    if answer.action != "accept" or not answer.content:
        return mcp_types.ElicitResult(action=answer.action)
    return mcp_types.ElicitResult(action="accept", content=dict(answer.content))
