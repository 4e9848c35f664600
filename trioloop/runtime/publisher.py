"""How a session's states reach the world outside: `states()` readers, which only ever get the newest state (a
slow reader skips states, never lags or holds the turn back), and observers, told synchronously of each one (an
observer that raises is dropped, never the turn).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable

import trio

from trioloop.machine.state import TurnState
from trioloop.runtime.observer import TurnObserver
from trioloop.runtime.observer import log as observer_log

__all__ = ["StatePublisher", "StateReader"]


class StatePublisher:
    """The newest published state, the readers parked until the next one, and the observers."""

    def __init__(self, observers: Iterable[TurnObserver] = ()) -> None:
        self._state: TurnState | None = None
        self._later: Callable[[], TurnState | None] | None = None  # the state, when it is made on first read
        self._changed = trio.lowlevel.ParkingLot()  # `states()` readers park here until the next state
        self.questions_seen = 0  # bumped each time a question opens or closes: `states()` yields again
        self._observers: tuple[TurnObserver, ...] = tuple(observers)

    @property
    def state(self) -> TurnState | None:
        """The newest state (None before any)."""
        later = self._later
        if later is not None:
            self._later = None
            self._state = later()
        return self._state

    @state.setter
    def state(self, state: TurnState | None) -> None:
        self._state, self._later = state, None

    def state_later(self, make: Callable[[], TurnState | None]) -> None:
        """The newest state is what ``make()`` gives, made when it is first read (a reopened session's last turn,
        replayed only if someone looks at it); a state published first replaces it unmade."""
        self._state, self._later = None, make

    def publish(self, state: TurnState, *, turn_running: bool) -> None:
        """Make ``state`` the newest: wake the readers, tell the observers."""
        if state is self._state and self._later is None and not turn_running:
            return  # already published (a settled turn's last state is handed over twice)
        self._state, self._later = state, None
        if self._changed:  # no reader parked: nothing to wake (a turn publishes about seven states per iteration)
            self._changed.unpark_all()
        for observer in self._observers:
            try:
                observer.on_state(state)
            except Exception:  # an observer's fault is its own: it is dropped, the turn goes on
                self._drop(observer)

    def questions_changed(self) -> None:
        """A question opened or closed: readers get the state again."""
        self.questions_seen += 1
        if self._changed:
            self._changed.unpark_all()

    async def changed(self) -> None:
        """Wait until the next state is published or a question opens or closes."""
        await self._changed.park()

    def states(self) -> StateReader:
        """The newest state each time it changes (or a question opens or closes), forever."""
        return StateReader(self)

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


class StateReader(AsyncIterator[TurnState]):
    """One reader of a publisher's states: each ``__anext__`` gives the newest state once it differs from the last one
    given (or a question opened or closed since), parking until then.

    An iterator object rather than an async generator: it holds no frame, so a loop over it that is left (a
    cancelled task, a ``break``) leaves nothing to finalize, and Trio has no unexhausted generator to warn of.
    ``aclose`` is there for ``contextlib.aclosing`` and does nothing."""

    __slots__ = ("_asked", "_publisher", "_seen")

    def __init__(self, publisher: StatePublisher) -> None:
        self._publisher = publisher
        self._seen: TurnState | None = None
        self._asked = publisher.questions_seen

    def __aiter__(self) -> StateReader:
        return self

    async def __anext__(self) -> TurnState:
        publisher = self._publisher
        while True:
            state = publisher.state
            if state is not None and (state is not self._seen or self._asked != publisher.questions_seen):
                self._seen, self._asked = state, publisher.questions_seen
                return state
            await publisher.changed()

    async def aclose(self) -> None:
        """Nothing to release (see the class)."""
