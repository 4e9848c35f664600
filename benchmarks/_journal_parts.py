"""What a durable journaled session's appends cost, part by part, measured from outside the session.

`measure_parts` replays the appends one recorded SQLite durable session made (`benchmarks._floor.Workload`) several
ways, each under a new session id, CPU of the whole process (every thread) per session:

- ``store_append``: through a real `SQLiteJournalStore` lease (its thread, the lease and number checks, the
  transaction and its sync), no witness;
- ``store_append_witnessed``: the same with each head witnessed in the same hand-over, as a session does;
- ``bare_sqlite3``: the same transactions through bare ``sqlite3`` in this thread (the floor's);
- ``witness_alone``: each batch's head written by ``FileWitness.witness_now`` in this thread, nothing else;
- ``encode``: every entry encoded again by ``encode_entry`` and hashed (SHA-256), as the journal writer does;
- ``sign``: one Ed25519 signature per seal (the floor's).

The differences name the parts: the store's hand-over and checks (``store_append - bare_sqlite3``), the witness
(``store_append_witnessed - store_append``). `profile_sessions` (``--parts``) also runs journaled sessions under
cProfile and prints, per iteration, the cumulative CPU time (``time.thread_time``) of the journal's steps on the
session's own thread (the store's thread is not profiled: its share is what `measure_parts` gives).
"""

from __future__ import annotations

import cProfile
import json
import pstats
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import trio

from benchmarks._floor import SqliteFloor, Workload, signing_key
from trioloop.durable.journal import encode_entry, entry_hash
from trioloop.durable.store import StoredEntry
from trioloop.durable.witness import FileWitness, WitnessedHead
from trioloop.stores import SQLiteJournalStore

__all__ = ["PARTS", "measure_parts", "profile_sessions"]

#: The parts `measure_parts` times, in the order they are printed.
PARTS = ("store_append", "store_append_witnessed", "bare_sqlite3", "witness_alone", "encode", "sign")

#: The steps `profile_sessions` prints: (a piece of the file's path, the function's name, what it is).
_STEPS = (
    ("trioloop/runtime/session.py", "open", "Session.open (lease, first append)"),
    ("trioloop/runtime/session.py", "send", "Session.send (the turn)"),
    ("trioloop/runtime/session.py", "__aexit__", "Session exit (close)"),
    ("trioloop/runtime/session_journal.py", "_append", "the session's appends (hand-over, waiting excluded)"),
    ("trioloop/durable/sqlite.py", "append_then", "the lease's append_then (queueing for the thread)"),
    ("trioloop/durable/journal_writer.py", "take", "JournalWriter.take (a batch, its seal)"),
    ("trioloop/durable/journal_writer.py", "_seal", "JournalWriter._seal (hash and sign the head)"),
    ("trioloop/durable/journal_writer.py", "note", "JournalWriter.note (entries of a turn's inputs)"),
    ("trioloop/durable/journal_writer.py", "snapshot", "JournalWriter.snapshot (the session snapshot)"),
    ("trioloop/durable/journal_writer.py", "dump", "JournalWriter.dump (the document's text, in a snapshot)"),
    ("trioloop/durable/journal.py", "encode_entry", "encode_entry"),
    ("trioloop/durable/signing.py", "sign", "JournalSigner.sign (Ed25519)"),
    ("trioloop/durable/witness.py", "witness", "FileWitness.witness (a thread of Trio's)"),
)


def _entries(rows: tuple[tuple[int, bytes], ...]) -> list[StoredEntry]:
    return [StoredEntry(seq, data) for seq, data in rows]


async def _through_store(path: Path, workload: Workload, reps: int, witness: FileWitness | None) -> float:
    """CPU seconds per session of the recorded appends through a `SQLiteJournalStore` lease."""
    batches = [_entries(batch.rows) for batch in workload.batches]
    total = 0.0
    async with SQLiteJournalStore(path, durable=True) as store:
        for rep in range(reps):
            session_id = f"parts-{witness is not None}-{rep}"
            lease: Any = await store.acquire(session_id)
            cpu = time.process_time()
            for entries in batches:
                if witness is None:
                    await lease.append(entries)
                else:
                    last = entries[-1]
                    head = WitnessedHead(
                        journal="parts", session=session_id, seq=last.seq, hash=entry_hash(last.data), store="parts"
                    )
                    await lease.append_then(entries, partial(witness.witness_now, head))
            total += time.process_time() - cpu
            await lease.release()
    return total / reps


def _timed(reps: int, work: Callable[[int], None]) -> float:
    cpu = time.process_time()
    for rep in range(reps):
        work(rep)
    return (time.process_time() - cpu) / reps


def measure_parts(workload: Workload, folder: Path, reps: int) -> dict[str, float]:
    """CPU µs per session of each part in `PARTS` (see the module docstring)."""
    if not workload.batches:
        raise RuntimeError("no recorded SQLite durable session to measure")
    folder.mkdir(parents=True, exist_ok=True)
    witness = FileWitness(folder / "witness")
    parts = {
        "store_append": trio.run(_through_store, folder / "parts.db", workload, reps, None),
        "store_append_witnessed": trio.run(_through_store, folder / "parts.db", workload, reps, witness),
    }
    bare = SqliteFloor(folder / "parts_bare.db")
    try:
        parts["bare_sqlite3"] = _timed(
            reps, lambda rep: [bare.append(f"bare-{rep}", batch.rows) for batch in workload.batches]
        )
    finally:
        bare.close()
    heads = [(batch.rows[-1][0], entry_hash(batch.rows[-1][1])) for batch in workload.batches]

    def witness_all(rep: int) -> None:
        for seq, digest in heads:
            witness.witness_now(WitnessedHead(journal="alone", session=f"alone-{rep}", seq=seq, hash=digest, store="x"))

    parts["witness_alone"] = _timed(reps, witness_all)
    decoded = [json.loads(data) for batch in workload.batches for _, data in batch.rows]

    def encode_all(_: int) -> None:
        for value in decoded:
            entry_hash(encode_entry(value["seq"], value["kind"], value["prev"], value["at"], value["data"]))

    parts["encode"] = _timed(reps, encode_all)
    key = signing_key()
    seals = [sealed for batch in workload.batches for _, sealed in batch.seals]
    parts["sign"] = _timed(reps, lambda _: [key.sign(entry_hash(sealed).encode()) for sealed in seals])
    return {name: round(value * 1e6, 1) for name, value in parts.items()}


def profile_sessions(run: Callable[[int], Any], sessions: int, iterations: int) -> list[tuple[str, float, float]]:
    """cProfile ``run(sessions)`` on this thread's CPU clock (a wait for the GIL or the disk is not counted): per
    `_STEPS` step, (what, cumulative CPU µs per iteration, frames entered per session)."""
    profiler = cProfile.Profile(time.thread_time)
    profiler.enable()
    run(sessions)
    profiler.disable()
    raw: dict[Any, Any] = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    found = []
    for where, name, what in _STEPS:
        calls = cumulative = 0.0
        for (filename, _, function), (_, primitive, _, cumtime, _) in raw.items():
            if function == name and where in filename.replace("\\", "/"):
                calls += primitive
                cumulative += cumtime
        found.append((what, round(cumulative / (sessions * iterations) * 1e6, 1), round(calls / sessions, 2)))
    return found
