"""Per-iteration overhead of a complete turn, beside pydantic-ai's Agent doing the same work.

Run ``python -m benchmarks.loop``. One turn is K = 8 iterations in which the model asks for one read tool
(``read_note``, returning the same 200-character text everywhere), then a final text answer. Timed end
to end (``await session.send(...)`` / ``await agent.run(...)``) and divided by K. trioloop runs over the
Anthropic provider against a loopback server in a separate process (``benchmarks._sse_server``: real
HTTP, SSE, mapper; only the client measured, connects per request counted at the server) and over an
in-process ``ChatProvider`` that sends
the very same ``StreamEvent``s with no socket, which is what pydantic-ai's ``FunctionModel`` costs too; the
in-process figure is the like-for-like one. ``read_note`` is a plain ``def`` for trioloop (as its shipped
read tools are; the runner settles such a tool in place) and ``async def`` for pydantic-ai (which runs a
plain function in a worker thread); ``trioloop_in_process_async_tool`` measures trioloop with the
``async def`` tool as well. The batches of each contender alternate in rounds, so drift hits all of them
alike. Targets (issues 42 and 51): trioloop in process at least 12x faster per iteration at K = 8 with its defaults,
at least 10x with an ``async def`` tool (issue 16 asked 10x in process, at K = 8, 32 and 100), judged on CPU time by
default (``--judge-on wall`` for the wall clock; both are printed).

By default the benchmark runs in five processes one after another, with ``PYTHONHASHSEED`` 0 to 4
(``--processes``, ``--first-seed``; `benchmarks._loop_processes`): the hash seed lays out every set and dict of str
keys differently, and one process's figure can be another's outlier (issue 42 saw one process in three run 40%
slower). It prints each process's ratios, then min / median / max across the processes for each ratio; a target
counts as met only when the minimum over the processes meets it. ``--processes 1`` runs in this process alone.

Each process also measures, in the same rounds, the pure reducer replaying one recorded turn's inputs
(``reducer_replay``, as `benchmarks.reducer_turn` does) and reports the reducer's share of an iteration: its CPU
per iteration over ``trioloop_in_process``'s. Every record's ``machine`` carries others' CPU during the run
(`benchmarks._load`, sampled between batches), the processes used and the priority in effect; ``--nice N`` sets
the nice of this process and of its autogroup (the children inherit both) and the summary says whether it could.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import pstats
import time
from collections.abc import AsyncIterator, Callable, Sequence
from functools import cache
from typing import Any, Final

import attrs
import httpx
import trio

from benchmarks import _load
from benchmarks._common import (
    PAYMENT_THF,
    InProcessProvider,
    case_record,
    emit,
    iteration_of,
    load_line,
    print_profile,
    print_table,
    summarize,
    wire_body,
    wire_events,
)
from benchmarks._loop_processes import CLOCKS, RATIO_CASES, REDUCER, across_processes, reducer_contender
from benchmarks._sse_server import MODEL, TABLE, server_stats, spawned_server
from trioloop.machine.limits import TurnLimits
from trioloop.machine.reducer import CallStatus, Outcome
from trioloop.machine.tool_input import tool_field
from trioloop.machine.tools import ToolOutcome, create_tool_registry
from trioloop.protocol.events import StreamEvent
from trioloop.protocol.tools import ChatRequest
from trioloop.providers import AnthropicProvider
from trioloop.providers.base import ChatProvider
from trioloop.runtime.tools import ToolExecutionContext, define_executable_tool
from trioloop.threatmodel import ThreatModel, load_thf, threat_model_session

K = 8
NOTE_TEXT = (
    "The payment service forwards card data to the PSP over mutually authenticated TLS; tokens are "
    "stored in the vault and never logged. Webhooks from the PSP are signed and checked on arrival."
)[:200].ljust(200)
FINAL_TEXT = "Done: read all eight notes."
PROMPT = "Read the eight notes."
PEERS = ("pydantic-ai-slim", "pydantic", "pydantic-graph", "anyio")


# -- trioloop side ---------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class NoteInput:
    id: str = tool_field(description="The note id.", min_length=1, max_length=64)


def _read_note(request: NoteInput, ctx: ToolExecutionContext) -> ToolOutcome:
    # A plain function, as trioloop's shipped read tools are: the runner settles it in place. The
    # async variant below measures the same tool as a coroutine (a task of its own per call).
    return ToolOutcome.success(NOTE_TEXT)


async def _read_note_async(request: NoteInput, ctx: ToolExecutionContext) -> ToolOutcome:
    return ToolOutcome.success(NOTE_TEXT)


def _note_registry(run: Any) -> Any:
    return create_tool_registry(
        [
            define_executable_tool(
                name="read_note",
                description="Read one note by id.",
                effect="read",
                destructive=False,
                input_type=NoteInput,
                run=run,
                summarize=lambda request: f"Read note {request.id}",
            )
        ]
    )


REGISTRY = _note_registry(_read_note)
ASYNC_REGISTRY = _note_registry(_read_note_async)
LIMITS = TurnLimits(max_iterations=K + 1)  # K tool iterations plus the final answer
BATCHED = True  # the in-process provider hands each answer over as one read (see InProcessProvider)


def _set_k(k: int) -> None:
    """K tool iterations per turn (the module's functions read K and LIMITS when they run)."""
    global K, LIMITS
    K = k
    LIMITS = TurnLimits(max_iterations=k + 1, max_tool_calls_per_turn=max(32, 2 * k))


def _call(i: int) -> tuple[str, str, dict[str, Any]]:
    return (f"call_{i}", "read_note", {"id": f"n{i}"})


@cache
def loop_answer_body(i: int, k: int) -> bytes:
    """The SSE body the loopback server sends for iteration ``i`` of a ``k``-iteration turn."""
    return wire_body(calls=[_call(i)], model=MODEL) if i < k else wire_body(text=FINAL_TEXT, model=MODEL)


@cache
def _note_events(i: int, k: int) -> tuple[StreamEvent, ...]:
    return wire_events(calls=[_call(i)]) if i < k else wire_events(text=FINAL_TEXT)


def answer_in_process(request: ChatRequest) -> Sequence[StreamEvent]:
    """Iteration i < K asks for note i; iteration K answers in text (same events as the loopback path).

    Looked up per iteration (events are immutable, so one tuple serves every turn): the harness's own
    share stays a dictionary lookup, as pydantic-ai's side only counts responses and builds its answer.
    """
    return _note_events(iteration_of(request), K)


async def _trioloop_turns(
    provider: ChatProvider, document: ThreatModel, turns: int, registry: Any = None, model: str = "scripted-1"
) -> list[Sample]:
    samples = []
    for _ in range(turns):
        async with threat_model_session(
            document=document, provider=provider, model=model, tools=registry or REGISTRY, limits=LIMITS
        ) as session:
            wall, cpu = time.perf_counter(), time.process_time()
            state = await session.send(PROMPT)
        samples.append(((time.perf_counter() - wall) / K, (time.process_time() - cpu) / K))
        if state.outcome is not Outcome.COMPLETED or [c.status for c in state.calls] != [CallStatus.SUCCEEDED] * K:
            raise RuntimeError(f"unexpected turn: {state.outcome} with {len(state.calls)} calls")
    return samples


async def trioloop_in_process(document: ThreatModel, turns: int) -> list[Sample]:
    return await _trioloop_turns(InProcessProvider(answer_in_process, batched=BATCHED), document, turns)


async def trioloop_in_process_async_tool(document: ThreatModel, turns: int) -> list[Sample]:
    provider = InProcessProvider(answer_in_process, batched=BATCHED)
    return await _trioloop_turns(provider, document, turns, ASYNC_REGISTRY)


# The shipped read tool: each iteration calls get_entity on the example document (a projection of
# one element with its flows and threats, fenced as canonical JSON) instead of the fixed-text note.
_ENTITY_IDS: list[str] = []


def _shipped_call(i: int) -> tuple[str, str, dict[str, Any]]:
    return (f"call_{i}", "get_entity", {"kind": "elements", "id": _ENTITY_IDS[i % len(_ENTITY_IDS)]})


@cache
def _shipped_events(i: int, k: int, entity_ids: tuple[str, ...]) -> tuple[StreamEvent, ...]:
    return wire_events(calls=[_shipped_call(i)]) if i < k else wire_events(text=FINAL_TEXT)


def answer_shipped(request: ChatRequest) -> Sequence[StreamEvent]:
    return _shipped_events(iteration_of(request), K, tuple(_ENTITY_IDS))


async def trioloop_shipped_read(document: ThreatModel, turns: int) -> list[Sample]:
    from trioloop.threatmodel.registry import create_ai_tool_registry

    _ENTITY_IDS[:] = [element.id for element in document.elements]
    provider = InProcessProvider(answer_shipped, batched=BATCHED)
    return await _trioloop_turns(provider, document, turns, create_ai_tool_registry())


async def trioloop_loopback(document: ThreatModel, turns: int, url: str) -> list[Sample]:
    """The turns over HTTP to the server at ``url`` (another process), on one keep-alive client."""
    async with httpx.AsyncClient(trust_env=False, timeout=httpx.Timeout(30.0, read=None)) as client:
        provider = AnthropicProvider("k", base_url=f"{url}/loop/{K}", client=client, retry=None, model_table=TABLE)
        return await _trioloop_turns(provider, document, turns, model=MODEL)


# -- pydantic-ai side ------------------------------------------------------------------------------


def _pydantic_agents() -> dict[str, Any]:
    """Two agents doing the turn above: ``FunctionModel(function=...)`` (no streaming, the cheapest path)
    and ``FunctionModel(stream_function=...)`` run with an event handler (streamed, like trioloop)."""
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, DeltaToolCall, FunctionModel
    from pydantic_ai.usage import RequestUsage

    def responses_so_far(messages: list[ModelMessage]) -> int:
        return sum(1 for m in messages if isinstance(m, ModelResponse))

    async def whole(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        # Usage is given so pydantic-ai skips estimating it (trioloop reads it from the stream too).
        usage = RequestUsage(input_tokens=100, output_tokens=10)
        i = responses_so_far(messages)
        if i < K:
            call_id, name, args = _call(i)
            return ModelResponse(parts=[ToolCallPart(tool_name=name, args=args, tool_call_id=call_id)], usage=usage)
        return ModelResponse(parts=[TextPart(FINAL_TEXT)], usage=usage)

    async def streamed(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[Any]:
        i = responses_so_far(messages)
        if i < K:
            call_id, name, args = _call(i)
            yield {0: DeltaToolCall(name=name, json_args=f'{{"id": "{args["id"]}"}}', tool_call_id=call_id)}
        else:
            yield FINAL_TEXT

    async def read_note(id: str) -> str:
        """Read one note by id."""
        return NOTE_TEXT

    plain = Agent(FunctionModel(whole))
    plain.tool_plain(read_note)
    streaming = Agent(FunctionModel(stream_function=streamed))
    streaming.tool_plain(read_note)
    return {"plain": plain, "streamed": streaming}


def _no_request_limit() -> Any:
    from pydantic_ai.usage import UsageLimits

    return UsageLimits(request_limit=None)  # its default (50 requests) would stop a K = 100 turn


async def _drain_events(ctx: Any, events: Any) -> None:
    async for _ in events:
        pass


async def pydantic_turns(agent: Any, turns: int, *, streamed: bool) -> list[Sample]:
    samples = []
    handler = _drain_events if streamed else None
    for _ in range(turns):
        wall, cpu = time.perf_counter(), time.process_time()
        result = await agent.run(PROMPT, event_stream_handler=handler, usage_limits=_no_request_limit())
        samples.append(((time.perf_counter() - wall) / K, (time.process_time() - cpu) / K))
        if result.output != FINAL_TEXT:
            raise RuntimeError(f"unexpected pydantic-ai output: {result.output!r}")
    return samples


# -- driver ----------------------------------------------------------------------------------------

Sample = tuple[float, float]  # (wall seconds, process CPU seconds) per iteration
Contender = tuple[str, Callable[[int], list[Sample]]]


def contenders(document: ThreatModel, url: str) -> list[Contender]:
    found: list[Contender] = [
        ("trioloop_in_process", lambda n: trio.run(trioloop_in_process, document, n)),
        ("trioloop_in_process_async_tool", lambda n: trio.run(trioloop_in_process_async_tool, document, n)),
        ("trioloop_loopback_http", lambda n: trio.run(trioloop_loopback, document, n, url)),
        ("trioloop_shipped_get_entity", lambda n: trio.run(trioloop_shipped_read, document, n)),
    ]
    try:
        agents = _pydantic_agents()
    except ImportError as exc:
        print(f"pydantic-ai not importable ({exc}); measuring trioloop only")
        return found
    found.append(
        ("pydantic_ai_function_model", lambda n: asyncio.run(pydantic_turns(agents["plain"], n, streamed=False)))
    )
    found.append(
        ("pydantic_ai_stream_function", lambda n: asyncio.run(pydantic_turns(agents["streamed"], n, streamed=True)))
    )
    return found


def profile(run: Callable[[int], list[Sample]], turns: int, top: int) -> None:
    profiler = cProfile.Profile()
    profiler.enable()
    run(turns)
    profiler.disable()
    print_profile(pstats.Stats(profiler), top)


#: pydantic-ai / trioloop per iteration, at least (issue 51: 12x in process, 10x with an async tool).
_TARGETS: Final = {"trioloop_in_process": 12.0, "trioloop_in_process_async_tool": 10.0, "trioloop_loopback_http": 2.0}


def _ratio_rows(stats: dict[str, dict[str, dict[str, Any]]], judge_on: str) -> list[tuple[Any, ...]]:
    """Fastest pydantic-ai variant over each trioloop variant, by median wall and by median CPU; a target is judged
    on the ``judge_on`` clock (``cpu`` or ``wall``)."""
    rows: list[tuple[Any, ...]] = []
    peers = [name for name in stats if name.startswith("pydantic")]
    if not peers:
        return rows
    for name in RATIO_CASES:
        ratios = {}
        for clock in ("wall_us", "cpu_us"):
            best = min(stats[p][clock]["median"] for p in peers)
            ratios[clock] = round(best / stats[name][clock]["median"], 2)
        target = _TARGETS[name]
        met = ratios[f"{judge_on}_us"] >= target
        emit(
            case_record(
                "loop",
                f"ratio_{name}",
                PEERS,
                against="fastest pydantic-ai variant, median per iteration",
                ratio_wall=ratios["wall_us"],
                ratio_cpu=ratios["cpu_us"],
                target=target,
                judged_on=judge_on,
                met=met,
            )
        )
        rows.append(
            (
                f"pydantic-ai / {name}",
                f"{ratios['wall_us']}x",
                "",
                f"{ratios['cpu_us']}x",
                "",
                f">= {target:g}x",
                "yes" if met else "NO",
            )
        )
    return rows


def _measure(
    found: list[Contender], rounds: int, turns: int, url: str, sampler: _load.LoadSampler
) -> tuple[dict[str, list[Sample]], float]:
    """Warm-up, then the contenders' batches in alternating rounds, the load sampled after each batch; also the HTTP
    case's connects per request, counted at the server (each batch opens one client: K + 1 requests per turn share
    it)."""
    for _, run in found:  # warm-up: imports, caches, first-connection costs
        run(3)
    sampler.sample()
    samples: dict[str, list[Sample]] = {name: [] for name, _ in found}
    before = server_stats(url)
    for _ in range(rounds):
        for name, run in found:
            gc.collect()
            samples[name] += run(turns)
            sampler.sample()
    after = server_stats(url)
    connects = after["connections"] - before["connections"] - 1  # the second stats request is one
    return samples, round(connects / max(after["requests"] - before["requests"], 1), 4)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds of every contender")
    parser.add_argument("--turns", type=int, default=20, help="turns per contender per round")
    parser.add_argument("--profile", metavar="CONTENDER", help="cProfile one contender instead of timing")
    parser.add_argument("--k", type=int, default=8, help="tool iterations per turn (default 8)")
    parser.add_argument(
        "--per-event", action="store_true", help="in-process provider sends event by event (no batch per read)"
    )
    parser.add_argument(
        "--processes", type=int, default=5, help="processes run one after another, each its own hash seed (default 5)"
    )
    parser.add_argument("--first-seed", type=int, default=0, help="PYTHONHASHSEED of the first process (default 0)")
    parser.add_argument("--nice", type=int, help="run at this nice, the process's and its autogroup's")
    parser.add_argument("--judge-on", choices=CLOCKS, default="cpu", help="the clock targets are judged on (cpu)")
    args = parser.parse_args(argv)
    if args.nice is not None:
        _load.set_nice(args.nice)
    if args.processes > 1 and not args.profile:
        return across_processes(args)
    global BATCHED
    BATCHED = not args.per_event
    _set_k(args.k)

    document = load_thf(PAYMENT_THF)
    _load.configure(processes=1, helpers=["loopback HTTP server"])
    sampler = _load.start_sampling()
    with spawned_server() as url:
        found = contenders(document, url)
        if args.profile:
            run = dict(found)[args.profile]
            run(3)
            profile(run, args.turns, 30)
            return 0
        found.append((REDUCER, reducer_contender(K, BATCHED)))
        samples, connects_per_request = _measure(found, args.rounds, args.turns, url, sampler)

    stats: dict[str, dict[str, dict[str, Any]]] = {}
    for name, values in samples.items():
        stats[name] = {
            "wall_us": summarize([wall for wall, _ in values]),
            "cpu_us": summarize([cpu for _, cpu in values]),
        }
        reducer = {}
        if name == REDUCER:
            share = stats[name]["cpu_us"]["median"] / stats["trioloop_in_process"]["cpu_us"]["median"]
            reducer = {"share": round(share, 4), "of": "trioloop_in_process, CPU medians per iteration"}
        emit(
            case_record(
                "loop",
                name,
                PEERS if name.startswith("pydantic") else (),
                iterations_per_turn=K,
                in_process_batched=BATCHED,
                turns=len(values),
                per_iteration_wall_us=stats[name]["wall_us"],
                per_iteration_cpu_us=stats[name]["cpu_us"],
                **({"connects_per_request": connects_per_request} if name == "trioloop_loopback_http" else {}),
                **reducer,
            )
        )
    ratio_rows = _ratio_rows(stats, args.judge_on)
    print()
    rows = [
        (name, s["wall_us"]["median"], s["wall_us"]["p99"], s["cpu_us"]["median"], s["cpu_us"]["p99"], "", "")
        for name, s in stats.items()
    ]
    headers = (f"per iteration, K={K}", "wall med us", "wall p99", "cpu med us", "cpu p99", "target", "met")
    print_table(headers, [*rows, *ratio_rows])
    share = stats[REDUCER]["cpu_us"]["median"] / stats["trioloop_in_process"]["cpu_us"]["median"]
    print(f"(targets judged on {args.judge_on} time; {REDUCER}: the pure reducer replaying one recorded turn)")
    print(f"reducer's share of an in-process iteration (CPU medians): {share:.1%}")
    print(load_line())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
