"""Plain input schemas, checked without walking jsonschema's machinery for every call.

Most MCP tools take a few typed properties. For a schema written only with the keywords below, `plain_check`
compiles a predicate, once per tool, that tells whether an input satisfies it: each keyword as the schema's own
validator class defines it (the check is built only when that class uses the function compiled here for the
keyword), its types as that validator's type checker decides them, ``enum`` and ``const`` by jsonschema's own
functions. The predicate only ever says "valid": an input it does not pass is validated by jsonschema, which
decides and says why. A schema with any other keyword its validator acts on (``$ref``, ``pattern``, ``anyOf``...)
gets no predicate; keywords the validator ignores (``description``, ``x-...``) are ignored here too.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping
from typing import Any, Final

import jsonschema
from jsonschema.exceptions import UnknownType
from jsonschema.protocols import Validator

from trioloop.mcp._patterns import additional_properties

__all__ = ["Check", "plain_check"]

Check = Callable[[Any], bool]

#: The keywords compiled here: the check for each has the meaning of jsonschema's function for it in draft 2020-12
#: (which drafts 6 and 7 share but for ``items``), and ours for ``additionalProperties`` (with no
#: ``patternProperties`` beside it, a keyword that is not plain).
_MEANINGS: Final[Mapping[str, object]] = {
    **{
        keyword: jsonschema.Draft202012Validator.VALIDATORS[keyword]
        for keyword in (
            "type",
            "properties",
            "required",
            "enum",
            "const",
            "minLength",
            "maxLength",
            "minimum",
            "maximum",
            "exclusiveMinimum",
            "exclusiveMaximum",
            "items",
            "minItems",
            "maxItems",
            "format",
        )
    },
    "additionalProperties": additional_properties,
}
#: Length keywords: the type they apply to, and whether they set a least length (else a greatest).
_SIZES: Final[Mapping[str, tuple[str, bool]]] = {
    "minLength": ("string", True),
    "maxLength": ("string", False),
    "minItems": ("array", True),
    "maxItems": ("array", False),
}
_BOUNDS: Final[Mapping[str, Callable[[Any, Any], bool]]] = {
    "minimum": lambda value, bound: not value < bound,
    "maximum": lambda value, bound: not value > bound,
    "exclusiveMinimum": lambda value, bound: not value <= bound,
    "exclusiveMaximum": lambda value, bound: not value >= bound,
}


#: The types of the type checker drafts 6 to 2020-12 share, as plain predicates: the same tests as its functions,
#: without a lookup and two calls per test.
_STANDARD_CHECKER: Final = jsonschema.Draft202012Validator.TYPE_CHECKER
_STANDARD_TYPES: Final[Mapping[str, Check]] = {
    "array": lambda instance: isinstance(instance, list),
    "boolean": lambda instance: isinstance(instance, bool),
    "integer": lambda instance: (
        not isinstance(instance, bool)
        and (isinstance(instance, int) or (isinstance(instance, float) and instance.is_integer()))
    ),
    "null": lambda instance: instance is None,
    "number": lambda instance: not isinstance(instance, bool) and isinstance(instance, numbers.Number),
    "object": lambda instance: isinstance(instance, dict),
    "string": lambda instance: isinstance(instance, str),
}


class _NotPlain(Exception):
    """The schema uses something only jsonschema checks."""


def plain_check(validator: Validator) -> Check | None:
    """A predicate true only for inputs ``validator`` finds no error in, or None for a schema that is not plain."""
    if getattr(validator, "format_checker", None) is not None:  # "format" then asserts something
        return None
    try:
        return _compile(validator, validator.schema)
    except (_NotPlain, RecursionError):
        return None


def _compile(validator: Validator, schema: Any) -> Check:
    if isinstance(schema, bool):
        return lambda instance: schema
    if not isinstance(schema, dict):
        raise _NotPlain
    for keyword in schema:
        meaning = validator.VALIDATORS.get(keyword)
        if meaning is not None and _MEANINGS.get(keyword) is not meaning:
            raise _NotPlain
    checks = [
        check
        for keyword in schema
        if keyword in validator.VALIDATORS and (check := _keyword(validator, keyword, schema)) is not None
    ]
    if len(checks) == 1:
        return checks[0]
    return lambda instance: all(check(instance) for check in checks)


def _of_type(validator: Validator, name: str) -> Check:
    """Whether an instance is of JSON type ``name``, as ``validator`` decides it."""
    if validator.TYPE_CHECKER is _STANDARD_CHECKER and name in _STANDARD_TYPES:
        return _STANDARD_TYPES[name]
    try:
        validator.is_type(None, name)
    except UnknownType:
        raise _NotPlain from None
    return lambda instance: validator.is_type(instance, name)


def _keyword(validator: Validator, keyword: str, schema: dict[str, Any]) -> Check | None:
    """The check for one keyword of ``schema``, as that keyword's jsonschema function decides (None: no check)."""
    value = schema[keyword]
    if keyword == "type":
        tests = [_of_type(validator, name) for name in ([value] if isinstance(value, str) else value)]
        if len(tests) == 1:
            return tests[0]
        return lambda instance: any(test(instance) for test in tests)
    if keyword in _SIZES:
        kind, at_least = _SIZES[keyword]
        sized = _of_type(validator, kind)
        if at_least:
            return lambda instance: not sized(instance) or not len(instance) < value
        return lambda instance: not sized(instance) or not len(instance) > value
    if keyword in _BOUNDS:
        within, is_number = _BOUNDS[keyword], _of_type(validator, "number")
        return lambda instance: not is_number(instance) or within(instance, value)
    if keyword in ("enum", "const"):  # jsonschema's own function: its equality tells True from 1
        test = validator.VALIDATORS[keyword]
        return lambda instance: next(iter(test(validator, value, instance, schema) or ()), None) is None
    if keyword == "items":
        is_array = _of_type(validator, "array")
        if value is False:
            return lambda instance: not is_array(instance) or not instance
        each = _compile(validator, value)
        return lambda instance: not is_array(instance) or all(each(item) for item in instance)
    is_object = _of_type(validator, "object")
    if keyword == "properties":
        subs = tuple((name, _compile(validator, sub)) for name, sub in value.items())
        return lambda instance: (
            not is_object(instance) or all(check(instance[name]) for name, check in subs if name in instance)
        )
    if keyword == "required":
        names = tuple(value)
        return lambda instance: not is_object(instance) or all(name in instance for name in names)
    if keyword == "additionalProperties":
        named = schema.get("properties", {})
        if validator.is_type(value, "object"):
            extra = _compile(validator, value)
            return lambda instance: (
                not is_object(instance) or all(extra(instance[key]) for key in instance if key not in named)
            )
        if value:
            return None
        return lambda instance: not is_object(instance) or all(key in named for key in instance)
    return None  # "format", with no format checker: asserts nothing
