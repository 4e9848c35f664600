"""Live updates for open pages: one task per server polls the store and tells every listening page what changed.

`ChangeHub.run` calls `Inbox.sync` every ``poll_s`` seconds (two small queries when nothing changed: the journals'
heads and the decision box's latest change) and hands the ids of the sessions that changed to each listener. A
listener keeps one pending set, so a slow page never makes the hub wait or hold more than the ids of what changed;
the number of listeners is bounded (`TooManyListeners`), and `close` ends every stream (the server's shutdown).
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator
from typing import Final, final

import trio

from trioloop.durable.journal import JournalError
from trioloop.durable.store import JournalStoreError
from trioloop.web.inbox import Inbox

__all__ = ["ChangeHub", "Listener", "TooManyListeners"]

_LOG = logging.getLogger("trioloop.web")
#: The most session ids one event names; past it the event says "all".
_EVENT_IDS: Final = 50


class TooManyListeners(Exception):
    """The server already streams to as many pages as it allows."""


@final
class Listener:
    """One open page's stream: the ids of the sessions changed since it last asked."""

    def __init__(self) -> None:
        self._pending: set[str] = set()
        self._everything = False
        self._wake = trio.Event()
        self.closed = False

    def tell(self, changed: set[str]) -> None:
        if len(self._pending) + len(changed) > _EVENT_IDS:
            self._everything = True
            self._pending.clear()
        elif not self._everything:
            self._pending |= changed
        self._wake.set()

    def close(self) -> None:
        self.closed = True
        self._wake.set()

    async def next(self) -> tuple[list[str], bool] | None:
        """Wait for a change: (the ids, whether it was more than those), or None when the hub closed."""
        await self._wake.wait()
        if self.closed:
            return None
        changed, everything = sorted(self._pending), self._everything
        self._pending, self._everything, self._wake = set(), False, trio.Event()
        return changed, everything


#: How often a store that announces its changes is asked anyway (a notice is lost with its connection).
_NOTICED_POLL_S: Final = 1.0
#: How often every journal's head is asked, however many notices came (a retired journal announces nothing).
_WHOLE_S: Final = 10.0


async def _until_set(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


@final
class ChangeHub:
    """Polls an inbox and fans its changes out to listeners (see the module docstring)."""

    def __init__(self, inbox: Inbox, *, max_listeners: int = 64, poll_s: float = 0.1) -> None:
        self._inbox = inbox
        self._max = max_listeners
        self._poll_s = poll_s
        self._listeners: set[Listener] = set()
        self._closed = False

    @property
    def listening(self) -> int:
        return len(self._listeners)

    @property
    def full(self) -> bool:
        return len(self._listeners) >= self._max

    async def run(self) -> None:
        """Poll until cancelled; a store that fails is logged and asked again at the next poll. A store that announces
        its appends and decisions (PostgreSQL) is asked when one is announced instead (armed before asking, so none
        falls between), and every `_NOTICED_POLL_S` besides."""
        store = self._inbox.store
        arms = [getattr(store, name, None) for name in ("arm_any_journal", "arm_any_decision")]
        announced = getattr(store, "journals_announced", None)
        whole, last_whole = True, -math.inf
        while True:
            armed = [arm() for arm in arms if arm is not None]
            named = None if announced is None else announced()
            if trio.current_time() - last_whole > _WHOLE_S:
                whole = True
            only = None if whole else named  # the journals a notice named; every head after a quiet second, or 10 s
            if only is None:
                last_whole = trio.current_time()
            whole = False
            try:
                changed = await self._inbox.sync(only=only)
            except (JournalStoreError, JournalError) as exc:
                _LOG.warning("the inbox could not read the store: %s", exc)
                changed = set()
            if changed:
                for listener in list(self._listeners):
                    listener.tell(changed)
            if len(armed) < 2 or any(event is None for event in armed):
                await trio.sleep(self._poll_s)
                continue
            with trio.move_on_after(_NOTICED_POLL_S) as quiet:
                async with trio.open_nursery() as nursery:  # the first notice of either kind wakes the hub
                    for event in armed:
                        nursery.start_soon(_until_set, event, nursery.cancel_scope)
            whole = quiet.cancelled_caught  # no notice for a second: ask every head (a retired journal goes too)

    @contextlib.contextmanager
    def listen(self) -> Iterator[Listener]:
        """A listener for as long as the block runs (`TooManyListeners` when the hub is full or closed)."""
        if self._closed or self.full:
            raise TooManyListeners(f"the inbox streams to at most {self._max} pages at once")
        listener = Listener()
        self._listeners.add(listener)
        try:
            yield listener
        finally:
            self._listeners.discard(listener)

    def close(self) -> None:
        """End every stream, and refuse new ones."""
        self._closed = True
        for listener in self._listeners:
            listener.close()
