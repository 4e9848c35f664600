"""A review card in the terminal: the call's summary, every field of its input, its dry-run preview and the keys.

A card can show an edit the person made instead of the model's input: the fields that changed are marked, each
with what it was, so the person approves what they see, never an edit they could not check. Renderables only:
`TurnView` prints them.
"""

from __future__ import annotations

from typing import Any, Final, final

import attrs
from rich.markup import escape
from rich.panel import Panel
from rich.text import Text

from trioloop.cli.review import DESTRUCTIVE_RULE_KEYS, EDIT_KEYS, HELP, KEYS, RULE_KEYS
from trioloop.machine.card import CardDetails, changed_fields, one_line
from trioloop.machine.preview import preview_call
from trioloop.machine.reducer import CallRecord
from trioloop.machine.tools import PreparedCall

__all__ = ["Edit", "card", "change_lines", "help_text", "make_edit"]

#: A changed field: its path, the value it had and the value it has (None where absent).
Change = tuple[str, str | None, str | None]

_ABSENT: Final = "(absent)"


@final
@attrs.frozen(kw_only=True)
class Edit:
    """An input the person edited and the call's own tool accepted, waiting for their key: the input, the call
    the tool prepared from it, and the fields that differ from the model's input."""

    input: dict[str, Any]
    prepared: PreparedCall[Any]
    changes: tuple[Change, ...]


def make_edit(call: CallRecord, edited: dict[str, Any], prepared: PreparedCall[Any]) -> Edit:
    """The edit of ``call`` to ``edited``, which its tool prepared as ``prepared``."""
    before: CardDetails = call.prepared.details if call.prepared is not None else ()
    return Edit(input=edited, prepared=prepared, changes=changed_fields(before, prepared.details))


def card(call: CallRecord, document: Any, *, width: int, keys: bool, edit: Edit | None = None) -> Panel:
    """The card of ``call`` (of its ``edit``, when given) for a terminal ``width`` columns wide; ``keys`` adds
    the line of answers."""
    prepared = call.prepared if edit is None else edit.prepared
    changed = {} if edit is None else {path: old for path, old, _ in edit.changes}
    body = Text()
    body.append(call.summary if edit is None else edit.prepared.summary)  # plain text: never read as markup
    if call.destructive:
        body.append("\nDESTRUCTIVE", style="bold red")
    if call.decided_by is not None:  # the rule or function that asked for this card
        body.append(f"\n{call.decided_by.describe()}", style="bold")
    details = prepared.details if prepared is not None else ()
    if details or changed:
        body.append("\nInput:" if edit is None else "\nInput, as you edited it (* changed):", style="bold")
    unset = 0
    for path, value in details:
        if path in changed:
            _changed_line(body, path, value, changed[path], width)
        elif value == "null":
            unset += 1  # a field left out (null) writes nothing; "?" lists every field
        else:
            body.append(f"\n  {path}: {one_line(value, _value_width(path, width))}")
    shown = {path for path, _ in details}
    for path, old in changed.items():
        if path not in shown:  # a field the edit took out
            _changed_line(body, path, None, old, width)
    if unset:
        body.append(f"\n  ({unset} more field(s) left null; ? shows every field, whole)", style="dim")
    for line in _preview_lines(prepared, document):
        body.append(f"\n{line}", style="bold" if not line.startswith(" ") else "")
    if keys:
        shown_keys = EDIT_KEYS if edit is not None else KEYS
        rule_keys = DESTRUCTIVE_RULE_KEYS if call.destructive else RULE_KEYS
        body.append(f"\n{shown_keys}\n{rule_keys}", style="dim")
    title = f"review {escape(call.id)} · {escape(call.tool_name)}"
    if edit is not None:
        title += f" · edited ({len(edit.changes)} field(s) changed)"
    style = "red" if call.destructive else "yellow" if edit is not None else "cyan"
    return Panel(body, title=title, expand=False, border_style=style)


def _changed_line(body: Text, path: str, value: str | None, old: str | None, width: int) -> None:
    room = _value_width(path, width)
    body.append(f"\n* {path}: {_ABSENT if value is None else one_line(value, room)}", style="bold yellow")
    body.append(f"\n    was: {_ABSENT if old is None else one_line(old, room)}", style="dim")


def _value_width(path: str, width: int) -> int:
    """How much of a value a card line shows: what the terminal's width leaves (about four lines of it), at
    least 60 characters; ``?`` shows every value whole."""
    room = max(width - len(path) - 10, 20)
    return max(60, room * 4)


def _preview_lines(prepared: PreparedCall[Any] | None, document: Any) -> tuple[str, ...]:
    preview = None if prepared is None else preview_call(prepared, document)
    if preview is None:
        return ()
    return ("Preview:", *(f"  {line}" for line in preview.lines()))


def help_text(call: CallRecord, document: Any, edit: Edit | None = None) -> Text:
    """The answers, the call's whole input (the edited one, when there is an edit) and its preview."""
    prepared = call.prepared if edit is None else edit.prepared
    body = Text(HELP)
    details = prepared.details if prepared is not None else ()
    body.append(f"\nThe whole input of {call.id}{'' if edit is None else ', as you edited it'}:", style="bold")
    for path, value in details:
        body.append(f"\n  {path}: {value}")
    for line in _preview_lines(prepared, document):
        body.append(f"\n{line}")
    return body


def change_lines(changes: tuple[Change, ...]) -> tuple[Text, ...]:
    """One line per changed field: ``path: old -> new``."""
    return tuple(
        Text(f"    {path}: {old if old is not None else _ABSENT} -> {new if new is not None else _ABSENT}")
        for path, old, new in changes
    )
