"""How a session's states reach the world outside: `states()` readers, which only ever get the newest state (a
slow reader skips states, never lags or holds the turn back), and observers, told synchronously of each one (an
observer that raises is dropped, never the turn).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Iterable

import trio

from trioloop.machine.state import TurnState
from trioloop.runtime.observer import TurnObserver
from trioloop.runtime.observer import log as observer_log

__all__ = ["StatePublisher"]


class StatePublisher:
    """The newest published state, the readers parked until the next one, and the observers."""

    def __init__(self, observers: Iterable[TurnObserver] = ()) -> None:
        self.state: TurnState | None = None
        self._changed = trio.lowlevel.ParkingLot()  # `states()` readers park here until the next state
        self._questions_seen = 0  # bumped each time a question opens or closes: `states()` yields again
        self._observers: tuple[TurnObserver, ...] = tuple(observers)

    def publish(self, state: TurnState, *, turn_running: bool) -> None:
        """Make ``state`` the newest: wake the readers, tell the observers."""
        if state is self.state and not turn_running:
            return  # already published (a settled turn's last state is handed over twice)
        self.state = state
        if self._changed:  # no reader parked: nothing to wake (a turn publishes about seven states per iteration)
            self._changed.unpark_all()
        for observer in self._observers:
            try:
                observer.on_state(state)
            except Exception:  # an observer's fault is its own: it is dropped, the turn goes on
                self._drop(observer)

    def questions_changed(self) -> None:
        """A question opened or closed: readers get the state again."""
        self._questions_seen += 1
        if self._changed:
            self._changed.unpark_all()

    async def states(self) -> AsyncGenerator[TurnState, None]:
        """Yield the newest state each time it changes (or a question opens or closes), forever."""
        seen: TurnState | None = None
        asked = self._questions_seen
        while True:
            if self.state is not None and (self.state is not seen or asked != self._questions_seen):
                seen, asked = self.state, self._questions_seen
                yield seen
                continue
            await self._changed.park()

    def observe(self, observer: TurnObserver) -> None:
        """Tell ``observer`` of every state published from now on."""
        self._observers = (*self._observers, observer)

    def tell_suspended(self, state: TurnState) -> None:
        """Observers that want it (an ``on_suspended(state)`` method) learn that the turn was suspended."""
        for observer in self._observers:
            hook = getattr(observer, "on_suspended", None)
            if hook is None:
                continue
            try:
                hook(state)
            except Exception:
                self._drop(observer)

    def _drop(self, observer: TurnObserver) -> None:
        observer_log.exception("observer %r failed and was removed", observer)
        self._observers = tuple(o for o in self._observers if o is not observer)
