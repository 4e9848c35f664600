"""Journal stores: where a durable session's journal lives, outside the core (DESIGN.md's ``stores/``).

`SQLiteJournalStore` (stdlib ``sqlite3``) is the embedded default: one file, any number of sessions.
`PostgresJournalStore` (psycopg 3, the ``trioloop[postgres]`` extra) is for a fleet of processes sharing one
database. Both keep `trioloop.loop.journal_store`'s promises exactly as `MemoryJournalStore` does; `open_store`
picks one from a target string.
"""

from __future__ import annotations

from trioloop.stores.postgres import PostgresJournalStore
from trioloop.stores.sqlite import SQLiteJournalStore

__all__ = ["PostgresJournalStore", "SQLiteJournalStore", "open_store"]

_POSTGRES_SCHEMES = ("postgresql://", "postgres://")
_SQLITE_SCHEME = "sqlite://"


def open_store(target: str) -> SQLiteJournalStore | PostgresJournalStore:
    """The store ``target`` names: a ``postgresql://`` / ``postgres://`` URL, ``sqlite:///PATH`` or a file path.

    As in SQLAlchemy, ``sqlite:///journal.db`` is relative and ``sqlite:////var/lib/app/journal.db``
    absolute: the path is what follows the third slash. Nothing is opened until the store is first used.
    """
    lowered = target.lower()
    if lowered.startswith(_POSTGRES_SCHEMES):
        return PostgresJournalStore(target)
    if lowered.startswith(_SQLITE_SCHEME):
        rest = target[len(_SQLITE_SCHEME) :]
        if not rest.startswith("/") or rest == "/":
            raise ValueError(f"a SQLite journal URL is sqlite:///PATH, not {target!r}")
        return SQLiteJournalStore(rest[1:])
    if "://" in target:
        raise ValueError(f"no journal store for {target!r}: use a postgresql:// URL, sqlite:///PATH or a file path")
    return SQLiteJournalStore(target)
