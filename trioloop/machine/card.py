"""What a review card shows of a call's input: every field, in order, as plain-text field/value lines.

The lines come from the canonical (unstructured) input, the very value the grant's digest is computed
over, so nothing a tool is handed comes from a field the reviewer could not see. Nested fields are
flattened with their path (``threat.mitigation.status``, ``technologies[0]``); values are shown whole,
with nothing hidden: every control, bidi and zero-width code point is written as ``\\u{XXXX}`` (and a
backslash doubled, so a lone backslash always starts such an escape), so two inputs that differ only by
an invisible character never look alike. `one_line` cuts a value for a compact view and marks the cut;
the detail view shows the whole value.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Final, TypeAlias

from trioloop.machine.canonical import canonical_json
from trioloop.machine.untrusted_text import TRUNCATION_MARK, is_stripped_code_point

__all__ = ["CardDetails", "changed_fields", "input_details", "one_line", "plain_value", "visible_char"]

#: Ordered (field path, value) pairs, one per leaf of the canonical input.
CardDetails: TypeAlias = tuple[tuple[str, str], ...]

#: How much of a value the one-line view shows, in code points, before it cuts and marks the value.
ONE_LINE_MAX: Final = 60


def plain_value(text: str) -> str:
    """``text`` as plain text with nothing hidden: every control, bidi and zero-width code point written as
    ``\\u{XXXX}`` (newline and tab kept), and a backslash doubled, so the escape cannot be typed to pose as
    one: distinct texts always read differently."""
    if text.isascii() and text.isprintable() and "\\" not in text:
        return text
    return "".join(visible_char(char) for char in text)


def visible_char(char: str, *, allow_newlines: bool = True) -> str:
    """One code point as a card shows it: a backslash doubled, a control, bidi or zero-width code point
    (and, unless ``allow_newlines``, a newline or tab) written as ``\\u{XXXX}``, anything else as itself."""
    if char == "\\":
        return "\\\\"
    if is_stripped_code_point(char, allow_newlines=allow_newlines):
        return f"\\u{{{ord(char):04X}}}"
    return char


def _leaf(value: Any) -> str:
    """A scalar as the card shows it: text as itself, anything else as JSON. Text that would read as
    something else (empty, ``null``, ``true``, a number, a bracket or a quote first) is shown quoted,
    so the string "null" and an absent (null) field never look alike."""
    if not isinstance(value, str):
        return canonical_json(value)
    plain = plain_value(value)
    if plain in _JSON_WORDS or plain[:1] in _JSON_OPENERS or _is_number(plain):
        return canonical_json(plain)
    return plain


_JSON_WORDS: Final = frozenset({"", "null", "true", "false"})
_JSON_OPENERS: Final = frozenset('"[{')


def _is_number(text: str) -> bool:
    first = text[:1]
    if first.isascii() and first.isalpha() and first not in "iInN":
        return False  # float() takes a sign, a digit, a point, inf or nan first (after spaces): no need to ask
    try:
        float(text)
    except ValueError:
        return False
    return True


#: A key containing one of these (or empty) is written ``["key"]`` in a path, so ``{"a.b": 1}`` and
#: ``{"a": {"b": 1}}`` (or ``{"a[0]": 1}`` and ``{"a": [1]}``) never share a line.
_PATH_SPECIALS: Final = frozenset('.[]"')


def _child(path: str, key: str) -> str:
    name = plain_value(key)
    if name and _PATH_SPECIALS.isdisjoint(name):
        return f"{path}.{name}" if path else name
    quoted = name.replace('"', '\\"')  # plain_value doubled every backslash: \" reads only as a quote
    return f'{path}["{quoted}"]'


def _flatten(value: Any, path: str, inline: bool) -> Iterator[tuple[str, str]]:
    if isinstance(value, Mapping) and value:
        for key, item in value.items():
            yield from _flatten(item, _child(path, str(key)), inline)
    elif inline and isinstance(value, list | tuple) and all(not isinstance(v, Mapping | list | tuple) for v in value):
        yield path, "[" + ", ".join(_leaf(item) for item in value) + "]"
    elif isinstance(value, list | tuple) and value:
        for index, item in enumerate(value):
            yield from _flatten(item, f"{path}[{index}]", inline)
    elif isinstance(value, Mapping):
        yield path, "{}"
    elif isinstance(value, list | tuple):
        yield path, "[]"
    else:
        yield path, _leaf(value)


def input_details(canonical_input: Any, *, inline_lists: bool = False) -> CardDetails:
    """Every leaf of ``canonical_input`` (a JSON value) as a (path, plain value) line, in input order.

    ``inline_lists`` shows a list of scalars as one ``[a, b]`` line (a preview compares whole lists).
    """
    if isinstance(canonical_input, Mapping) and not canonical_input:
        return ()
    return tuple(_flatten(canonical_input, "", inline_lists))


def one_line(value: str, width: int = ONE_LINE_MAX) -> str:
    """``value`` on one line (line breaks and tabs shown as spaces) of at most ``width`` code points; a value
    that does not fit is cut and ends in "…", so the compact view never passes for the whole value."""
    if width < 1:
        raise ValueError("width must be at least 1")
    flat = value.replace("\r", " ").replace("\n", " ").replace("\t", " ")
    return flat if len(flat) <= width else flat[: width - 1] + TRUNCATION_MARK


def changed_fields(before: CardDetails, after: CardDetails) -> tuple[tuple[str, str | None, str | None], ...]:
    """Which fields differ between two inputs' details: (path, old or None, new or None), in ``after``'s order
    with removed fields last."""
    old = dict(before)
    new = dict(after)
    changes: list[tuple[str, str | None, str | None]] = [
        (path, old.get(path), value) for path, value in after if old.get(path) != value
    ]
    changes.extend((path, value, None) for path, value in before if path not in new)
    return tuple(changes)
