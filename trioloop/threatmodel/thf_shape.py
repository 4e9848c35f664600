"""The shape gate of `.thf` documents: plain data (as YAML loads it) <-> ThreatModel, field by field.

`model_from_data` checks the exact version and the shape (every known field has its declared type; unknown keys
are kept in `extra`); `model_to_data` writes a model back in a fixed, diff-friendly key order. Known fields are
typed strictly: a YAML number or boolean where text is expected is an InvalidShape error, never silently
converted; dates are the one exception, read as the text written. The field tables are shared with the
round-trip save (`thf_file`), which writes one entity or one key at a time as `model_to_data` does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final, Literal, TypeAlias, final

import attrs

from trioloop.threatmodel._safe_yaml import plain_data, type_label
from trioloop.threatmodel.errors import InvalidShape, UnsupportedVersion, quote
from trioloop.threatmodel.model import (
    SECTION_NAMES,
    SUPPORTED_VERSION,
    DataFlow,
    Diagram,
    Element,
    Group,
    Layer,
    Metadata,
    Mitigation,
    Position,
    Relationship,
    Size,
    Threat,
    ThreatModel,
    TrustBoundary,
    Viewport,
)

__all__ = [
    "METADATA_FIELDS",
    "REQUIRED_SECTIONS",
    "TABLES",
    "TOP_LEVEL_KEYS",
    "model_from_data",
    "model_to_data",
    "write_fields",
]

#: Sections a file must have (possibly empty); the other four may be absent and are then empty.
REQUIRED_SECTIONS: Final = ("elements", "data_flows", "trust_boundaries", "threats")

Kind: TypeAlias = Literal["id", "str", "opt_str", "strs", "bool", "opt_bool", "opt_int", "position", "size", "viewport"]


@attrs.frozen
class _Field:
    key: str  # the YAML key
    attr: str  # the attribute on the model class
    kind: Kind | Literal["mitigation"]
    always: bool = False  # written even when empty


def _f(key: str, kind: Kind | Literal["mitigation"], *, attr: str | None = None, always: bool = False) -> _Field:
    return _Field(key, attr or key, kind, always)


#: Each section's entity class and its known fields, in the order they are written.
TABLES: Final[Mapping[str, tuple[type[Any], tuple[_Field, ...]]]] = {
    "elements": (
        Element,
        (
            _f("id", "id"),
            _f("type", "str"),
            _f("name", "str"),
            _f("trust_zone", "opt_str"),
            _f("subtype", "opt_str"),
            _f("icon", "opt_str"),
            _f("description", "opt_str"),
            _f("technologies", "strs", always=True),
            _f("layer", "opt_str"),
            _f("group", "opt_str"),
            _f("position", "position"),
            _f("tags", "strs"),
            _f("stores", "strs"),
            _f("encryption", "opt_str"),
        ),
    ),
    "data_flows": (
        DataFlow,
        (
            _f("id", "id"),
            _f("from", "str", attr="source"),
            _f("to", "str", attr="target"),
            _f("name", "opt_str"),
            _f("protocol", "opt_str"),
            _f("data", "strs", always=True),
            _f("authenticated", "bool", always=True),
            _f("encrypted", "opt_bool"),
            _f("flow_number", "opt_int"),
        ),
    ),
    "trust_boundaries": (
        TrustBoundary,
        (
            _f("id", "id"),
            _f("name", "str"),
            _f("contains", "strs", always=True),
            _f("position", "position"),
            _f("size", "size"),
        ),
    ),
    "threats": (
        Threat,
        (
            _f("id", "id"),
            _f("title", "str"),
            _f("category", "str"),
            _f("element", "opt_str"),
            _f("flow", "opt_str"),
            _f("severity", "str"),
            _f("description", "opt_str"),
            _f("mitigation", "mitigation"),
        ),
    ),
    "layers": (Layer, (_f("id", "id"), _f("name", "str"), _f("description", "opt_str"))),
    "groups": (
        Group,
        (
            _f("id", "id"),
            _f("name", "str"),
            _f("type", "opt_str"),
            _f("parent", "opt_str"),
            _f("description", "opt_str"),
        ),
    ),
    "relationships": (
        Relationship,
        (
            _f("id", "id"),
            _f("type", "str"),
            _f("from", "str", attr="source"),
            _f("to", "str", attr="target"),
            _f("name", "opt_str"),
            _f("description", "opt_str"),
        ),
    ),
    "diagrams": (
        Diagram,
        (
            _f("id", "id"),
            _f("name", "str"),
            _f("kind", "opt_str"),
            _f("description", "opt_str"),
            _f("viewport", "viewport"),
        ),
    ),
}

#: The known fields of ``metadata``, in the order they are written.
METADATA_FIELDS: Final = (
    _f("title", "opt_str"),
    _f("author", "opt_str"),
    _f("created", "opt_str"),
    _f("modified", "opt_str"),
    _f("description", "opt_str"),
    _f("threat_analysis_enabled", "opt_bool"),
)
_MITIGATION_FIELDS: Final = (_f("status", "str"), _f("description", "str"))
#: The top-level keys the model knows; any other one is kept in ``ThreatModel.extra``.
TOP_LEVEL_KEYS: Final = frozenset({"version", "metadata", *SECTION_NAMES})
_GEOMETRY: Final[Mapping[str, tuple[type[Any], tuple[str, ...]]]] = {
    "position": (Position, ("x", "y")),
    "size": (Size, ("width", "height")),
    "viewport": (Viewport, ("x", "y", "zoom")),
}


# ---------------------------------------------------------------------------------------------
# Reading


def model_from_data(data: Any) -> ThreatModel:
    """Shape-check plain data (as YAML loads it) into a ThreatModel; raises InvalidShape or UnsupportedVersion."""
    if not isinstance(data, dict):
        raise InvalidShape(f"the document must be a mapping at the top level, got {type_label(data)}")
    version = data.get("version")
    if not isinstance(version, str):
        shown = (
            "is missing" if version is None else f'must be the text "{SUPPORTED_VERSION}", got {type_label(version)}'
        )
        hint = " (quote it)" if isinstance(version, int | float) and not isinstance(version, bool) else ""
        raise UnsupportedVersion(f"version {shown}{hint}")
    if version != SUPPORTED_VERSION:
        raise UnsupportedVersion(f'version {quote(version)} is not supported; the supported version is "1.0"')
    if "metadata" not in data:
        raise InvalidShape("metadata is missing")
    metadata_raw = data["metadata"]
    if not isinstance(metadata_raw, dict):
        raise InvalidShape(f"metadata must be a mapping, got {type_label(metadata_raw)}")
    metadata = Metadata(
        **_read_fields("metadata", metadata_raw, METADATA_FIELDS), extra=_extra(metadata_raw, METADATA_FIELDS)
    )
    sections: dict[str, tuple[Any, ...]] = {}
    for name in SECTION_NAMES:
        raw = data.get(name)
        if raw is None:
            if name in REQUIRED_SECTIONS:
                raise InvalidShape(f"{name} is missing (write {name}: [] for none)")
            sections[name] = ()
            continue
        if not isinstance(raw, list):
            raise InvalidShape(f"{name} must be a list, got {type_label(raw)}")
        sections[name] = tuple(_read_entity(name, index, entry) for index, entry in enumerate(raw))
    extra = {key: value for key, value in data.items() if key not in TOP_LEVEL_KEYS}
    return ThreatModel(version=version, metadata=metadata, extra=extra, **sections)


def _read_entity(section: str, index: int, entry: Any) -> Any:
    cls, fields = TABLES[section]
    if not isinstance(entry, dict):
        raise InvalidShape(f"{section}[{index}] must be a mapping, got {type_label(entry)}")
    entity_id = entry.get("id")
    if entity_id is None:
        raise InvalidShape(f"{section}[{index}].id is missing")
    if not isinstance(entity_id, str):
        raise InvalidShape(f"{section}[{index}].id must be text, got {type_label(entity_id)}")
    if not entity_id:
        raise InvalidShape(f"{section}[{index}].id must not be empty")
    return cls(**_read_fields(_EntityPlace(section, entity_id), entry, fields), extra=_extra(entry, fields))


@final
class _EntityPlace:
    """``section["id"]``, for messages: formatted only when one is written (quoting costs more than reading)."""

    __slots__ = ("entity_id", "section", "shown")

    def __init__(self, section: str, entity_id: str) -> None:
        self.section, self.entity_id = section, entity_id
        self.shown: str | None = None

    def __str__(self) -> str:
        if self.shown is None:
            self.shown = f"{self.section}[{quote(self.entity_id)}]"
        return self.shown

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)


@final
class _FieldPlace:
    """``place.key``, for messages, formatted only when one is written."""

    __slots__ = ("key", "parent")

    def __init__(self, parent: str | _EntityPlace | _FieldPlace, key: str) -> None:
        self.parent, self.key = parent, key

    def __str__(self) -> str:
        return f"{self.parent}.{self.key}"

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)


_Place: TypeAlias = "str | _EntityPlace | _FieldPlace"


def _extra(raw: Mapping[str, Any], fields: tuple[_Field, ...]) -> dict[str, Any]:
    known = {field.key for field in fields}
    return {key: value for key, value in raw.items() if key not in known}


def _read_fields(where: _Place, raw: Mapping[str, Any], fields: tuple[_Field, ...]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for field in fields:
        value = raw.get(field.key)
        if value is None:
            if field.kind in ("id", "str"):
                raise InvalidShape(f"{where}.{field.key} is missing")
            continue
        kind = field.kind
        # The common cases, read without naming their place (a message needs it only when one is refused).
        if type(value) is str and kind in _TEXT_KINDS:
            values[field.attr] = value
        elif kind == "strs" and type(value) is list and all(type(item) is str for item in value):
            values[field.attr] = tuple(value)
        elif type(value) is bool and kind in _BOOL_KINDS:
            values[field.attr] = value
        else:
            values[field.attr] = _read_value(_FieldPlace(where, field.key), kind, value)
    return values


_TEXT_KINDS: Final = frozenset({"id", "str", "opt_str"})
_BOOL_KINDS: Final = frozenset({"bool", "opt_bool"})


def _read_value(where: _Place, kind: str, value: Any) -> Any:
    if kind in ("id", "str", "opt_str"):
        if not isinstance(value, str):
            raise InvalidShape(f"{where} must be text, got {type_label(value)}")
        return value
    if kind == "strs":
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise InvalidShape(f"{where} must be a list of text")
        return tuple(value)
    if kind in ("bool", "opt_bool"):
        if not isinstance(value, bool):
            raise InvalidShape(f"{where} must be true or false, got {type_label(value)}")
        return value
    if kind == "opt_int":
        if not isinstance(value, int) or isinstance(value, bool):
            raise InvalidShape(f"{where} must be a whole number, got {type_label(value)}")
        return value
    if kind == "mitigation":
        if not isinstance(value, dict):
            raise InvalidShape(f"{where} must be a mapping, got {type_label(value)}")
        return Mitigation(**_read_fields(where, value, _MITIGATION_FIELDS), extra=_extra(value, _MITIGATION_FIELDS))
    cls, keys = _GEOMETRY[kind]
    if not isinstance(value, dict):
        raise InvalidShape(f"{where} must be a mapping, got {type_label(value)}")
    unknown = sorted(set(value) - set(keys))
    if unknown:
        raise InvalidShape(f"{where} has the unknown key {quote(unknown[0])}; expected {', '.join(keys)}")
    numbers: dict[str, float] = {}
    for key in keys:
        number = value.get(key)
        if not isinstance(number, int | float) or isinstance(number, bool) or not math.isfinite(number):
            raise InvalidShape(f"{where}.{key} must be a finite number, got {type_label(number)}")
        numbers[key] = float(number)
    return cls(**numbers)


# ---------------------------------------------------------------------------------------------
# Writing


def model_to_data(model: ThreatModel, *, strict: bool = False) -> dict[str, Any]:
    """Plain data for `model` in the order it is written.

    With `strict`, anything that would not read back as the same model (an `extra` key shadowing a
    known key, a value YAML cannot hold) raises InvalidShape; otherwise known keys win quietly.
    """
    data: dict[str, Any] = {"version": model.version}
    data["metadata"] = write_fields("metadata", model.metadata, METADATA_FIELDS, strict)
    for name in SECTION_NAMES:
        entities = getattr(model, name)
        if not entities and name not in REQUIRED_SECTIONS:
            continue
        cls, fields = TABLES[name]
        if strict:
            if not isinstance(entities, tuple):
                raise InvalidShape(f"{name} must be a tuple of {cls.__name__} values")
            for index, entity in enumerate(entities):
                if not isinstance(entity, cls):
                    raise InvalidShape(f"{name}[{index}] must be a {cls.__name__}, got {type(entity).__name__}")
        data[name] = [write_fields(f"{name}[{index}]", entity, fields, strict) for index, entity in enumerate(entities)]
    _write_extra("the document", data, model.extra, TOP_LEVEL_KEYS, strict)
    return data


def write_fields(where: str, value: Any, fields: tuple[_Field, ...], strict: bool) -> dict[str, Any]:
    """Plain data for one entity (or the metadata): its known ``fields`` in table order, then its extra keys.

    With ``strict``, a value that would not read back as the same one raises InvalidShape (``where`` names it).
    """
    out: dict[str, Any] = {}
    for field in fields:
        item = getattr(value, field.attr)
        if item is None:
            continue
        if field.kind == "strs":
            if strict and not isinstance(item, tuple):
                raise InvalidShape(f"{where}.{field.key} must be a tuple of text")
            if isinstance(item, tuple | list):
                if not item and not field.always:
                    continue
                item = list(item)
        elif field.kind == "mitigation":
            if strict and not isinstance(item, Mitigation):
                raise InvalidShape(f"{where}.{field.key} must be a Mitigation")
            if isinstance(item, Mitigation):
                item = write_fields(f"{where}.{field.key}", item, _MITIGATION_FIELDS, strict)
        elif field.kind in _GEOMETRY:
            cls, keys = _GEOMETRY[field.kind]
            if strict and not isinstance(item, cls):
                raise InvalidShape(f"{where}.{field.key} must be a {cls.__name__}")
            if isinstance(item, cls):
                item = {key: getattr(item, key) for key in keys}
        out[field.key] = item
    _write_extra(where, out, value.extra, {field.key for field in fields}, strict)
    return out


def _write_extra(where: str, out: dict[str, Any], extra: Mapping[str, Any], known: Any, strict: bool) -> None:
    for key, item in extra.items():
        if key in known:
            if strict:
                raise InvalidShape(f"{where}: extra key {quote(str(key))} shadows a known field")
            continue
        if strict:
            if not isinstance(key, str):
                raise InvalidShape(f"{where}: extra keys must be text")
            item = plain_data(item, f"{where}.{key}")
        out[key] = item
