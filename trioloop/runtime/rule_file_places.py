"""Where a rule file's tables and keys are: the line of each ``[[rules]]`` header, each key and each condition.

`tomllib` gives values, never positions, and an error in a rule file is reported with its line. This module
reads the text of a file `tomllib` has already accepted and finds its statements: table headers (``[a.b]``),
array-of-tables headers (``[[a.b]]``) and key assignments (``a.b = value``), each with its line. Values are
skipped, not read: strings of all four kinds (a ``[[rules]]`` line inside a multi-line string is text, not a
header) and arrays and inline tables over any number of lines. It is iterative (no nesting depth limit) and
linear in the text.
"""

from __future__ import annotations

import re
import tomllib
from typing import Final, Literal, final

import attrs

__all__ = ["Statement", "statements"]

# Strings, as TOML writes them (the text is valid TOML: these only have to find where each one ends).
_BASIC: Final = re.compile(r'"(?:[^"\\\n]|\\.)*"')
_LITERAL: Final = re.compile(r"'[^'\n]*'")
_MULTI_BASIC: Final = re.compile(r'"""(?:[^"\\]|\\[\s\S]|"(?!""))*"{3,5}')
_MULTI_LITERAL: Final = re.compile(r"'''[\s\S]*?'{3,5}")
_BARE_KEY: Final = re.compile(r"[A-Za-z0-9_-]+")
_BLANK: Final = re.compile(r"(?:[ \t\r\n]|#[^\n]*)*")
_SPACES: Final = re.compile(r"[ \t]*")
# Inside an array or inline table: a run of characters that neither opens a string, a comment or a container,
# nor closes one.
_PLAIN: Final = re.compile(r"[^\"'\[\]{}#]+")
_SCALAR_END: Final = re.compile(r"[^#\n]*")
_COMMENT: Final = re.compile(r"#[^\n]*")

Kind = Literal["table", "array", "key"]


@final
@attrs.frozen
class Statement:
    """One statement of a TOML text: a ``[table]`` or ``[[array]]`` header, or a key assignment, with its dotted
    key (as `tomllib` reads it: quotes and escapes resolved) and the line it starts on (1-based)."""

    line: int
    kind: Kind
    key: tuple[str, ...]


def _skip(pattern: re.Pattern[str], text: str, pos: int) -> int:
    """Where ``pattern`` (one that matches the empty string, or is known to match here) ends from ``pos``."""
    found = pattern.match(text, pos)
    return pos if found is None else found.end()


def _string_end(text: str, pos: int) -> int:
    """The end of the string that starts at ``pos``."""
    for pattern in (_MULTI_BASIC, _MULTI_LITERAL, _BASIC, _LITERAL):
        found = pattern.match(text, pos)
        if found is not None:
            return found.end()
    raise ValueError(f"no string at offset {pos}")  # not valid TOML: tomllib would have refused it


def _read_key(text: str, pos: int) -> tuple[tuple[str, ...], int]:
    """The dotted key at ``pos`` and where it ends (whitespace after it skipped)."""
    parts = []
    while True:
        pos = _skip(_SPACES, text, pos)
        char = text[pos : pos + 1]
        if char in ('"', "'"):
            end = _string_end(text, pos)
            raw = text[pos:end]
            parts.append(raw[1:-1] if char == "'" else str(tomllib.loads(f"k = {raw}")["k"]))
        else:
            bare = _BARE_KEY.match(text, pos)
            if bare is None:
                raise ValueError(f"no key at offset {pos}")
            end = bare.end()
            parts.append(bare.group())
        pos = _skip(_SPACES, text, end)
        if text[pos : pos + 1] != ".":
            return tuple(parts), pos
        pos += 1


def _value_end(text: str, pos: int) -> int:
    """The end of the value that starts at ``pos``: a string, a scalar, or an array or inline table (with
    everything inside it, over any number of lines)."""
    char = text[pos : pos + 1]
    if char in ('"', "'"):
        return _string_end(text, pos)
    if char not in ("[", "{"):
        return _skip(_SCALAR_END, text, pos)
    depth = 0
    while pos < len(text):
        char = text[pos]
        if char in "[{":
            depth += 1
            pos += 1
        elif char in "]}":
            depth -= 1
            pos += 1
            if depth == 0:
                return pos
        elif char in "\"'":
            pos = _string_end(text, pos)
        elif char == "#":
            pos = _skip(_COMMENT, text, pos)
        else:
            pos = _skip(_PLAIN, text, pos)
    return pos


def statements(text: str) -> list[Statement]:
    """Every header and key assignment of ``text`` (a valid TOML document), in order, with its line.

    Keys are as written in their table (``verdict`` under ``[[rules]]``, not ``rules.verdict``): the caller
    follows the headers. `ValueError` for text that is not valid TOML (which `tomllib` refuses first)."""
    found: list[Statement] = []
    pos, line, counted = 0, 1, 0
    while True:
        pos = _skip(_BLANK, text, pos)
        if pos >= len(text):
            return found
        line += text.count("\n", counted, pos)
        counted = pos
        if text[pos] == "[":
            array = text.startswith("[[", pos)
            key, pos = _read_key(text, pos + (2 if array else 1))
            closing = "]]" if array else "]"
            if not text.startswith(closing, pos):
                raise ValueError(f"line {line}: a table header without its {closing}")
            pos += len(closing)
            found.append(Statement(line, "array" if array else "table", key))
            continue
        key, pos = _read_key(text, pos)
        found.append(Statement(line, "key", key))
        if text[pos : pos + 1] != "=":
            raise ValueError(f"line {line}: a key without =")
        pos = _skip(_SPACES, text, pos + 1)
        pos = _value_end(text, pos)
