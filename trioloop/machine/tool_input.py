"""Tool inputs from attrs classes: one class gives both the JSON schema the model sees (`json_schema_for`) and
the strict validation of what the model sends (`structure_input`: no coercion, no extra keys, every issue named
by its path); `tool_field` declares a field's constraints once, for both.
"""

from __future__ import annotations

import enum
import math
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal, TypeAlias, TypeVar

import attrs
import cattrs
from cattrs.errors import ClassValidationError, ForbiddenExtraKeysError, IterableValidationError

from trioloop.machine.tools import PrepareFailure

__all__ = ["json_schema_for", "structure_input", "tool_field", "unstructure_input"]

T = TypeVar("T")


def tool_field(
    *,
    default: Any = attrs.NOTHING,
    description: str | None = None,
    min_length: int | None = None,
    max_length: int | None = None,
    minimum: float | None = None,
    maximum: float | None = None,
    max_items: int | None = None,
) -> Any:
    """An attrs field whose constraints appear in the JSON schema and are enforced by ``prepare``."""
    metadata = {
        key: value
        for key, value in {
            "description": description,
            "minLength": min_length,
            "maxLength": max_length,
            "minimum": minimum,
            "maximum": maximum,
            "maxItems": max_items,
        }.items()
        if value is not None
    }
    return attrs.field(default=default, metadata={"trioloop": metadata})


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        nullable = len(args) != len(typing.get_args(tp))
        if len(args) == 1:
            return args[0], nullable
        raise TypeError(f"unions other than Optional are not supported in tool inputs: {tp!r}")
    return tp, False


def _type_schema(tp: Any) -> dict[str, Any]:
    tp, nullable = _unwrap_optional(tp)
    schema: dict[str, Any]
    origin = typing.get_origin(tp)
    if tp is str:
        schema = {"type": "string"}
    elif tp is bool:
        schema = {"type": "boolean"}
    elif tp is int:
        schema = {"type": "integer"}
    elif tp is float:
        schema = {"type": "number"}
    elif tp is Any:
        schema = {}
    elif origin is Literal:
        values = list(typing.get_args(tp))
        schema = {"type": "string", "enum": values} if all(isinstance(v, str) for v in values) else {"enum": values}
    elif isinstance(tp, type) and issubclass(tp, enum.Enum):
        schema = {"type": "string", "enum": [m.value for m in tp]}
    elif origin in (tuple, list):
        args = typing.get_args(tp)
        schema = {"type": "array", "items": _type_schema(args[0]) if args else {}}
    elif attrs.has(tp):
        schema = json_schema_for(tp)
    else:
        raise TypeError(f"unsupported tool input type: {tp!r}")
    if nullable and "type" in schema:
        schema = {**schema, "type": [schema["type"], "null"]}
        if "enum" in schema:
            schema["enum"] = [*schema["enum"], None]
    return schema


def json_schema_for(cls: type[Any]) -> dict[str, Any]:
    """The JSON schema of an attrs input class: strict object, required fields in declaration order."""
    hints = typing.get_type_hints(cls)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for field in attrs.fields(cls):
        name = field.alias or field.name
        schema = _type_schema(hints[field.name])
        constraints = dict(field.metadata.get("trioloop", {}))
        properties[name] = {**schema, **constraints}
        if field.default is attrs.NOTHING:
            required.append(name)
    result: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        result["required"] = required
    return result


# ---------------------------------------------------------------------------------------------
# Strict structuring


class _InputIssue(Exception):
    def __init__(self, path: str, problem: str) -> None:
        super().__init__(problem)
        self.path = path
        self.problem = problem


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _enum_member(value: Any, tp: type[enum.Enum]) -> Any:
    for member in tp:
        if type(value) is type(member.value) and value == member.value:
            return member
    choices = ", ".join(repr(m.value) for m in tp)
    raise ValueError(f"must be one of {choices}")


def _strict_str(value: Any, tp: Any) -> Any:
    if isinstance(tp, type) and issubclass(tp, enum.Enum):  # a StrEnum dispatches here as a str subclass
        return _enum_member(value, tp)
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {_type_name(value)}")
    return value


def _strict_int(value: Any, _: Any) -> int:
    if isinstance(value, float) and value.is_integer() and math.isfinite(value):
        return int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"expected an integer, got {_type_name(value)}")
    return value


def _strict_float(value: Any, _: Any) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise TypeError(f"expected a number, got {_type_name(value)}")
    return float(value)


def _strict_bool(value: Any, _: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"expected a boolean, got {_type_name(value)}")
    return value


def _make_converter() -> cattrs.Converter:
    conv = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)
    conv.register_structure_hook(str, _strict_str)
    conv.register_structure_hook(int, _strict_int)
    conv.register_structure_hook(float, _strict_float)
    conv.register_structure_hook(bool, _strict_bool)
    conv.register_structure_hook(Any, lambda v, _: v)

    def is_literal(tp: Any) -> bool:
        return typing.get_origin(tp) is Literal

    def structure_literal(value: Any, tp: Any) -> Any:
        allowed = typing.get_args(tp)
        if isinstance(value, bool) or value not in allowed or type(value) not in {type(a) for a in allowed}:
            choices = ", ".join(repr(a) for a in allowed)
            raise ValueError(f"must be one of {choices}")
        return value

    conv.register_structure_hook_func(is_literal, structure_literal)

    def is_enum(tp: Any) -> bool:
        return isinstance(tp, type) and issubclass(tp, enum.Enum)

    conv.register_structure_hook_func(is_enum, _enum_member)

    def is_sequence(tp: Any) -> bool:
        return typing.get_origin(tp) in (tuple, list)

    def structure_sequence(value: Any, tp: Any) -> Any:
        if not isinstance(value, list):
            raise TypeError(f"expected an array, got {_type_name(value)}")
        (item_type, *_rest) = typing.get_args(tp) or (Any,)
        items = []
        for index, item in enumerate(value):
            try:
                items.append(conv.structure(item, item_type))
            except Exception as exc:
                raise _NestedIssue(f"[{index}]", exc) from None
        return tuple(items) if typing.get_origin(tp) is tuple else items

    conv.register_structure_hook_func(is_sequence, structure_sequence)

    def is_attrs_class(tp: Any) -> bool:
        return isinstance(tp, type) and attrs.has(tp)

    def structure_object(value: Any, tp: Any) -> Any:
        if not isinstance(value, dict):
            raise TypeError(f"expected an object, got {_type_name(value)}")
        return _object_hook(conv, tp)(value, tp)

    conv.register_structure_hook_func(is_attrs_class, structure_object)
    return conv


class _NestedIssue(Exception):
    def __init__(self, step: str, inner: BaseException) -> None:
        super().__init__(step)
        self.step = step
        self.inner = inner


_object_hooks: dict[type[Any], Callable[[Any, Any], Any]] = {}


def _object_hook(conv: cattrs.Converter, tp: type[Any]) -> Callable[[Any, Any], Any]:
    hook = _object_hooks.get(tp)
    if hook is None:
        hook = cattrs.gen.make_dict_structure_fn(tp, conv, _cattrs_forbid_extra_keys=True)
        _object_hooks[tp] = hook
    return hook


_converter = _make_converter()


def _issues(exc: BaseException, path: str) -> Iterator[str]:
    """Flatten a cattrs error tree into ``path: problem`` lines."""
    if isinstance(exc, _NestedIssue):
        yield from _issues(exc.inner, path + exc.step)
        return
    if isinstance(exc, ForbiddenExtraKeysError):
        for key in sorted(exc.extra_fields):
            yield f"{_join(path, key)}: {key!r} is not an accepted key"
        return
    if isinstance(exc, ClassValidationError | IterableValidationError):
        for sub in exc.exceptions:
            step = ""
            for note in getattr(sub, "__notes__", []):
                name = getattr(note, "name", None)
                index = getattr(note, "index", None)
                if isinstance(name, str):
                    step = "." + name
                elif isinstance(index, int):
                    step = f"[{index}]"
            if isinstance(sub, KeyError) and step:
                yield f"{(path + step).lstrip('.')}: required field is missing"
            else:
                yield from _issues(sub, path + step)
        return
    message = str(exc) if not isinstance(exc, KeyError) else "required field is missing"
    where = path.lstrip(".")
    yield f"{where}: {message}" if where else message


def _join(path: str, key: str) -> str:
    return f"{path}.{key}".lstrip(".")


_FieldRules: TypeAlias = tuple[tuple[str, str, Mapping[str, Any]], ...]
_field_rules_by_class: dict[type[Any], _FieldRules] = {}


def _field_rules(cls: type[Any]) -> _FieldRules:
    """(attribute, name in the input, constraint rules) for each field of an attrs input class, read once."""
    rules = _field_rules_by_class.get(cls)
    if rules is None:
        fields = attrs.fields(cls)
        rules = tuple(
            (field.name, field.alias or field.name, _checked_rules(field.metadata.get("trioloop", {})))
            for field in fields
        )
        _field_rules_by_class[cls] = rules
    return rules


_CHECKED_RULES = ("minLength", "maxLength", "minimum", "maximum", "maxItems")


def _checked_rules(metadata: Mapping[str, Any]) -> Mapping[str, Any]:
    """The rules ``prepare`` enforces (a field's description is for the schema only)."""
    return {key: metadata[key] for key in _CHECKED_RULES if key in metadata}


#: Values that can hold no nested input (so need no ``attrs.has`` check) and carry no rules when none are set.
_PLAIN_VALUES: frozenset[type[Any]] = frozenset({str, int, float, bool})


def _check_constraints(instance: Any, path: str) -> Iterator[str]:
    for name, alias, rules in _field_rules(type(instance)):
        value = getattr(instance, name)
        if value is None or (not rules and type(value) in _PLAIN_VALUES):
            continue  # nothing to check (the common case: no per-field work, not even the path)
        if isinstance(value, str):
            length = len(value)
            if "minLength" in rules and length < rules["minLength"]:
                yield f"{_join(path, alias)}: must be at least {rules['minLength']} character(s)"
            if "maxLength" in rules and length > rules["maxLength"]:
                yield f"{_join(path, alias)}: must be at most {rules['maxLength']} characters"
            if type(value) is str:
                continue  # a plain string holds no nested input
        elif isinstance(value, int | float) and not isinstance(value, bool):
            if "minimum" in rules and value < rules["minimum"]:
                yield f"{_join(path, alias)}: must be >= {_fmt(rules['minimum'])}"
            if "maximum" in rules and value > rules["maximum"]:
                yield f"{_join(path, alias)}: must be <= {_fmt(rules['maximum'])}"
        elif isinstance(value, tuple | list):
            where = _join(path, alias)
            if "maxItems" in rules and len(value) > rules["maxItems"]:
                yield f"{where}: must have at most {rules['maxItems']} items"
            for index, item in enumerate(value):
                if attrs.has(type(item)):
                    yield from _check_constraints(item, f"{where}[{index}]")
        if attrs.has(type(value)):
            yield from _check_constraints(value, _join(path, alias))


def _fmt(number: float) -> str:
    return str(int(number)) if float(number).is_integer() else str(number)


def structure_input(raw: Any, input_type: type[T]) -> T | PrepareFailure:
    """Strictly structure raw model JSON into ``input_type`` or explain every problem found."""
    if not isinstance(raw, dict):
        return PrepareFailure(issues=(f"the input must be a JSON object, got {_type_name(raw)}",))
    try:
        # Structure a private copy: an ``Any`` field would otherwise hand the tool the very JSON object
        # the history's ToolCallBlock holds, and a tool mutating it would rewrite what the model sent.
        instance = _converter.structure(_json_copy(raw), input_type)
    except Exception as exc:
        issues = tuple(dict.fromkeys(_issues(exc, ""))) or ("the input is not valid",)
        return PrepareFailure(issues=issues)
    problems = tuple(_check_constraints(instance, ""))
    if problems:
        return PrepareFailure(issues=problems)
    return instance


def _json_copy(value: Any) -> Any:
    """A deep copy of a JSON value (containers rebuilt with their own types; scalars are immutable)."""
    if isinstance(value, dict):
        return {key: _json_copy(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_json_copy(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_json_copy(item) for item in value)
    return value


def unstructure_input(instance: Any) -> Any:
    return _converter.unstructure(instance)
