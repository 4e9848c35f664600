"""How every store waits for a lease: try, then poll until ``wait_s`` runs out, then `SessionLocked`.

The stores' locks (a POSIX byte-range lock, a PostgreSQL advisory lock) cannot wake a waiter, so a waiter
polls. The deadline is read from Trio's clock, so a test's `trio.testing.MockClock` controls it.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import TypeVar

import trio

from trioloop.durable.store import SessionLocked

__all__ = ["POLL_INTERVAL_S", "check_session_id", "wait_for_lease"]

#: How often a waiting `acquire` tries the lock again.
POLL_INTERVAL_S = 0.025

_T = TypeVar("_T")


def check_session_id(session_id: str) -> None:
    """Refuse (`ValueError`) a session id a database cannot store as text: not a str, NUL, a lone surrogate."""
    if not isinstance(session_id, str):
        raise TypeError(f"a session id is a str, not {type(session_id).__name__}")
    if "\x00" in session_id:
        raise ValueError("a session id cannot contain NUL")
    try:
        session_id.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("a session id must be valid Unicode text (no lone surrogates)") from None


async def wait_for_lease(session_id: str, wait_s: float, try_once: Callable[[], Awaitable[_T | None]]) -> _T:
    """``try_once()`` until it returns a lease, polling for up to ``wait_s`` seconds; then `SessionLocked`.

    ``try_once`` must not checkpoint after it has taken the lock, so a cancellation never strands a lease.
    """
    if math.isnan(wait_s) or wait_s < 0:
        raise ValueError(f"wait_s must be a number of seconds >= 0, not {wait_s!r}")
    deadline = trio.current_time() + wait_s
    while True:
        lease = await try_once()
        if lease is not None:
            return lease
        remaining = deadline - trio.current_time()
        if remaining <= 0:
            raise SessionLocked(f"session {session_id!r} is driven by another lease")
        await trio.sleep(min(POLL_INTERVAL_S, remaining))
