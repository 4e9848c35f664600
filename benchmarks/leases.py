"""How long another process waits to take over a session whose holder was killed (SIGKILL) or frozen (SIGSTOP).

    python -m benchmarks.leases [--rounds 5] [--ttl 2.0]

For each store (a SQLite file; a throwaway PostgreSQL server when its binaries are installed) and each signal,
a worker process (``tests/lease_worker.py``, mode ``hold``) opens a session, renewing its lease; this process
signals it and times, from the signal, how long ``acquire(wait_s=...)`` takes to get the lease (it polls every
25 ms), and how long until the new holder's first append is durable. A killed holder's process lock dies with it,
so the wait is the poll; a frozen holder keeps its lock and its connection, so the wait is what is left of its
time to live (at most ``--ttl``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import trio

from benchmarks._common import case_record, emit, print_table
from trioloop.durable.store import StoredEntry

ROOT = Path(__file__).resolve().parent.parent
WORKER = ROOT / "tests" / "lease_worker.py"
sys.path.insert(0, str(ROOT))

from tests.lease_worker import make_store  # noqa: E402 -- the worker's own store maker, so both agree
from tests.pg_support import find_postgres_bin, running_postgres  # noqa: E402


async def _takeover(target: str, ttl_s: float, sig: signal.Signals, folder: Path) -> tuple[float, float]:
    sid = f"bench-{secrets.token_hex(4)}"
    await trio.Path(folder).mkdir()
    worker = await trio.lowlevel.open_process(
        [sys.executable, str(WORKER), target, sid, str(ttl_s), "hold", str(folder)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        while not await trio.Path(folder / "holding").exists():  # noqa: ASYNC110 -- another process makes it
            await trio.sleep(0.01)
        await trio.sleep(ttl_s / 2)  # a renewal or so in: the lease's end is anywhere in its time to live
        async with make_store(target, 60.0) as store:
            os.kill(worker.pid, sig)
            signalled = time.monotonic()
            lease = await store.acquire(sid, wait_s=ttl_s * 5)
            took = time.monotonic() - signalled
            last = await lease.last_seq()
            await lease.append([StoredEntry(last + 1, b'{"bench":"the new holder\'s first append"}')])
            appended = time.monotonic() - signalled
            await lease.release()
        return took, appended
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker.pid, signal.SIGCONT)
        worker.kill()
        with trio.CancelScope(shield=True):
            await worker.wait()


@contextlib.contextmanager
def _targets(folder: Path) -> Iterator[list[tuple[str, str]]]:
    targets = [("sqlite", str(folder / "journal.db"))]
    bindir = find_postgres_bin()
    if bindir is None:
        print("no PostgreSQL binaries: SQLite only", file=sys.stderr)
        yield targets
        return
    with running_postgres(bindir) as url:
        yield [*targets, ("postgres", url)]


async def main(rounds: int, ttl_s: float) -> None:
    with tempfile.TemporaryDirectory() as scratch, _targets(Path(scratch)) as targets:
        results: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for n in range(rounds):  # interleaved: every store and signal once per round
            for store_name, target in targets:
                for sig in (signal.SIGKILL, signal.SIGSTOP):
                    took = await _takeover(target, ttl_s, sig, Path(scratch) / f"{store_name}-{sig.name}-{n}")
                    results.setdefault((store_name, sig.name), []).append(took)
        rows = []
        for (store_name, sig_name), times in results.items():
            leased = sorted(t * 1000 for t, _ in times)
            appended = sorted(a * 1000 for _, a in times)
            figures = {
                "median_ms": round(statistics.median(leased), 1),
                "min_ms": round(leased[0], 1),
                "max_ms": round(leased[-1], 1),
                "first_append_median_ms": round(statistics.median(appended), 1),
                "first_append_max_ms": round(appended[-1], 1),
            }
            emit(case_record("leases", f"{store_name} {sig_name}", ttl_s=ttl_s, rounds=rounds, **figures))
            rows.append([f"{store_name} {sig_name}", *(f"{figures[k]:.1f}" for k in figures)])
        print(f"\ntakeover after the holder is signalled (time to live {ttl_s} s, {rounds} rounds)")
        print_table(["case", "lease median ms", "min ms", "max ms", "first append median ms", "max ms"], rows)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ttl", type=float, default=2.0)
    args = parser.parse_args()
    trio.run(main, args.rounds, args.ttl)
