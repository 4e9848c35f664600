"""Leases that expire and fence: the lease table the SQL stores share, and the takeover rule.

A lock held by a process that is frozen (SIGSTOP, a VM paused, a debugger) is held for ever: the kernel keeps its
file lock and its TCP connection alive. So a lease is a row, ``trioloop_lease(session_id, epoch, expires_at,
holder)``, with a time to live the holder keeps renewing, and a **fencing epoch** that grows by one with every
grant. The store checks the epoch in the same transaction as every append (a holder whose lease was taken over
writes nothing more), and the holder checks its own clock right before a tool starts (`JournalLease.check_held`):
a holder that was frozen past its time to live runs nothing more, even a call whose ``start`` it had appended.

The row alone would make a killed holder's session wait out the time to live. So the holder of epoch ``E`` also
holds a lock that dies with its process (a POSIX byte lock, a PostgreSQL advisory lock) named after ``(session,
E)``. Taking a lease:

1. no row: lock ``(session, 1)``, insert epoch 1;
2. a row whose time ran out, or whose ``(session, E)`` lock can be taken (its holder is gone): lock ``(session,
   E + 1)`` first, then move the row from ``E`` to ``E + 1`` only if it still says ``E``;
3. otherwise a live holder has it: `SessionLocked` (after ``wait_s``).

Each epoch's lock is its own, so a frozen holder that still holds its lock does not block the next epochs, and
locking ``E + 1`` before the row says ``E + 1`` means nobody can read the new epoch and find its lock free.
Times are the database's (``expires_at`` in seconds from its clock), so processes on different machines agree.
"""

from __future__ import annotations

import math
import os
import socket
from collections.abc import Callable, Sequence
from typing import Any, Final, final

import attrs
import trio

from trioloop.durable.store import JournalStoreError

__all__ = [
    "DEFAULT_LEASE_TTL_S",
    "LEASE_SCHEMA",
    "ExpiringLease",
    "LeaseClock",
    "LeaseLost",
    "LeaseSql",
    "check_ttl",
    "holder_name",
]

#: A lease's time to live unless the store is told otherwise: a frozen holder loses its lease after it.
DEFAULT_LEASE_TTL_S: Final = 30.0

LEASE_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS trioloop_lease (
    session_id TEXT PRIMARY KEY,
    epoch BIGINT NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL,
    holder TEXT NOT NULL
)
"""


class LeaseLost(JournalStoreError):
    """This lease is no longer its holder's: its time ran out (the process was frozen, or could not renew it), or
    another process took the session over with a newer epoch. Nothing more is written or run under it."""


def check_ttl(ttl_s: float) -> float:
    if not isinstance(ttl_s, int | float) or math.isnan(ttl_s) or not 0.05 <= ttl_s <= 86_400:
        raise ValueError(f"lease_ttl_s must be a number of seconds from 0.05 to 86400, not {ttl_s!r}")
    return float(ttl_s)


def holder_name() -> str:
    """Who holds a lease, for people reading the table: pid and host."""
    return f"pid {os.getpid()} on {socket.gethostname()}"


@final
@attrs.frozen
class LeaseSql:
    """A driver's spelling of the lease statements: its placeholder, its clock, the lock an append takes."""

    p: str
    now: str
    row_lock: str = ""

    def claim(
        self,
        connection: Any,
        session_id: str,
        ttl_s: float,
        hold: Callable[[int], bool],
        unhold: Callable[[int], None],
    ) -> int | None:
        """Take the lease (in a worker thread): its epoch, or None while a live holder has it. ``hold(e)`` takes
        epoch ``e``'s process lock (False if taken), ``unhold(e)`` gives it back; a lock that can be taken is a
        holder that is gone."""
        p, now = self.p, self.now
        for _ in range(3):  # another process moved the row between our read and our write: read it again
            row = connection.execute(
                f"SELECT epoch, expires_at - {now} FROM trioloop_lease WHERE session_id = {p}", (session_id,)
            ).fetchone()
            if row is None:
                epoch = 1
                sql = (
                    f"INSERT INTO trioloop_lease (session_id, epoch, expires_at, holder) "
                    f"VALUES ({p}, 1, {now} + {p}, {p}) ON CONFLICT (session_id) DO NOTHING"
                )
                params: tuple[Any, ...] = (session_id, ttl_s, holder_name())
            else:
                current, remaining = int(row[0]), float(row[1])
                if remaining > 0:
                    if not hold(current):
                        return None  # its holder is alive (maybe frozen) and its time has not run out
                    unhold(current)
                epoch = current + 1
                sql = (
                    f"UPDATE trioloop_lease SET epoch = {p}, expires_at = {now} + {p}, holder = {p} "
                    f"WHERE session_id = {p} AND epoch = {p}"
                )
                params = (epoch, ttl_s, holder_name(), session_id, current)
            if not hold(epoch):
                return None
            if connection.execute(sql, params).rowcount == 1:
                return epoch
            unhold(epoch)
        return None

    def renew(self, connection: Any, session_id: str, epoch: int, ttl_s: float) -> bool:
        """Push the lease's end ``ttl_s`` on; False when it is no longer this epoch's, or its time already ran out."""
        p, now = self.p, self.now
        sql = (
            f"UPDATE trioloop_lease SET expires_at = {now} + {p} "
            f"WHERE session_id = {p} AND epoch = {p} AND expires_at > {now}"
        )
        return bool(connection.execute(sql, (ttl_s, session_id, epoch)).rowcount == 1)

    def check(self, connection: Any, session_id: str, epoch: int) -> None:
        """`LeaseLost` unless the lease is this epoch's and unexpired (inside the append's transaction, with the
        row locked where the database can: a takeover waits for the append, or the append sees the takeover)."""
        p, now = self.p, self.now
        row = connection.execute(
            f"SELECT epoch, expires_at > {now} FROM trioloop_lease WHERE session_id = {p}{self.row_lock}",
            (session_id,),
        ).fetchone()
        if row is None or int(row[0]) != epoch:
            newer = "" if row is None else f" (now epoch {int(row[0])})"
            raise LeaseLost(f"the lease on session {session_id!r} (epoch {epoch}) was taken over{newer}")
        if not row[1]:
            raise LeaseLost(f"the lease on session {session_id!r} (epoch {epoch}) ran out of time")

    def end(self, connection: Any, session_id: str, epoch: int) -> None:
        """Give the lease up: its time ends now (the row stays, so the next epoch still counts on from it)."""
        p = self.p
        connection.execute(
            f"UPDATE trioloop_lease SET expires_at = 0 WHERE session_id = {p} AND epoch = {p}", (session_id, epoch)
        )


@final
class LeaseClock:
    """The holder's own view of its lease: until when it surely holds (Trio's clock), from when each grant or
    renewal was asked. The database set the end at least that late, so this errs early, never late."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._held_until = -math.inf

    def granted(self, asked_at: float) -> None:
        """A grant or renewal asked at ``asked_at`` (Trio's clock) succeeded."""
        self._held_until = max(self._held_until, asked_at + self.ttl_s * 0.9)

    def lost(self) -> None:
        self._held_until = -math.inf

    @property
    def held_until(self) -> float:
        return self._held_until

    def check(self, session_id: str, epoch: int) -> None:
        """`LeaseLost` once the lease may have run out (no I/O: right before a tool starts)."""
        if trio.current_time() >= self._held_until:
            raise LeaseLost(
                f"the lease on session {session_id!r} (epoch {epoch}) may have run out: not renewed in time"
            )


class ExpiringLease:
    """What the SQL stores' leases share: the fencing epoch, the holder's clock, and what a renewal's answer means.
    A lease sets ``_session_id``, ``_epoch`` and ``clock`` and renews through its own connection."""

    _session_id: str
    _epoch: int
    clock: LeaseClock
    #: The journal's outline rows as the claim read them (in the same hand-over; judged by `outline_rows` when asked
    #: for, as any); None: not read, or no longer the journal's.
    found: Sequence[Any] | None = None

    def take_found(self, after: int) -> Sequence[Any] | None:
        """The outline rows read with the claim, once, for the whole journal (``after`` 0) while they are still the
        journal's; else None (an append, a compaction, an erase and the release set ``found`` to None)."""
        found, self.found = self.found, None
        return found if after == 0 else None

    @property
    def epoch(self) -> int:
        """The fencing epoch: larger than every earlier lease's on this session."""
        return self._epoch

    @property
    def renew_every_s(self) -> float:
        """How often the holder renews the lease: three times per time to live."""
        return self.clock.ttl_s / 3

    def check_held(self) -> None:
        """`LeaseLost` once the lease may have run out (no I/O)."""
        self.clock.check(self._session_id, self._epoch)

    def _renewed(self, asked_at: float, renewed: bool) -> None:
        """A renewal asked at ``asked_at`` came back: the clock moves on, or `LeaseLost`."""
        if not renewed:
            self.clock.lost()
            raise LeaseLost(f"the lease on session {self._session_id!r} (epoch {self._epoch}) was lost")
        self.clock.granted(asked_at)
