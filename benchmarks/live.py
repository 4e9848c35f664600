"""Live-shaped streams over loopback HTTP: one chunk per event, fast and paced, trioloop beside its peers.

Run ``python -m benchmarks.live`` (``--quick`` for a short development run, ``--part a`` or ``--part b`` for
one part). The server is ``benchmarks._live_server``, a bare asyncio HTTP/1.1 server in a separate process
(so only the clients are measured), writing every SSE event of an Anthropic Messages stream as its own HTTP
chunk. It counts TCP connections and requests, so each case reports connects per request.

**(a) Fast stream** (``/burst/<E>``): E = 1k and 10k text deltas, one chunk each, written back to back
with no pause, so one socket read brings several chunks. Four contenders, interleaved (one block of
``--per-round`` requests each, round after round, the order rotating each round), all in this process:

- ``trioloop``: a whole turn (``run_turn`` with `AnthropicProvider` over one app-held ``httpx.AsyncClient``)
  timed to the settled reducer state: the path an app runs, with the transport's key scrubber on a key as
  long as a real one;
- ``sdk_async``: the anthropic SDK's ``AsyncAnthropic`` on Trio (through anyio), ``messages.stream``;
- ``sdk_sync``: the SDK's synchronous ``Anthropic`` client, ``messages.stream``;
- ``httpx_floor``: a bare ``httpx.AsyncClient`` on Trio iterating ``aiter_raw`` and dropping the bytes:
  the least any client on httpx's async path can cost (trioloop cannot go below it without leaving httpx).

The figure is the client's process CPU µs per event (median over the requests), with the ratios
contender / trioloop, connects per request, and the collections the garbage collector made during each
contender's requests (count per request and longest pause, timed with ``gc.callbacks``).

**(b) Paced sessions** (``/paced/<E>/<R>``): N = 10 / 100 / 300 / 500 sessions at once, each running
``--turns`` turns of E = 300 text deltas at R = 50 per second (one chunk per delta), started staggered
over one second. Each delta's text is the server's ``time.monotonic_ns()`` at its write, so the client
measures the latency from the server's write to the moment the text is visible: for trioloop, when an
observer of the session (``Session.observe``) first sees it in the published ``TurnState``; for the SDK
and pydantic-ai, when their stream yields it (see ``benchmarks._live_sessions``). Contenders: trioloop
sessions sharing one provider that holds its own client (``trioloop``), the same sessions with a provider
each (``trioloop_per_session``, what sharing is measured against), the same with one app-held
``httpx.AsyncClient`` of httpx's default pool, 100 connections of which 20 kept alive
(``trioloop_app_client``; ``--pool`` changes it), the SDK's ``AsyncAnthropic`` on Trio, pydantic-ai's
``Agent`` on asyncio, and a floor: bare ``httpx.AsyncClient`` streams on Trio, unbounded pool, finding the
stamps in the raw body (``httpx_floor``: no SSE, no events, no state). Each case runs in a fresh worker
process (``--worker``), so its CPU and GC figures are its own; the contenders are interleaved per N, and
the 1-minute load average is read before each. ``python -m benchmarks.live --worker trioloop --sessions
100`` runs one case alone with a server of its own (to put a profiler on it) and prints its record.
Reported: CPU µs per event (the worker's process CPU over the case / deltas shown), CPU use (% of one
core), latency p50 / p99, connects per request, the garbage collector's collections and longest pause
(target: none above 5 ms at N = 100; in wall time, and in the thread's CPU time, which another process
taking the core meanwhile does not stretch), and the server's own CPU use and lateness against its
schedule (a late server means the machine, not the client, ran out of time). A Trio or asyncio process
runs on one core: at 100% CPU use the client is saturated and the latency is its backlog.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

from benchmarks import stream_http
from benchmarks._common import case_record, emit, machine, print_table
from benchmarks._live_server import live_stats, spawned_live_server
from benchmarks._live_sessions import CONTENDERS, KEY, GcPauses, worker
from benchmarks.stream_http import async_sdk_requests, httpx_floor_requests, sdk_requests

PEERS: Final = ("anthropic", "pydantic-ai-slim", "httpx2", "anyio", "psutil")
ROOT: Final = Path(__file__).resolve().parent.parent
GC_TARGET_MS: Final = 5.0
GC_TARGET_N: Final = 100

Samples = list[tuple[float, float]]


# -- (a) fast stream, one chunk per event -------------------------------------------------------------------


def trioloop_requests(base: str, events: int, count: int) -> Samples:
    """Whole turns through `AnthropicProvider` on one app-held client, with a key as long as a real one."""
    return stream_http.trioloop_requests(base, events, count, key=KEY)


FAST: Final[tuple[tuple[str, Callable[[str, int, int], Samples]], ...]] = (
    ("trioloop", trioloop_requests),
    ("sdk_async", async_sdk_requests),
    ("sdk_sync", sdk_requests),
    ("httpx_floor", httpx_floor_requests),
)


def fast(url: str, sizes: Sequence[int], rounds: int, per_round: int) -> list[tuple[Any, ...]]:
    rows: list[tuple[Any, ...]] = []
    for events in sizes:
        base = f"{url}/burst/{events}"
        for _, fn in FAST:
            fn(base, events, 2)  # warm-up: imports, first connection
        cpu: dict[str, list[float]] = {name: [] for name, _ in FAST}
        connects: dict[str, list[float]] = {name: [] for name, _ in FAST}
        pauses = {name: GcPauses() for name, _ in FAST}
        loadavg = machine()["loadavg"]
        for round_ in range(rounds):
            shift = round_ % len(FAST)
            for name, fn in FAST[shift:] + FAST[:shift]:
                gc.collect()
                before = live_stats(url)
                with pauses[name]:
                    samples = fn(base, events, per_round)
                after = live_stats(url)
                # one connection of the difference is the "after" /stats request's own
                connects[name].append((after["connections"] - before["connections"] - 1) / per_round)
                cpu[name] += [c / events * 1e6 for _, c in samples]
        med = {name: statistics.median(values) for name, values in cpu.items()}
        for name, _ in FAST:
            gc_figures = pauses[name].summary()
            requests = len(cpu[name])
            figures = {
                "events": events,
                "contender": name,
                "cpu_us_per_event": round(med[name], 3),
                "over_trioloop": round(med[name] / med["trioloop"], 2),
                "requests": requests,
                "connects_per_request": round(statistics.mean(connects[name]), 3),
                "gc": {**gc_figures, "collections_per_request": round(gc_figures["collections"] / requests, 2)},
                "loadavg_before": loadavg,
            }
            if name == "trioloop":
                figures["above_floor_us_per_event"] = round(med["trioloop"] - med["httpx_floor"], 3)
            emit(case_record("live", f"fast/{events}/{name}", PEERS, **figures))
            rows.append(
                (
                    f"{events} events" if name == "trioloop" else "",
                    name,
                    round(med[name], 2),
                    f"{figures['over_trioloop']}x",
                    figures["connects_per_request"],
                    figures["gc"]["collections_per_request"],
                    gc_figures["max_pause_ms"],
                    loadavg if name == "trioloop" else "",
                )
            )
    return rows


# -- (b) paced sessions ---------------------------------------------------------------------------------


def paced_case(url: str, name: str, n: int, args: argparse.Namespace) -> dict[str, Any] | None:
    command = [
        sys.executable,
        "-m",
        "benchmarks.live",
        "--worker",
        name,
        "--url",
        url,
        "--sessions",
        str(n),
        "--events",
        str(args.events),
        "--rate",
        str(args.rate),
        "--turns",
        str(args.turns),
        "--stagger",
        str(args.stagger),
        "--pool",
        args.pool,
    ]
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True, timeout=args.timeout)
    except subprocess.CalledProcessError as exc:
        print(f"{name} at N = {n} failed:\n{exc.stderr[-3000:]}", file=sys.stderr, flush=True)
        return None
    except subprocess.TimeoutExpired:
        print(f"{name} at N = {n} took longer than {args.timeout} s: skipped", file=sys.stderr, flush=True)
        return None
    figures: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def paced(url: str, sizes: Sequence[int], args: argparse.Namespace) -> list[tuple[Any, ...]]:
    rows: list[tuple[Any, ...]] = []
    for n in sizes:
        results: dict[str, dict[str, Any]] = {}
        for name in args.contenders:
            loadavg = machine()["loadavg"]
            figures = paced_case(url, name, n, args)
            if figures is None:
                rows.append((n, name, loadavg.split()[0], "failed", "", "", "", "", "", "", "", "", ""))
                continue
            results[name] = figures
            base = results.get("trioloop")
            extra: dict[str, Any] = {"loadavg_before": loadavg}
            if base is not None and name != "trioloop":
                extra["cpu_over_trioloop"] = round(figures["cpu_us_per_event"] / base["cpu_us_per_event"], 2)
            if n == GC_TARGET_N:
                extra["gc_target_met"] = figures["gc"]["max_pause_ms"] <= GC_TARGET_MS
                extra["gc_target_met_by_cpu"] = figures["gc"]["max_pause_cpu_ms"] <= GC_TARGET_MS
            emit(case_record("live", f"paced/{n}/{name}", PEERS, **figures, **extra))
            gc_figures = figures["gc"]
            rows.append(
                (
                    n,
                    name,
                    loadavg.split()[0],
                    figures["wall_s"],
                    figures["cpu_us_per_event"],
                    f"{extra['cpu_over_trioloop']}x" if "cpu_over_trioloop" in extra else "",
                    figures["cpu_percent_of_one_core"],
                    figures["latency_ms"]["p50"],
                    figures["latency_ms"]["p99"],
                    f"{figures['connects_per_request']} / {figures['reconnects']}",
                    f"{gc_figures['collections']} / {gc_figures['gen2_collections']}",
                    f"{gc_figures['max_pause_ms']} / {gc_figures['max_pause_cpu_ms']}",
                    f"{figures['server_cpu_percent_of_one_core']} / {figures['server_late_ms']['p99']}",
                )
            )
    return rows


# -- command line ---------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a short run: N = 10 / 50, fewer events and rounds")
    parser.add_argument("--part", choices=("a", "b", "both"), default="both")
    parser.add_argument("--sizes", type=int, nargs="+", help="(a) events per fast stream (default 1000 10000)")
    parser.add_argument("--rounds", type=int, help="(a) interleaved rounds (default 7)")
    parser.add_argument("--per-round", type=int, default=4, help="(a) requests per contender per round")
    parser.add_argument("--sessions", type=int, nargs="+", help="(b) N (default 10 100 300 500)")
    parser.add_argument("--events", type=int, help="(b) text deltas per turn (default 300)")
    parser.add_argument("--rate", type=float, default=50.0, help="(b) deltas per second per session")
    parser.add_argument("--turns", type=int, default=2, help="(b) turns per session, one after another")
    parser.add_argument("--stagger", type=float, default=1.0, help="(b) seconds over which the sessions start")
    parser.add_argument(
        "--pool", default="default", help="(b) trioloop_app_client's pool: default (httpx's), none, or a number"
    )
    parser.add_argument("--contenders", nargs="+", choices=tuple(CONTENDERS), default=list(CONTENDERS))
    parser.add_argument("--timeout", type=float, default=900.0, help="(b) seconds before a case is given up")
    parser.add_argument("--worker", choices=tuple(CONTENDERS), help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    quick = args.quick
    sizes = args.sizes or ([1_000] if quick else [1_000, 10_000])
    rounds = args.rounds or (2 if quick else 7)
    sessions = args.sessions or ([10, 50] if quick else [10, 100, 300, 500])
    args.events = args.events or (100 if quick else 300)

    if args.worker is not None:
        n = sessions[0]
        if args.url is None:  # standalone (a profiler's run): a server of its own
            with spawned_live_server() as url:
                figures = worker(args.worker, url, n, args.events, args.rate, args.turns, args.stagger, args.pool)
        else:
            figures = worker(args.worker, args.url, n, args.events, args.rate, args.turns, args.stagger, args.pool)
        print(json.dumps(figures))
        return 0

    started = time.perf_counter()
    fast_rows: list[tuple[Any, ...]] = []
    paced_rows: list[tuple[Any, ...]] = []
    with spawned_live_server() as url:
        if args.part in ("a", "both"):
            fast_rows = fast(url, sizes, rounds, args.per_round)
        if args.part in ("b", "both"):
            paced_rows = paced(url, sessions, args)
    if fast_rows:
        print()
        print("(a) fast stream, one chunk per event, back to back: client CPU per event (median)")
        print_table(
            ("case", "contender", "cpu us/event", "x trioloop", "connects/req", "gc/req", "gc max ms", "load before"),
            fast_rows,
        )
    if paced_rows:
        print()
        print(
            f"(b) paced: N sessions x {args.turns} turns x {args.events} deltas at {args.rate:g}/s, one chunk each, "
            f"started over {args.stagger:g} s; latency = server write -> visible to the app"
        )
        print_table(
            (
                "N",
                "contender",
                "load",
                "wall s",
                "cpu us/event",
                "x trioloop",
                "cpu %",
                "lat p50 ms",
                "lat p99 ms",
                "connects/req / reconnects",
                "gc n / gen2",
                "gc max ms (wall / cpu)",
                "server cpu % / late p99 ms",
            ),
            paced_rows,
        )
        print(
            f"trioloop: sessions sharing one provider holding its own client; trioloop_per_session: a provider "
            f"per session; trioloop_app_client: one app-held "
            f"httpx.AsyncClient, pool {args.pool!r}. GC target: no pause above {GC_TARGET_MS:g} ms at "
            f"N = {GC_TARGET_N}."
        )
    print(f"\ntook {time.perf_counter() - started:.0f} s; load average now {machine()['loadavg']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
