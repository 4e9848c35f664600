"""What the OpenTelemetry observer costs a loop iteration: `benchmarks.loop`'s in-process turn (K read-tool
iterations, then a text answer) without an observer, beside the same turn with `trioloop.otel.instrument`
under the API's no-op default (no tracer or meter provider configured: issue 30 asks for no measurable
change), and with the SDK recording every span and metric (exported nowhere), when it is installed.

Run ``python -m benchmarks.otel``. CPU time per iteration is the figure. The turn without an observer runs
twice as two contenders (``no_observer`` and ``no_observer_again``): their difference is the noise a change
must exceed to be measurable. Contenders alternate in rounds, in reverse order every other round, so drift
and order hit them alike. The global providers are never set, so ``noop_observer`` sees the API's default.
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Callable, Sequence
from typing import Any

import trio

from benchmarks import loop
from benchmarks._common import PAYMENT_THF, InProcessProvider, case_record, emit, print_table, summarize
from trioloop.machine.reducer import CallStatus, Outcome
from trioloop.otel import instrument
from trioloop.threatmodel import ThreatModel, load_thf, threat_model_session

Attach = Callable[[Any], None]


def _no_observer(session: Any) -> None:
    return None


def _noop_observer(session: Any) -> None:
    instrument(session)


def _sdk_observer() -> Attach | None:
    try:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider
    except ImportError:
        return None
    tracing, meters = TracerProvider(), MeterProvider(metric_readers=[InMemoryMetricReader()])

    def attach(session: Any) -> None:
        instrument(session, tracer_provider=tracing, meter_provider=meters)

    return attach


async def turns(document: ThreatModel, count: int, attach: Attach) -> list[float]:
    """CPU seconds per iteration of ``count`` turns, each in a new session with ``attach`` applied."""
    provider = InProcessProvider(loop.answer_in_process, batched=True)
    samples = []
    for _ in range(count):
        async with threat_model_session(
            document=document, provider=provider, model="scripted-1", tools=loop.REGISTRY, limits=loop.LIMITS
        ) as session:
            attach(session)
            cpu = time.process_time()
            state = await session.send(loop.PROMPT)
            samples.append((time.process_time() - cpu) / loop.K)
        if state.outcome is not Outcome.COMPLETED or [c.status for c in state.calls] != [CallStatus.SUCCEEDED] * loop.K:
            raise RuntimeError(f"unexpected turn: {state.outcome} with {len(state.calls)} calls")
    return samples


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=10, help="alternating rounds of every contender")
    parser.add_argument("--turns", type=int, default=20, help="turns per contender per round")
    args = parser.parse_args(argv)
    document = load_thf(PAYMENT_THF)
    contenders: list[tuple[str, Attach]] = [
        ("no_observer", _no_observer),
        ("noop_observer", _noop_observer),
        ("no_observer_again", _no_observer),
    ]
    sdk = _sdk_observer()
    if sdk is not None:
        contenders.append(("sdk_observer", sdk))
    for _, attach in contenders:
        trio.run(turns, document, 3, attach)  # warm-up
    samples: dict[str, list[float]] = {name: [] for name, _ in contenders}
    for round_ in range(args.rounds):
        for name, attach in contenders if round_ % 2 == 0 else contenders[::-1]:
            gc.collect()
            samples[name] += trio.run(turns, document, args.turns, attach)
    stats = {name: summarize(s, digits=2) for name, s in samples.items()}
    base = stats["no_observer"]["median"]
    rows = []
    for name, s in stats.items():
        added = round(s["median"] - base, 2)
        emit(
            case_record(
                "otel",
                name,
                iterations_per_turn=loop.K,
                turns=len(samples[name]),
                per_iteration_cpu_us=s,
                cpu_added_us=added,
            )
        )
        rows.append((name, s["median"], s["p99"], f"{added:+.2f}", f"{s['median'] / base - 1:+.1%}"))
    print()
    print_table(("per iteration, K=8", "cpu med us", "cpu p99", "added us", "added"), rows)
    noise = abs(stats["no_observer_again"]["median"] - base)
    noop = stats["noop_observer"]["median"] - base
    verdict = "within the noise" if abs(noop) <= noise else "above the noise"
    print(f"\nno-op observer: {noop:+.2f} us per iteration; noise (no observer, twice): {noise:.2f} us: {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
