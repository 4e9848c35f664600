"""What journaling costs a loop iteration: `benchmarks.loop`'s in-process turn (K read-tool iterations, then a
text answer) with no store, beside the same turn journaled in memory, in SQLite without fsync, and in SQLite
durable (WAL, synchronous=FULL: every append fsyncs before the turn goes on).

The same pair runs over HTTP too (the Anthropic provider against ``benchmarks._sse_server`` in another
process), the iteration a real app pays for. Run ``python -m benchmarks.journal``. CPU time is the budget
(issue 26: journaling on SQLite adds at most 25% CPU to an iteration); the fsync is wall time spent waiting
for the disk, reported apart as the difference between durable and no-fsync SQLite. Contenders alternate in
rounds, so drift hits them alike. Each turn opens its own journaled session (a new session id in one database
file); only ``send`` is timed, which includes the turn's closing snapshot when one is due.
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import trio

from benchmarks import loop
from benchmarks._common import PAYMENT_THF, InProcessProvider, case_record, emit, print_table, summarize
from benchmarks._sse_server import MODEL, TABLE, spawned_server
from trioloop.durable.store import JournalStore, MemoryJournalStore
from trioloop.machine.reducer import CallStatus, Outcome
from trioloop.providers import AnthropicProvider
from trioloop.runtime.session import Session
from trioloop.stores import SQLiteJournalStore
from trioloop.threatmodel import THREAT_MODEL, ThreatModel, load_thf, threat_model_session
from trioloop.threatmodel.session import THREAT_MODEL_SYSTEM_PROMPT

Sample = tuple[float, float]
_opened = 0


def _check(state: Any) -> None:
    if state.outcome is not Outcome.COMPLETED or [c.status for c in state.calls] != [CallStatus.SUCCEEDED] * loop.K:
        raise RuntimeError(f"unexpected turn: {state.outcome} with {len(state.calls)} calls")


async def plain(document: ThreatModel, turns: int, provider: Any = None, model: str = "scripted-1") -> list[Sample]:
    provider = provider or InProcessProvider(loop.answer_in_process, batched=True)
    samples = []
    for _ in range(turns):
        async with threat_model_session(
            document=document, provider=provider, model=model, tools=loop.REGISTRY, limits=loop.LIMITS
        ) as session:
            wall, cpu = time.perf_counter(), time.process_time()
            state = await session.send(loop.PROMPT)
            samples.append(((time.perf_counter() - wall) / loop.K, (time.process_time() - cpu) / loop.K))
        _check(state)
    return samples


async def journaled(
    document: ThreatModel, turns: int, store: JournalStore, provider: Any = None, model: str = "scripted-1"
) -> list[Sample]:
    global _opened
    provider = provider or InProcessProvider(loop.answer_in_process, batched=True)
    samples = []
    for _ in range(turns):
        _opened += 1
        session = await Session.open(
            store,
            f"bench-{_opened}",
            kind=THREAT_MODEL,
            provider=provider,
            document=document,
            model=model,
            tools=loop.REGISTRY,
            limits=loop.LIMITS,
            system_prompt=THREAT_MODEL_SYSTEM_PROMPT,
        )
        async with session:
            wall, cpu = time.perf_counter(), time.process_time()
            state = await session.send(loop.PROMPT)
            samples.append(((time.perf_counter() - wall) / loop.K, (time.process_time() - cpu) / loop.K))
        _check(state)
    return samples


def _http_provider(client: httpx.AsyncClient, url: str) -> AnthropicProvider:
    return AnthropicProvider("k", base_url=f"{url}/loop/{loop.K}", client=client, retry=None, model_table=TABLE)


def _sqlite(folder: Path, durable: bool, url: str | None = None) -> Callable[[ThreatModel, int], list[Sample]]:
    path = folder / ("durable.db" if durable else "nofsync.db")

    async def run(document: ThreatModel, turns: int) -> list[Sample]:
        async with SQLiteJournalStore(path, durable=durable) as store:
            if url is None:
                return await journaled(document, turns, store)
            async with httpx.AsyncClient(trust_env=False, timeout=httpx.Timeout(30.0, read=None)) as client:
                return await journaled(document, turns, store, _http_provider(client, url), MODEL)

    return lambda document, turns: trio.run(run, document, turns)


def _memory_http(store: JournalStore, url: str) -> Callable[[ThreatModel, int], list[Sample]]:
    async def run(document: ThreatModel, turns: int) -> list[Sample]:
        async with httpx.AsyncClient(trust_env=False, timeout=httpx.Timeout(30.0, read=None)) as client:
            return await journaled(document, turns, store, _http_provider(client, url), MODEL)

    return lambda document, turns: trio.run(run, document, turns)


def _plain_http(url: str) -> Callable[[ThreatModel, int], list[Sample]]:
    async def run(document: ThreatModel, turns: int) -> list[Sample]:
        async with httpx.AsyncClient(trust_env=False, timeout=httpx.Timeout(30.0, read=None)) as client:
            return await plain(document, turns, _http_provider(client, url), MODEL)

    return lambda document, turns: trio.run(run, document, turns)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds of every contender")
    parser.add_argument("--turns", type=int, default=10, help="turns per contender per round")
    parser.add_argument("--dir", help="where the SQLite files go (default: a temporary folder)")
    args = parser.parse_args(argv)
    document = load_thf(PAYMENT_THF)
    memory = MemoryJournalStore()
    with tempfile.TemporaryDirectory(dir=args.dir) as folder, spawned_server() as url:
        http_folder = Path(folder) / "http"
        http_folder.mkdir()
        contenders: list[tuple[str, Callable[[ThreatModel, int], list[Sample]]]] = [
            ("no_store", lambda d, n: trio.run(plain, d, n)),
            ("memory_store", lambda d, n: trio.run(journaled, d, n, memory)),
            ("sqlite_no_fsync", _sqlite(Path(folder), durable=False)),
            ("sqlite_durable", _sqlite(Path(folder), durable=True)),
            ("http_no_store", _plain_http(url)),
            ("http_memory_store", _memory_http(memory, url)),
            ("http_sqlite_durable", _sqlite(http_folder, durable=True, url=url)),
        ]
        for _, run in contenders:
            run(document, 2)  # warm-up
        samples: dict[str, list[Sample]] = {name: [] for name, _ in contenders}
        for _ in range(args.rounds):
            for name, run in contenders:
                gc.collect()
                samples[name] += run(document, args.turns)
    stats = {
        name: {"wall_us": summarize([w for w, _ in s]), "cpu_us": summarize([c for _, c in s])}
        for name, s in samples.items()
    }
    base_cpu = stats["no_store"]["cpu_us"]["median"]
    rows = []
    for name, s in stats.items():
        peer = stats["http_no_store" if name.startswith("http") else "no_store"]["cpu_us"]["median"]
        cpu_ratio = round(s["cpu_us"]["median"] / peer, 3)
        emit(
            case_record(
                "journal",
                name,
                iterations_per_turn=loop.K,
                turns=len(samples[name]),
                per_iteration_wall_us=s["wall_us"],
                per_iteration_cpu_us=s["cpu_us"],
                cpu_over_no_store=cpu_ratio,
            )
        )
        rows.append((name, s["wall_us"]["median"], s["cpu_us"]["median"], s["cpu_us"]["p99"], f"{cpu_ratio}x"))
    fsync_us = round(stats["sqlite_durable"]["wall_us"]["median"] - stats["sqlite_no_fsync"]["wall_us"]["median"], 1)
    added = round(stats["sqlite_durable"]["cpu_us"]["median"] / base_cpu - 1, 3)
    http_base = stats["http_no_store"]["cpu_us"]["median"]
    http_added = round(stats["http_sqlite_durable"]["cpu_us"]["median"] / http_base - 1, 3)
    emit(
        case_record(
            "journal",
            "summary",
            fsync_wall_us_per_iteration=fsync_us,
            sqlite_cpu_added_in_process=added,
            sqlite_cpu_added_http=http_added,
            target=0.25,
        )
    )
    print()
    print_table(("per iteration, K=8", "wall med us", "cpu med us", "cpu p99", "cpu / no store"), rows)
    print(f"\nfsync wall per iteration (durable - no fsync, in process): {fsync_us} us")
    for label, value in (("in process", added), ("over loopback HTTP", http_added)):
        verdict = "met" if value <= 0.25 else "NOT met"
        print(f"CPU added by durable SQLite journaling, {label}: {value:+.1%} (target at most +25%): {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
