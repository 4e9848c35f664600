"""How a journal keeps documents: in the kind's data form when it has one, else in its text form.

A journal writes the whole document at every commit and every snapshot, and reads them back when a session
is opened again. For the threat model the text form is YAML, whose pure-Python writer took 10 ms for the
demo document, most of what opening a journaled session cost; its plain data, written as compact JSON by the
C encoder, takes 0.2 ms. So a `DataDocumentKind` has its documents journaled as the JSON text of
``to_data``, marked ``"document_form": "json"`` where they are (a snapshot's session, a settlement), and read
back through a bounded JSON parse and ``from_data``, the same gates as its text form's ``load``. A document
without a data form, or whose data is not JSON (a non-finite number, a value the encoder refuses, nesting
deeper than a journal reads back), is kept as text, as every document was before. The document stays inside
the entry as a string either way, so the entry's own depth does not grow with it, and its digest is the
SHA-256 of that string.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, Final, Generic, TypeVar, final

from trioloop.durable.bounded_json import parse_bounded_json
from trioloop.durable.journal import MAX_ENTRY_BYTES
from trioloop.machine.document import TextDocumentKind

__all__ = ["DATA_FORM", "TEXT_FORM", "DocumentCodec", "DocumentFormError"]

D = TypeVar("D")

#: The kind's text form (``dump`` / ``load``): every document journaled before the data form, and any without one.
TEXT_FORM: Final = "text"
#: The kind's plain data (``to_data`` / ``from_data``) as compact JSON text.
DATA_FORM: Final = "json"
#: How deep a document's data may nest and still be journaled in its data form (read back to this depth).
MAX_DATA_DEPTH: Final = 128

_STRINGS: Final = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKETS: Final = re.compile(r"[^\[\]{}]+")
_INNERMOST: Final = re.compile(r"\[\]|\{\}")
_encode: Final = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode


class DocumentFormError(ValueError):
    """A journaled document in a form this reader cannot read (an unknown form, or the data form of a kind that
    has none), or whose data does not parse within the bounds."""


def _nests_at_most(text: str, depth: int) -> bool:
    """Whether the JSON ``text`` nests at most ``depth`` deep: with its strings and everything but brackets
    removed, each pass removes the innermost pairs, so ``depth`` passes empty it exactly when it is that shallow
    (a pass is one scan in C; a document nests a few levels)."""
    brackets = _NOT_BRACKETS.sub("", _STRINGS.sub("", text))
    for _ in range(depth):
        if not brackets:
            return True
        brackets = _INNERMOST.sub("", brackets)
    return not brackets


def _data_text(data: Any) -> str | None:
    """``data`` as compact JSON text, or None when it is not JSON or nests too deep to be read back."""
    try:
        text = _encode(data)
    except (TypeError, ValueError, RecursionError):
        return None
    return text if _nests_at_most(text, MAX_DATA_DEPTH) else None


@final
class DocumentCodec(Generic[D]):
    """A document kind's journal forms: ``encode`` gives a document's form and text, ``decode`` reads one back."""

    __slots__ = ("_dump", "_from_data", "_load", "_to_data")

    def __init__(
        self,
        dump: Callable[[D], str],
        load: Callable[[str], D],
        to_data: Callable[[D], Any] | None = None,
        from_data: Callable[[Any], D] | None = None,
    ) -> None:
        self._dump, self._load = dump, load
        self._to_data, self._from_data = to_data, from_data

    @classmethod
    def of(cls, kind: TextDocumentKind[D]) -> DocumentCodec[D]:
        """The forms of ``kind``: its data form first when it has one, its text form always."""
        # A DataDocumentKind, told by its methods: a Protocol's isinstance costs tens of microseconds per open.
        to_data, from_data = getattr(kind, "to_data", None), getattr(kind, "from_data", None)
        if callable(to_data) and callable(from_data):
            return cls(kind.dump, kind.load, to_data, from_data)
        return cls(kind.dump, kind.load)

    @property
    def from_data(self) -> Callable[[Any], D] | None:
        """The kind's ``from_data`` when it has a data form (what `replay_journal` reads data-form documents with)."""
        return self._from_data

    def encode(self, document: D) -> tuple[str, str]:
        """``(form, text)``: the data form's JSON text when the kind has one for this document, else the text form."""
        if self._to_data is not None:
            data = self._to_data(document)
            if data is not None:
                text = _data_text(data)
                if text is not None:
                    return DATA_FORM, text
        return TEXT_FORM, self._dump(document)

    def encode_text(self, document: D) -> str:
        """The document's text form, whatever forms the kind has."""
        return self._dump(document)

    def decode(self, form: object, text: str) -> D:
        """The document ``text`` holds in ``form``; `DocumentFormError` for a form this kind cannot read, and
        whatever the kind's ``load`` or ``from_data`` raises for a document that is not valid."""
        if form == TEXT_FORM:
            return self._load(text)
        if form != DATA_FORM:
            raise DocumentFormError(f"the document is in a form this version does not know: {form!r}")
        if self._from_data is None:
            raise DocumentFormError("the document is in its data form, and this document kind has none (no from_data)")
        value = parse_bounded_json(
            text, max_bytes=MAX_ENTRY_BYTES, max_depth=MAX_DATA_DEPTH, error=DocumentFormError, subject="the document"
        )
        return self._from_data(value)
