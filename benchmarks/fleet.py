"""A fleet of worker processes continuing sessions suspended in review, on one PostgreSQL store.

    python -m benchmarks.fleet [--sizes 100,1000] [--big] [--workers 1,2] [--rates 50,0] [--lanes 4]

For each size N, worker count W and rate, on a throwaway PostgreSQL server (a fresh set of tables per case):
this process opens N journaled sessions (a small note each), sends one turn whose model asks for one mutating
call, waits for review and suspends the turn (setup). The first case of each N measures what the suspended
sessions cost the store (the journal's table and indexes and the lease table, per session, as written and after
``VACUUM FULL``) and what holding suspended sessions open costs a process's memory (a process that opens
``--hold`` of them at once). Then a decider process decides the sessions at the rate (a row in a decision table
with the wall time, and ``NOTIFY``; rate 0 decides them all at once, which measures capacity), and W worker
processes (``benchmarks/_fleet_worker.py``, ``--lanes`` sessions at a time each) claim the decisions (``FOR
UPDATE SKIP LOCKED``), open each session, approve the decided call, continue the turn and close it. The tool
writes the wall time it starts to a ledger, so decision-to-first-tool-start is the ledger's time minus the
decision's. For W >= 2 one more run, at the first nonzero rate, kills a worker (SIGKILL) in the middle of its
call number 0.4 N / W (its tool never returns from that one) and starts it again; the ledger must show no call
run twice, and every decided session must have been continued.

Targets (issue 42): decision-to-tool-start p99 under 50 ms at 1,000 sessions with one worker; a suspended
session costs the store at most its document's size plus 4 KiB; no figure grows faster than the number of
sessions (a per-session figure at the largest N at most 1.5x the one at the smallest: noise, not growth).
Journals are signed (one key for the run, heads witnessed in files) unless ``--unsigned``.
Exit status 1 when an invariant (no call twice, every session continued) fails.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from contextlib import aclosing
from pathlib import Path
from typing import Any

import trio

from benchmarks._common import case_record, emit, percentile, print_table
from benchmarks._fleet_worker import (
    INTERRUPTED,
    NOTE,
    QUEUE_SCHEMA,
    STICK_ENV,
    call_id_of,
    effect_tool,
    open_options,
    proposing,
)
from trioloop import JournalSigner, Phase, Session
from trioloop.stores import PostgresJournalStore

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.pg_support import find_postgres_bin, running_postgres  # noqa: E402

STORE_TARGET_SLACK = 4096
LATENCY_TARGET_MS = 50.0
GROWTH_TOLERANCE = 1.5

#: One run: sessions, worker processes, decisions per second (0: all at once), whether a worker is killed.
Case = tuple[int, int, float, bool]
#: In the kill case the victim's call number N * KILL_SHARE / W (at least 1) never returns: the kill lands there.
KILL_SHARE = 0.4


def note_of(index: int) -> str:
    """A small note, about 200 bytes."""
    return f"# Note {index}\n\n" + "".join(f"- item {index}.{k}: check the figures\n" for k in range(6))


DOC_BYTES = len(note_of(0).encode())


# -- setup -----------------------------------------------------------------------------------------


async def _suspend_one(store: PostgresJournalStore, folder: Path, index: int, options: dict[str, Any]) -> str:
    session_id = f"s{index:05d}"
    call_id = call_id_of(index)
    session = await Session.open(
        store,
        session_id,
        kind=NOTE,
        provider=proposing(call_id),
        document=note_of(index),
        model="scripted-1",
        tools=[effect_tool(-1)],
        **options,
    )
    async with session, trio.open_nursery() as nursery:
        nursery.start_soon(session.send, "Record the effect.")
        async with aclosing(session.states()) as states:  # type: ignore[type-var]  # an async generator
            async for state in states:
                if state.phase is Phase.AWAITING_APPROVAL:
                    break
        await session.suspend()
    return call_id


async def setup(url: str, folder: Path, n: int, concurrency: int) -> float:
    """Make ``n`` sessions suspended in review; the wall seconds it took."""
    options = open_options(folder)
    limiter = trio.CapacityLimiter(concurrency)
    began = time.perf_counter()
    async with PostgresJournalStore(url) as store:

        async def one(index: int) -> None:
            async with limiter:
                await _suspend_one(store, folder, index, options)

        async with trio.open_nursery() as nursery:
            for index in range(n):
                nursery.start_soon(one, index)
    return time.perf_counter() - began


def _sql(url: str, statement: str, *params: Any) -> Any:
    import psycopg

    with psycopg.connect(url, autocommit=True) as connection:
        cursor = connection.execute(statement, params or None)
        return cursor.fetchall() if cursor.description else None


def store_bytes(url: str) -> dict[str, int]:
    """Bytes on disk: the journal's heap (with TOAST) and indexes, the lease table; and the entries' own bytes."""
    [(heap, index, lease, logical, entries)] = _sql(
        url,
        "SELECT pg_table_size('trioloop_journal'), pg_indexes_size('trioloop_journal'),"
        " pg_total_relation_size('trioloop_lease'),"
        " (SELECT coalesce(sum(octet_length(data)), 0) FROM trioloop_journal),"
        " (SELECT count(*) FROM trioloop_journal)",
    )
    total = heap + index + lease
    return {"heap": heap, "index": index, "lease": lease, "total": total, "logical": logical, "entries": entries}


def reset(url: str) -> None:
    _sql(url, QUEUE_SCHEMA)
    _sql(url, "DROP TABLE IF EXISTS trioloop_journal, trioloop_lease")
    _sql(url, "TRUNCATE fleet_decision")
    _sql(url, "VACUUM FULL fleet_decision")


# -- the fleet -------------------------------------------------------------------------------------


def _spawn(role: str, config: Path, out: Path, stick_at: int = 0) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), STICK_ENV: str(stick_at)}
    return subprocess.Popen(
        [sys.executable, "-m", "benchmarks._fleet_worker", role, str(config), str(out)], cwd=ROOT, env=env
    )


def _done(url: str) -> int:
    [(count,)] = _sql(url, "SELECT count(*) FROM fleet_decision WHERE done_at IS NOT NULL")
    return int(count)


def hold_probe(url: str, folder: Path, calls: list[tuple[str, str]], hold: int) -> dict[str, Any]:
    """RSS of a fresh process before and while it holds ``hold`` of the suspended sessions open."""
    config = folder / "hold.json"
    config.write_text(json.dumps({"url": url, "folder": str(folder), "calls": calls, "hold": hold}))
    out = folder / "hold-out.json"
    subprocess.run(
        [sys.executable, "-m", "benchmarks._fleet_worker", "hold", str(config), str(out)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=True,
        timeout=600,
    )
    figures: dict[str, Any] = json.loads(out.read_text())
    return figures


def _wait_ready(folder: Path, procs: list[subprocess.Popen[bytes]], deadline: float) -> None:
    """Until every worker listens for decisions (it creates ``ready-PID``)."""
    while not all((folder / f"ready-{proc.pid}").exists() for proc in procs):
        if time.monotonic() > deadline or any(proc.poll() is not None for proc in procs):
            raise RuntimeError("a worker did not start")
        time.sleep(0.01)


def _wait_stuck(stuck: Path, victim: subprocess.Popen[bytes], deadline: float) -> None:
    """Until the victim's tool is stuck in its call (or the victim ended, or the deadline)."""
    while not stuck.exists() and victim.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)


def run_fleet(
    url: str, folder: Path, calls: list[tuple[str, str]], workers: int, rate: float, lanes: int, kill: bool
) -> dict[str, Any]:
    """Decider + ``workers`` processes until every decision is done; the raw results."""
    config = folder / "fleet.json"
    config.write_text(
        json.dumps(
            {"url": url, "folder": str(folder), "calls": calls, "sessions": len(calls), "rate": rate, "lanes": lanes}
        )
    )
    outs = []
    procs = []
    for w in range(workers):
        outs.append(folder / f"worker-{w}.json")
        stick_at = max(1, round(len(calls) * KILL_SHARE / workers)) if kill and w == 0 else 0
        procs.append(_spawn("worker", config, outs[-1], stick_at))
    deadline = time.monotonic() + 120 + 3 * len(calls) / max(rate, 1.0)
    _wait_ready(folder, procs, deadline)
    decider = _spawn("decider", config, folder / "decider.json")
    killed: dict[str, Any] | None = None
    try:
        if kill:
            victim = procs[0]
            _wait_stuck(folder / f"stuck-{victim.pid}", victim, deadline)
            if victim.poll() is None:  # else it never got that many calls: no kill, and the report says so
                os.kill(victim.pid, signal.SIGKILL)
                victim.wait()
                killed = {"pid": victim.pid, "done_at_kill": _done(url)}
                outs[0] = folder / "worker-0-restarted.json"
                procs[0] = _spawn("worker", config, outs[0])
        for proc in [decider, *procs]:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for proc in [decider, *procs]:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    failed = [proc.returncode for proc in [decider, *procs] if proc.returncode != 0]
    if failed:
        raise RuntimeError(f"a fleet process failed: exit statuses {failed}")
    rows = _sql(url, "SELECT session_id, call_id, decided_at, done_at, worker, found, outcome FROM fleet_decision")
    ledger: list[tuple[str, float, int]] = []
    for path in folder.glob("ledger-*.txt"):
        for line in path.read_text().splitlines():
            key, at, pid = line.split()
            ledger.append((key, float(at), int(pid)))
    return {
        "rows": rows,
        "ledger": ledger,
        "workers": [json.loads(out.read_text()) for out in outs],
        "decider": json.loads((folder / "decider.json").read_text()),
        "killed": killed,
    }


def analyse(raw: dict[str, Any], n: int) -> dict[str, Any]:
    rows = raw["rows"]
    decided = {call_id: decided_at for _, call_id, decided_at, *_ in rows}
    runs = Counter(key for key, _, _ in raw["ledger"])
    first_start: dict[str, float] = {}
    for key, at, _ in raw["ledger"]:
        first_start[key] = min(at, first_start.get(key, at))
    latencies = [first_start[key] - decided[key] for key in first_start if key in decided]
    began = min(decided.values(), default=0.0)
    slowest = sorted(
        ((first_start[k] - decided[k], decided[k] - began) for k in first_start if k in decided), reverse=True
    )
    interrupted = [row[1] for row in rows if row[6] == INTERRUPTED]
    continued = sum(1 for row in rows if row[3] is not None)
    span = max(row[3] for row in rows) - min(row[2] for row in rows) if continued == len(rows) and rows else 0.0
    outcomes = Counter(f"{row[5]} -> {row[6]}" for row in rows)
    workers = raw["workers"]
    return {
        "sessions": n,
        "decided": len(rows),
        "continued": continued,
        "calls_run": len(runs),
        "calls_run_twice": sum(1 for count in runs.values() if count > 1),
        "interrupted": len(interrupted),
        "interrupted_started_once": sum(1 for key in interrupted if runs[key] == 1),
        "outcomes": dict(outcomes),
        "continued_per_s": round(continued / span, 1) if span else None,
        "latency_p50_ms": round(percentile(latencies, 50) * 1e3, 2) if latencies else None,
        "latency_p99_ms": round(percentile(latencies, 99) * 1e3, 2) if latencies else None,
        "latency_max_ms": round(max(latencies) * 1e3, 2) if latencies else None,
        "slowest_ms_at_s": [(round(ms * 1e3, 1), round(at, 2)) for ms, at in slowest[:10]],
        "worker_rss_start": [w["rss_start"] for w in workers],
        "worker_rss_end": [w["rss_end"] for w in workers],
        "worker_continued": [w["continued"] for w in workers],
        "worker_retained_bytes_per_session": round(
            sum(w["rss_end"] - w["rss_start"] for w in workers) / max(continued, 1)
        ),
        "worker_cpu_ms_per_session": round(sum(w["cpu_s"] for w in workers) / max(continued, 1) * 1e3, 2),
        "decider_max_late_ms": round(raw["decider"]["max_late_s"] * 1e3, 1),
        "killed": raw["killed"],
    }


# -- report ----------------------------------------------------------------------------------------


def mode_of(case: Case) -> str:
    _, _, rate, kill = case
    return (f"{rate:g}/s" if rate > 0 else "at once") + (" kill" if kill else "")


def _kib(value: float) -> str:
    return f"{value / 1024:.1f}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,1000", help="session counts, comma-separated")
    parser.add_argument("--big", action="store_true", help="add 10,000 sessions")
    parser.add_argument("--workers", default="1,2", help="worker process counts, comma-separated")
    parser.add_argument(
        "--rates", default="50,0", help="decisions per second, comma-separated (0: all at once, for capacity)"
    )
    parser.add_argument("--lanes", type=int, default=4, help="sessions one worker continues at a time")
    parser.add_argument("--hold", type=int, default=40, help="suspended sessions one process opens at once")
    parser.add_argument("--setup-concurrency", type=int, default=8)
    parser.add_argument("--unsigned", action="store_true", help="journals without signatures (signer=None)")
    parser.add_argument("--no-kill", action="store_true", help="no run with a worker killed (W >= 2, first rate)")
    return parser.parse_args(argv)


def cases_of(args: argparse.Namespace) -> list[Case]:
    """Every size, worker count and rate; and, for W >= 2 at the first paced rate, a run with a kill."""
    sizes = [int(s) for s in args.sizes.split(",")] + ([10_000] if args.big else [])
    worker_counts = [int(w) for w in args.workers.split(",")]
    rates = [float(r) for r in args.rates.split(",")]
    cases = [(n, w, rate, False) for n in sizes for w in worker_counts for rate in rates]
    paced = [rate for rate in rates if rate > 0]
    if paced and not args.no_kill:
        cases += [(n, w, paced[0], True) for n in sizes for w in worker_counts if w >= 2]
    return sorted(cases, key=lambda case: case[0])


def run(url: str, args: argparse.Namespace) -> tuple[dict[int, dict[str, Any]], dict[Case, dict[str, Any]]]:
    """Every case on the database at ``url`` (its trioloop tables are dropped first): setups and fleet results."""
    setups: dict[int, dict[str, Any]] = {}
    fleets: dict[Case, dict[str, Any]] = {}
    for case in cases_of(args):
        fleets[case] = one_case(url, args, case, setups, DOC_BYTES)
    return setups, fleets


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    bindir = find_postgres_bin()
    if bindir is None:
        print("no PostgreSQL server binaries (initdb, pg_ctl): nothing to measure", file=sys.stderr)
        return 2
    with running_postgres(bindir) as url:
        setups, fleets = run(url, args)
    report(setups, fleets, DOC_BYTES)
    broken = any(f["calls_run_twice"] or f["continued"] != f["sessions"] for f in fleets.values())
    return 1 if broken else 0


def one_case(
    url: str, args: argparse.Namespace, case: Case, setups: dict[int, dict[str, Any]], doc_bytes: int
) -> dict[str, Any]:
    """Set up ``n`` suspended sessions, measure them (the first time for this ``n``), run the fleet on them."""
    n, w, rate, kill = case
    with tempfile.TemporaryDirectory(prefix=f"trioloop-fleet-{n}-{w}-") as scratch:
        folder = Path(scratch)
        if not args.unsigned:
            JournalSigner.generate().save(folder / "key")
        reset(url)
        took = trio.run(setup, url, folder, n, args.setup_concurrency)
        calls = [(f"s{i:05d}", call_id_of(i)) for i in range(n)]
        random.Random(n).shuffle(calls)  # decided in an order unrelated to creation
        if n not in setups:
            setups[n] = measure_setup(url, folder, calls, n, took, min(args.hold, n), doc_bytes)
            emit(case_record("fleet", f"setup N={n}", **setups[n]))
        result = analyse(run_fleet(url, folder, calls, w, rate, args.lanes, kill=kill), n)
        emit(case_record("fleet", f"N={n} W={w} {mode_of(case)}", rate=rate, kill=kill, lanes=args.lanes, **result))
        return result


def measure_setup(
    url: str, folder: Path, calls: list[tuple[str, str]], n: int, took: float, hold: int, doc_bytes: int
) -> dict[str, Any]:
    """What ``n`` suspended sessions cost the store (as written, then compacted) and a process holding some open."""
    written = store_bytes(url)
    _sql(url, "VACUUM FULL trioloop_journal")
    _sql(url, "VACUUM FULL trioloop_lease")
    compact = store_bytes(url)
    held = hold_probe(url, folder, calls, hold)
    return {
        "sessions": n,
        "setup_ms_per_session": round(took / n * 1e3, 2),
        "store_bytes_per_session": round(written["total"] / n),
        "heap_bytes_per_session": round(written["heap"] / n),
        "index_bytes_per_session": round(written["index"] / n),
        "lease_bytes_per_session": round(written["lease"] / n),
        "compacted_bytes_per_session": round(compact["total"] / n),
        "logical_bytes_per_session": round(written["logical"] / n),
        "entries_per_session": round(written["entries"] / n, 1),
        "document_bytes": doc_bytes,
        "held": held["held"],
        "held_suspended": held["suspended"],
        "rss_bytes_per_held_session": round((held["rss_held"] - held["rss_before"]) / held["held"]),
    }


FLEET_COLUMNS: tuple[str, ...] = ("N", "W", "decisions", "continued", "per s", "p50 ms", "p99 ms", "max ms")
FLEET_COLUMNS += ("twice", "interrupted", "CPU ms/session", "RSS MiB start -> end", "RSS B kept/session")


def report(setups: dict[int, dict[str, Any]], fleets: dict[Case, dict[str, Any]], doc_bytes: int) -> None:
    print(f"\nsuspended sessions (setup in one process; document {doc_bytes} B; bytes per session)")
    print_table(
        ["N", "setup ms", "store", "heap", "index", "lease", "compacted", "entries' own", "entries", "RSS/held KiB"],
        [
            [
                n,
                s["setup_ms_per_session"],
                s["store_bytes_per_session"],
                s["heap_bytes_per_session"],
                s["index_bytes_per_session"],
                s["lease_bytes_per_session"],
                s["compacted_bytes_per_session"],
                s["logical_bytes_per_session"],
                s["entries_per_session"],
                f"{_kib(s['rss_bytes_per_held_session'])} ({s['held']})",
            ]
            for n, s in setups.items()
        ],
    )
    print("\nworkers continuing decided sessions (latency: decision to first tool start; kill: one worker SIGKILLed)")
    print_table(
        [*FLEET_COLUMNS],
        [
            [
                n,
                w,
                mode_of((n, w, rate, kill)),
                f["continued"],
                f["continued_per_s"],
                f["latency_p50_ms"],
                f["latency_p99_ms"],
                f["latency_max_ms"],
                f["calls_run_twice"],
                f"{f['interrupted']} ({f['interrupted_started_once']} once)" if f["interrupted"] else 0,
                f["worker_cpu_ms_per_session"],
                ", ".join(
                    f"{a / 2**20:.1f} -> {b / 2**20:.1f}"
                    for a, b in zip(f["worker_rss_start"], f["worker_rss_end"], strict=True)
                ),
                f["worker_retained_bytes_per_session"],
            ]
            for (n, w, rate, kill), f in fleets.items()
        ],
    )
    print("\ntargets")
    print_table(["target", "measured", ""], target_rows(setups, fleets, doc_bytes))


def target_rows(
    setups: dict[int, dict[str, Any]], fleets: dict[Case, dict[str, Any]], doc_bytes: int
) -> list[list[str]]:
    rows = []
    for (n, w, rate, kill), f in fleets.items():
        if n == 1000 and w == 1 and rate > 0 and not kill and f["latency_p99_ms"] is not None:
            p99 = f["latency_p99_ms"]
            label = f"decision-to-tool-start p99 < 50 ms (N=1000, W=1, {rate:g}/s)"
            rows.append([label, f"{p99} ms", _met(p99 < LATENCY_TARGET_MS)])
    limit = doc_bytes + STORE_TARGET_SLACK
    for n, s in setups.items():
        got, compacted = s["store_bytes_per_session"], s["compacted_bytes_per_session"]
        rows.append([f"store per suspended session <= doc + 4 KiB (N={n})", f"{got} <= {limit} B", _met(got <= limit)])
        rows.append(
            [f"  the same, compacted (VACUUM FULL) (N={n})", f"{compacted} <= {limit} B", _met(compacted <= limit)]
        )
    twice = sum(f["calls_run_twice"] for f in fleets.values())
    rows.append(["calls run twice", str(twice), _met(twice == 0)])
    missed = sum(f["decided"] - f["continued"] for f in fleets.values())
    rows.append(["decided sessions not continued", str(missed), _met(missed == 0)])
    if len(setups) < 2:
        return rows
    small, large = min(setups), max(setups)
    per_session = [
        ("store_bytes_per_session", "store B/session"),
        ("compacted_bytes_per_session", "compacted B/session"),
        ("setup_ms_per_session", "setup ms/session"),
        ("rss_bytes_per_held_session", "RSS/held session"),
    ]
    for key, label in per_session:
        rows.append(_growth(f"{label} N={large} vs N={small}", setups[small][key], setups[large][key]))
    for w, rate in sorted({(w, rate) for _, w, rate, kill in fleets if not kill}):
        if (small, w, rate, False) not in fleets or (large, w, rate, False) not in fleets:
            continue
        mode = mode_of((small, w, rate, False))
        a, b = fleets[(small, w, rate, False)], fleets[(large, w, rate, False)]
        keys = ["worker_cpu_ms_per_session"] + (["latency_p50_ms", "latency_p99_ms"] if rate > 0 else [])
        for key in keys:
            rows.append(_growth(f"{key} W={w} {mode} N={large} vs N={small}", a[key], b[key]))
        if rate == 0:  # capacity must not fall as sessions grow: the inverse grows at most as fast
            rows.append(
                _growth(
                    f"1/continued_per_s W={w} at once N={large} vs N={small}",
                    1 / a["continued_per_s"],
                    1 / b["continued_per_s"],
                )
            )
    return rows


def _growth(label: str, small: float, large: float) -> list[str]:
    ratio = large / small if small else float("nan")
    return [label, f"{ratio:.2f}x", _met(ratio <= GROWTH_TOLERANCE)]


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


if __name__ == "__main__":
    sys.exit(main())
