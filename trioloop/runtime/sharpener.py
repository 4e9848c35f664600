"""Waking Trio at a deadline to within the OS timer's slack instead of up to a millisecond late.

Trio sleeps in ``epoll_wait``, whose timeout is whole milliseconds rounded up, so a cancel scope's
deadline fires up to 1 ms late: how late depends on when the loop last went to sleep, which for a turn
is whenever its last network read happened to arrive. `DeadlineSharpener` takes over the last `LEAD_S`
before a deadline: it sleeps that stretch in a worker thread (``nanosleep``), whose return reaches Trio
through its wakeup socket, an I/O event with no rounding, just after the deadline; Trio then expires the
scope on that same pass. The sharpener never cancels anything itself: it only makes the loop look at its
clock on time, so with any clock (a ``MockClock`` included) the worst it does is one early wake-up.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable

import trio

__all__ = ["LEAD_S", "THREADS", "DeadlineSharpener", "sharpener_limiter", "sleep_in_thread_until"]

#: How long before a deadline the sharpener hands over to a thread: more than Trio's 1 ms rounding, so
#: Trio's own timer has woken it before the deadline, not after.
LEAD_S = 0.002

#: Worker threads the sharpeners of one Trio run may hold at once. Their own limiter, not Trio's default
#: one, so a sharpener never delays a tool's ``trio.to_thread`` call; a sharpener beyond these waits, and
#: its deadline then fires on Trio's own timer, as it would without one.
THREADS = 4
_LIMITER: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar("trioloop_sharpener_threads")


def sharpener_limiter() -> trio.CapacityLimiter:
    """The sharpeners' `CapacityLimiter` of ``THREADS`` tokens for the current Trio run."""
    try:
        return _LIMITER.get()
    except LookupError:
        limiter = trio.CapacityLimiter(THREADS)
        _LIMITER.set(limiter)
        return limiter


def _sleep_until(instant: float) -> None:
    """In a worker thread: sleep until ``instant`` on ``time.perf_counter``'s clock."""
    left = instant - time.perf_counter()
    if left > 0:
        time.sleep(left)


async def sleep_in_thread_until(instant: float) -> None:
    """Sleep until ``instant`` (``time.perf_counter``) in a worker thread; its return wakes the loop.

    A fixed instant, so the thread's hand-off does not delay the wake-up (nor a wait for a token: a
    thread that starts late sleeps less, or not at all). Bounded by the caller (at most `LEAD_S`), so
    abandoning it on cancellation leaves nothing behind for long. Threads come from Trio's cache under
    `sharpener_limiter`.
    """
    await trio.to_thread.run_sync(_sleep_until, instant, abandon_on_cancel=True, limiter=sharpener_limiter())


class DeadlineSharpener:
    """Keeps the loop's wake-up for ``deadline`` (a Trio clock time) sharp; `move` follows a changed one.

    ``sleep_until`` sleeps to a ``time.perf_counter`` instant in a way that wakes the loop when it ends
    (`sleep_in_thread_until`; a test may record the calls instead). ``thread_sleeps`` counts hand-overs.
    """

    def __init__(
        self, deadline: float, *, sleep_until: Callable[[float], Awaitable[object]] = sleep_in_thread_until
    ) -> None:
        self.deadline = deadline
        self._sleep_until = sleep_until
        self._armed: trio.CancelScope | None = None
        self._sharpened: float | None = None  # the deadline the thread already slept up to
        self.thread_sleeps = 0

    def move(self, deadline: float) -> None:
        """The deadline changed (a review pause, its end): re-arm for the new one."""
        self.deadline = deadline
        if self._armed is not None:
            self._armed.deadline = deadline - LEAD_S

    async def run(self) -> None:
        """Sleep until the deadline draws near, sharpen it, and wait for the next one; until cancelled."""
        while True:
            armed_for = self.deadline
            wake_at = math.inf if armed_for == self._sharpened else armed_for - LEAD_S
            with trio.CancelScope(deadline=wake_at) as armed:
                self._armed = armed
                await trio.sleep_forever()
            self._armed = None
            deadline = self.deadline
            if deadline != armed_for:
                continue  # moved while we slept: re-arm for the new one
            self._sharpened = deadline
            now = time.perf_counter()
            remaining = min(deadline - trio.current_time(), LEAD_S)
            if remaining > 0:
                self.thread_sleeps += 1
                await self._sleep_until(now + remaining)
