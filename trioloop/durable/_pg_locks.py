"""Who holds a PostgreSQL lease, asked of the server's lock table: each lease's connection holds an advisory lock
of its session and epoch for as long as it lives (`trioloop.durable.postgres`).

`check_alive` is what an append on another connection (group commit) checks; `lease_held` is what an ``acquire``
that would not wait asks first, on the store's own connection, so that finding a session held costs no connection
of its own (a worker woken with the others for one decision, say). Both read ``pg_locks``; the claim still decides.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trioloop.durable.leases import LeaseLost

if TYPE_CHECKING:
    import psycopg

__all__ = ["check_alive", "lease_held"]

_LOCK_HELD = (
    "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted AND classid = %s::bigint::oid "
    "AND objid = %s::bigint::oid AND objsubid = 1"
)


def _halves(key: int) -> tuple[int, int]:
    unsigned = key & 0xFFFFFFFFFFFFFFFF
    return unsigned >> 32, unsigned & 0xFFFFFFFF


def check_alive(connection: psycopg.Connection[tuple[Any, ...]], backend: int, key: int, session_id: str) -> None:
    """`LeaseLost` unless the lease's own connection (server process ``backend``) still holds its session's advisory
    lock ``key``: an append on the shared connection commits only while the lease's connection lives."""
    row = connection.execute(_LOCK_HELD + " AND pid = %s", (*_halves(key), backend)).fetchone()
    if row is None:
        raise LeaseLost(f"the connection holding the lease on session {session_id!r} was lost, and the lease with it")


def lease_held(connection: psycopg.Connection[tuple[Any, ...]], session_id: str, now: str, key_of: Any) -> bool:
    """Whether a live holder has ``session_id``'s lease now: its row has not run out (by the server's clock
    ``now``) and some connection holds the advisory lock of its epoch (``key_of(epoch)``). A hint: the claim decides."""
    row = connection.execute(
        f"SELECT epoch FROM trioloop_lease WHERE session_id = %s AND expires_at > {now}", (session_id,)
    ).fetchone()
    return row is not None and connection.execute(_LOCK_HELD, _halves(key_of(int(row[0])))).fetchone() is not None
