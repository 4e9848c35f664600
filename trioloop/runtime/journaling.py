"""Where a journaled turn writes (`TurnJournal`), and a live turn taken up again from its journal (`ResumePoint`).

The runner appends what is ready before its effect is visible outside the process; what to write is the
`JournalWriter`'s (`trioloop.durable.journal`), where it goes is the store's lease: this is the hook between them.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping, Sequence

import attrs
import trio

from trioloop.durable.journal_writer import JournalWriter
from trioloop.durable.store import JournalStoreError, StoredEntry
from trioloop.machine.state import TurnState

__all__ = ["ResumePoint", "TurnJournal"]


class TurnJournal:
    """Where a journaled turn writes: the entries `JournalWriter` makes, appended through ``append``.

    The runner appends what is ready before its effect is visible outside the process: every start (and
    the decisions before it) before any tool of that pass runs, a commit before its state is published or
    another call starts, the cards before the review is shown, a turn before its first request; the rest
    rides along with the next of these, or the end of the turn. An append that fails stops the turn
    (nothing runs that could not be recorded); ``error`` keeps the failure, and later entries are dropped.
    """

    def __init__(
        self,
        writer: JournalWriter,
        append: Callable[[Sequence[StoredEntry]], Awaitable[None]],
        check_held: Callable[[], None] | None = None,
        epoch: int | None = None,
    ) -> None:
        self.writer = writer
        self._append = append
        self._check_held = check_held
        #: The lease's fencing epoch (`ToolExecutionContext.fencing_epoch`), when the store has one.
        self.epoch = epoch
        self.error: Exception | None = None
        #: Called once with a turn's settled state right before its last append: what its session adds to that
        #: append (the session snapshot, when one is due), so a turn ends with one append rather than two.
        self.on_settled: Callable[[TurnState], None] | None = None

    def fail(self, error: Exception) -> None:
        """The journal can no longer be written (its lease was lost, say): the turn stops at its next append."""
        if self.error is None:
            self.error = error

    def settled(self, state: TurnState) -> None:
        """The turn settled in ``state``: what the session adds to its last append is added now, once."""
        on_settled, self.on_settled = self.on_settled, None
        if on_settled is not None and self.error is None:
            on_settled(state)

    def fenced(self) -> bool:
        """Whether the lease still holds by the holder's own clock (no I/O, no checkpoint): asked right before a
        tool starts. False (the error kept) once it may have run out: that tool, and anything after, never runs."""
        if self.error is None and self._check_held is not None:
            try:
                self._check_held()
            except Exception as exc:
                self.error = exc
        return self.error is None

    async def flush(self, deadline: float = math.inf, stoppers: set[trio.CancelScope] | None = None) -> bool:
        """Append what is ready; False on failure. The wait is shielded from everything but ``deadline`` (the
        turn's) and a cancel of its scope by Stop (added to ``stoppers`` meanwhile): a store that stops answering
        cannot hold the turn past either. An append cut short that way has an unknown outcome: the journal fails
        (nothing more runs that could not be recorded), and reopening the session reads what the store holds."""
        entries = self.writer.take()
        if not entries or self.error is not None:
            return self.error is None
        waiting = trio.CancelScope(shield=True, deadline=deadline)
        if stoppers is not None:
            stoppers.add(waiting)
        try:
            with waiting:
                await self._append(entries)
        except Exception as exc:
            self.error = exc
            return False
        finally:
            if stoppers is not None:
                stoppers.discard(waiting)
        if waiting.cancelled_caught:
            self.error = JournalStoreError(
                "the journal's store had not confirmed an append when the turn was stopped or reached its deadline; "
                "whether it was written is unknown"
            )
            return False
        return True


@attrs.frozen(kw_only=True)
class ResumePoint:
    """A live turn taken up again from its journal: its state, the machine time it had spent, and how long
    its review had waited (when it was suspended in review)."""

    state: TurnState
    machine_ms: int = 0
    review_waited_ms: int = 0
    card_digests: Mapping[str, str] = attrs.field(factory=dict)
