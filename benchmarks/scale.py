"""Many sessions in one Trio process: throughput, peak RSS and memory per idle session for N = 10, 100, 1000.

Run ``python -m benchmarks.scale``. Each N runs in a fresh worker process (``--worker N``), so RSS
baselines and the peak (``ru_maxrss``) belong to that N alone. In the worker, N ``Session``s with the
default tool registry each run one turn concurrently: two iterations calling the shipped read tools
(``get_document_summary``, then ``get_entity``), then a text answer. All sessions share one stateless
in-process provider (``benchmarks._common.InProcessProvider``; it reads the iteration from the request,
and sends the same events the loopback HTTP path would) and one loaded ``examples/payment.thf``, so the
per-session figures are what a session itself costs, not a document copy or an HTTP connection.

Reported per N: turns/s (N turns over the wall time of a round; median and worst of the rounds), process
CPU per turn (median round; unlike turns/s it does not move with other load on the machine), per-turn
latency (median, p99), peak RSS, and memory per idle session as the RSS delta over N and as Python heap
bytes (tracemalloc, over min(N, 200) sessions), both for a new session and for one that has finished its
turn (it then holds the turn's conversation). Target: < 100 KiB per idle session.
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio

from benchmarks._common import (
    PAYMENT_THF,
    InProcessProvider,
    case_record,
    emit,
    iteration_of,
    print_table,
    summarize,
    wire_events,
)
from trioloop.machine.reducer import Outcome
from trioloop.protocol.events import StreamEvent
from trioloop.protocol.tools import ChatRequest
from trioloop.runtime.session import Session
from trioloop.threatmodel import ThreatModel, load_thf, threat_model_session

SIZES = (10, 100, 1000)
TARGET_KIB_PER_IDLE_SESSION = 100
ROOT = Path(__file__).resolve().parent.parent


def answer(request: ChatRequest) -> Sequence[StreamEvent]:
    """Summary, then one element, then a text answer: the same for every session."""
    i = iteration_of(request)
    if i == 0:
        return wire_events(calls=[("call_summary", "get_document_summary", {})])
    if i == 1:
        return wire_events(calls=[("call_entity", "get_entity", {"kind": "elements", "id": "payment-service"})])
    return wire_events(text="The payment service is covered.")


def rss_bytes() -> int:
    """Resident set size now (psutil when installed, else /proc/self/statm)."""
    try:
        import psutil  # type: ignore[import-untyped,unused-ignore]
    except ImportError:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * resource.getpagesize()
    return int(psutil.Process().memory_info().rss)


def new_sessions(n: int, document: ThreatModel, provider: InProcessProvider) -> list[Session]:
    return [threat_model_session(document=document, provider=provider, model="scripted-1") for _ in range(n)]


async def run_round(sessions: list[Session]) -> tuple[float, float, list[float]]:
    """Every session's turn at once: (wall seconds for all, CPU seconds for all, each turn's own seconds)."""
    latencies: list[float] = []

    async def one(session: Session) -> None:
        started = time.perf_counter()
        async with session:
            state = await session.send("Is the payment service covered?")
        latencies.append(time.perf_counter() - started)
        if state.outcome is not Outcome.COMPLETED or len(state.calls) != 2:
            raise RuntimeError(f"unexpected turn: {state.outcome} with {len(state.calls)} calls")

    started, cpu = time.perf_counter(), time.process_time()
    async with trio.open_nursery() as nursery:
        for session in sessions:
            nursery.start_soon(one, session)
    return time.perf_counter() - started, time.process_time() - cpu, latencies


def _settled_rss() -> int:
    gc.collect()
    return rss_bytes()


def _heap_per_session(n: int, document: ThreatModel, provider: InProcessProvider) -> tuple[float, float]:
    """Python heap bytes per session (tracemalloc): new, and after its turn."""
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    sessions = new_sessions(n, document, provider)
    gc.collect()
    new = (tracemalloc.get_traced_memory()[0] - base) / n
    trio.run(run_round, sessions)
    gc.collect()
    after = (tracemalloc.get_traced_memory()[0] - base) / n
    tracemalloc.stop()
    del sessions
    return new, after


def worker(n: int, rounds: int) -> dict[str, Any]:
    document = load_thf(PAYMENT_THF)
    provider = InProcessProvider(answer)
    trio.run(run_round, new_sessions(2, document, provider))  # warm-up: imports, caches
    base = _settled_rss()

    sessions = new_sessions(n, document, provider)
    idle_new = _settled_rss()
    walls, cpus, latencies = [], [], []
    wall, cpu, lat = trio.run(run_round, sessions)
    walls.append(wall)
    cpus.append(cpu)
    latencies += lat
    idle_after = _settled_rss()
    del sessions
    for _ in range(rounds - 1):
        gc.collect()
        wall, cpu, lat = trio.run(run_round, new_sessions(n, document, provider))
        walls.append(wall)
        cpus.append(cpu)
        latencies += lat
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    # tracemalloc slows every allocation; the heap per session does not depend on N, so 200 suffice.
    heap_new, heap_after = _heap_per_session(min(n, 200), document, provider)
    throughputs = [n / w for w in walls]
    return {
        "sessions": n,
        "rounds": rounds,
        "turns_per_second": {
            "median": round(statistics.median(throughputs), 1),
            "worst": round(min(throughputs), 1),
            "best": round(max(throughputs), 1),
        },
        "cpu_ms_per_turn": round(statistics.median(cpus) / n * 1e3, 3),
        "turn_latency_ms": summarize(latencies, scale=1e3, digits=2),
        "peak_rss_mib": round(peak / 2**20, 1),
        "baseline_rss_mib": round(base / 2**20, 1),
        "rss_per_idle_session_kib": {
            "new": round((idle_new - base) / n / 1024, 1),
            "after_turn": round((idle_after - base) / n / 1024, 1),
        },
        "heap_per_idle_session_kib": {"new": round(heap_new / 1024, 1), "after_turn": round(heap_after / 1024, 1)},
        "provider": "in-process (one shared, stateless)",
        "requests_per_turn": 3,
        "tool_calls_per_turn": 2,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--rounds", type=int, default=4, help="rounds of N concurrent turns per size")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        print(json.dumps(worker(args.worker, args.rounds)))
        return 0

    results = []
    for n in args.sizes:
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.scale", "--worker", str(n), "--rounds", str(args.rounds)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        figures = json.loads(done.stdout.strip().splitlines()[-1])
        worst_kib = max(
            figures["rss_per_idle_session_kib"]["after_turn"], figures["heap_per_idle_session_kib"]["after_turn"]
        )
        figures["target_kib_per_idle_session"] = TARGET_KIB_PER_IDLE_SESSION
        figures["met"] = worst_kib < TARGET_KIB_PER_IDLE_SESSION
        results.append(figures)
        emit(case_record("scale", f"sessions_{n}", ("psutil",), **figures))

    if len(results) > 1:
        first, last = results[0], results[-1]
        growth = {
            "sessions": [first["sessions"], last["sessions"]],
            "turns_per_second_ratio": round(
                last["turns_per_second"]["median"] / first["turns_per_second"]["median"], 2
            ),
            "cpu_per_turn_ratio": round(last["cpu_ms_per_turn"] / first["cpu_ms_per_turn"], 2),
            "turn_latency_median_ratio": round(
                last["turn_latency_ms"]["median"] / first["turn_latency_ms"]["median"], 1
            ),
            "heap_per_session_after_turn_ratio": round(
                last["heap_per_idle_session_kib"]["after_turn"] / first["heap_per_idle_session_kib"]["after_turn"], 2
            ),
            "peak_rss_growth_mib": round(last["peak_rss_mib"] - first["peak_rss_mib"], 1),
        }
        emit(case_record("scale", "growth", ("psutil",), **growth))

    print()
    print_table(
        (
            "sessions",
            "turns/s",
            "worst",
            "cpu ms/turn",
            "lat med ms",
            "lat p99 ms",
            "peak MiB",
            "RSS KiB/idle",
            "heap KiB/idle",
            "<100",
        ),
        [
            (
                r["sessions"],
                r["turns_per_second"]["median"],
                r["turns_per_second"]["worst"],
                r["cpu_ms_per_turn"],
                r["turn_latency_ms"]["median"],
                r["turn_latency_ms"]["p99"],
                r["peak_rss_mib"],
                f"{r['rss_per_idle_session_kib']['new']} / {r['rss_per_idle_session_kib']['after_turn']}",
                f"{r['heap_per_idle_session_kib']['new']} / {r['heap_per_idle_session_kib']['after_turn']}",
                "yes" if r["met"] else "NO",
            )
            for r in results
        ],
    )
    print("KiB per idle session: new / after its turn. Provider: one shared in-process provider.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
