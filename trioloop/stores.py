"""Journal stores: where a durable session's journal lives (the stores themselves are in `trioloop.durable`).

`SQLiteJournalStore` (stdlib ``sqlite3``) is the embedded default: one file, any number of sessions.
`PostgresJournalStore` (psycopg 3, the ``trioloop[postgres]`` extra) is for a fleet of processes sharing one
database. Both keep the `JournalStore` protocol's promises exactly as `MemoryJournalStore` does; `open_store`
picks one from a target string.
"""

from trioloop.durable.postgres import PostgresJournalStore
from trioloop.durable.sqlite import SQLiteJournalStore
from trioloop.durable.targets import open_store

__all__ = ["PostgresJournalStore", "SQLiteJournalStore", "open_store"]
