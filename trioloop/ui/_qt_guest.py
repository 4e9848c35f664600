"""Trio as a guest of a Qt event loop.

Qt owns the main thread; Trio runs in guest mode (``trio.lowlevel.start_guest_run``), so every Trio
scheduler tick, and therefore every Trio task, runs on the Qt main thread. Trio asks for ticks from its
I/O thread; a queued signal carries each request to the main thread, which is the thread-safe half of
the bargain. Going the other way, Qt code reaches Trio only through the run's ``TrioToken``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar, TypeVarTuple, final

import trio
from outcome import Outcome
from PySide6.QtCore import QCoreApplication, QEventLoop, QObject, Qt, QThread, Signal, SignalInstance, Slot

__all__ = ["TrioGuestHost", "run_trio_guest"]

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


class _Reentry(QObject):
    """Lives on the Qt main thread; runs whatever callable reaches it through ``requested``."""

    requested = Signal(object)
    finished = Signal()

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        # Queued even when emitted on the main thread: Trio must never be re-entered from inside its own tick.
        self.requested.connect(self._run, Qt.ConnectionType.QueuedConnection)

    @Slot(object)
    def _run(self, fn: Callable[[], object]) -> None:
        fn()


@final
class TrioGuestHost(Generic[T]):
    """Runs one Trio run as a guest inside a Qt application's event loop.

    ``start`` returns at once; the run advances whenever Qt processes events (``app.exec()``, a
    ``QEventLoop``, ``processEvents``). The ``finished`` signal fires once, on the main thread, when the
    run is over; ``result()`` then returns its value or raises its exception.
    """

    def __init__(self, app: QCoreApplication) -> None:
        if QThread.currentThread() is not app.thread():
            raise RuntimeError("TrioGuestHost must be created on the Qt application's main thread")
        self._app = app
        self._reentry = _Reentry()
        self._started = False
        self._outcome: Outcome[T | None] | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._scope: trio.CancelScope | None = None
        self._cancel_requested = False

    @property
    def finished(self) -> SignalInstance:
        """A Qt signal emitted once, on the main thread, when the run is over."""
        return self._reentry.finished

    @property
    def app(self) -> QCoreApplication:
        """The Qt application Trio runs as a guest of."""
        return self._app

    @property
    def is_done(self) -> bool:
        """Whether the Trio run has ended."""
        return self._outcome is not None

    @property
    def outcome(self) -> Outcome[T | None] | None:
        """How the Trio run ended (its outcome), once it has."""
        return self._outcome

    @property
    def trio_token(self) -> trio.lowlevel.TrioToken | None:
        """The run's token once it has started (None before, and after the run is over)."""
        return None if self.is_done else self._token

    def start(self, async_fn: Callable[[*Ts], Awaitable[T]], *args: *Ts) -> None:
        """Start ``async_fn(*args)`` as the Trio run's main task."""
        if self._started:
            raise RuntimeError("this TrioGuestHost has already started a run")
        self._started = True
        trio.lowlevel.start_guest_run(
            self._main,
            async_fn,
            *args,
            run_sync_soon_threadsafe=self._reentry.requested.emit,
            done_callback=self._on_done,
        )

    async def _main(self, async_fn: Callable[[*Ts], Awaitable[T]], *args: *Ts) -> T | None:
        self._token = trio.lowlevel.current_trio_token()
        with trio.CancelScope() as scope:
            self._scope = scope
            if self._cancel_requested:
                scope.cancel()
            return await async_fn(*args)
        return None

    def _on_done(self, result: Outcome[T | None]) -> None:
        self._outcome = result
        self._scope = None
        self._reentry.finished.emit()

    def cancel(self) -> None:
        """Cancel the whole run (its main task then returns None); safe to call from any thread, any time."""
        self._cancel_requested = True
        token, scope = self._token, self._scope
        if token is None or scope is None or self.is_done:
            return
        with contextlib.suppress(trio.RunFinishedError):
            token.run_sync_soon(scope.cancel)

    def result(self) -> T | None:
        """The main task's return value (None if the run was cancelled first), or its exception, raised."""
        if self._outcome is None:
            raise RuntimeError("the Trio run has not finished yet")
        return self._outcome.unwrap()

    def process_events_until_done(self) -> None:
        """Process Qt events until the run is over (also after the application's own loop has quit)."""
        while self._outcome is None:
            self._app.processEvents(QEventLoop.ProcessEventsFlag.WaitForMoreEvents)


def run_trio_guest(async_fn: Callable[[*Ts], Awaitable[T]], *args: *Ts, app: QCoreApplication) -> T | None:
    """Run ``async_fn(*args)`` in Trio guest mode inside ``app.exec()``; return its value.

    The Qt event loop quits when the run is over. If the application quits first (its last window
    closed, ``app.quit()``), the run is cancelled, allowed to unwind, and None is returned.
    """
    host: TrioGuestHost[T] = TrioGuestHost(app)
    host.finished.connect(app.quit)
    host.start(async_fn, *args)
    app.exec()
    if not host.is_done:
        host.cancel()
        host.process_events_until_done()
    return host.result()
