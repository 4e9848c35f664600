"""The connections a PostgreSQL store's leases ended on, kept for its next leases (`LeaseConnections`).

A lease holds a connection of its own (its advisory lock ends the lease when the process dies), and a new
connection costs the client a handshake and the server a process: for a worker that takes up session after session,
a few milliseconds of CPU each time, on both sides. A connection goes back to the pool only when its lease ended
cleanly: no transaction open, no error, every advisory lock it held given back (``pg_advisory_unlock_all``), so the
next lease starts from a connection that holds nothing. A broken or abandoned one is closed, never kept.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg

__all__ = ["LeaseConnections"]


class LeaseConnections:
    """At most ``keep`` idle connections (thread-safe: leases end in worker threads)."""

    def __init__(self, keep: int) -> None:
        self._keep = keep
        self._idle: list[psycopg.Connection[tuple[Any, ...]]] = []
        self._lock = threading.Lock()

    def take_or(
        self, connect: Callable[[], psycopg.Connection[tuple[Any, ...]]]
    ) -> Callable[[], psycopg.Connection[tuple[Any, ...]]]:
        """A function (for a worker thread) giving an idle connection that is still open, else a new one."""

        def take() -> psycopg.Connection[tuple[Any, ...]]:
            while True:
                with self._lock:
                    connection = self._idle.pop() if self._idle else None
                if connection is None:
                    return connect()
                if not connection.closed and not connection.broken:
                    return connection
                with contextlib.suppress(Exception):
                    connection.close()

        return take

    def give_back(self, connection: psycopg.Connection[tuple[Any, ...]]) -> None:
        """Keep ``connection`` for a later lease if it ended cleanly and there is room; else close it (a worker
        thread: this may talk to the server)."""
        from psycopg.pq import TransactionStatus

        if self._keep == 0:
            with contextlib.suppress(Exception):
                connection.close()
            return
        try:
            if connection.closed or connection.broken or connection.info.transaction_status != TransactionStatus.IDLE:
                raise ConnectionError("not clean")
            connection.execute("SELECT pg_advisory_unlock_all()")  # the lease's process lock, and any other
            with self._lock:
                if len(self._idle) < self._keep:
                    self._idle.append(connection)
                    return
        except Exception:
            pass
        with contextlib.suppress(Exception):
            connection.close()

    def close_all(self) -> None:
        """Close every idle connection (the store closes)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for connection in idle:
            with contextlib.suppress(Exception):
                connection.close()
