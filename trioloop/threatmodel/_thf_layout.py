"""Where each part of a `.thf` file sits in its text, so a save can rewrite only what changed.

`LayoutRecorder` watches the parser events of the bounded pre-pass (no second parse) and notes, for
every top-level key, the lines from the key to the end of its value and, for a section written as a
block sequence, the lines of each entity. `Layout.build` checks what was noted against the text and
gives up (returns None: the file is then written whole) on anything it cannot patch safely: a
top-level mapping that is not in block style at column 0, or any anchor or alias (a rewritten
entity could hold the anchor another part refers to). A section whose items are not all
``- `` entries at one column is patched as a whole rather than entity by entity.

Lines are split exactly where libyaml counts line breaks (LF, CR, CRLF, NEL, LS, PS), and every
entity's start is checked against the parser's character offset, so a span never cuts a line the
parser saw differently.
"""

from __future__ import annotations

import itertools
import re
from typing import Any, Final, cast

import attrs
import yaml

__all__ = ["Field", "Item", "Layout", "LayoutRecorder", "Top", "split_lines"]

_BREAK: Final = re.compile("\r\n|[\r\n\x85\u2028\u2029]")
_DASH: Final = re.compile(r"( *)- +")


def split_lines(text: str) -> list[str]:
    """``text`` cut after each line break libyaml counts; the pieces join back to ``text``."""
    if not any(char in text for char in "\r\x85\u2028\u2029"):
        parts = text.split("\n")  # the common case, at C speed
        lines = [part + "\n" for part in parts[:-1]]
        if parts[-1]:
            lines.append(parts[-1])
        return lines
    lines = []
    start = 0
    for match in _BREAK.finditer(text):
        lines.append(text[start : match.end()])
        start = match.end()
    if start < len(text):
        lines.append(text[start:])
    return lines


@attrs.frozen
class Field:
    """One key of an entity written in block style: its lines (counted from the entity's first line),
    from the key to the end of its value."""

    key: str
    first: int
    last: int


@attrs.frozen
class Item:
    """One entity of a section: its lines (``first`` to ``last``, inclusive, counted from the section's
    key line) and its keys in file order. Relative positions make moving a section or an entity O(1).

    ``fields`` (None unless the entity is a block mapping with one key per line, keys at ``column``,
    the first on the dash line) lets a save rewrite only the keys of the entity that changed.
    """

    first: int
    last: int
    keys: tuple[str, ...]
    fields: tuple[Field, ...] | None = None
    column: int = 0

    def moved_to(self, first: int) -> Item:
        return Item(first, first + self.last - self.first, self.keys, self.fields, self.column)


@attrs.frozen
class Top:
    """One top-level key: its lines, the key order of a mapping value, the entities of a block sequence."""

    key: str
    first: int
    last: int
    keys: tuple[str, ...] = ()
    items: tuple[Item, ...] | None = None  # None: not patchable entity by entity
    dash: int = 2

    def shifted(self, by: int) -> Top:
        return Top(self.key, self.first + by, self.last + by, self.keys, self.items, self.dash)

    def item_lines(self, item: Item) -> tuple[int, int]:
        """The absolute first and last line of ``item``."""
        return self.first + item.first, self.first + item.last


@attrs.frozen
class Layout:
    lines: tuple[str, ...]
    tops: tuple[Top, ...]
    newline: str

    @staticmethod
    def build(text: str, recorder: LayoutRecorder) -> Layout | None:
        if not recorder.usable or not recorder.tops:
            return None
        lines = split_lines(text)
        starts = list(itertools.accumulate(map(len, lines), initial=0))
        tops: list[Top] = []
        previous_last = -1
        for draft in recorder.tops:
            if draft.first <= previous_last or draft.last < draft.first or draft.last >= len(lines):
                return None
            previous_last = draft.last
            tops.append(draft.finish(lines, starts))
        newline = "\r\n" if lines and lines[0].endswith("\r\n") else "\n"
        return Layout(tuple(lines), tuple(tops), newline)


@attrs.define
class _ItemDraft:
    first: int
    column: int
    index: int
    last: int
    keys: list[str] = attrs.field(factory=list)
    fields: list[list[int | str]] = attrs.field(factory=list)  # [key, first line, last line, column]
    flow: bool = False

    def finish(self, base: int) -> Item:
        """The item, its lines counted from ``base`` (the section's key line)."""
        keys = tuple(self.keys)
        first, last = self.first - base, self.last - base
        fields: list[Field] = []
        floor = self.first - 1
        for key, start, end, column in self.fields:
            assert isinstance(key, str) and isinstance(start, int) and isinstance(end, int)
            if self.flow or column != self.column or start <= floor or end < start:
                return Item(first, last, keys)
            fields.append(Field(key, start - self.first, end - self.first))
            floor = end
        if not fields or fields[0].first != 0 or len(fields) != len(keys):
            return Item(first, last, keys)
        return Item(first, last, keys, tuple(fields), self.column)


@attrs.define
class _TopDraft:
    key: str
    first: int
    last: int
    keys: list[str] | None = None
    items: list[_ItemDraft] | None = None
    items_ok: bool = True

    def finish(self, lines: list[str], starts: list[int]) -> Top:
        keys = tuple(self.keys or ())
        if self.items is None or not self.items or not self.items_ok:
            return Top(self.key, self.first, self.last, keys)
        dash: int | None = None
        items: list[Item] = []
        floor = self.first
        for draft in self.items:
            if draft.first <= floor or draft.last < draft.first or draft.last > self.last:
                return Top(self.key, self.first, self.last, keys)
            if starts[draft.first] + draft.column != draft.index:
                return Top(self.key, self.first, self.last, keys)  # lines split differently: do not patch
            match = _DASH.fullmatch(lines[draft.first][: draft.column])
            if match is None or (dash is not None and len(match.group(1)) != dash):
                return Top(self.key, self.first, self.last, keys)
            dash = len(match.group(1))
            items.append(draft.finish(self.first))
            floor = draft.last
        return Top(self.key, self.first, self.last, keys, tuple(items), dash or 0)


def _mark(mark: Any) -> yaml.Mark:
    # The stubs allow None; the parser sets every mark (feed() refuses an event without one).
    return cast(yaml.Mark, mark)


_Scalar: Final = yaml.ScalarEvent


class LayoutRecorder:
    """Feed it every parser event of one document (``parse_yaml(..., observe=recorder.feed)``).

    Cheap per event: a scalar deeper than an entity's keys only moves the "last content line"
    mark; a top-level key, an entity or a key closes the previous one at that mark (the mark only
    moves forward, since events come in text order).
    """

    def __init__(self) -> None:
        self.usable = True
        self.tops: list[_TopDraft] = []
        # One frame per open collection: [is_mapping, children so far, flow style]
        self._stack: list[list[bool | int]] = []
        self._item: _ItemDraft | None = None
        self._end = 0  # the last line holding content so far

    def feed(self, event: yaml.Event) -> None:
        if not self.usable:
            return
        end = event.end_mark
        if end is None or event.start_mark is None:
            self.usable = False
            return
        if type(event) is _Scalar:
            if event.anchor is not None:
                self.usable = False
                return
            if len(self._stack) > 3:  # inside a key's value: only the content mark moves
                self._end = end.line if end.column else end.line - 1
                return
            self._node(event)
            self._end = end.line if end.column else end.line - 1
        elif isinstance(event, yaml.AliasEvent):
            self.usable = False
        elif isinstance(event, yaml.CollectionStartEvent):
            if event.anchor is not None:
                self.usable = False
                return
            if len(self._stack) <= 3:
                self._node(event)
            self._stack.append([isinstance(event, yaml.MappingStartEvent), 0, bool(event.flow_style)])
        elif isinstance(event, yaml.CollectionEndEvent):
            frame = self._stack.pop()
            if frame[2]:
                self._end = end.line if end.column else end.line - 1
            depth = len(self._stack)
            if depth == 2 and self._item is not None:
                self._close_item()
            elif depth == 0 and self.tops:
                self.tops[-1].last = max(self.tops[-1].last, self._end)

    def _node(self, event: yaml.NodeEvent) -> None:
        depth = len(self._stack)
        if depth == 0:
            if not isinstance(event, yaml.MappingStartEvent) or event.flow_style:
                self.usable = False
            return
        frame = self._stack[-1]
        is_key = bool(frame[0]) and int(frame[1]) % 2 == 0
        frame[1] = int(frame[1]) + 1
        if depth == 1:
            self._top_level(event, is_key)
        elif depth == 2:
            self._second_level(event, is_key)
        elif depth == 3 and is_key and self._item is not None:
            self._item_key(event)

    def _top_level(self, event: yaml.NodeEvent, is_key: bool) -> None:
        if is_key:
            if not isinstance(event, yaml.ScalarEvent) or _mark(event.start_mark).column != 0:
                self.usable = False
                return
            if self.tops:
                self.tops[-1].last = max(self.tops[-1].last, self._end)
            line = int(_mark(event.start_mark).line)
            self.tops.append(_TopDraft(key=event.value, first=line, last=line))
            return
        top = self.tops[-1]
        if isinstance(event, yaml.SequenceStartEvent) and not event.flow_style:
            top.items = []
        elif isinstance(event, yaml.MappingStartEvent) and not event.flow_style:
            top.keys = []

    def _second_level(self, event: yaml.NodeEvent, is_key: bool) -> None:
        top = self.tops[-1]
        if top.items is not None:
            if not isinstance(event, yaml.MappingStartEvent):
                top.items_ok = False
                return
            mark = _mark(event.start_mark)
            line = int(mark.line)
            self._item = _ItemDraft(first=line, column=int(mark.column), index=int(mark.index), last=line)
            self._item.flow = bool(event.flow_style)
            top.items.append(self._item)
        elif top.keys is not None and is_key and isinstance(event, yaml.ScalarEvent):
            top.keys.append(event.value)

    def _item_key(self, event: yaml.NodeEvent) -> None:
        item = self._item
        assert item is not None
        if not isinstance(event, yaml.ScalarEvent):
            item.flow = True  # a complex key: no per-key patching for this entity
            return
        if item.fields:
            item.fields[-1][2] = max(int(item.fields[-1][2]), self._end)
        item.keys.append(event.value)
        mark = _mark(event.start_mark)
        line = int(mark.line)
        item.fields.append([event.value, line, line, int(mark.column)])

    def _close_item(self) -> None:
        item = self._item
        assert item is not None
        item.last = max(item.last, self._end)
        if item.fields:
            item.fields[-1][2] = max(int(item.fields[-1][2]), self._end)
        self._item = None
