"""Bounded YAML reading and writing for `.thf` documents.

Untrusted YAML is checked in a streaming pre-pass over parser events before anything is composed:
the pre-pass caps nesting depth and the node count the document would have with every alias expanded,
refuses recursive aliases and duplicate mapping keys, all in memory bounded by the nesting cap. Only
then does the safe loader build Python data, which is finally copied into plain, alias-free JSON-like
values (str, int, float, bool, None, list, dict with str keys). Timestamps are not resolved, so dates
stay text.
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Callable, Iterator
from typing import Any, Final

import yaml

from trioloop.threatmodel.errors import InvalidShape, UnsafeYaml, quote

__all__ = [
    "MAX_DEPTH",
    "MAX_DOCUMENT_BYTES",
    "MAX_EXPANDED_NODES",
    "dump_yaml",
    "parse_yaml",
    "plain_data",
    "type_label",
]

MAX_DOCUMENT_BYTES: Final = 5 * 1024 * 1024
#: Deepest allowed nesting of mappings and sequences (a normal document needs about 5).
MAX_DEPTH: Final = 64
#: Most nodes a document may have once every alias is expanded (billion-laughs bound).
MAX_EXPANDED_NODES: Final = 500_000

_TIMESTAMP_TAG: Final = "tag:yaml.org,2002:timestamp"
#: Explicit tags a document may use: plain data only ("!" is the non-specific tag of quoted scalars).
_ALLOWED_TAGS: Final = frozenset(
    {"!"} | {f"tag:yaml.org,2002:{name}" for name in ("str", "int", "float", "bool", "null", "map", "seq", "timestamp")}
)

_BaseLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _TextTimestampLoader(_BaseLoader):  # type: ignore[misc]
    """Safe loader that leaves date-like scalars as text."""


_TextTimestampLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != _TIMESTAMP_TAG]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _timestamp_as_text(loader: Any, node: yaml.Node) -> str:
    return str(loader.construct_scalar(node))


_TextTimestampLoader.add_constructor(_TIMESTAMP_TAG, _timestamp_as_text)


class _Frame:
    __slots__ = ("anchor", "children", "height", "is_mapping", "keys", "last_key", "size")

    def __init__(self, *, anchor: str | None, is_mapping: bool) -> None:
        self.anchor = anchor
        self.is_mapping = is_mapping
        self.size = 1
        self.height = 1
        self.children = 0
        self.keys: set[str] = set()
        self.last_key: str | None = None


def _events(text: str) -> Iterator[yaml.Event]:
    loader = _BaseLoader(text)
    try:
        while loader.check_event():
            yield loader.get_event()
    finally:
        loader.dispose()


class _Prescan:
    """Expanded size and height of everything seen so far; each check is O(MAX_DEPTH)."""

    def __init__(self) -> None:
        self.anchors: dict[str, tuple[int, int]] = {}  # anchor -> (expanded size, height)
        self.open_anchors: set[str] = set()
        self.stack: list[_Frame] = []
        self.closed = 0  # expanded size of finished top-level nodes

    def add(self, size: int, height: int, scalar_key: str | None = None) -> None:
        if len(self.stack) + height > MAX_DEPTH:
            raise UnsafeYaml(f"the document nests deeper than {MAX_DEPTH} levels")
        if self.stack:
            frame = self.stack[-1]
            if frame.is_mapping and frame.children % 2 == 0:
                frame.last_key = scalar_key
                if scalar_key is not None and scalar_key != "<<":
                    if scalar_key in frame.keys:
                        raise InvalidShape(f"{self.where()}: the key {quote(scalar_key)} appears twice")
                    frame.keys.add(scalar_key)
            frame.children += 1
            frame.size += size
            frame.height = max(frame.height, height + 1)
        else:
            self.closed += size
        if self.closed + sum(frame.size for frame in self.stack) > MAX_EXPANDED_NODES:
            raise UnsafeYaml(f"the document expands to more than {MAX_EXPANDED_NODES} nodes")

    def where(self) -> str:
        """Path of the innermost open collection, e.g. `elements[2].position`."""
        path = ""
        for frame in self.stack[:-1]:
            if frame.is_mapping:
                path += _key_segment(frame.last_key if frame.last_key is not None else "?")
            else:
                path += f"[{frame.children}]"
        return path.lstrip(".") or "the top level"

    def feed(self, event: yaml.Event) -> None:
        tag = getattr(event, "tag", None)
        if tag is not None and tag not in _ALLOWED_TAGS:
            if tag.startswith("tag:yaml.org,2002:python/"):
                raise UnsafeYaml("the document uses a Python object tag, which is never allowed")
            shown = "!!" + tag.removeprefix("tag:yaml.org,2002:") if tag.startswith("tag:yaml.org,2002:") else tag
            raise InvalidShape(f"{self.where()}: the document uses the unsupported YAML tag {quote(shown)}")
        if isinstance(event, yaml.ScalarEvent):
            if event.anchor is not None:
                self.anchors[event.anchor] = (1, 0)
            self.add(1, 0, event.value)
        elif isinstance(event, yaml.CollectionStartEvent):
            if len(self.stack) >= MAX_DEPTH:
                raise UnsafeYaml(f"the document nests deeper than {MAX_DEPTH} levels")
            if event.anchor is not None:
                self.open_anchors.add(event.anchor)
            self.stack.append(_Frame(anchor=event.anchor, is_mapping=isinstance(event, yaml.MappingStartEvent)))
        elif isinstance(event, yaml.CollectionEndEvent):
            frame = self.stack.pop()
            if frame.anchor is not None:
                self.open_anchors.discard(frame.anchor)
                self.anchors[frame.anchor] = (frame.size, frame.height)
            self.add(frame.size, frame.height)
        elif isinstance(event, yaml.AliasEvent):
            name = event.anchor
            if name in self.open_anchors:
                raise UnsafeYaml("the document contains a recursive alias")
            if name not in self.anchors:
                raise InvalidShape("the document uses an alias that was never defined")
            self.add(*self.anchors[name])
        elif isinstance(event, yaml.DocumentStartEvent) and self.closed:
            raise InvalidShape("the file holds more than one YAML document")


def _prescan(text: str, observe: Callable[[yaml.Event], None] | None = None) -> None:
    """Refuse hostile structure by walking parser events, before any node is composed.

    ``observe`` sees every event the checks accepted (the `.thf` layout recorder uses it).
    """
    scan = _Prescan()
    for event in _events(text):
        scan.feed(event)
        if observe is not None:
            observe(event)


def _key_segment(key: str) -> str:
    return f".{key}" if key.isascii() and key.isidentifier() else f"[{quote(key)}]"


def type_label(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "text"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return "a value of an unsupported YAML type"


class _NotPlain(Exception):
    pass


def _plain_copy(value: Any) -> Any:
    """`plain_data` without the path its messages name: `_NotPlain` for anything it would refuse."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return value
    if kind is dict:
        result: dict[str, Any] = {}
        for key, item in value.items():
            if type(key) is not str:
                raise _NotPlain
            result[key] = _plain_copy(item)
        return result
    if kind is list:
        return [_plain_copy(item) for item in value]
    if kind is float and math.isfinite(value):
        return value
    raise _NotPlain  # a subclass, a tuple, a non-finite number: the full walk decides and names the place


def plain_data(value: Any, where: str = "") -> Any:
    """Copy loaded YAML into alias-free plain data, refusing types a `.thf` document cannot hold."""
    if not where:
        try:
            return _plain_copy(value)
        except _NotPlain:
            pass
    return _plain_walk(value, where)


def _plain_walk(value: Any, where: str) -> Any:
    if isinstance(value, str | bool | int) or value is None:
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidShape(f"{where.lstrip('.') or 'the document'}: numbers must be finite (no .nan or .inf)")
        return value
    if isinstance(value, list | tuple):
        return [_plain_walk(item, f"{where}[{index}]") for index, item in enumerate(value)]
    if isinstance(value, dict):
        result: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                shown = where.lstrip(".") or "the top level"
                raise InvalidShape(f"{shown}: mapping keys must be text, found {type_label(key)} key {quote(str(key))}")
            result[key] = _plain_walk(item, where + _key_segment(key))
        return result
    raise InvalidShape(f"{where.lstrip('.') or 'the document'}: holds a value of a type a .thf file cannot hold")


def parse_yaml(source: str | bytes, *, observe: Callable[[yaml.Event], None] | None = None) -> Any:
    """Parse untrusted YAML into plain data, or raise UnsafeYaml / InvalidShape.

    ``observe`` is called with each parser event of the bounded pre-pass, in order.
    """
    if isinstance(source, bytes):
        if len(source) > MAX_DOCUMENT_BYTES:
            raise UnsafeYaml(f"the document is larger than {MAX_DOCUMENT_BYTES} bytes")
        try:
            text = source.decode("utf-8-sig")
        except UnicodeDecodeError:
            raise InvalidShape("the document is not UTF-8 text") from None
    else:
        if len(source) > MAX_DOCUMENT_BYTES or len(source.encode("utf-8", "surrogatepass")) > MAX_DOCUMENT_BYTES:
            raise UnsafeYaml(f"the document is larger than {MAX_DOCUMENT_BYTES} bytes")
        text = source
    try:
        _prescan(text, observe)
        loaded = yaml.load(text, Loader=_TextTimestampLoader)  # a SafeLoader subclass: no arbitrary objects
    except yaml.constructor.ConstructorError as exc:
        raise InvalidShape(_yaml_problem(exc, "uses a YAML construct a .thf file cannot hold")) from None
    except yaml.MarkedYAMLError as exc:
        if exc.problem is not None and "nesting depth" in exc.problem:  # libyaml's own depth guard
            raise UnsafeYaml(f"the document nests deeper than {MAX_DEPTH} levels") from None
        raise InvalidShape(_yaml_problem(exc, "is not valid YAML")) from None
    except yaml.YAMLError:
        raise InvalidShape("the document is not valid YAML") from None
    except (TypeError, ValueError, RecursionError):
        # e.g. an unhashable (list or mapping) key, or a malformed explicitly tagged scalar.
        raise InvalidShape("the document uses a YAML construct a .thf file cannot hold") from None
    return plain_data(loaded)


def _yaml_problem(exc: yaml.MarkedYAMLError, problem: str) -> str:
    """Say where, never what the parser said: its wording is an internal detail."""
    mark = exc.problem_mark or exc.context_mark
    where = f" near line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"the document {problem}{where}"


_ESCAPE_CATEGORIES: Final = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    # PyYAML can write some characters (NEL, line separators, BOM) raw in plain or single-quoted
    # scalars, where a reader folds them into line breaks; double quotes escape them all.
    if any(unicodedata.category(char) in _ESCAPE_CATEGORIES and char not in "\n\t" for char in value):
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style='"')
    return dumper.represent_str(value)


class _Dumper(yaml.SafeDumper):
    """Safe dumper that never writes anchors, so shared values are written out in full."""

    def ignore_aliases(self, data: Any) -> bool:
        return True

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        # Indent list items under their key ("elements:\n  - id: ..."), the layout people write by hand.
        super().increase_indent(flow, False)


_Dumper.add_representer(str, _represent_str)
# A document's `extra` holds read-only dict and list subclasses (model.FrozenDict, model.FrozenList).
_Dumper.add_multi_representer(dict, yaml.SafeDumper.represent_dict)
_Dumper.add_multi_representer(list, yaml.SafeDumper.represent_list)


def dump_yaml(data: Any) -> str:
    """Write plain data as block-style YAML, keeping mapping key order."""
    text: str = yaml.dump(
        data,
        Dumper=_Dumper,
        sort_keys=False,
        allow_unicode=True,
        default_flow_style=False,
        width=120,
    )
    return text
