"""From a reviewer's decision to the approved tool's start, through a fleet of workers on PostgreSQL.

    python -m benchmarks.inbox [--sessions 100 1000] [--workers 4] [--rate 20]

For each K: K sessions suspended in review (one card each, the app of ``tests/worker_app.py``) in a throwaway
PostgreSQL server; W worker processes (``python -m trioloop.web.worker``, polling every 50 ms) and the inbox
(``trioloop serve``) started on it, each a process of its own. A reviewer logged in to the inbox listens to its live
updates (``/events``) and, at RATE per second, loads a session's page and approves its card there (the form's HTTP
POST), noting the wall-clock time of each POST. Each tool notes the time it started (``runs.log``). Reported: POST
-> tool start (p50, p99, max), POST -> the page told the turn went on (the first live update naming the session
after its tool started), the journal entries and bytes each carried turn added (its durable cost per tool start), and
the workers' CPU per tool start (after a warm-up of two decisions per worker, not counted), with the machine's load.
The decisions start once the workers and the inbox have settled after their start-up (each has used under 15 % of a
core for a second: a worker's first orphan scan reads every journal's first bytes, the inbox's first look reads every
head; with 1,000 sessions that burst held the first decisions up to 160 ms); ``settled_s`` says how long that took.
Targets (issue 53): tool start p99 under 100 ms, page updated p99 under 200 ms, at 20 decisions per second.
"""

from __future__ import annotations

import argparse
import json
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
from tests.web_support import reviewers_file, serve_process  # noqa: E402
from trioloop.stores import open_store  # noqa: E402

_WARM = "warm"
_POSTS: list[float] = []  # how long each POST took (the inbox's own share of the latency)


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


async def _review_all(
    base: str, link: str, k: int, rate: float, folder: Path, sample: Any
) -> tuple[dict[str, float], dict[str, list[float]]]:
    """A reviewer in the inbox: logged in with ``link``, listening to the live updates, approving one card per session
    at ``rate`` per second through the page's form. The time of each POST, and the times updates named each session."""
    import httpx
    from web_support import card_form

    posted: dict[str, float] = {}
    told: dict[str, list[float]] = {}
    origin = {"origin": base}
    async with httpx.AsyncClient(base_url=base, timeout=30) as client, trio.open_nursery() as nursery:
        token = link.rsplit("/", 1)[1]
        assert (await client.post("/login/link", data={"token": token}, headers=origin)).status_code == 303

        async def listen() -> None:
            async with client.stream("GET", "/events", timeout=None) as events:
                async for line in events.aiter_lines():
                    if line.startswith("data:"):
                        now = time.time()
                        for session_id in json.loads(line[5:]).get("sessions", ()):
                            told.setdefault(session_id, []).append(now)

        nursery.start_soon(listen)
        start = trio.current_time()
        for n in range(k):
            session_id = f"bench-{n}"
            await trio.sleep_until(start + n / rate)
            form = card_form((await client.get("/session", params={"id": session_id})).text, "c1", "approve")
            posted[session_id] = time.time()
            answer = await client.post("/decide", data=form.data(), headers=origin)
            assert answer.status_code == 303, answer.text[:300]
            _POSTS.append((time.time() - posted[session_id]) * 1000)
            if n % 10 == 0:
                sample()
        with trio.move_on_after(60):
            while len(started_tools(folder)) < len(posted) + 1000:  # every tool of the run, the warm-up's too
                if all(session_id in started_tools(folder) for session_id in posted):
                    break
                await trio.sleep(0.1)
        await trio.sleep(1.0)  # the last updates
        nursery.cancel_scope.cancel()
    return posted, told


async def decide_all(url: str, k: int, rate: float, sample: Any = None, prefix: str = "bench") -> dict[str, float]:
    """One decision per session (``prefix``-0, -1, ...) at ``rate`` per second, posted to the box as the inbox posts
    it: the wall-clock time each post began."""
    posted: dict[str, float] = {}
    async with open_store(url) as store:
        start = trio.current_time()
        for n in range(k):
            await trio.sleep_until(start + n / rate)
            posted[f"{prefix}-{n}"] = time.time()
            await _decide(store, f"{prefix}-{n}")
            if sample is not None and n % 10 == 0:
                sample()
    return posted


def started_tools(folder: Path) -> dict[str, float]:
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


def _settle(pids: list[int], *, busy: float = 0.15, timeout_s: float = 20.0) -> float:
    """Wait until the processes ``pids`` have used under ``busy`` of a core for two half-seconds in a row (their
    start-up done: a worker's first orphan scan of every journal, the inbox's first read of every head), at most
    ``timeout_s``; the seconds waited."""
    began = time.monotonic()
    quiet = 0
    last = _cpu_s(pids)
    while quiet < 2 and time.monotonic() - began < timeout_s:
        time.sleep(0.5)
        now = _cpu_s(pids)
        quiet = quiet + 1 if (now - last) / 0.5 < busy else 0
        last = now
    return time.monotonic() - began


def one_case(url: str, k: int, workers: int, rate: float, direct: bool = False) -> dict[str, Any]:
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
        SERVER.save(folder / "inbox-key")
        (folder / "keys").write_text(f"{APP_KEY.key_id} {APP_KEY.public_key_text}\n")
        people = reviewers_file(folder, (("ada", "Ada"),))
        try:
            trio.run(_warm_up, url, warm)
            deadline = time.monotonic() + 60
            while len(started_tools(folder)) < warm and time.monotonic() < deadline:
                time.sleep(0.05)
            inbox_cpu = 0.0
            settled_s = 0.0
            if direct:  # the box only: what the workers take, without the inbox server's share
                settled_s = _settle([proc.pid for proc in procs])
                cpu_before = _cpu_s([proc.pid for proc in procs])
                posted, told = trio.run(decide_all, url, k, rate, sampler.sample), {}
                deadline = time.monotonic() + 60
                while len(started_tools(folder)) < k + warm and time.monotonic() < deadline:
                    time.sleep(0.1)
                    sampler.sample()
                cpu = _cpu_s([proc.pid for proc in procs]) - cpu_before
            else:
                links = ("--login-link", "ada")
                with serve_process(url, people.path, folder / "keys", folder / "inbox-key", *links) as inbox:
                    sampler.add_root(inbox.process.pid)
                    _load.configure(processes=1, helpers=[f"{workers} workers", "trioloop serve", "PostgreSQL server"])
                    settled_s = _settle([inbox.process.pid, *(proc.pid for proc in procs)])
                    cpu_before = _cpu_s([proc.pid for proc in procs])
                    inbox_before = _cpu_s([inbox.process.pid])
                    posted, told = trio.run(
                        _review_all, inbox.base, inbox.links["ada"][-1], k, rate, folder, sampler.sample
                    )
                    cpu = _cpu_s([proc.pid for proc in procs]) - cpu_before
                    inbox_cpu = _cpu_s([inbox.process.pid]) - inbox_before
        finally:
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
            for proc in procs:
                proc.wait(timeout=60)
        started = {sid: at for sid, at in started_tools(folder).items() if not sid.startswith(_WARM)}
        latencies = sorted((started[sid] - at) * 1000 for sid, at in posted.items() if sid in started)
        updated = sorted(
            (min(t for t in told[sid] if t >= started[sid]) - at) * 1000
            for sid, at in posted.items()
            if sid in started and any(t >= started[sid] for t in told.get(sid, ()))
        )
        entries, size = trio.run(_cost, url, heads)
        return {
            "sessions": k,
            "via": "the box directly" if direct else "the inbox (HTTP POST)",
            "workers": workers,
            "rate_per_s": rate,
            "setup_s": round(setup_s, 1),
            "settled_s": round(settled_s, 1),
            "tools_started": len(started),
            "p50_ms": round(percentile(latencies, 50), 1) if latencies else None,
            "p99_ms": round(percentile(latencies, 99), 1) if latencies else None,
            "max_ms": round(latencies[-1], 1) if latencies else None,
            "mean_ms": round(statistics.fmean(latencies), 1) if latencies else None,
            "post_p50_ms": round(percentile(sorted(_POSTS), 50), 1) if _POSTS else None,
            "post_p99_ms": round(percentile(sorted(_POSTS), 99), 1) if _POSTS else None,
            "pages_updated": len(updated),
            "page_p50_ms": round(percentile(updated, 50), 1) if updated else None,
            "page_p99_ms": round(percentile(updated, 99), 1) if updated else None,
            "entries_per_tool_start": round(entries, 1),
            "bytes_per_tool_start": round(size),
            "worker_cpu_ms_per_tool_start": round(cpu * 1000 / max(len(started), 1), 1),
            "inbox_cpu_ms_per_decision": round(inbox_cpu * 1000 / max(len(posted), 1), 1),
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--rate", type=float, nargs="+", default=[20.0])
    parser.add_argument(
        "--direct",
        action="store_true",
        help="post each decision to the box directly (no inbox server: the workers' share)",
    )
    args = parser.parse_args(argv)
    bindir = find_postgres_bin()
    if bindir is None:
        print("no PostgreSQL server binaries (initdb, pg_ctl): nothing to measure", file=sys.stderr)
        return 2
    rows = []
    with running_postgres(bindir) as url:
        for k in args.sessions:
            for rate in args.rate:
                _POSTS.clear()
                result = one_case(url, k, args.workers, rate, args.direct)
                emit(case_record("inbox", f"K={k} W={args.workers} rate={rate:g}/s via={result['via']}", **result))
                rows.append([f"K={k} {rate:g}/s", *(result[f] for f in ("tools_started", "p50_ms", "p99_ms"))])
                rows[-1] += [result["max_ms"], result["page_p50_ms"], result["page_p99_ms"]]
                rows[-1] += [result["post_p50_ms"], result["entries_per_tool_start"], result["bytes_per_tool_start"]]
                rows[-1] += [result["worker_cpu_ms_per_tool_start"]]
    via = "posted to the box directly" if args.direct else "approved in the inbox (HTTP POST)"
    print(f"\ndecision {via} -> tool started, and -> page told; {args.workers} workers")
    head = ["case", "started", "p50 ms", "p99 ms", "max ms", "page p50", "page p99", "POST p50"]
    print_table([*head, "entries/start", "bytes/start", "CPU ms/start"], rows)
    print(load_line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
