"""Who holds a PostgreSQL lease, asked of the server's lock table: each lease's connection holds an advisory lock
of its session and epoch for as long as it lives (`trioloop.durable.postgres`).

An append on another connection (group commit, `_pg_appends.OneAppend`) checks its lease's lock there; `lease_held`
is what an ``acquire`` that would not wait asks first, on the store's own connection, so that finding a session held
costs no connection of its own (a worker woken with the others for one decision, say). Both read ``pg_locks``; the
claim still decides.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

from trioloop.durable.leases import LeaseSql

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "JOURNAL_NOTICE",
    "LEASES",
    "LOCK_WAIT_MS",
    "SCHEMA_KEY",
    "advisory_key",
    "claim",
    "epoch_key",
    "halves",
    "lease_held",
]

#: Every append announces its session (``NOTIFY trioloop_journal``, once per transaction and session): a face that
#: shows journals (the inbox) hears of a change instead of asking every journal's head again and again.
JOURNAL_NOTICE = """
CREATE OR REPLACE FUNCTION trioloop_journal_notice() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('trioloop_journal', session_id) FROM (SELECT DISTINCT session_id FROM appended) AS s;
    RETURN NULL;
END $$;
CREATE OR REPLACE TRIGGER trioloop_journal_notice AFTER INSERT ON trioloop_journal
    REFERENCING NEW TABLE AS appended FOR EACH STATEMENT EXECUTE FUNCTION trioloop_journal_notice();
"""

#: How long a lease's statement waits for a row lock another connection holds before it gives up.
LOCK_WAIT_MS = 1000


_LOCK_HELD = (
    "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted AND classid = %s::bigint::oid "
    "AND objid = %s::bigint::oid AND objsubid = 1"
)


def halves(key: int) -> tuple[int, int]:
    """The two unsigned 32-bit halves of an advisory key, as ``pg_locks`` shows them (classid, objid)."""
    unsigned = key & 0xFFFFFFFFFFFFFFFF
    return unsigned >> 32, unsigned & 0xFFFFFFFF


def lease_held(connection: psycopg.Connection[tuple[Any, ...]], session_id: str, now: str, key_of: Any) -> bool:
    """Whether a live holder has ``session_id``'s lease now: its row has not run out (by the server's clock
    ``now``) and some connection holds the advisory lock of its epoch (``key_of(epoch)``). A hint: the claim decides."""
    row = connection.execute(
        f"SELECT epoch FROM trioloop_lease WHERE session_id = %s AND expires_at > {now}", (session_id,)
    ).fetchone()
    return row is not None and connection.execute(_LOCK_HELD, halves(key_of(int(row[0])))).fetchone() is not None


def advisory_key(text: str) -> int:
    """The signed 64-bit advisory-lock key for ``text``: the first 8 bytes of its sha256."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big", signed=True)


#: The advisory lock that serializes creating the tables across a fleet.
SCHEMA_KEY = advisory_key("trioloop_journal: CREATE TABLE")
#: The lease statements in PostgreSQL's spelling (its clock, the row lock an append takes).
LEASES = LeaseSql(p="%s", now="extract(epoch from clock_timestamp())::float8", row_lock=" FOR SHARE")


def epoch_key(session_id: str, epoch: int) -> int:
    return advisory_key(f"{session_id}\x00{epoch}")


def _try_advisory_lock(connection: psycopg.Connection[tuple[Any, ...]], key: int) -> bool:
    row = connection.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()
    return bool(row and row[0])


def claim(connection: psycopg.Connection[tuple[Any, ...]], session_id: str, ttl_s: float) -> int | None:
    """The epoch of the lease taken on ``connection``, or None while a live holder has it (a worker thread).

    The connection is set up first so that no holder, frozen or not, can keep the row locked past the time to
    live: the server ends a session left idle inside a transaction that long (a holder frozen mid-append: its
    locks go with it, and its woken process finds its connection gone), and a wait for the row's lock gives up
    after a second (the session counts as held: the caller polls again, within ``wait_s``)."""
    import psycopg

    idle_ms = str(max(int(ttl_s * 1000), 1))
    connection.execute("SELECT set_config('idle_in_transaction_session_timeout', %s, false)", (idle_ms,))
    connection.execute("SELECT set_config('lock_timeout', %s, false)", (str(LOCK_WAIT_MS),))

    def hold(epoch: int) -> bool:
        return _try_advisory_lock(connection, epoch_key(session_id, epoch))

    def unhold(epoch: int) -> None:
        connection.execute("SELECT pg_advisory_unlock(%s)", (epoch_key(session_id, epoch),))

    try:
        return LEASES.claim(connection, session_id, ttl_s, hold, unhold)
    except psycopg.errors.LockNotAvailable:
        return None
