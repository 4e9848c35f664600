"""What journaling costs a loop iteration: `benchmarks.loop`'s in-process turn (K read-tool iterations, then a
text answer) with no store, beside the same turn journaled in memory, in SQLite without fsync, and in SQLite
durable (WAL, synchronous=FULL: every append fsyncs before the turn goes on).

The same pair runs over HTTP too (the Anthropic provider against ``benchmarks._sse_server`` in another
process), the iteration a real app pays for. Run ``python -m benchmarks.journal``. CPU time is the budget; the
fsync is wall time spent waiting for the disk, reported apart as the difference between durable and no-fsync
SQLite. Contenders alternate in rounds, so drift hits them alike. Journals are signed (the default per-user key),
so every figure includes signing.

**Sessions, phase by phase.** Each session is a new session id in one database file, timed in three phases, wall
and CPU (`benchmarks._journal_run`): ``open`` (``Session.open(...)`` and the ``async with`` entry; for a session with
no store, constructing and entering it), ``send`` (``await session.send(...)``, the turn with its closing snapshot
when one is due) and ``close`` (the ``async with`` exit). The ``send`` columns divided by K are the figures earlier
runs reported; the headline is the whole session (open + send + close) divided by K, what a one-turn journaled
session costs per iteration, and every overhead and ratio target below is taken on it.

**The floor in the same run** (`benchmarks._floor`). The warm-up records what one journaled session's journal did:
its appends (store transactions) by phase, each batch's exact bytes, its seals (signatures), its other store calls.
``floor_sqlite_durable``, ``floor_postgres_durable`` and their ``floor_http_*`` twins replay that workload with bare
libraries and no trioloop, in the calling thread: one Ed25519 signature (``cryptography``) per seal and one
transaction per append inserting the same rows, in bare ``sqlite3`` (WAL, synchronous=FULL, BEGIN IMMEDIATE) or bare
``psycopg`` (synchronous_commit=on). The summary divides trioloop's durable overhead (journaled whole session - the
no-store whole session, CPU per iteration) by the floor's cost per iteration: at most 2x (issue 51), for SQLite and
PostgreSQL, in process and over HTTP. It also prints the parts of a SQLite durable session's appends measured from
outside (`benchmarks._journal_parts`: the store's hand-over and checks, the witness, the encoding, the signing);
``--parts`` runs those with more repeats and cProfiles journaled sessions instead of the rounds.

Beside them, in the same rounds: ``postgres_durable`` (`PostgresJournalStore`, each append waiting for its commit
with ``synchronous_commit=on``, on the throwaway server `tests.pg_support` starts, which runs with ``fsync=off``:
its wall time leaves out the server's disk flush; CPU is this process's alone, the server's own is not counted), in
process and over HTTP, skipped with a message without PostgreSQL's binaries or psycopg; and the LangGraph peer
(`benchmarks.journal_peers`: a ``StateGraph`` agent loop without a checkpointer and with ``SqliteSaver``, durable
too; only its ``invoke`` is timed, all of it counted as its send), skipped with a message without LangGraph.
``--quick`` is one round of two turns. The summary prints issue 42's targets, each a ratio of whole-session CPU
medians of this run (the send-only ratio beside it): SQLite durable at most 2x the no-store session in process and
at most 1.15x over loopback HTTP, the memory journal at most 1.15x, and trioloop's durable overhead per iteration
(``sqlite_durable - no_store``) at most a sixth of LangGraph's checkpoint overhead
(``langgraph_sqlite_saver - langgraph_no_checkpointer``); PostgreSQL is reported, with no target.

**The load.** Every record's ``machine`` carries others' CPU during the run (sampled between batches, the
PostgreSQL server and the HTTP server counted as the run's own), the processes used and the priority in effect;
``--nice N`` sets this process's nice and its autogroup's (`benchmarks._load.set_nice`), and says whether it could.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import _journal_run as run_
from benchmarks import _load, loop
from benchmarks._common import PAYMENT_THF, case_record, emit
from benchmarks._floor import PostgresFloor, SqliteFloor, Workload
from benchmarks._journal_parts import PARTS, measure_parts, profile_sessions
from benchmarks._journal_report import FLOOR_TARGET, baseline, floor_rows, phase_stats, print_tables
from benchmarks._sse_server import spawned_server
from benchmarks.journal_peers import LANGGRAPH_DISTS, langgraph_contenders, langgraph_missing
from trioloop.durable.store import MemoryJournalStore
from trioloop.durable.witness import FileWitness
from trioloop.threatmodel import load_thf

#: Issue 42's ratio targets: what is printed, the contender, its baseline, the most the ratio may be.
RATIO_TARGETS = (
    ("SQLite durable / no store, in process", "sqlite_durable", "no_store", 2.0),
    ("SQLite durable / no store, over loopback HTTP", "http_sqlite_durable", "http_no_store", 1.15),
    ("memory journal / no store, in process", "memory_store", "no_store", 1.15),
)
#: Issue 42: trioloop's durable overhead per iteration at most this share of LangGraph's checkpoint overhead.
PEER_TARGET = 1 / 6
#: The journaled contenders whose warm-up records a workload, and the floor that replays it.
FLOOR_OF = {
    "sqlite_durable": "floor_sqlite_durable",
    "postgres_durable": "floor_postgres_durable",
    "http_sqlite_durable": "floor_http_sqlite_durable",
    "http_postgres_durable": "floor_http_postgres_durable",
}
#: The rows whose records carry the settings their store ran with.
_SETTINGS_OF = {
    "postgres_durable": "postgres",
    "http_postgres_durable": "postgres",
    "floor_postgres_durable": "postgres",
    "floor_http_postgres_durable": "postgres",
    "langgraph_sqlite_saver": "langgraph",
}


def _peers_of(name: str) -> tuple[str, ...]:
    if name.startswith("langgraph_"):
        return LANGGRAPH_DISTS
    if name.startswith("floor_"):
        return ("cryptography", *(("psycopg",) if "postgres" in name else ()))
    return ("psycopg",) if "postgres" in name else ()


def _verdict(met: bool) -> str:
    return "met" if met else "NOT met"


def _contenders(
    folder: Path, url: str, pg_url: str | None, peers: list[tuple[str, Any]], workloads: dict[str, Workload]
) -> list[tuple[str, run_.Contender]]:
    """Every contender in the order the rounds run them; a floor right after the contender it replays."""
    memory = MemoryJournalStore()
    http_folder = folder / "http"
    http_folder.mkdir(exist_ok=True)
    journaled: list[tuple[str, run_.Contender]] = [
        ("no_store", run_.no_store()),
        ("memory_store", run_.memory(memory)),
        ("sqlite_no_fsync", run_.sqlite(folder, durable=False)),
        ("sqlite_durable", run_.sqlite(folder, durable=True)),
    ]
    if pg_url is not None:
        journaled.append(("postgres_durable", run_.postgres(pg_url)))
    journaled += [(name, run_.send_only(run)) for name, run in peers]
    journaled += [
        ("http_no_store", run_.no_store(url)),
        ("http_memory_store", run_.memory(memory, url)),
        ("http_sqlite_durable", run_.sqlite(http_folder, durable=True, url=url)),
    ]
    if pg_url is not None:
        journaled.append(("http_postgres_durable", run_.postgres(pg_url, url)))
    found: list[tuple[str, run_.Contender]] = []
    for name, run in journaled:
        found.append((name, run))
        if name in FLOOR_OF:
            workload = workloads[name] = Workload()
            if "postgres" in name:
                assert pg_url is not None
                writer: Any = lambda u=pg_url: PostgresFloor(u)  # noqa: E731
            else:
                writer = lambda f=folder / f"{FLOOR_OF[name]}.db": SqliteFloor(f)  # noqa: E731
            found.append((FLOOR_OF[name], run_.floor(workload, writer)))
    return found


def _parts_only(document: Any, folder: Path, args: argparse.Namespace) -> int:
    """``--parts``: the parts of a SQLite durable session's appends, then cProfile of journaled sessions."""
    workload = Workload()
    durable = run_.sqlite(folder, durable=True)
    durable(document, 2, workload)
    parts = measure_parts(workload, folder / "parts", args.parts)
    _print_parts(parts, len(workload.batches))
    steps = profile_sessions(lambda n: durable(document, n), args.parts, loop.K)
    emit(case_record("journal", "parts", per_session_cpu_us=parts, journal_work=workload.summary(), profile=steps))
    print(f"\ncProfile of {args.parts} SQLite durable sessions, the session's thread, per iteration (K = {loop.K}):")
    for what, cumulative, calls in steps:
        print(f"  {cumulative:9.1f} us  {calls:7.2f} frames entered per session  {what}")
    print("(a coroutine's frame is entered again at each resume; the store's thread is not profiled)")
    return 0


def _print_parts(parts: dict[str, float], appends: int | None) -> None:
    k = loop.K
    hop = round(parts["store_append"] - parts["bare_sqlite3"], 1)
    witness = round(parts["store_append_witnessed"] - parts["store_append"], 1)
    print(f"\nthe appends of one SQLite durable session ({appends} appends), CPU us per session / per")
    print(f"iteration (K = {k}), all threads:")
    for name in PARTS:
        print(f"  {name:24} {parts[name]:9.1f} / {parts[name] / k:7.1f}")
    print(f"  -> the store's hand-over to its thread, lease and number checks: {hop} / {hop / k:.1f}")
    print(f"  -> the witness written in the same hand-over: {witness} / {witness / k:.1f}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds of every contender")
    parser.add_argument("--turns", type=int, default=10, help="turns per contender per round")
    parser.add_argument("--quick", action="store_true", help="one round of two turns (a smoke run)")
    parser.add_argument("--dir", help="where the SQLite files go (default: a temporary folder)")
    parser.add_argument("--nice", type=int, help="run at this nice, the process's and its autogroup's")
    parser.add_argument(
        "--parts", type=int, nargs="?", const=50, metavar="N", help="only the parts of an append, N sessions each"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.turns = 1, 2
    if args.nice is not None:
        _load.set_nice(args.nice)
    document = load_thf(PAYMENT_THF)
    skipped: dict[str, str] = {}
    settings: dict[str, dict[str, str]] = {}
    workloads: dict[str, Workload] = {}
    with contextlib.ExitStack() as stack:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(dir=args.dir)))
        run_.witness = FileWitness(folder / "witness")
        if args.parts:
            return _parts_only(document, folder, args)
        sampler = _load.start_sampling()
        url = stack.enter_context(spawned_server())
        helpers = ["loopback HTTP server"]
        pg_url, pg_settings = stack.enter_context(run_.running_postgres())
        if isinstance(pg_settings, str):
            skipped["postgres"] = pg_settings
            print(f"PostgreSQL journaling skipped: {pg_settings}", flush=True)
        else:
            settings["postgres"] = pg_settings
            helpers.append("PostgreSQL server")
            assert pg_url is not None
            postmaster = run_.postmaster_pid(pg_url)
            if postmaster is not None:
                sampler.add_root(postmaster)
        _load.configure(processes=1, helpers=helpers)
        peers: list[tuple[str, Any]] = []
        why_not = langgraph_missing()
        if why_not is not None:
            skipped["langgraph"] = why_not
            print(f"LangGraph peer skipped: {why_not}", flush=True)
        else:
            peers, settings["langgraph"] = stack.enter_context(langgraph_contenders(folder))
        contenders = _contenders(folder, url, pg_url, peers, workloads)
        recorded: dict[str, Workload] = {}
        for name, run in contenders:  # warm-up; each journaled contender records what its journal did
            recorded[name] = workloads.get(name, Workload())
            run(document, 2, None if name.startswith(("no_store", "http_no_store", "floor_")) else recorded[name])
        sampler.sample()
        samples: dict[str, list[run_.Phases]] = {name: [] for name, _ in contenders}
        for _ in range(args.rounds):
            for name, run in contenders:
                gc.collect()
                samples[name] += run(document, args.turns)
                sampler.sample()
        parts = measure_parts(workloads["sqlite_durable"], folder / "parts", max(args.turns, 3))
        sampler.sample()
    work = {name: w.summary() for name, w in recorded.items() if w.sessions and w.batches}
    stats = {name: phase_stats(s, loop.K) for name, s in samples.items()}
    _report(stats, work, parts, settings, skipped, bool(peers))
    return 0


def _report(
    stats: dict[str, dict[str, Any]],
    work: dict[str, dict[str, Any]],
    parts: dict[str, float],
    settings: dict[str, dict[str, str]],
    skipped: dict[str, str],
    peers: bool,
) -> None:
    cpu = {name: s["whole_per_iteration_cpu_us"]["median"] for name, s in stats.items()}
    send = {name: s["per_iteration_cpu_us"]["median"] for name, s in stats.items()}
    for name, s in stats.items():
        base = baseline(name)
        extra = {"settings": settings[_SETTINGS_OF[name]]} if name in _SETTINGS_OF else {}
        if name in work:
            extra["journal_work"] = work[name]
        if not name.startswith("floor_"):
            extra["cpu_over_no_store"] = round(send[name] / send[base], 3)
            extra["whole_cpu_over_no_store"] = round(cpu[name] / cpu[base], 3)
        turns = s["per_iteration_cpu_us"]["n"]
        emit(case_record("journal", name, _peers_of(name), iterations_per_turn=loop.K, turns=turns, **s, **extra))
    fsync_us = round(
        stats["sqlite_durable"]["whole_per_iteration_wall_us"]["median"]
        - stats["sqlite_no_fsync"]["whole_per_iteration_wall_us"]["median"],
        1,
    )
    added = round(cpu["sqlite_durable"] / cpu["no_store"] - 1, 3)
    http_added = round(cpu["http_sqlite_durable"] / cpu["http_no_store"] - 1, 3)
    targets: list[dict[str, Any]] = []
    for label, name, base, most in RATIO_TARGETS:
        ratio, send_ratio = cpu[name] / cpu[base], send[name] / send[base]
        targets.append(
            {
                "target": label,
                "value": round(ratio, 3),
                "send_only_value": round(send_ratio, 3),
                "at_most": most,
                "met": ratio <= most,
            }
        )
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
    floors = floor_rows(stats)
    postgres: dict[str, Any] = {}
    if "postgres" in settings:
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
            durable_overhead_cpu_us=ours,
            durable_overhead_send_only_cpu_us=round(send["sqlite_durable"] - send["no_store"], 1),
            langgraph_overhead_cpu_us=theirs,
            ours_over_langgraph=ours_over_theirs,
            **postgres,
            issue42_targets=targets,
            floor_targets=floors,
            parts_per_session_cpu_us=parts,
            settings=settings,
            skipped=skipped,
        )
    )
    print_tables(stats, work, loop.K)
    _print_parts(parts, work.get("sqlite_durable", {}).get("per_session", {}).get("appends"))
    print(f"\nfsync wall per iteration, whole session (durable - no fsync, in process): {fsync_us} us")
    print(f"CPU added by durable SQLite journaling, whole session: {added:+.1%} in process, {http_added:+.1%} by HTTP")
    print("\nissue 42 targets (whole-session CPU medians of this run, signed journals; send() alone in brackets):")
    for target in targets[: len(RATIO_TARGETS)]:
        print(
            f"  {target['target']}: {target['value']}x [{target['send_only_value']}x]"
            f" (at most {target['at_most']}x): {_verdict(target['met'])}"
        )
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
    _print_open(stats)
    print("\nissue 51: durable overhead (journaled - no store, whole session) / the floor, CPU per iteration:")
    for row in floors:
        print(
            f"  {row['target'][len('durable overhead / floor, ') :]}: {row['overhead_cpu_us_per_iteration']} us /"
            f" {row['floor_cpu_us_per_iteration']} us = {row['value']}x (at most {FLOOR_TARGET:g}x):"
            f" {_verdict(row['met'])}"
        )


#: Issue 51: opening a journaled session, new or existing, at most this much CPU beyond a plain one's open and close.
OPEN_TARGET_MS = 2.0


def _print_open(stats: dict[str, Any]) -> None:
    """Issue 51's cheap open: a journaled session's open and close, new and reopened, beyond a plain session's."""
    plain = stats["no_store"]["per_session_us"]
    base = plain["open"]["cpu"]["median"] + plain["close"]["cpu"]["median"]
    print(f"\nissue 51: opening a journaled session, CPU beyond a plain session's open + close ({base:.0f} us):")
    for name in ("memory_store", "sqlite_no_fsync", "sqlite_durable", "postgres_durable"):
        if name not in stats:
            continue
        phases = stats[name]["per_session_us"]
        new = (phases["open"]["cpu"]["median"] + phases["close"]["cpu"]["median"] - base) / 1000
        line, figures = f"  {name}: new {new:.2f} ms", [new]
        for phase, label in (("reopen", "existing, in the process that wrote it"), ("cold_reopen", "in a new one")):
            if phase in phases:
                figures.append((phases[phase]["cpu"]["median"] - base) / 1000)
                line += f", {label} {figures[-1]:.2f} ms"
        print(f"{line} (at most {OPEN_TARGET_MS:g} ms): {_verdict(max(figures) <= OPEN_TARGET_MS)}")


if __name__ == "__main__":
    raise SystemExit(main())
