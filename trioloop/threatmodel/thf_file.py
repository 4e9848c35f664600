"""Round-trip saving of `.thf` files: a save rewrites only the lines of what changed.

`load_thf_file` reads a document as `load_thf` does (same bounded parser, same checks) and keeps the
text and where each part of it sits. `ThfFile.render(model)` then writes ``model`` by copying the
original text for every top-level key and every entity that is unchanged (comments, blank lines, key
order, quoting, flow or block style, line endings all kept) and rendering only the entities that
differ (an edited entity keeps its key order; its own comments go with it). An unchanged model
gives the original text byte for byte. A file the layout cannot patch safely (anchors or aliases,
a top-level mapping in flow style) is written whole, as `dump_thf` writes it.

Saving is `save_thf(path, model, original)`: atomic (`trioloop.durable.files.write_atomic`), and it returns
the `ThfFile` of what was written, so the next save patches against it. Cost: an unchanged entity is
found by identity (the models are immutable, so an edit shares every untouched entity), so a save
after a one-entity edit renders one entity and joins the lines, instead of rendering the document.
"""

from __future__ import annotations

import codecs
import os
from collections.abc import Mapping
from typing import Any, Final

import attrs

from trioloop.durable.files import write_atomic
from trioloop.threatmodel._safe_yaml import MAX_DOCUMENT_BYTES, dump_yaml, parse_yaml
from trioloop.threatmodel._thf_layout import Field, Item, Layout, LayoutRecorder, Top
from trioloop.threatmodel.errors import UnsafeYaml, path_hint
from trioloop.threatmodel.model import SECTION_NAMES, ThreatModel
from trioloop.threatmodel.thf_shape import (
    METADATA_FIELDS,
    REQUIRED_SECTIONS,
    TABLES,
    TOP_LEVEL_KEYS,
    model_from_data,
    model_to_data,
    write_fields,
)
from trioloop.threatmodel.validation import check_semantics

__all__ = ["ThfFile", "load_thf_file", "save_thf"]

_SECTIONS: Final = frozenset(SECTION_NAMES)


@attrs.frozen(eq=False)
class ThfFile:
    """A `.thf` document as it was read or last written: its model, its text, and where things sit."""

    model: ThreatModel
    text: str
    bom: bool = False
    _layout: Layout | None = attrs.field(default=None, alias="layout", repr=False)

    def render(self, model: ThreatModel) -> str:
        """``model`` as `.thf` text, patched into this file's text (see the module docstring)."""
        return self._patched(model)[0]

    def updated(self, model: ThreatModel) -> ThfFile:
        """The file after ``model`` is written into it (its text, and the layout for the next save)."""
        text, layout = self._patched(model)
        return ThfFile(model=model, text=text, bom=self.bom, layout=layout)

    def encoded(self) -> bytes:
        """The file's bytes as they were read (what a round-trip save starts from)."""
        return (codecs.BOM_UTF8 if self.bom else b"") + self.text.encode("utf-8")

    def _patched(self, model: ThreatModel) -> tuple[str, Layout | None]:
        if model is self.model or model == self.model:
            return self.text, self._layout
        if self._layout is not None:
            patched = _patch(self._layout, self.model, model)
            if patched is not None:
                return "".join(patched.lines), patched
        text = dump_yaml(model_to_data(model))
        return text, _layout_of(text)


def load_thf_file(source: str | bytes | os.PathLike[str]) -> ThfFile:
    """Read a `.thf` document like `load_thf` (same bounds, same errors) and keep its text for saving."""
    recorder = LayoutRecorder()
    if isinstance(source, str):
        with path_hint(source):
            model = model_from_data(parse_yaml(source, observe=recorder.feed))
        bom, text = False, source
    else:
        raw = source if isinstance(source, bytes) else _read(source)
        data = parse_yaml(raw, observe=recorder.feed)  # checks the size and the UTF-8 first
        bom, text = raw.startswith(codecs.BOM_UTF8), raw.decode("utf-8-sig")
        model = model_from_data(data)
    check_semantics(model)
    return ThfFile(model=model, text=text, bom=bom, layout=Layout.build(text, recorder))


def save_thf(path: str | os.PathLike[str], model: ThreatModel, original: ThfFile | None = None) -> ThfFile:
    """Write ``model`` to ``path`` atomically, patched into ``original`` when given; returns what was written."""
    written = original.updated(model) if original is not None else _fresh(model)
    write_atomic(path, written.encoded())
    return written


def _fresh(model: ThreatModel) -> ThfFile:
    text = dump_yaml(model_to_data(model))
    return ThfFile(model=model, text=text, layout=_layout_of(text))


def _read(path: os.PathLike[str]) -> bytes:
    with open(path, "rb") as file:
        if os.fstat(file.fileno()).st_size > MAX_DOCUMENT_BYTES:
            raise UnsafeYaml(f"the document is larger than {MAX_DOCUMENT_BYTES} bytes")
        return file.read(MAX_DOCUMENT_BYTES + 1)  # a pipe or device reports no size


def _layout_of(text: str) -> Layout | None:
    """The layout of text we rendered ourselves (trusted, so no bounds beyond the parser's own)."""
    recorder = LayoutRecorder()
    try:
        parse_yaml(text, observe=recorder.feed)
    except Exception:  # not expected for our own output; then the next save writes the file whole
        return None
    return Layout.build(text, recorder)


# ---------------------------------------------------------------------------------------------
# Patching


def _present(model: ThreatModel, key: str) -> bool:
    if key in ("version", "metadata"):
        return True
    if key in _SECTIONS:
        return key in REQUIRED_SECTIONS or bool(getattr(model, key))
    return key in model.extra and key not in TOP_LEVEL_KEYS


def _value(model: ThreatModel, key: str) -> Any:
    if key == "version":
        return model.version
    if key == "metadata":
        return model.metadata
    if key in _SECTIONS:
        return getattr(model, key)
    return model.extra.get(key, _MISSING)


_MISSING: Final = object()


def _data(model: ThreatModel, key: str, order: tuple[str, ...]) -> Any:
    """Plain data for one top-level key, as `model_to_data` writes it (mapping keys in ``order`` first)."""
    if key == "version":
        return model.version
    if key == "metadata":
        return _ordered(write_fields("metadata", model.metadata, METADATA_FIELDS, False), order)
    if key in _SECTIONS:
        _, fields = TABLES[key]
        return [write_fields(f"{key}[{i}]", entity, fields, False) for i, entity in enumerate(getattr(model, key))]
    value = model.extra[key]
    return _ordered(value, order) if isinstance(value, Mapping) else value


def _ordered(data: Any, order: tuple[str, ...]) -> Any:
    if not order or not isinstance(data, Mapping):
        return data
    first = {key: data[key] for key in order if key in data}
    return first | {key: value for key, value in data.items() if key not in first}


def _new_keys(model: ThreatModel) -> list[str]:
    keys = ["version", "metadata", *(name for name in SECTION_NAMES if _present(model, name))]
    keys += [key for key in model.extra if key not in TOP_LEVEL_KEYS]
    return keys


class _Out:
    """The lines being written and the layout they will have."""

    def __init__(self, newline: str) -> None:
        self.lines: list[str] = []
        self.newline = newline

    def copy(self, source: tuple[str, ...], first: int, stop: int) -> int:
        start = len(self.lines)
        self.lines.extend(source[first:stop])
        return start

    def rendered(self, text: str, indent: int = 0) -> tuple[int, int]:
        """Append our own YAML text (LF line ends), indented; returns its first and last line."""
        if self.lines and not self.lines[-1].endswith(("\n", "\r", "\x85", "\u2028", "\u2029")):
            self.lines[-1] += self.newline
        pad = " " * indent
        start = len(self.lines)
        for line in text.split("\n")[:-1]:
            self.lines.append((pad + line if line else "") + self.newline)
        return start, len(self.lines) - 1


def _patch(layout: Layout, old: ThreatModel, new: ThreatModel) -> Layout | None:
    lines = layout.lines
    out = _Out(layout.newline)
    tops: list[Top] = []
    cursor = 0
    seen: set[str] = set()
    for top in layout.tops:
        out.copy(lines, cursor, top.first)  # comments and blank lines before the key
        cursor = top.last + 1
        seen.add(top.key)
        before, after = _value(old, top.key), _value(new, top.key)
        if before is after or before == after:
            start = out.copy(lines, top.first, top.last + 1)
            tops.append(top.shifted(start - top.first))
            continue
        if not _present(new, top.key):
            continue
        if top.key in _SECTIONS and top.items:  # None or empty: rewrite the section whole
            patched = _patch_section(out, lines, top, before, after)
            if patched is not None:
                tops.append(patched)
                continue
        tops.append(_render_top(out, new, top.key, top.keys))
    tail = cursor
    for key in _new_keys(new):
        if key not in seen:
            tops.append(_render_top(out, new, key, ()))
    out.copy(lines, tail, len(lines))  # comments after the last key
    return Layout(tuple(out.lines), tuple(tops), layout.newline)


def _render_top(out: _Out, model: ThreatModel, key: str, order: tuple[str, ...]) -> Top:
    data = _data(model, key, order)
    first, last = out.rendered(dump_yaml({key: data}))
    items: tuple[Item, ...] | None = None
    if key in _SECTIONS:
        # Our own block layout: "key:" then each entity from a line starting with "  - ".
        starts = [i - first for i in range(first + 1, last + 1) if out.lines[i].startswith("  - ")]
        ends = [s - 1 for s in starts[1:]] + [last - first]
        _, fields = TABLES[key]
        items = tuple(Item(s, e, tuple(f.key for f in fields)) for s, e in zip(starts, ends, strict=True))
        if len(items) != len(data):
            items = None
    keys = tuple(data) if isinstance(data, Mapping) else ()
    return Top(key, first, last, keys, items, 2)


def _patch_section(out: _Out, lines: tuple[str, ...], top: Top, before: Any, after: Any) -> Top | None:
    """Entity by entity: unchanged ones copied, changed and new ones rendered, removed ones dropped."""
    items = top.items
    assert items is not None
    if len(items) != len(before):
        return None
    old_index: dict[str, int] = {}
    for number, entity in enumerate(before):
        old_index.setdefault(entity.id, number)
    if len(old_index) != len(before) or len({entity.id for entity in after}) != len(after):
        return None  # duplicate ids: rewrite the section whole
    _, fields = TABLES[top.key]
    mark = len(out.lines)
    # The key line and what precedes the first entity.
    base = out.copy(lines, top.first, top.item_lines(items[0])[0])
    placed: list[Item] = []
    for position, entity in enumerate(after):
        index = old_index.get(entity.id)
        if index is None:
            order = tuple(f.key for f in fields)
        else:
            item = items[index]
            item_first, item_last = top.item_lines(item)
            if index:
                out.copy(lines, top.item_lines(items[index - 1])[1] + 1, item_first)  # comments between entities
            if before[index] is entity or before[index] == entity:
                start = out.copy(lines, item_first, item_last + 1)
                placed.append(item.moved_to(start - base))
                continue
            where = f"{top.key}[{position}]"
            patched = _patch_fields(out, lines, item_first, item, before[index], entity, where, fields)
            if patched is not None:
                placed.append(patched.moved_to(patched.first - base))
                continue
            order = item.keys
        data = _ordered(write_fields(f"{top.key}[{position}]", entity, fields, False), order)
        start, end = out.rendered(dump_yaml([data]), top.dash)
        placed.append(Item(start - base, end - base, tuple(data)))
    if not placed:
        # The section is now empty: "key: []" (keeping what preceded the first entity is not possible).
        del out.lines[mark:]
        start, end = out.rendered(dump_yaml({top.key: []}))
        return Top(top.key, start, end)
    return Top(top.key, base, base + placed[-1].last, top.keys, tuple(placed), top.dash)


def _patch_fields(
    out: _Out, lines: tuple[str, ...], item_first: int, item: Item, before: Any, after: Any, where: str, spec: Any
) -> Item | None:
    """Key by key inside one entity: unchanged keys copied, changed and new keys rendered, removed keys dropped.

    None (the caller renders the entity whole) when the entity has no per-key layout or its first
    key, which shares the line with the dash, would change.
    """
    if item.fields is None:
        return None
    old = write_fields(where, before, spec, False)
    new = write_fields(where, after, spec, False)

    def unchanged(key: str) -> bool:
        if key in old and key in new:
            return bool(old[key] == new[key])
        return key not in old and key not in new  # e.g. "tags: []" or "x: null", still empty

    if not unchanged(item.fields[0].key):
        return None
    placed: list[Field] = []  # absolute lines here; made relative to the entity's first line below
    previous: int | None = None
    for field in item.fields:
        first, last = item_first + field.first, item_first + field.last
        if previous is not None:
            out.copy(lines, previous + 1, first)  # comments between keys
        previous = last
        if unchanged(field.key):
            start = out.copy(lines, first, last + 1)
            placed.append(Field(field.key, start, start + last - first))
        elif field.key in new:
            start, end = out.rendered(dump_yaml({field.key: new[field.key]}), item.column)
            placed.append(Field(field.key, start, end))
    written = {field.key for field in item.fields}
    for key, value in new.items():
        if key not in written:
            start, end = out.rendered(dump_yaml({key: value}), item.column)
            placed.append(Field(key, start, end))
    origin = placed[0].first
    relative = tuple(Field(f.key, f.first - origin, f.last - origin) for f in placed)
    return Item(origin, placed[-1].last, tuple(f.key for f in placed), relative, item.column)
