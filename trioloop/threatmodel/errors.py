"""Typed failures for reading and validating `.thf` documents.

Each class is one class of failure (SPEC §8). A message is a single line that names the section, the
id and the broken rule, and never contains a filesystem path or parser internals, because messages
are shown to users and handed back to a model so it can correct itself. `path_hint` adds the fix to a
failure on text that names a file.
"""

from __future__ import annotations

import os
import unicodedata
from collections.abc import Iterator
from contextlib import contextmanager
from typing import ClassVar

__all__ = [
    "CircularGroupNesting",
    "DuplicateId",
    "InvalidReference",
    "InvalidShape",
    "ThfError",
    "UnsafeYaml",
    "UnsupportedVersion",
]


_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def quote(text: str, limit: int = 64) -> str:
    """`text` in double quotes, capped, with control, format (bidi) and separator characters escaped.

    Document ids and names end up in messages a model or a terminal reads; escaping keeps each message
    on one line and stops a crafted id from reordering or hiding the text around it.
    """
    cut = text if len(text) <= limit else text[: limit - 1] + "…"
    out = []
    for char in cut:
        if char in '"\\':
            out.append("\\" + char)
        elif unicodedata.category(char) in _UNSAFE_CATEGORIES:
            out.append(f"\\u{ord(char):04x}" if ord(char) <= 0xFFFF else f"\\U{ord(char):08x}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def _one_line(message: str) -> str:
    return " ".join(message.split())


class ThfError(Exception):
    """A `.thf` document cannot be used; `.message` is one line, safe to show to a user or a model."""

    kind: ClassVar[str] = "thf-error"

    def __init__(self, message: str) -> None:
        self.message = _one_line(message)
        super().__init__(self.message)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and isinstance(other, ThfError) and other.message == self.message

    def __hash__(self) -> int:
        return hash((type(self), self.message))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r})"


class UnsupportedVersion(ThfError):
    """`version` is missing, not text, or not exactly "1.0"."""

    kind = "unsupported-version"


class InvalidShape(ThfError):
    """The document is not YAML, or a section, entry or field has the wrong type."""

    kind = "invalid-shape"


class DuplicateId(ThfError):
    """An id repeats within a section, or collides across sections where ids must be distinct."""

    kind = "duplicate-id"


class InvalidReference(ThfError):
    """A field names an id that does not exist, or a threat targets nothing."""

    kind = "invalid-reference"


class CircularGroupNesting(ThfError):
    """Groups nest in a cycle through `parent` (a group that is its own parent included)."""

    kind = "circular-group-nesting"


class UnsafeYaml(ThfError):
    """The input is too large, too deeply nested, or expands aliases beyond the allowed bound."""

    kind = "unsafe-yaml"


@contextmanager
def path_hint(source: str | bytes) -> Iterator[None]:
    """Re-raise a document error on text that names an existing file (or a `.thf` name) with the fix.

    `load_thf("payment.thf")` reads the string as YAML (one scalar, not a document); the error then says
    to pass a `pathlib.Path`, which is how a file is read.
    """
    try:
        yield
    except ThfError as error:
        name = source.decode("utf-8", "replace") if isinstance(source, bytes) else source
        if len(name) > 4096 or "\n" in name or "\0" in name or not name.strip():
            raise
        exists = os.path.isfile(name)
        if not (exists or name.strip().lower().endswith(".thf")):
            raise
        where = "names an existing file" if exists else "looks like a file name"
        raise type(error)(
            f"{error.message}; the text given, {quote(name)}, {where}: pass a Path to read a file "
            "(pathlib.Path of that text)"
        ) from error
