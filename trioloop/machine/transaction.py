"""The one path from a tool's outcome to the live document, and undo of a whole turn.

A tool proposes a whole next document; `commit_tool_outcome` either swaps it in or refuses, and on
a turn's first commit records the pre-turn document in `UndoHistory` so the turn can be undone as
one step. Everything here is a pure function over immutable values: the caller holds the live
document and history and replaces them with what it gets back. Documents are of any type ``D``; the
`DocumentKind` validates them and compares them.
"""

from __future__ import annotations

import enum
from typing import Final, Generic, TypeVar, final

import attrs

from trioloop.machine.document import DocumentKind
from trioloop.machine.tools import RegisteredTool, ToolOutcome

__all__ = [
    "DEFAULT_UNDO_ENTRIES",
    "Committed",
    "DocumentMatch",
    "Refusal",
    "Refused",
    "Unchanged",
    "UndoAvailability",
    "UndoEntry",
    "UndoHistory",
    "commit_tool_outcome",
    "match_document",
    "redo_step",
    "turn_undo_availability",
    "undo_step",
    "undo_turn",
]

DEFAULT_UNDO_ENTRIES: Final = 20
D = TypeVar("D")


@final
@attrs.frozen(kw_only=True)
class UndoEntry(Generic[D]):
    """The document as it was before ``turn_id`` changed it."""

    turn_id: str
    document: D


@final
@attrs.frozen(kw_only=True)
class _Retired:
    """A turn whose entry left the stack: popped by an undo, or trimmed off the bottom."""

    turn_id: str
    undone: bool


def _positive(instance: object, attribute: attrs.Attribute[int], value: object) -> None:
    if type(value) is not int or value <= 0:
        raise ValueError(f"{attribute.name} must be a positive int, got {value!r}")


@final
@attrs.frozen(kw_only=True)
class UndoHistory(Generic[D]):
    """An immutable, capped undo stack (newest last); the oldest entry is dropped beyond the cap.

    ``retired`` remembers (up to the cap) which turns left the stack and whether by undo or by
    trimming, so availability can say "already undone" rather than "nothing to undo". ``redo`` holds
    what undo took back (the document each undone turn had left, newest last): `redo_step` re-applies
    it while nothing newer was committed (a `push`, every commit, clears it). ``undone_last`` says whether
    the newest change was an undo (then the top of ``redo`` is the document before it; else the top entry is),
    for `match_document`; it is not saved, and not part of equality.
    """

    entries: tuple[UndoEntry[D], ...] = ()
    max_entries: int = attrs.field(default=DEFAULT_UNDO_ENTRIES, validator=_positive)
    retired: tuple[_Retired, ...] = ()
    redo: tuple[UndoEntry[D], ...] = ()
    undone_last: bool = attrs.field(default=False, eq=False)

    @property
    def top(self) -> UndoEntry[D] | None:
        """The newest entry, or None when the history is empty."""
        return self.entries[-1] if self.entries else None

    def push(self, entry: UndoEntry[D]) -> UndoHistory[D]:
        """The history with ``entry`` on top (the oldest dropped past the cap); what could be redone is dropped."""
        entries = (*self.entries, entry)
        cut = len(entries) - self.max_entries
        trimmed = tuple(_Retired(turn_id=e.turn_id, undone=False) for e in entries[:cut]) if cut > 0 else ()
        return attrs.evolve(
            self, entries=entries[max(cut, 0) :], retired=self._remember(trimmed), redo=(), undone_last=False
        )

    def pop(self) -> UndoHistory[D]:
        """The history without its top entry (unchanged when empty)."""
        top = self.top
        if top is None:
            return self
        return attrs.evolve(
            self, entries=self.entries[:-1], retired=self._remember((_Retired(turn_id=top.turn_id, undone=True),))
        )

    def _remember(self, more: tuple[_Retired, ...]) -> tuple[_Retired, ...]:
        return (*self.retired, *more)[-self.max_entries :] if more else self.retired


# ---------------------------------------------------------------------------------------------
# Commit


@final
class Refusal(enum.StrEnum):
    """Why a commit was refused: the tool failed, a read proposed a change, the document changed under the call, or the
    result is invalid."""

    TOOL_ERROR = "tool_error"
    READ_TOOL_MUTATED = "read_tool_mutated"
    DOCUMENT_CHANGED = "document_changed"
    INVALID_DOCUMENT = "invalid_document"


@final
@attrs.frozen(kw_only=True)
class Committed(Generic[D]):
    """The proposed document is now live; ``history`` holds the turn's pre-turn snapshot."""

    document: D
    history: UndoHistory[D]
    result: str


@final
@attrs.frozen(kw_only=True)
class Unchanged:
    """The tool succeeded without proposing a document (every read tool, a no-op mutation)."""

    result: str


@final
@attrs.frozen(kw_only=True)
class Refused:
    """Nothing was committed; ``result`` is the error text the model receives for the call."""

    refusal: Refusal
    result: str


_READ_MUTATED_TEXT: Final = "A read-only tool returned a document change; it was refused and nothing changed."
_CHANGED_TEXT: Final = (
    "The document changed while this tool was running, so its change was not applied. "
    "Read the current document and try again."
)


def commit_tool_outcome(
    live_document: D,
    call_snapshot: D,
    outcome: ToolOutcome[D],
    tool: RegisteredTool[D],
    history: UndoHistory[D],
    *,
    turn_id: str,
    kind: DocumentKind[D],
) -> Committed[D] | Unchanged | Refused:
    """Commit a tool's proposed document, or say why not. First refusal wins:

    the tool failed (``tool_error``, its own text) -> a read tool proposed a document
    (``read_tool_mutated``) -> the live document is not the very object the call started from
    (``document_changed``) -> the proposal fails ``kind.validate`` (``invalid_document``, with
    the validator's message for the model). Identity, not equality, decides "changed": an equal copy
    put in place by someone else is still a write the call did not see, and identity can never
    mistake two different edits for one. On the turn's first commit the pre-turn document is pushed.
    """
    if not outcome.ok:
        return Refused(refusal=Refusal.TOOL_ERROR, result=outcome.result)
    proposed = outcome.document
    if proposed is None:
        return Unchanged(result=outcome.result)
    if tool.effect == "read":
        return Refused(refusal=Refusal.READ_TOOL_MUTATED, result=_READ_MUTATED_TEXT)
    if live_document is not call_snapshot:
        return Refused(refusal=Refusal.DOCUMENT_CHANGED, result=_CHANGED_TEXT)
    try:
        problem = kind.validate(proposed)
    except Exception as exc:  # a validator bug refuses the change; it never commits an unchecked document
        problem = f"the {kind.name} could not be validated ({type(exc).__name__})"
    if problem is not None:
        return Refused(
            refusal=Refusal.INVALID_DOCUMENT,
            result=f"The change was not applied because the document would be invalid: {problem}",
        )
    top = history.top
    if top is None or top.turn_id != turn_id:
        history = history.push(UndoEntry(turn_id=turn_id, document=live_document))
    return Committed(document=proposed, history=history, result=outcome.result)


# ---------------------------------------------------------------------------------------------
# Undo


@final
class UndoAvailability(enum.StrEnum):
    """Whether a turn can be undone: undoable, nothing to undo, already undone, or superseded by a later one."""

    UNDOABLE = "undoable"
    NOTHING_TO_UNDO = "nothing_to_undo"
    ALREADY_UNDONE = "already_undone"
    SUPERSEDED = "superseded"

    @property
    def undoable(self) -> bool:
        """Whether undo would restore the turn's pre-turn document now."""
        return self is UndoAvailability.UNDOABLE


def turn_undo_availability(
    history: UndoHistory[D], turn_id: str, snapshot: D | None = None, *, kind: DocumentKind[D] | None = None
) -> UndoAvailability:
    """Whether undoing ``turn_id`` now would restore exactly its pre-turn document.

    Only the top of the stack can be undone, and it is compared by value (turn id, and the pre-turn
    ``snapshot`` when the caller kept it, through ``kind.same`` when given) -- never by a remembered
    depth, which a trimmed history would alias to a newer entry. A turn that never committed has nothing to undo.
    """
    top = history.top
    if top is not None and top.turn_id == turn_id:
        if snapshot is None or (kind.same(top.document, snapshot) if kind is not None else top.document == snapshot):
            return UndoAvailability.UNDOABLE
        return UndoAvailability.SUPERSEDED
    if any(entry.turn_id == turn_id for entry in history.entries):
        return UndoAvailability.SUPERSEDED
    for retired in reversed(history.retired):
        if retired.turn_id == turn_id:
            return UndoAvailability.ALREADY_UNDONE if retired.undone else UndoAvailability.SUPERSEDED
    # Committed (the caller kept a snapshot) but no longer known: it was trimmed long ago.
    return UndoAvailability.NOTHING_TO_UNDO if snapshot is None else UndoAvailability.SUPERSEDED


def undo_turn(
    history: UndoHistory[D],
    live_document: D,
    turn_id: str,
    snapshot: D | None = None,
    *,
    kind: DocumentKind[D] | None = None,
) -> tuple[D, UndoHistory[D]] | None:
    """The pre-turn document and the history without the turn's entry, or None when not undoable.

    ``live_document`` is the document the undo replaces whole; it is not consulted, because the
    turn's entry being on top already means nothing was recorded after the turn's changes.
    """
    if not turn_undo_availability(history, turn_id, snapshot, kind=kind).undoable:
        return None
    top = history.top
    if top is None:  # undoable implies a top entry; kept total all the same
        return None
    return top.document, _undone(history, live_document)


def undo_step(history: UndoHistory[D], live_document: D) -> tuple[D, UndoHistory[D], str] | None:
    """Undo the newest turn still on the stack, whichever it is: its pre-turn document, the history without
    it (what it left kept for `redo_step`), and its turn id; None when there is nothing left to undo.

    Steps back one turn a call, as far as the history reaches (its cap, 20 by default)."""
    top = history.top
    if top is None:
        return None
    return top.document, _undone(history, live_document), top.turn_id


def redo_step(history: UndoHistory[D], live_document: D) -> tuple[D, UndoHistory[D], str] | None:
    """Re-apply the turn undone last: the document it had left, the history with it undoable again, and its
    turn id; None when nothing was undone since the last commit."""
    if not history.redo:
        return None
    entry = history.redo[-1]
    entries = (*history.entries, UndoEntry(turn_id=entry.turn_id, document=live_document))[-history.max_entries :]
    retired = tuple(r for r in history.retired if r.turn_id != entry.turn_id)
    return (
        entry.document,
        attrs.evolve(history, entries=entries, retired=retired, redo=history.redo[:-1], undone_last=False),
        entry.turn_id,
    )


def _undone(history: UndoHistory[D], live_document: D) -> UndoHistory[D]:
    """``history`` without its top entry, which `redo_step` can re-apply (to ``live_document``, as it was)."""
    top = history.top
    assert top is not None
    popped = history.pop()
    redo = (*history.redo, UndoEntry(turn_id=top.turn_id, document=live_document))[-history.max_entries :]
    return attrs.evolve(popped, redo=redo, undone_last=True)


class DocumentMatch(enum.StrEnum):
    """How a document (a file read back, say) stands to a session's: `match_document`."""

    #: The session's live document.
    SAME = "same"
    #: The document as it was before the session's latest change (its latest committing turn, or its latest undo
    #: or redo): what a file holds when the app stopped between committing a change and saving it.
    BEHIND = "behind"
    #: Neither: another document, or this one changed outside the session.
    OTHER = "other"


def match_document(kind: DocumentKind[D], candidate: D, live_document: D, history: UndoHistory[D]) -> DocumentMatch:
    """Whether ``candidate`` is the live document, the document one change behind it, or another (by ``kind.same``).

    One change behind is the top of the redo stack after an undo (the document the undone turn had left) and
    otherwise the top undo entry (the document before the newest turn that changed it, or before a redo)."""
    if kind.same(candidate, live_document):
        return DocumentMatch.SAME
    before = history.redo[-1] if history.undone_last and history.redo else history.top
    if before is not None and kind.same(candidate, before.document):
        return DocumentMatch.BEHIND
    return DocumentMatch.OTHER
