"""From a reviewer's decision to the tool's start when the app holds the session open in review (no worker).

    python -m benchmarks.inbox_held [--sessions 20] [--rate 20] [--stores sqlite postgres]

One process (the app, ``benchmarks/_inbox_holder.py``) opens S journaled sessions, sends a turn in each and waits in
review with the session open: each session's own listener hears of decisions (SQLite: the bounded poll, every
50 ms; PostgreSQL: the ``NOTIFY`` the decision box sends, the box asked once a second besides). This process posts
one signed decision per session at RATE per second, as the inbox does, and notes when it posted; the tool notes
when it started. Reported per store: post -> tool start p50 / p99 / max, with the machine's load. Target (issue
53): under 100 ms p99.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from benchmarks import _load
from benchmarks._common import case_record, emit, load_line, percentile, print_table
from benchmarks.inbox import SERVER, decide_all, started_tools

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from tests.pg_support import find_postgres_bin, running_postgres  # noqa: E402
from trioloop.durable.journal import decode_entries  # noqa: E402
from trioloop.durable.review_view import waiting_review  # noqa: E402
from trioloop.stores import open_store  # noqa: E402


async def _all_waiting(target: str, sessions: int) -> bool:
    async with open_store(target) as store:
        for n in range(sessions):
            view = waiting_review(f"held-{n}", decode_entries(await store.read(f"held-{n}")))
            if view is None:
                return False
    return True


def one_case(name: str, target: str, sessions: int, rate: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="trioloop-held-") as scratch:
        folder = Path(scratch)
        env = {**os.environ, "PYTHONPATH": str(ROOT), "TRIOLOOP_TEST_RUNS": scratch}
        holder = subprocess.Popen(
            [sys.executable, "-m", "benchmarks._inbox_holder", target, str(sessions), scratch, SERVER.public_key_text],
            cwd=ROOT,
            env=env,
        )
        sampler = _load.start_sampling()
        sampler.add_root(holder.pid)
        _load.configure(processes=1, helpers=["the app holding the sessions"])
        try:
            deadline = time.monotonic() + 120
            while not (folder / "ready").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert trio.run(_all_waiting, target, sessions), "the sessions are not waiting in review"
            posted = trio.run(decide_all, target, sessions, rate, sampler.sample, "held")
            deadline = time.monotonic() + 60
            while len(started_tools(folder)) < sessions and time.monotonic() < deadline:
                time.sleep(0.05)
                sampler.sample()
        finally:
            holder.send_signal(signal.SIGTERM)
            try:
                holder.wait(timeout=60)
            except subprocess.TimeoutExpired:
                holder.kill()
        started = started_tools(folder)
        latencies = sorted((started[sid] - at) * 1000 for sid, at in posted.items() if sid in started)
        return {
            "store": name,
            "sessions": sessions,
            "rate_per_s": rate,
            "tools_started": len(started),
            "p50_ms": round(percentile(latencies, 50), 1) if latencies else None,
            "p99_ms": round(percentile(latencies, 99), 1) if latencies else None,
            "max_ms": round(latencies[-1], 1) if latencies else None,
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--stores", nargs="+", default=["sqlite", "postgres"])
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="trioloop-held-db-") as folder:
        for name in args.stores:
            if name == "sqlite":
                result = one_case(name, str(Path(folder) / "held.db"), args.sessions, args.rate)
            else:
                bindir = find_postgres_bin()
                if bindir is None:
                    print("no PostgreSQL server binaries: the postgres case is skipped", file=sys.stderr)
                    continue
                with running_postgres(bindir) as url:
                    result = one_case(name, url, args.sessions, args.rate)
            emit(case_record("inbox_held", f"{name} S={args.sessions} rate={args.rate:g}/s", **result))
            rows.append([name, *(result[f] for f in ("tools_started", "p50_ms", "p99_ms", "max_ms"))])
    print(f"\ndecision posted -> tool started, the app holding {args.sessions} sessions open in review")
    print_table(["store", "started", "p50 ms", "p99 ms", "max ms"], rows)
    print(load_line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
