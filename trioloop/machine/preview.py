"""Dry-run previews: what a call would change in the document, shown on its card before the user decides.

A tool may declare a pure ``preview(document, input) -> Preview``. It never runs the tool's ``run`` and
never touches the live document; the reducer never sees a preview (it stays document-free). A face
computes the preview with `preview_call` from the document as it stands, and again after every commit,
so a card still waiting to run shows what will really happen. Every entry is named, and a cascade's
removals are listed one by one, so a destructive card hides nothing it takes with it; an entity a call
adds is named by the id its run will give it, reserved for it among the step's other adds
(`trioloop.machine.reservations`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, TypeAlias, final

import attrs

from trioloop.machine.card import plain_value

__all__ = ["EntityChange", "FieldChange", "Preview", "PreviewFn", "preview_call"]


@final
@attrs.frozen(kw_only=True)
class FieldChange:
    """One field of one entity: its value before and after (None where the field is absent)."""

    field: str
    before: str | None
    after: str | None


@final
@attrs.frozen(kw_only=True)
class EntityChange:
    """One entity the call would add, change or remove, named by its kind, id and display name.

    ``fields`` holds every field of an added entity (``before`` None), every field of a removed one
    (``after`` None), or only the fields that change of a changed one.
    """

    kind: str
    id: str
    name: str = ""
    fields: tuple[FieldChange, ...] = ()

    @property
    def label(self) -> str:
        """How the change reads on a card, e.g. ``Adds threat threat-8 (Forged PSP webhook)``."""
        shown = plain_value(self.name)
        return f"{self.kind} {plain_value(self.id)}" + (f" ({shown})" if shown and shown != self.id else "")


@final
@attrs.frozen(kw_only=True)
class Preview:
    """What a call would do to the document: entities added, changed and removed, or why it would fail."""

    added: tuple[EntityChange, ...] = ()
    changed: tuple[EntityChange, ...] = ()
    removed: tuple[EntityChange, ...] = ()
    #: Set when the call would be refused on this document (the text says why); nothing would change.
    failure: str | None = None

    @property
    def is_empty(self) -> bool:
        """Whether the preview shows no change at all."""
        return not (self.added or self.changed or self.removed)

    def lines(self) -> tuple[str, ...]:
        """The preview as plain-text lines: one per entity, then one per field that changes."""
        if self.failure is not None:
            return (f"Would fail: {plain_value(self.failure)}",)
        if self.is_empty:
            return ("No change to the document.",)
        out: list[str] = []
        for verb, entries in (("Adds", self.added), ("Changes", self.changed), ("Removes", self.removed)):
            for entry in entries:
                out.append(f"{verb} {entry.label}")
                if verb == "Changes":
                    out.extend(f"  {c.field}: {_shown(c.before)} -> {_shown(c.after)}" for c in entry.fields)
        return tuple(out)


def _shown(value: str | None) -> str:
    return "(none)" if value is None else plain_value(value)


#: A tool's preview, as declared to `define_executable_tool`: (document, validated input) -> Preview.
PreviewFn: TypeAlias = Callable[[Any, Any], Preview]

PREVIEW_FAILED: Final = "The preview could not be computed."


def preview_call(prepared: Any, document: Any) -> Preview | None:
    """The preview of a prepared call on ``document``, or None when its tool declares none.

    Never raises: a preview that fails is reported as a `Preview` with ``failure`` set.
    """
    bound: Callable[[Any], Preview] | None = getattr(prepared, "preview", None)
    if bound is None:
        return None
    try:
        produced = bound(document)
    except Exception as exc:  # a tool's preview must not crash a face
        return Preview(failure=f"{PREVIEW_FAILED} ({type(exc).__name__})")
    if not isinstance(produced, Preview):
        return Preview(failure=PREVIEW_FAILED)
    return produced
