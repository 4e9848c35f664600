"""What journaling costs a loop iteration: `benchmarks.loop`'s in-process turn (K read-tool iterations, then a
text answer) with no store, beside the same turn journaled in memory, in SQLite without fsync, and in SQLite
durable (WAL, synchronous=FULL: every append fsyncs before the turn goes on).

The same pair runs over HTTP too (the Anthropic provider against ``benchmarks._sse_server`` in another
process), the iteration a real app pays for. Run ``python -m benchmarks.journal``. CPU time is the budget
(issue 26: journaling on SQLite adds at most 25% CPU to an iteration); the fsync is wall time spent waiting
for the disk, reported apart as the difference between durable and no-fsync SQLite. Contenders alternate in
rounds, so drift hits them alike. Each turn opens its own journaled session (a new session id in one database
file); only ``send`` is timed, which includes the turn's closing snapshot when one is due. Journals are signed
(the default per-user key), so every figure includes signing.

Beside them, in the same rounds: ``postgres_durable`` (`PostgresJournalStore`, each append waiting for its commit
with ``synchronous_commit=on``, on the throwaway server `tests.pg_support` starts, which runs with ``fsync=off``:
its wall time leaves out the server's disk flush; CPU is this process's alone, the server's own is not counted), in
process and over HTTP, skipped with a message without PostgreSQL's binaries or psycopg; and the LangGraph peer
(`benchmarks.journal_peers`: a ``StateGraph`` agent loop without a checkpointer and with ``SqliteSaver``, durable
too), skipped with a message without LangGraph. ``--quick`` is one round of two turns. The summary prints issue
42's targets, each a ratio of CPU medians of this run: SQLite durable at most 2x the no-store iteration in process
and at most 1.15x over loopback HTTP, the memory journal at most 1.15x, and trioloop's durable overhead per
iteration (``sqlite_durable - no_store``) at most a sixth of LangGraph's checkpoint overhead
(``langgraph_sqlite_saver - langgraph_no_checkpointer``); PostgreSQL is reported, with no target.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import trio

from benchmarks import loop
from benchmarks._common import PAYMENT_THF, InProcessProvider, case_record, emit, print_table, summarize
from benchmarks._sse_server import MODEL, TABLE, spawned_server
from benchmarks.journal_peers import LANGGRAPH_DISTS, langgraph_contenders, langgraph_missing
from trioloop.durable.store import JournalStore, MemoryJournalStore
from trioloop.durable.witness import FileWitness
from trioloop.machine.reducer import CallStatus, Outcome
from trioloop.providers import AnthropicProvider
from trioloop.runtime.session import Session
from trioloop.stores import PostgresJournalStore, SQLiteJournalStore
from trioloop.threatmodel import THREAT_MODEL, ThreatModel, load_thf, threat_model_session
from trioloop.threatmodel.session import THREAT_MODEL_SYSTEM_PROMPT

ROOT = Path(__file__).resolve().parent.parent
Sample = tuple[float, float]
Contender = Callable[[ThreatModel, int], list[Sample]]
_opened = 0
#: Where the benchmark's sessions witness their heads: a folder of the run's own, not the user's config folder.
_witness: Any = "default"

#: Issue 42's ratio targets: what is printed, the contender, its baseline, the most the ratio may be.
RATIO_TARGETS = (
    ("SQLite durable / no store, in process", "sqlite_durable", "no_store", 2.0),
    ("SQLite durable / no store, over loopback HTTP", "http_sqlite_durable", "http_no_store", 1.15),
    ("memory journal / no store, in process", "memory_store", "no_store", 1.15),
)
#: Issue 42: trioloop's durable overhead per iteration at most this share of LangGraph's checkpoint overhead.
PEER_TARGET = 1 / 6
#: The PostgreSQL settings a record carries (`tests.pg_support`'s throwaway server runs with fsync off).
_PG_SETTINGS = ("synchronous_commit", "fsync", "full_page_writes")


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
            witness=None if isinstance(store, MemoryJournalStore) else _witness,  # as by default: memory is not
        )
        async with session:
            wall, cpu = time.perf_counter(), time.process_time()
            state = await session.send(loop.PROMPT)
            samples.append(((time.perf_counter() - wall) / loop.K, (time.process_time() - cpu) / loop.K))
        _check(state)
    return samples


def _http_provider(client: httpx.AsyncClient, url: str) -> AnthropicProvider:
    return AnthropicProvider("k", base_url=f"{url}/loop/{loop.K}", client=client, retry=None, model_table=TABLE)


def _stored(make_store: Callable[[], Any], url: str | None = None) -> Contender:
    """Turns journaled in the store ``make_store()`` opens once per batch, in process or over HTTP at ``url``."""

    async def run(document: ThreatModel, turns: int) -> list[Sample]:
        async with make_store() as store:
            if url is None:
                return await journaled(document, turns, store)
            async with httpx.AsyncClient(trust_env=False, timeout=httpx.Timeout(30.0, read=None)) as client:
                return await journaled(document, turns, store, _http_provider(client, url), MODEL)

    return lambda document, turns: trio.run(run, document, turns)


def _sqlite(folder: Path, durable: bool, url: str | None = None) -> Contender:
    path = folder / ("durable.db" if durable else "nofsync.db")
    return _stored(lambda: SQLiteJournalStore(path, durable=durable), url)


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


def _server_settings(url: str) -> dict[str, str]:
    """What the server commits with: the client waits for each commit (synchronous_commit), the disk may not."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as probe:
        rows = {name: probe.execute(f"SHOW {name}").fetchone() for name in _PG_SETTINGS}
    return {name: str(row[0]) if row else "unknown" for name, row in rows.items()}


@contextlib.contextmanager
def _postgres() -> Iterator[tuple[str | None, dict[str, str] | str]]:
    """A throwaway PostgreSQL server: its URL and settings, or None and why there is none."""
    try:
        import psycopg  # noqa: F401

        if str(ROOT) not in sys.path:
            sys.path.insert(0, str(ROOT))
        from tests.pg_support import find_postgres_bin, running_postgres
    except ImportError as exc:
        yield None, f"{exc} (pip install -e '.[postgres,test]')"
        return
    bindir = find_postgres_bin()
    if bindir is None:
        yield None, "no PostgreSQL server binaries (initdb, pg_ctl on PATH or in /usr/lib/postgresql/*/bin)"
        return
    with running_postgres(bindir) as url:
        yield url, _server_settings(url)


def _baseline(name: str) -> str:
    """The contender a row's CPU ratio is taken over."""
    if name.startswith("http_"):
        return "http_no_store"
    if name.startswith("langgraph_"):
        return "langgraph_no_checkpointer"
    return "no_store"


def _peers_of(name: str) -> tuple[str, ...]:
    if name.startswith("langgraph_"):
        return LANGGRAPH_DISTS
    return ("psycopg",) if "postgres" in name else ()


#: The rows whose records carry the settings their store ran with.
_SETTINGS_OF = {
    "postgres_durable": "postgres",
    "http_postgres_durable": "postgres",
    "langgraph_sqlite_saver": "langgraph",
}


def _verdict(met: bool) -> str:
    return "met" if met else "NOT met"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds of every contender")
    parser.add_argument("--turns", type=int, default=10, help="turns per contender per round")
    parser.add_argument("--quick", action="store_true", help="one round of two turns (a smoke run)")
    parser.add_argument("--dir", help="where the SQLite files go (default: a temporary folder)")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.turns = 1, 2
    document = load_thf(PAYMENT_THF)
    memory = MemoryJournalStore()
    skipped: dict[str, str] = {}
    settings: dict[str, dict[str, str]] = {}
    with contextlib.ExitStack() as stack:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(dir=args.dir)))
        global _witness
        _witness = FileWitness(folder / "witness")
        url = stack.enter_context(spawned_server())
        http_folder = folder / "http"
        http_folder.mkdir()
        pg_url, pg_settings = stack.enter_context(_postgres())
        if isinstance(pg_settings, str):
            skipped["postgres"] = pg_settings
            print(f"PostgreSQL journaling skipped: {pg_settings}", flush=True)
        else:
            settings["postgres"] = pg_settings
        peers: list[tuple[str, Contender]] = []
        why_not = langgraph_missing()
        if why_not is not None:
            skipped["langgraph"] = why_not
            print(f"LangGraph peer skipped: {why_not}", flush=True)
        else:
            peers, settings["langgraph"] = stack.enter_context(langgraph_contenders(folder))
        contenders: list[tuple[str, Contender]] = [
            ("no_store", lambda d, n: trio.run(plain, d, n)),
            ("memory_store", lambda d, n: trio.run(journaled, d, n, memory)),
            ("sqlite_no_fsync", _sqlite(folder, durable=False)),
            ("sqlite_durable", _sqlite(folder, durable=True)),
        ]
        if pg_url is not None:
            contenders.append(("postgres_durable", _stored(lambda: PostgresJournalStore(pg_url))))
        contenders += peers
        contenders += [
            ("http_no_store", _plain_http(url)),
            ("http_memory_store", _memory_http(memory, url)),
            ("http_sqlite_durable", _sqlite(http_folder, durable=True, url=url)),
        ]
        if pg_url is not None:
            contenders.append(("http_postgres_durable", _stored(lambda: PostgresJournalStore(pg_url), url)))
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
    cpu = {name: s["cpu_us"]["median"] for name, s in stats.items()}
    rows = []
    for name, s in stats.items():
        cpu_ratio = round(cpu[name] / cpu[_baseline(name)], 3)
        extra = {"settings": settings[_SETTINGS_OF[name]]} if name in _SETTINGS_OF else {}
        emit(
            case_record(
                "journal",
                name,
                _peers_of(name),
                iterations_per_turn=loop.K,
                turns=len(samples[name]),
                per_iteration_wall_us=s["wall_us"],
                per_iteration_cpu_us=s["cpu_us"],
                cpu_over_no_store=cpu_ratio,
                **extra,
            )
        )
        rows.append((name, s["wall_us"]["median"], s["cpu_us"]["median"], s["cpu_us"]["p99"], f"{cpu_ratio}x"))
    fsync_us = round(stats["sqlite_durable"]["wall_us"]["median"] - stats["sqlite_no_fsync"]["wall_us"]["median"], 1)
    added = round(cpu["sqlite_durable"] / cpu["no_store"] - 1, 3)
    http_added = round(cpu["http_sqlite_durable"] / cpu["http_no_store"] - 1, 3)
    targets: list[dict[str, Any]] = []
    for label, name, base, most in RATIO_TARGETS:
        ratio = cpu[name] / cpu[base]
        targets.append({"target": label, "value": round(ratio, 3), "at_most": most, "met": ratio <= most})
    ours = round(cpu["sqlite_durable"] - cpu["no_store"], 1)
    theirs = ours_over_theirs = None
    if peers:
        theirs = round(cpu["langgraph_sqlite_saver"] - cpu["langgraph_no_checkpointer"], 1)
        share = ours / theirs if theirs > 0 else None  # LangGraph's overhead lost in the noise: no ratio
        ours_over_theirs = None if share is None else round(share, 3)
        targets.append(
            {
                "target": "durable overhead, ours / LangGraph SqliteSaver's",
                "value": ours_over_theirs,
                "at_most": round(PEER_TARGET, 3),
                "met": share is not None and share <= PEER_TARGET,
            }
        )
    postgres: dict[str, Any] = {}
    if pg_url is not None:
        postgres = {
            "postgres_overhead_cpu_us": round(cpu["postgres_durable"] - cpu["no_store"], 1),
            "postgres_durable_over_no_store": round(cpu["postgres_durable"] / cpu["no_store"], 3),
            "http_postgres_durable_over_http_no_store": round(cpu["http_postgres_durable"] / cpu["http_no_store"], 3),
        }
    emit(
        case_record(
            "journal",
            "summary",
            LANGGRAPH_DISTS if peers else (),
            fsync_wall_us_per_iteration=fsync_us,
            sqlite_cpu_added_in_process=added,
            sqlite_cpu_added_http=http_added,
            target=0.25,
            durable_overhead_cpu_us=ours,
            langgraph_overhead_cpu_us=theirs,
            ours_over_langgraph=ours_over_theirs,
            **postgres,
            issue42_targets=targets,
            settings=settings,
            skipped=skipped,
        )
    )
    print()
    print_table(("per iteration, K=8", "wall med us", "cpu med us", "cpu p99", "cpu / baseline"), rows)
    print("(baseline: no_store, http_no_store over HTTP, langgraph_no_checkpointer for LangGraph)")
    print(f"\nfsync wall per iteration (durable - no fsync, in process): {fsync_us} us")
    for label, value in (("in process", added), ("over loopback HTTP", http_added)):
        verdict = "met" if value <= 0.25 else "NOT met"
        print(f"CPU added by durable SQLite journaling, {label}: {value:+.1%} (target at most +25%): {verdict}")
    print("\nissue 42 targets (CPU medians of this run, signed journals):")
    for target in targets[: len(RATIO_TARGETS)]:
        print(f"  {target['target']}: {target['value']}x (at most {target['at_most']}x): {_verdict(target['met'])}")
    label = "durable overhead per iteration, ours (sqlite_durable - no_store) / LangGraph SqliteSaver's"
    if peers:
        mode = ", ".join(f"{k}={v}" for k, v in settings["langgraph"].items())
        print(
            f"  {label}: {ours} us / {theirs} us = {ours_over_theirs} (at most 1/6 = {PEER_TARGET:.3f};"
            f" SqliteSaver {mode}): {_verdict(targets[-1]['met'])}"
        )
    else:
        print(f"  {label}: skipped ({skipped['langgraph']})")
    if postgres:
        print(
            f"  PostgreSQL durable (reported, no target): +{postgres['postgres_overhead_cpu_us']} us per iteration,"
            f" {postgres['postgres_durable_over_no_store']}x no store in process;"
            f" {postgres['http_postgres_durable_over_http_no_store']}x over loopback HTTP"
            f" (server fsync={settings['postgres']['fsync']},"
            f" synchronous_commit={settings['postgres']['synchronous_commit']}; its CPU not counted)"
        )
    else:
        print(f"  PostgreSQL durable (reported, no target): skipped ({skipped['postgres']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
