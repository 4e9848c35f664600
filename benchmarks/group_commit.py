"""What one tool start's durable append costs a worker that holds many sessions, with and without group commit.

    python -m benchmarks.group_commit [--sessions 1 100] [--appends 20] [--rounds 3]

On a throwaway PostgreSQL server with ``fsync`` and ``synchronous_commit`` on (each commit waits for its WAL
flush, as in production): one `PostgresJournalStore` holds N leases, and each lease appends, one after another,
APPENDS batches like a tool start's (a ``start`` entry and its seal: ~450 bytes), all N sessions at once. Reported
per append: wall time of the whole run divided by the appends (the durable cost a tool start pays, amortized), this
process's CPU, and the server's commits (``pg_stat_database``), with ``group_commit`` off and on, interleaved over
ROUNDS. Target (issue 53): at 100 sessions the cost per tool start with group commit at most 1/3 of one session's
alone.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import trio

from benchmarks import _load
from benchmarks._common import case_record, emit, load_line, print_table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.pg_support import find_postgres_bin, running_postgres  # noqa: E402
from trioloop.durable.journal import GENESIS, encode_entry  # noqa: E402
from trioloop.durable.store import StoredEntry  # noqa: E402
from trioloop.stores import PostgresJournalStore  # noqa: E402

_SEAL = {"session": "s", "key": "ed25519:0123456789abcdef", "signature": "A" * 88, "v": 2}


def _batch(seq: int) -> list[StoredEntry]:
    start = encode_entry(seq, "start", GENESIS, 0, {"call_id": "c1", "now_ms": 123456})
    seal = encode_entry(seq + 1, "seal", GENESIS, 0, _SEAL)
    return [StoredEntry(seq, start), StoredEntry(seq + 1, seal)]


def _commits(url: str) -> int:
    import psycopg

    with psycopg.connect(url, autocommit=True) as admin:
        row = admin.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()").fetchone()
    return int(row[0]) if row else 0


async def _run(url: str, sessions: int, appends: int, group: bool, tag: str) -> tuple[float, float]:
    async with PostgresJournalStore(url, group_commit=group) as store:
        leases = [await store.acquire(f"{tag}-{n}") for n in range(sessions)]
        cpu, wall = time.process_time(), time.perf_counter()

        async def one(lease: Any) -> None:
            for k in range(appends):
                await lease.append(_batch(2 * k + 1))

        async with trio.open_nursery() as nursery:
            for lease in leases:
                nursery.start_soon(one, lease)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        for lease in leases:
            await lease.release()
    return wall, cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 100])
    parser.add_argument("--appends", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    bindir = find_postgres_bin()
    if bindir is None:
        print("no PostgreSQL server binaries (initdb, pg_ctl): nothing to measure", file=sys.stderr)
        return 2
    results: dict[tuple[int, bool], list[tuple[float, float, float]]] = {}
    # Each lease holds a connection of its own (its advisory lock): room for the largest N, and fsync on (the
    # throwaway server's default is off), so each commit waits for its WAL flush.
    options = f"-c fsync=on -c full_page_writes=on -c max_connections={max(args.sessions) + 20}"
    with running_postgres(bindir, options) as url:
        sampler = _load.start_sampling()
        _load.configure(processes=1, helpers=["PostgreSQL server (fsync on)"])
        for round_ in range(args.rounds):
            for sessions in args.sessions:
                for group in (False, True):  # interleaved
                    before = _commits(url)
                    wall, cpu = trio.run(_run, url, sessions, args.appends, group, f"r{round_}-{sessions}-{group}")
                    commits = _commits(url) - before
                    total = sessions * args.appends
                    results.setdefault((sessions, group), []).append((wall / total, cpu / total, commits / total))
                    sampler.sample()
    rows = []
    alone = statistics.median(r[0] for r in results[(min(args.sessions), False)])
    for (sessions, group), runs in sorted(results.items()):
        wall_ms = statistics.median(r[0] for r in runs) * 1000
        cpu_ms = statistics.median(r[1] for r in runs) * 1000
        commits = statistics.median(r[2] for r in runs)
        ratio = wall_ms / (alone * 1000)
        emit(
            case_record(
                "group_commit",
                f"N={sessions} group_commit={group}",
                sessions=sessions,
                group_commit=group,
                appends_each=args.appends,
                rounds=args.rounds,
                wall_ms_per_append=round(wall_ms, 3),
                cpu_ms_per_append=round(cpu_ms, 3),
                commits_per_append=round(commits, 3),
                ratio_to_one_session_alone=round(ratio, 3),
            )
        )
        rows.append([f"N={sessions}", "on" if group else "off", f"{wall_ms:.3f}", f"{cpu_ms:.3f}", f"{commits:.2f}"])
        rows[-1].append(f"{ratio:.2f}")
    print(f"\none tool start's append (start + seal), PostgreSQL with fsync on, median of {args.rounds} rounds")
    print_table(["sessions", "group commit", "wall ms/append", "CPU ms/append", "commits/append", "x alone"], rows)
    print(load_line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
