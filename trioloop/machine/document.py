"""The document interface: what the loop needs from a document type ``D``, and nothing more.

The core never looks inside a document. It asks a `DocumentKind` four things: is this proposed next document
valid (``validate``), give a tool a private copy it may do anything to (``private_copy``, skipped when the kind
declares its documents ``immutable``), are these two documents the same (``same``, for undo availability), and
what changed between two (``diff``, for previews and the CLI). A domain implements it once; `define_document_kind`
builds one from plain functions for the common cases (a string, a frozen attrs value). A kind that can also write
its documents as text and read them back (`TextDocumentKind`: ``dump`` / ``load``) lets a `Session` be saved to a
session file and resumed.
"""

from __future__ import annotations

import copy
import difflib
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar, final, runtime_checkable

import attrs

__all__ = [
    "DataDocumentKind",
    "DocumentKind",
    "SimpleDocumentKind",
    "TextDocumentKind",
    "define_document_kind",
    "document_type_problem",
    "text_diff",
]

D = TypeVar("D")


class DocumentKind(Protocol[D]):
    """What the loop needs from documents of type ``D``. Every method is pure and must not raise."""

    @property
    def name(self) -> str:
        """A short noun for messages and cards ("threat model", "note")."""
        ...

    @property
    def immutable(self) -> bool:
        """True when a ``D`` can never change in place: tools then share the snapshot, and no copy is made."""
        ...

    def validate(self, document: D) -> str | None:
        """None when ``document`` may become the live document, else a message the model can act on."""
        ...

    def private_copy(self, document: D) -> D:
        """An equal document sharing no mutable object with ``document`` (only called when not immutable)."""
        ...

    def same(self, a: D, b: D) -> bool:
        """Whether two documents are the same content (undo availability compares with it)."""
        ...

    def diff(self, before: D, after: D) -> str:
        """A plain-text unified diff from ``before`` to ``after``; empty when they are the same."""
        ...


@runtime_checkable
class TextDocumentKind(DocumentKind[D], Protocol[D]):
    """A `DocumentKind` whose documents have a text form, so sessions on them can be saved and resumed."""

    def dump(self, document: D) -> str:
        """The document as text that ``load`` reads back to an equal document."""
        ...

    def load(self, text: str) -> D:
        """A document from text; raises (any ``Exception``) for text that is not a valid document."""
        ...


@runtime_checkable
class DataDocumentKind(TextDocumentKind[D], Protocol[D]):
    """A `TextDocumentKind` whose documents also have a plain-data form (JSON values: dicts with text keys,
    lists, text, numbers, booleans, None).

    A journal keeps a document in this form when the kind has it: encoding and checking plain data costs a
    fraction of rendering and parsing most text forms (a YAML document, for one), and a journal writes the
    document at every commit and snapshot. The text form stays what files and diffs use.
    """

    def to_data(self, document: D) -> Any:
        """The document as plain data that ``from_data`` turns back into an equal document, or None when this
        document has none (the journal then keeps its text form)."""
        ...

    def from_data(self, data: Any) -> D:
        """A document from plain data ``to_data`` gave; raises (any ``Exception``) for data that is not a valid
        document, as ``load`` does for text."""
        ...


def text_diff(before: str, after: str, *, before_name: str = "before", after_name: str = "after") -> str:
    """A unified line diff of two texts (empty when equal)."""
    if before == after:
        return ""
    lines = difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True), before_name, after_name
    )
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)


def _no_problem(document: Any) -> str | None:
    return None


def _equal(a: Any, b: Any) -> bool:
    return bool(a == b)


@final
@attrs.frozen(kw_only=True)
class SimpleDocumentKind(Generic[D]):
    """A `DocumentKind` made of plain functions (see `define_document_kind`)."""

    name: str
    #: The type its documents are (None: any), checked where a session is made.
    document_type: type[D] | None = None
    validator: Callable[[D], str | None] = attrs.field(default=_no_problem, repr=False)
    copier: Callable[[D], D] | None = attrs.field(default=None, repr=False)
    render: Callable[[D], str] = attrs.field(default=str, repr=False)
    comparer: Callable[[D, D], bool] = attrs.field(default=_equal, repr=False)
    dumper: Callable[[D], str] | None = attrs.field(default=None, repr=False)
    loader: Callable[[str], D] | None = attrs.field(default=None, repr=False)
    data_dumper: Callable[[D], Any] | None = attrs.field(default=None, repr=False)
    data_loader: Callable[[Any], D] | None = attrs.field(default=None, repr=False)

    @property
    def immutable(self) -> bool:
        """Whether documents of this kind are never changed in place (tools then share one, no copies)."""
        return self.copier is None

    def validate(self, document: D) -> str | None:
        """None for a valid document, else the problem, in words the model can act on."""
        return self.validator(document)

    def private_copy(self, document: D) -> D:
        """A copy a tool may change freely without reaching the live document."""
        return document if self.copier is None else self.copier(document)

    def same(self, a: D, b: D) -> bool:
        """Whether two documents are equal (what undo compares)."""
        return a is b or self.comparer(a, b)

    def diff(self, before: D, after: D) -> str:
        """A unified diff of ``before`` and ``after`` in the kind's text form (empty when equal)."""
        return text_diff(self.render(before), self.render(after))

    def dump(self, document: D) -> str:
        """The document's text form (what session files and journals store)."""
        if self.dumper is None:
            raise TypeError(f"the {self.name} kind has no text form: give define_document_kind dump= and load=")
        return self.dumper(document)

    def load(self, text: str) -> D:
        """A document from its text form; raises on text that is not a valid document."""
        if self.loader is None:
            raise TypeError(f"the {self.name} kind has no text form: give define_document_kind dump= and load=")
        return self.loader(text)

    def to_data(self, document: D) -> Any:
        """The document's plain-data form (what journals store), or None when the kind has none."""
        return None if self.data_dumper is None else self.data_dumper(document)

    def from_data(self, data: Any) -> D:
        """A document from its plain-data form; raises on data that is not a valid document."""
        if self.data_loader is None:
            raise TypeError(f"the {self.name} kind has no data form: give define_document_kind to_data= and from_data=")
        return self.data_loader(data)


def define_document_kind(
    name: str,
    *,
    validate: Callable[[D], str | None] | None = None,
    copy_with: Callable[[D], D] | None = None,
    mutable: bool = False,
    render: Callable[[D], str] = str,
    same: Callable[[D, D], bool] | None = None,
    dump: Callable[[D], str] | None = None,
    load: Callable[[str], D] | None = None,
    document_type: type[D] | None = None,
    to_data: Callable[[D], Any] | None = None,
    from_data: Callable[[Any], D] | None = None,
) -> SimpleDocumentKind[D]:
    """A document kind from functions.

    ``validate`` returns None or a message for the model (default: every document is valid). Documents are
    immutable by default (a ``str``, a tuple, a frozen attrs class of immutable fields): tools share them. For a
    mutable type pass ``mutable=True`` (each tool gets ``copy.deepcopy``) or your own ``copy_with``. ``render``
    gives the text ``diff`` compares (default ``str``); ``same`` defaults to ``==``. ``dump`` and ``load``
    (document to text and back; ``load`` must refuse invalid text by raising) let sessions be saved and resumed.
    ``document_type``, when given, is the type every document of the kind is: a session made with a value of
    another type is refused at once (`document_type_problem`), not deep in a tool or a save. ``to_data`` and
    ``from_data`` (document to plain JSON data and back, e.g. cattrs' ``unstructure`` and ``structure``;
    ``from_data`` must refuse invalid data by raising) give it a data form, which journals store instead of the
    text form, at a fraction of the cost when the text form is expensive to write or read.
    """
    if (to_data is None) != (from_data is None):
        raise TypeError("give define_document_kind both to_data= and from_data=, or neither")
    copier: Callable[[D], D] | None = copy_with
    if copier is None and mutable:
        copier = copy.deepcopy
    return SimpleDocumentKind(
        name=name,
        document_type=document_type,
        validator=validate if validate is not None else _no_problem,
        copier=copier,
        render=render,
        comparer=same if same is not None else _equal,
        dumper=dump,
        loader=load,
        data_dumper=to_data,
        data_loader=from_data,
    )


def document_type_problem(kind: DocumentKind[Any], document: object) -> str | None:
    """Why ``document`` cannot be a document of ``kind`` (a value of another type than the kind's
    ``document_type``, when it names one), or None."""
    expected = getattr(kind, "document_type", None)
    if not isinstance(expected, type) or isinstance(document, expected):
        return None
    hint = " (its .model is one)" if isinstance(getattr(document, "model", None), expected) else ""
    return f"the {kind.name} kind takes a {expected.__name__} as its document, not a {type(document).__name__}{hint}"
