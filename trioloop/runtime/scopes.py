"""What Stop and the deadline reach in a live turn: the turn's own cancel scope and the scope of everything that
runs under it on its behalf (each tool run, a toolset listing its tools again, a sampling request, a journal
append), and whether the turn is stopping, suspending or settling.
"""

from __future__ import annotations

import trio

__all__ = ["TurnScopes"]


class TurnScopes:
    """The turn's scope (``turn``, while the turn is driven), the scopes of its work (``work``: each leaves the set
    as it ends), and what was asked of them."""

    def __init__(self) -> None:
        self.turn: trio.CancelScope | None = None
        self.work: set[trio.CancelScope] = set()
        self.stop_requested = False
        self.suspend_requested = False
        #: Set when the turn starts settling: no tool value is committed, and no question asked, after it.
        self.settling = False

    def cancel_work(self) -> None:
        """Cancel every scope of the turn's work still running."""
        for scope in tuple(self.work):
            if not scope.cancel_called:  # cancel() costs even when it has nothing left to do
                scope.cancel()

    def stop(self) -> None:
        """Stop: the work's scopes first (a running tool sees its own scope cancelled), then the turn's."""
        self.stop_requested = True
        self.cancel_work()
        if self.turn is not None:
            self.turn.cancel()

    def suspend(self) -> None:
        """End the turn's tasks without settling it (the consumer decides whether it can be suspended)."""
        self.suspend_requested = True
        if self.turn is not None:
            self.turn.cancel()

    @property
    def turn_cancelled(self) -> bool:
        """Whether the turn is being cancelled (Stop, or its deadline passed)."""
        return self.stop_requested or (self.turn is not None and self.turn.cancel_called)
