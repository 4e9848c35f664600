"""A journal store named by a target string: a PostgreSQL URL, a ``sqlite:///`` URL or a file path."""

from __future__ import annotations

from trioloop.durable.postgres import PostgresJournalStore
from trioloop.durable.sqlite import SQLiteJournalStore

__all__ = ["PostgresJournalStore", "SQLiteJournalStore", "open_store"]

_POSTGRES_SCHEMES = ("postgresql://", "postgres://")
_SQLITE_SCHEME = "sqlite://"


def open_store(
    target: str, *, read_only: bool = False, group_commit: bool = False, reuse_connections: int = 0
) -> SQLiteJournalStore | PostgresJournalStore:
    """The store ``target`` names: a ``postgresql://`` / ``postgres://`` URL, ``sqlite:///PATH`` or a file path.

    As in SQLAlchemy, ``sqlite:///journal.db`` is relative and ``sqlite:////var/lib/app/journal.db``
    absolute: the path is what follows the third slash. Nothing is opened until the store is first used.
    ``read_only=True`` opens it as an auditor does: nothing written, no lease granted. ``group_commit=True`` (a
    process that holds many sessions: a worker) has a PostgreSQL store commit its leases' appends together (a SQLite
    store always does, in its one thread); ``reuse_connections`` has it keep that many connections of ended leases
    for the next ones (a worker).
    """
    lowered = target.lower()
    if lowered.startswith(_POSTGRES_SCHEMES):
        return PostgresJournalStore(
            target, read_only=read_only, group_commit=group_commit, reuse_connections=reuse_connections
        )
    if lowered.startswith(_SQLITE_SCHEME):
        rest = target[len(_SQLITE_SCHEME) :]
        if not rest.startswith("/") or rest == "/":
            raise ValueError(f"a SQLite journal URL is sqlite:///PATH, not {target!r}")
        return SQLiteJournalStore(rest[1:], read_only=read_only)
    if "://" in target:
        raise ValueError(f"no journal store for {target!r}: use a postgresql:// URL, sqlite:///PATH or a file path")
    return SQLiteJournalStore(target, read_only=read_only)
