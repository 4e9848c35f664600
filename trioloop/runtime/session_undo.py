"""Undo and redo across a session's turns: each step restores a whole document from the undo history (the
machine's `undo_turn`, `undo_step`, `redo_step`), is refused while a turn runs, and is journaled; undoing the
last turn also shows it in that turn's state (its calls ``undone``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Generic, Literal, TypeVar

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

if TYPE_CHECKING:
    from trioloop.runtime.session import Session

__all__ = ["UndoSteps"]

D = TypeVar("D")


class UndoSteps(Generic[D]):
    """A session's undo and redo: what they may take, and what they change (the workspace, the journal, the
    published state)."""

    def __init__(self, session: Session[D]) -> None:
        self.session = session

    def availability(self) -> UndoAvailability:
        turn_id = self.session._turns.last_turn_id
        if turn_id is None:
            return UndoAvailability.NOTHING_TO_UNDO
        return turn_undo_availability(self.session._workspace.undo, turn_id)

    def undo_last_turn(self) -> bool:
        session = self.session
        turn_id = session._turns.last_turn_id
        if session._turns.controls is not None or turn_id is None:
            return False
        workspace = session._workspace
        undone = undo_turn(workspace.undo, workspace.document, turn_id)
        if undone is None:
            return False
        workspace.document, workspace.undo = undone
        self._journaled("undo", turn_id)
        return True

    def step(
        self,
        step: Callable[[UndoHistory[D], D], tuple[D, UndoHistory[D], str] | None],
        entry: Literal["undo", "redo"],
    ) -> str | None:
        """One undo or redo step on the workspace, journaled; the turn id it took, or None."""
        session = self.session
        if session._turns.controls is not None:
            return None
        workspace = session._workspace
        stepped = step(workspace.undo, workspace.document)
        if stepped is None:
            return None
        workspace.document, workspace.undo, turn_id = stepped
        self._journaled(entry, turn_id)
        return turn_id

    def undo_step(self) -> str | None:
        return self.step(undo_step, "undo")

    def redo(self) -> str | None:
        return self.step(redo_step, "redo")

    def _journaled(self, entry: Literal["undo", "redo"], turn_id: str) -> None:
        """Journal an undo or redo of ``turn_id``; the last turn's state, undone, shows it."""
        session = self.session
        if session._journal is not None:
            session._journal.add(entry, {"turn_id": turn_id, "by": session.actor})
        state = session._publisher.state
        if entry == "undo" and state is not None and turn_id == session._turns.last_turn_id:
            session._publish(reduce_turn(state, UndoTurn()))
