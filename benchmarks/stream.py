"""Streaming throughput: bytes -> SSE frames -> StreamEvents, for both wire shapes.

Run with ``python -m benchmarks.stream``. Cases: trioloop's sans-IO pipeline (decoder + mapper), the
same bytes through trioloop's real provider path (httpx transport under Trio, served by
``httpx.MockTransport``), and, when installed, the official ``anthropic`` and ``openai`` SDKs
accumulating the same bytes with their own stream helpers (also fed by ``httpx.MockTransport``).
Prints one JSON object per case, then a table of events/second with ratios to the SDKs.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import platform
import statistics
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import trio

from trioloop.protocol import ChatRequest, Message, StreamEvent, TextDelta
from trioloop.providers import AnthropicProvider, OpenAIProvider
from trioloop.providers.anthropic import AnthropicStreamMapper, render_anthropic_stream
from trioloop.providers.base import StreamMapper, WireResponse
from trioloop.providers.openai import OpenAIStreamMapper, render_openai_stream
from trioloop.providers.sse import SseDecoder

CHUNK = 16 * 1024
SIZES = (1_000, 10_000, 100_000)
CASE_BUDGET_S = 1.0
MAX_CASE_S = 6.0
CHANNEL_BUFFER = 64
MODEL = "bench-model"
WORDS = ("alpha ", "βetas ", "gamma ", "δelta ", "epsil ", "zetaς ", "ηtaaa ", "theta ")  # 6 code points each


def _body(shape: str, events: int) -> bytes:
    """A text answer of ``events`` deltas, one word each, rendered by the wire module itself."""
    text = "".join(WORDS[i % len(WORDS)] for i in range(events))
    response = WireResponse(model=MODEL, text=text, text_piece=6, input_tokens=5, output_tokens=events)
    render = render_anthropic_stream if shape == "anthropic" else render_openai_stream
    return render(response)


def _chunks(raw: bytes) -> list[bytes]:
    return [raw[i : i + CHUNK] for i in range(0, len(raw), CHUNK)]


def _mapper(shape: str) -> StreamMapper:
    return AnthropicStreamMapper() if shape == "anthropic" else OpenAIStreamMapper()


def run_sans_io(shape: str, raw: bytes) -> int:
    """Decoder and mapper only, counting events as a consumer would (nothing accumulated)."""
    decoder, mapper, counted = SseDecoder(), _mapper(shape), 0
    for chunk in _chunks(raw):
        for frame in decoder.feed(chunk):
            for event in mapper.feed(frame):
                counted += isinstance(event, TextDelta)
    decoder.close()
    mapper.finish()
    return counted


def run_transport(shape: str, raw: bytes) -> int:
    async def body() -> AsyncIterator[bytes]:
        for chunk in _chunks(raw):
            yield chunk

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body())

    async def main() -> int:
        counted = 0
        request = ChatRequest(model=MODEL, messages=(Message.user("go"),))
        send, receive = trio.open_memory_channel[StreamEvent](CHANNEL_BUFFER)
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            provider: AnthropicProvider | OpenAIProvider
            if shape == "anthropic":
                provider = AnthropicProvider("k", base_url="https://bench.invalid", client=client, retry=None)
            else:
                provider = OpenAIProvider("k", base_url="https://bench.invalid/v1", client=client, retry=None)
            async with trio.open_nursery() as nursery:

                async def produce() -> None:
                    async with send:
                        await provider.stream(request, send)

                nursery.start_soon(produce)
                async with receive:
                    async for event in receive:
                        counted += isinstance(event, TextDelta)
        return counted

    return trio.run(main)


def _sync_client(sdk: Any, raw: bytes) -> Any:
    """An HTTP client of the flavor the SDK expects (recent SDKs ship their own ``httpx2``), serving ``raw``."""
    module: Any = httpx
    if "httpx2" in getattr(sdk._base_client, "__dict__", {}):
        import httpx2

        module = httpx2

    def body() -> Iterator[bytes]:
        yield from _chunks(raw)

    def handler(request: Any) -> Any:
        return module.Response(200, headers={"content-type": "text/event-stream"}, content=body())

    return module.Client(transport=module.MockTransport(handler))


def run_anthropic_sdk(shape: str, raw: bytes) -> int:
    import anthropic

    client = anthropic.Anthropic(
        api_key="k", base_url="https://bench.invalid", http_client=_sync_client(anthropic, raw)
    )
    with client.messages.stream(model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "go"}]) as stream:
        counted = sum(1 for event in stream if event.type == "text")
        final = stream.get_final_message()
    assert final.content
    return counted


def run_openai_sdk(shape: str, raw: bytes) -> int:
    import openai

    client = openai.OpenAI(api_key="k", base_url="https://bench.invalid/v1", http_client=_sync_client(openai, raw))
    with client.chat.completions.stream(model=MODEL, messages=[{"role": "user", "content": "go"}]) as stream:
        counted = sum(1 for event in stream if event.type == "content.delta" and event.delta)
        final = stream.get_final_completion()
    assert final.choices
    return counted


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _timed(fn: Callable[[str, bytes], int], shape: str, raw: bytes) -> tuple[float, int]:
    start = time.perf_counter()
    counted = fn(shape, raw)
    return time.perf_counter() - start, counted


def _measure(
    fn: Callable[[str, bytes], int], shape: str, raw: bytes, events: int, budget: float, max_case: float
) -> dict[str, Any]:
    """Time repeated runs: at least 3 when they fit in ``max_case`` seconds, more until ``budget`` is spent."""
    first, counted = _timed(fn, shape, raw)
    if counted != events:
        raise AssertionError(f"{fn.__name__} counted {counted} text events, expected {events}")
    samples = [first]
    minimum = 3 if first * 3 <= max_case else 1
    while len(samples) < 30 and (len(samples) < minimum or sum(samples) < budget):
        samples.append(_timed(fn, shape, raw)[0])
    samples.sort()
    p99 = samples[min(len(samples) - 1, round(0.99 * (len(samples) - 1)))]
    median = statistics.median(samples)
    return {"repeats": len(samples), "median_s": median, "p99_s": p99, "events_per_s": events / median}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="*", default=list(SIZES))
    parser.add_argument("--budget", type=float, default=CASE_BUDGET_S, help="seconds of repeats per case")
    parser.add_argument(
        "--max-case", type=float, default=MAX_CASE_S, help="skip a case whose estimated single run is longer"
    )
    args = parser.parse_args(argv)
    versions = {
        "python": platform.python_version(),
        "trioloop": _version("trioloop"),
        "httpx": _version("httpx"),
        "trio": _version("trio"),
        "anthropic": _version("anthropic"),
        "openai": _version("openai"),
    }
    impls: list[tuple[str, str, Callable[[str, bytes], int]]] = []
    for shape in ("anthropic", "openai"):
        impls.append((shape, "trioloop-sans-io", run_sans_io))
        impls.append((shape, "trioloop-http", run_transport))
        if versions[shape] is not None:
            impls.append((shape, f"{shape}-sdk", run_anthropic_sdk if shape == "anthropic" else run_openai_sdk))
    results: list[dict[str, Any]] = []
    previous: dict[str, tuple[int, float]] = {}
    for events in sorted(args.sizes):
        bodies = {shape: _body(shape, events) for shape in ("anthropic", "openai")}
        for shape, impl, fn in impls:
            case = f"{shape}/{impl}/{events}"
            record: dict[str, Any] = {
                "case": case,
                "shape": shape,
                "impl": impl,
                "events": events,
                "bytes": len(bodies[shape]),
            }
            earlier = previous.get(f"{shape}/{impl}")
            estimate = earlier[1] * events / earlier[0] if earlier else 0.0
            if earlier is None:
                _timed(fn, shape, _body(shape, 10))  # warm-up once per implementation: imports, caches
            if estimate > args.max_case:
                record.update(skipped=f"estimated {estimate:.1f} s per run > --max-case {args.max_case}")
            else:
                record.update(_measure(fn, shape, bodies[shape], events, args.budget, args.max_case))
                previous[f"{shape}/{impl}"] = (events, record["median_s"])
                results.append(record)
            print(json.dumps({**record, "versions": versions}), flush=True)
    print()
    print(f"{'shape':<10} {'events':>7} {'impl':<18} {'events/s':>12} {'median ms':>10} {'p99 ms':>9} {'vs sdk':>7}")
    for record in results:
        sdk = next(
            (
                r
                for r in results
                if r["shape"] == record["shape"] and r["events"] == record["events"] and "sdk" in r["impl"]
            ),
            None,
        )
        ratio = f"{record['events_per_s'] / sdk['events_per_s']:.2f}x" if sdk else "-"
        print(
            f"{record['shape']:<10} {record['events']:>7} {record['impl']:<18} {record['events_per_s']:>12,.0f} "
            f"{record['median_s'] * 1000:>10.1f} {record['p99_s'] * 1000:>9.1f} {ratio:>7}"
        )


if __name__ == "__main__":
    main()
