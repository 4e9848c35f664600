"""From a reviewer's decision to the approved tool's start, through a fleet of workers on PostgreSQL.

    python -m benchmarks.inbox [--sessions 100 1000] [--workers 4] [--rate 20]

For each K: K sessions suspended in review (one card each, the app of ``tests/worker_app.py``) in a throwaway
PostgreSQL server; W worker processes (``python -m trioloop.web.worker``, polling every 50 ms) started on it; then
this process posts one signed decision per session at RATE per second, as the inbox would, noting the wall-clock time
of each post. Each tool notes the time it started (``runs.log``). Reported: the latency from post to tool start
(p50, p99, max), the journal entries and bytes each carried turn added (its durable cost per tool start), and the
workers' CPU per tool start (measured after a warm-up of two decisions per worker, which are not counted), with the
machine's load.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from benchmarks import _load
from benchmarks._common import case_record, emit, load_line, percentile, print_table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from tests.pg_support import find_postgres_bin, running_postgres  # noqa: E402
from tests.test_worker import APP_KEY, SERVER, _decide, _suspend_in_review  # noqa: E402
from trioloop.stores import open_store  # noqa: E402

_WARM = "warm"


async def _setup(url: str, k: int, warm: int = 0) -> dict[str, int]:
    """K suspended sessions (and ``warm`` more, decided before the measured ones); the head of each measured one."""
    async with open_store(url) as store:
        limiter = trio.CapacityLimiter(16)

        async def one(n: int) -> None:
            async with limiter:
                await _suspend_in_review(store, f"bench-{n}")

        async def warming(n: int) -> None:
            async with limiter:
                await _suspend_in_review(store, f"{_WARM}-{n}")

        async with trio.open_nursery() as nursery:
            for n in range(k):
                nursery.start_soon(one, n)
            for n in range(warm):
                nursery.start_soon(warming, n)
        return {f"bench-{n}": len(await store.read(f"bench-{n}")) for n in range(k)}


async def _warm_up(url: str, warm: int) -> None:
    """Decide the warm-up sessions at once: each worker has imported what carrying a turn needs before the run."""
    async with open_store(url) as store:
        for n in range(warm):
            await _decide(store, f"{_WARM}-{n}")


def _cpu_s(pids: list[int]) -> float:
    """The CPU time (user and system) the processes ``pids`` used so far."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / ticks
    return total


async def _decide_all(url: str, k: int, rate: float, sample: Any = None) -> dict[str, float]:
    """One decision per session at ``rate`` per second: the wall-clock time each post began."""
    posted: dict[str, float] = {}
    async with open_store(url) as store:
        start = trio.current_time()
        for n in range(k):
            await trio.sleep_until(start + n / rate)
            posted[f"bench-{n}"] = time.time()
            await _decide(store, f"bench-{n}")
            if sample is not None and n % 10 == 0:
                sample()
    return posted


def _started(folder: Path) -> dict[str, float]:
    log = folder / "runs.log"
    found: dict[str, float] = {}
    for line in log.read_text().splitlines() if log.exists() else []:
        what, _, at = line.partition("\t")
        found.setdefault(what.removesuffix(" one"), float(at))
    return found


async def _cost(url: str, heads: dict[str, int]) -> tuple[float, float]:
    """Journal entries and bytes each carried turn added, on average."""
    entries = size = 0
    async with open_store(url) as store:
        for session_id, head in heads.items():
            added = (await store.read(session_id))[head:]
            entries += len(added)
            size += sum(len(e.data) for e in added)
    return entries / len(heads), size / len(heads)


def _postmaster(url: str) -> int | None:
    """The PostgreSQL server's process (its children are the backends this run's workers use)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as admin:
        row = admin.execute("SELECT setting FROM pg_settings WHERE name = 'data_directory'").fetchone()
    try:
        return int((Path(row[0]) / "postmaster.pid").read_text().split()[0]) if row else None
    except (OSError, ValueError):
        return None


def one_case(url: str, k: int, workers: int, rate: float) -> dict[str, Any]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute("DROP TABLE IF EXISTS trioloop_journal, trioloop_decisions, trioloop_lease CASCADE")
    with tempfile.TemporaryDirectory(prefix="trioloop-inbox-") as scratch:
        folder = Path(scratch)
        APP_KEY.save(folder / "key")
        os.environ["TRIOLOOP_TEST_RUNS"] = scratch
        setup_began = time.monotonic()
        warm = 2 * workers
        heads = trio.run(_setup, url, k, warm)
        setup_s = time.monotonic() - setup_began
        env = {**os.environ, "PYTHONPATH": str(ROOT), "TRIOLOOP_TEST_APP_KEY": str(folder / "key")}
        command = [sys.executable, "-m", "trioloop.web.worker", "--app", "tests.worker_app:app", "--store", url]
        command += ["--key", SERVER.public_key_text, "--poll-s", "0.05"]
        procs = [subprocess.Popen(command, cwd=ROOT, env=env) for _ in range(workers)]
        sampler = _load.start_sampling()  # the workers and the PostgreSQL server are this run's own
        for proc in procs:
            sampler.add_root(proc.pid)
        postmaster = _postmaster(url)
        if postmaster is not None:
            sampler.add_root(postmaster)
        _load.configure(processes=1, helpers=[f"{workers} worker processes", "PostgreSQL server"])
        try:
            trio.run(_warm_up, url, warm)
            deadline = time.monotonic() + 60
            while len(_started(folder)) < warm and time.monotonic() < deadline:
                time.sleep(0.05)
            cpu_before = _cpu_s([proc.pid for proc in procs])
            posted = trio.run(_decide_all, url, k, rate, sampler.sample)
            deadline = time.monotonic() + 60
            while len(_started(folder)) < k + warm and time.monotonic() < deadline:
                time.sleep(0.1)
                sampler.sample()
            cpu = _cpu_s([proc.pid for proc in procs]) - cpu_before
        finally:
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
            for proc in procs:
                proc.wait(timeout=60)
        started = {sid: at for sid, at in _started(folder).items() if not sid.startswith(_WARM)}
        latencies = sorted((started[sid] - at) * 1000 for sid, at in posted.items() if sid in started)
        entries, size = trio.run(_cost, url, heads)
        return {
            "sessions": k,
            "workers": workers,
            "rate_per_s": rate,
            "setup_s": round(setup_s, 1),
            "tools_started": len(started),
            "p50_ms": round(percentile(latencies, 50), 1) if latencies else None,
            "p99_ms": round(percentile(latencies, 99), 1) if latencies else None,
            "max_ms": round(latencies[-1], 1) if latencies else None,
            "mean_ms": round(statistics.fmean(latencies), 1) if latencies else None,
            "entries_per_tool_start": round(entries, 1),
            "bytes_per_tool_start": round(size),
            "worker_cpu_ms_per_tool_start": round(cpu * 1000 / max(len(started), 1), 1),
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--rate", type=float, default=20.0)
    args = parser.parse_args(argv)
    bindir = find_postgres_bin()
    if bindir is None:
        print("no PostgreSQL server binaries (initdb, pg_ctl): nothing to measure", file=sys.stderr)
        return 2
    rows = []
    with running_postgres(bindir) as url:
        for k in args.sessions:
            result = one_case(url, k, args.workers, args.rate)
            emit(case_record("inbox", f"K={k} W={args.workers} rate={args.rate:g}/s", **result))
            rows.append([f"K={k}", *(result[f] for f in ("tools_started", "p50_ms", "p99_ms", "max_ms"))])
            rows[-1] += [result["entries_per_tool_start"], result["bytes_per_tool_start"]]
            rows[-1] += [result["worker_cpu_ms_per_tool_start"]]
    print(f"\ndecision posted -> tool started, {args.workers} workers, decisions at {args.rate:g}/s")
    print_table(["case", "started", "p50 ms", "p99 ms", "max ms", "entries/start", "bytes/start", "CPU ms/start"], rows)
    print(load_line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
