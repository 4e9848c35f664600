"""The contenders of ``benchmarks.live``'s paced part: N sessions at once in one process, and what they cost.

Each function here runs in a worker process of its own (``python -m benchmarks.live --worker NAME``) so
the process CPU and the garbage collector's pauses it reports belong to that contender and that N alone.
A contender opens N sessions, started ``stagger`` seconds apart in all (``i * stagger / N`` for session
``i``), each running ``turns`` turns one after another against
``benchmarks._live_server``'s ``/paced/<E>/<R>`` stream (E text deltas at R per second, one HTTP chunk
each, each delta's text the server's write time). For every delta it records the latency from the
server's write to the moment the contender shows the text to the app:

- ``trioloop``: `Session`s sharing one `AnthropicProvider`; the moment an observer (`Session.observe`,
  called synchronously with each state the session publishes) first sees the delta's text in the
  published `TurnState` (``state.draft.plain_text``). ``pool`` says whose client the provider uses:
  ``held`` is the provider's own (``async with provider``; `HELD_POOL_LIMITS`, no connection cap), anything
  else an app-held ``httpx.AsyncClient`` with that pool (``default``: httpx's 100 connections, 20 kept
  alive; ``none``: unbounded; a number: that many, all kept alive). The app's client has no pool timeout,
  so requests past the cap wait for a connection instead of failing.
- ``trioloop_per_session``: the same sessions, each with an `AnthropicProvider` of its own (held by its
  session, so one connection each): what sharing one provider is measured against.
- ``sdk``: the anthropic SDK's ``AsyncAnthropic`` on Trio (through anyio), one client for every session,
  ``messages.stream``: the moment its ``text`` event comes out of the stream.
- ``pydantic_ai``: one pydantic-ai ``Agent`` on its Anthropic model (one provider, so one SDK client), on
  asyncio (pydantic-ai's home), ``run_stream`` then ``stream_text(delta=True, debounce_by=None)`` (no
  debouncing, which would hold text back by design): the moment a text delta is yielded.

Each session's second turn carries the first turn's conversation (trioloop's session does so itself; the
SDK gets the assistant's text back in ``messages``, pydantic-ai ``message_history``), so every contender
sends the same kind of requests.
"""

from __future__ import annotations

import asyncio
import gc
import json
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

import httpx
import trio

from benchmarks._common import percentile
from benchmarks._live_server import STAMP_DIGITS, live_stats, stamps_in
from benchmarks._sse_server import MODEL, TABLE

#: An API key as long as a real one (the transport scrubs it from every text delta, holding back any tail that
#: could start it: its cost depends on the key, so a one-letter key would flatter trioloop).
KEY: Final = "sk-ant-api03-" + "bench" * 19
PROMPT: Final = "Go on."
WARM_UP_PATH: Final = "/paced/5/1000"


class GcPauses:
    """Times every collection of the garbage collector (``gc.callbacks``) while installed: wall time (the pause
    the program sees, stretched when the OS runs another process meanwhile) and the thread's CPU time."""

    def __init__(self) -> None:
        self.pauses: list[float] = []
        self.cpu: list[float] = []
        self.generations: list[int] = []
        self._started = self._started_cpu = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started, self._started_cpu = time.perf_counter(), time.thread_time()
        else:
            self.pauses.append(time.perf_counter() - self._started)
            self.cpu.append(time.thread_time() - self._started_cpu)
            self.generations.append(info.get("generation", -1))

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        gc.callbacks.remove(self)

    def summary(self) -> dict[str, Any]:
        return {
            "collections": len(self.pauses),
            "gen2_collections": self.generations.count(2),
            "max_pause_ms": round(max(self.pauses, default=0.0) * 1e3, 3),
            "max_pause_cpu_ms": round(max(self.cpu, default=0.0) * 1e3, 3),
            "total_pause_ms": round(sum(self.pauses) * 1e3, 2),
            "pauses_over_5ms": sum(1 for p in self.pauses if p > 0.005),
        }


def app_client(pool: str) -> httpx.AsyncClient:
    """An app's client with no pool timeout and the pool ``--pool`` names (see `pool_limits`)."""
    timeout = httpx.Timeout(30.0, read=None, pool=None)
    if pool == "default":  # no ``limits=``: httpx's own default (``httpx.Limits()`` alone would be unbounded)
        return httpx.AsyncClient(trust_env=False, timeout=timeout)
    return httpx.AsyncClient(trust_env=False, timeout=timeout, limits=pool_limits(pool))


def pool_limits(pool: str) -> httpx.Limits:
    """The pool for ``--pool``: ``none`` (unbounded) or a number (that many connections, all kept alive)."""
    if pool == "none":
        return httpx.Limits(max_connections=None, max_keepalive_connections=None)
    size = int(pool)
    return httpx.Limits(max_connections=size, max_keepalive_connections=size)


class _Latencies:
    """Write-to-visible latencies (ns) of every delta a session showed, and how many it showed."""

    def __init__(self) -> None:
        self.ns: list[int] = []

    def record(self, text: str, start: int = 0) -> None:
        now = time.monotonic_ns()
        self.ns.extend(now - stamp for stamp in stamps_in(text, start))


class _DraftWatch:
    """A `TurnObserver`: the deltas of each published state's draft that were not visible before.

    It reads only the pieces of the draft's text run added since the previous state (the run's list, a private
    attribute: ``plain_text`` joins the whole answer on every state, an O(length) cost per delta that would be
    the harness's, not trioloop's). A draft closed in the same wake-up as its last deltas holds its text as a
    block: that once, the tail of ``plain_text`` is read.
    """

    __slots__ = ("chars", "closed", "latencies", "pieces", "turn")

    def __init__(self, latencies: _Latencies) -> None:
        self.latencies = latencies
        self.turn = ""
        self.chars = self.pieces = 0
        self.closed = False

    def on_state(self, state: Any) -> None:
        draft = state.draft
        if draft is None:
            return
        if state.turn_id != self.turn:
            self.turn, self.chars, self.pieces, self.closed = state.turn_id, 0, 0, False
        run = draft.text
        size = len(run)
        if size > self.pieces:
            new = "".join(run._pieces[self.pieces : size])
            self.pieces = size
        elif draft.open or self.closed:
            return
        else:
            self.closed = True
            new = draft.plain_text[self.chars :]
        self.chars += len(new)
        self.latencies.record(new)


# -- trioloop -------------------------------------------------------------------------------------------


async def _trioloop(
    base: str, n: int, turns: int, stagger: float, pool: str, latencies: _Latencies | None
) -> list[float]:
    from trioloop.machine.reducer import Outcome
    from trioloop.providers import AnthropicProvider
    from trioloop.runtime.session import Session
    from trioloop.threatmodel import THREAT_MODEL, ThreatModel

    client = None if pool in ("held", "per session") else app_client(pool)
    provider = AnthropicProvider(KEY, base_url=base, client=client, model_table=TABLE)
    turn_walls: list[float] = []

    async def one(i: int, start: float) -> None:
        await trio.sleep_until(start + i * stagger / n)
        own = provider if pool != "per session" else AnthropicProvider(KEY, base_url=base, model_table=TABLE)
        session = Session(document=ThreatModel(), kind=THREAT_MODEL, provider=own, model=MODEL)
        if latencies is not None:
            session.observe(_DraftWatch(latencies))
        async with session:
            for _ in range(turns):
                began = trio.current_time()
                state = await session.send(PROMPT)
                turn_walls.append(trio.current_time() - began)
                if state.outcome is not Outcome.COMPLETED:
                    raise RuntimeError(f"trioloop turn ended {state.outcome}: {state.error}")

    try:
        async with provider, trio.open_nursery() as nursery:
            start = trio.current_time()
            for i in range(n):
                nursery.start_soon(one, i, start)
    finally:
        if client is not None:
            await client.aclose()
    return turn_walls


# -- the anthropic SDK ----------------------------------------------------------------------------------


async def _sdk(base: str, n: int, turns: int, stagger: float, pool: str, latencies: _Latencies | None) -> list[float]:
    import anthropic

    turn_walls: list[float] = []
    async with anthropic.AsyncAnthropic(api_key=KEY, base_url=base, max_retries=0) as client:

        async def one(i: int, start: float) -> None:
            await trio.sleep_until(start + i * stagger / n)
            messages: list[Any] = [{"role": "user", "content": PROMPT}]
            for _ in range(turns):
                began = trio.current_time()
                async with client.messages.stream(model=MODEL, max_tokens=4096, messages=messages) as stream:
                    async for event in stream:
                        if event.type == "text" and latencies is not None:
                            latencies.record(event.text)
                    final = await stream.get_final_message()
                turn_walls.append(trio.current_time() - began)
                text = "".join(block.text for block in final.content if block.type == "text")
                messages += [{"role": "assistant", "content": text}, {"role": "user", "content": PROMPT}]

        async with trio.open_nursery() as nursery:
            start = trio.current_time()
            for i in range(n):
                nursery.start_soon(one, i, start)
    return turn_walls


# -- pydantic-ai ----------------------------------------------------------------------------------------


async def _pydantic_ai(
    base: str, n: int, turns: int, stagger: float, pool: str, latencies: _Latencies | None
) -> list[float]:
    from pydantic_ai import Agent
    from pydantic_ai.models.anthropic import AnthropicModel
    from pydantic_ai.providers.anthropic import AnthropicProvider as PydanticAnthropicProvider

    turn_walls: list[float] = []
    loop = asyncio.get_running_loop()
    async with PydanticAnthropicProvider(api_key=KEY, base_url=base) as provider:
        agent = Agent(AnthropicModel(MODEL, provider=provider))

        async def one(i: int, start: float) -> None:
            await asyncio.sleep(max(0.0, start + i * stagger / n - loop.time()))
            history: Any = None
            for _ in range(turns):
                began = loop.time()
                async with agent.run_stream(PROMPT, message_history=history) as result:
                    async for delta in result.stream_text(delta=True, debounce_by=None):
                        if latencies is not None:
                            latencies.record(delta)
                turn_walls.append(loop.time() - began)
                history = result.all_messages()

        async with asyncio.TaskGroup() as group:
            start = loop.time()
            for i in range(n):
                group.create_task(one(i, start))
    return turn_walls


# -- the floor ------------------------------------------------------------------------------------------


async def _httpx_floor(
    base: str, n: int, turns: int, stagger: float, pool: str, latencies: _Latencies | None
) -> list[float]:
    """Bare ``httpx.AsyncClient`` streams on Trio: the raw body read and its stamps found, nothing else."""
    body = json.dumps(
        {"model": MODEL, "max_tokens": 4096, "stream": True, "messages": [{"role": "user", "content": PROMPT}]}
    )
    marker = b'"text":"'
    turn_walls: list[float] = []
    async with app_client("none") as client:

        async def one(i: int, start: float) -> None:
            await trio.sleep_until(start + i * stagger / n)
            for _ in range(turns):
                began = trio.current_time()
                async with client.stream("POST", base + "/v1/messages", content=body) as response:
                    async for chunk in response.aiter_raw():
                        if latencies is None:
                            continue
                        now = time.monotonic_ns()
                        at = chunk.find(marker)
                        while at != -1:
                            stamp = chunk[at + len(marker) : at + len(marker) + STAMP_DIGITS]
                            if stamp.isdigit():  # the block start's empty text is no stamp
                                latencies.ns.append(now - int(stamp))
                            at = chunk.find(marker, at + 1)
                turn_walls.append(trio.current_time() - began)

        async with trio.open_nursery() as nursery:
            start = trio.current_time()
            for i in range(n):
                nursery.start_soon(one, i, start)
    return turn_walls


Contender = Callable[[str, int, int, float, str, "_Latencies | None"], Awaitable[list[float]]]
CONTENDERS: Final[dict[str, tuple[Contender, str]]] = {
    "trioloop": (_trioloop, "trio"),
    "trioloop_app_client": (_trioloop, "trio"),
    "trioloop_per_session": (_trioloop, "trio"),
    "sdk": (_sdk, "trio"),
    "pydantic_ai": (_pydantic_ai, "asyncio"),
    "httpx_floor": (_httpx_floor, "trio"),
}


def _run(name: str, fn: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(fn()) if CONTENDERS[name][1] == "asyncio" else trio.run(fn)  # type: ignore[arg-type]


def worker(
    name: str, url: str, n: int, events: int, rate: float, turns: int, stagger: float, pool: str
) -> dict[str, Any]:
    """One case: ``name`` with ``n`` sessions; CPU, GC, latency and the server's counts over its window."""
    fn, _ = CONTENDERS[name]
    # trioloop_app_client's pool is --pool; the others' are fixed (the SDK's own: 1000 connections, 100 kept)
    pool = {
        "trioloop": "held",
        "trioloop_app_client": pool,
        "trioloop_per_session": "per session",
        "httpx_floor": "none",
    }.get(name, "sdk default")
    base = f"{url}/paced/{events}/{rate:g}"
    # Warm-up with a client of its own: imports, first-use caches; its connection is closed before the window.
    _run(name, lambda: fn(url + WARM_UP_PATH, 2, 1, 0.0, pool, None))
    gc.collect()
    latencies = _Latencies()
    before = live_stats(url)
    with GcPauses() as pauses:
        wall, cpu = time.perf_counter(), time.process_time()
        turn_walls = _run(name, lambda: fn(base, n, turns, stagger, pool, latencies))
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    after = live_stats(url)
    requests = after["requests"] - before["requests"]
    seen = len(latencies.ns)
    expected = n * turns * events
    if seen != expected:
        raise RuntimeError(f"{name} showed {seen} deltas, expected {expected}")
    lat_ms = [value / 1e6 for value in latencies.ns]
    return {
        "contender": name,
        "sessions": n,
        "turns_per_session": turns,
        "events_per_turn": events,
        "events_per_second_per_session": rate,
        "pool": pool,
        "events": seen,
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 3),
        "cpu_us_per_event": round(cpu / seen * 1e6, 2),
        "cpu_percent_of_one_core": round(cpu / wall * 100, 1),
        "latency_ms": {
            "p50": round(statistics.median(lat_ms), 3),
            "p99": round(percentile(lat_ms, 99), 3),
            "max": round(max(lat_ms), 3),
        },
        "turn_wall_s": {"median": round(statistics.median(turn_walls), 2), "max": round(max(turn_walls), 2)},
        "requests": requests,
        # the "after" /stats request's own connection is counted too
        "connects_per_request": round((after["connections"] - before["connections"] - 1) / max(requests, 1), 3),
        # every session streams at once, so N connections are needed; each one more is a reconnect
        "reconnects": after["connections"] - before["connections"] - 1 - n,
        "server_max_open_connections": after["max_open"],
        "server_cpu_percent_of_one_core": round((after["cpu_s"] - before["cpu_s"]) / wall * 100, 1),
        "server_late_ms": {"p99": after["late_ms_p99"], "max": after["late_ms_max"]},
        "gc": pauses.summary(),
    }
