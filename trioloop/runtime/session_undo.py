"""Undo and redo across a session's turns: each step restores a whole document from the undo history (the
machine's `undo_turn`, `undo_step`, `redo_step`), is refused while a turn runs, and is journaled; undoing the
last turn also shows it in that turn's state (its calls ``undone``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, Literal, TypeVar

from trioloop.machine.inputs import UndoTurn
from trioloop.machine.reducer import reduce_turn
from trioloop.machine.transaction import (
    UndoAvailability,
    UndoHistory,
    redo_step,
    turn_undo_availability,
    undo_step,
    undo_turn,
)
from trioloop.runtime.session_journal import JournalHandle
from trioloop.runtime.session_turns import TurnSlot
from trioloop.runtime.workspace import Workspace

__all__ = ["UndoSteps"]

D = TypeVar("D")


class UndoSteps(Generic[D]):
    """A session's undo and redo: what they may take, and what they change (the workspace, the journal, the
    published state). Given the workspace, the session's turns (no step while one runs; the last one is the turn
    `undo_last_turn` undoes) and its journal."""

    def __init__(self, *, workspace: Workspace[D], turns: TurnSlot[D], journal: JournalHandle) -> None:
        self.workspace = workspace
        self.turns = turns
        self.journals = journal

    def availability(self) -> UndoAvailability:
        turn_id = self.turns.last_turn_id
        if turn_id is None:
            return UndoAvailability.NOTHING_TO_UNDO
        return turn_undo_availability(self.workspace.undo, turn_id)

    def undo_last_turn(self, actor: str) -> bool:
        turn_id = self.turns.last_turn_id
        if self.turns.controls is not None or turn_id is None:
            return False
        workspace = self.workspace
        undone = undo_turn(workspace.undo, workspace.document, turn_id)
        if undone is None:
            return False
        workspace.document, workspace.undo = undone
        self._journaled("undo", turn_id, actor)
        return True

    def step(
        self,
        step: Callable[[UndoHistory[D], D], tuple[D, UndoHistory[D], str] | None],
        entry: Literal["undo", "redo"],
        actor: str,
    ) -> str | None:
        """One undo or redo step on the workspace, journaled; the turn id it took, or None."""
        if self.turns.controls is not None:
            return None
        workspace = self.workspace
        stepped = step(workspace.undo, workspace.document)
        if stepped is None:
            return None
        workspace.document, workspace.undo, turn_id = stepped
        self._journaled(entry, turn_id, actor)
        return turn_id

    def undo_step(self, actor: str) -> str | None:
        return self.step(undo_step, "undo", actor)

    def redo(self, actor: str) -> str | None:
        return self.step(redo_step, "redo", actor)

    def _journaled(self, entry: Literal["undo", "redo"], turn_id: str, actor: str) -> None:
        """Journal an undo or redo of ``turn_id``; the last turn's state, undone, shows it."""
        journal = self.journals.journal
        if journal is not None:
            journal.add(entry, {"turn_id": turn_id, "by": actor})
        state = self.turns.publisher.state
        if entry == "undo" and state is not None and turn_id == self.turns.last_turn_id:
            self.turns.publish(reduce_turn(state, UndoTurn()))
