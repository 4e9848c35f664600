"""A soak with faults on every edge: many journaled sessions, a person each, for a set time, checked as they run.

    python -m benchmarks.soak [--sessions 100] [--minutes 10] [--seed N] [--short]

**What runs.** N sessions at once (`benchmarks._soak_sessions`), most in this process and a few in worker
processes (`benchmarks._soak_worker`) that are killed with SIGKILL at random times and started again: each
takes up its sessions from their journals and continues any turn the kill cut short. Each session is a
conversation of 5 to 20 turns on a note, journaled in SQLite (or, for a share of them, in a throwaway
PostgreSQL server when its binaries are installed), then retired (its journal read back and checked) and
replaced by a new one. Every turn has a deadline (`TurnLimits.turn_deadline_ms`, 2.5 s; review timeout 4 s).

**The model** is `benchmarks._soak_server`, a loopback HTTP server speaking Anthropic's Messages stream in a
process of its own, which also answers 429 and 529 with a ``retry-after``. It asks for tools that read the note,
append to it, archive a line (destructive), ask the person a question, read slowly (sometimes past the
deadline), and, for a share of the sessions, tools of an MCP server over stdio (`benchmarks._soak_mcp_server`,
one process per such conversation) that stalls, garbles its output and dies on its own, and that the soak
freezes (SIGSTOP, then SIGCONT) and kills (SIGKILL).

**The edges.** The provider's HTTP and the PostgreSQL connections each go through a `benchmarks._fault_proxy`
in a process of its own, which draws a fault per connection: latency spikes, stalls longer than the turn
deadline, resets mid-stream, truncation mid-SSE-event, one byte at a time. The person
(`benchmarks._soak_sessions.Person`) approves, edits, denies, stops, suspends and continues, walks away, answers
questions, and clicks on cards and questions that are gone.

**What it checks** (`benchmarks._soak_report`): no unauthorized run, no call run twice, no lost commit, every
turn settled, and within its deadline + 50 ms (time waiting for the person excluded) unless the machine explains
why not, and no growth of this process's memory, file descriptors or Trio tasks beyond a bound per 1,000 turns.
Each leg over the bound gets a cause (`benchmarks._soak_causes`): the process starved of a core, a journal write
in flight, a garbage collection, or none of these ("ours": trioloop's own work); only the last two fail the run.
It prints JSON lines (a ``summary`` record with every figure and the ``verdict``, a ``samples`` record), a table
(`benchmarks._soak_table`) and the worst late leg of each cause, and exits 1 when an invariant failed.
``--short`` runs a small soak (10 sessions, ~12 s of load, under 30 s in all) for the tests; ``--census``
counts the objects the garbage collector tracks, per session, and the garbage it finds in cycles per turn
(`benchmarks._soak_census`); ``--freeze-every S`` freezes what is alive every S seconds under load, as an app may
now that trioloop leaves no reference cycle (a full collection then walks only what the last S seconds made; what
dies in others' cycles after a freeze is never freed, and the memory bound shows what that costs).

**The process, as an app would run it.** Before the load it warms up (`warm_up`: a short conversation on each
store, retired), then collects and freezes (``gc.freeze()``) what start-up and the warm-up made, so a collection
under load walks only what the load made (see ``docs/howto/reliability.md``).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import random
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Final

import attrs
import trio

from benchmarks._soak_census import census_later, left_behind
from benchmarks._soak_chaos import McpChaos, Workers
from benchmarks._soak_dump import dump_on_signal, dump_tasks
from benchmarks._soak_health import Sampler, SlowSteps
from benchmarks._soak_report import Tally
from benchmarks._soak_sessions import Conversation, SlotPlan, SoakContext, percentile, run_slot
from benchmarks._soak_table import report
from benchmarks._soak_tools import read_events
from benchmarks._soak_wiring import opened_context
from trioloop import JournalSigner

ROOT: Final = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.pg_support import find_postgres_bin, running_postgres  # noqa: E402 -- a throwaway server, as the tests

#: Turns of each warm-up conversation, before the load (`warm_up`).
WARM_UP_TURNS: Final = 2


@attrs.define
class Plan:
    """How big and how long, and how often the chaos strikes."""

    sessions: int
    duration_s: float
    seed: int
    workers: int
    worker_sessions: int
    postgres_sessions: int
    mcp_sessions: int
    deadline_ms: int = 2500
    review_timeout_ms: int = 4000
    lease_ttl_s: float = 5.0
    kill_every_s: tuple[float, float] = (5.0, 15.0)
    mcp_chaos_every_s: tuple[float, float] = (2.0, 6.0)
    sample_every_s: float = 2.0
    trace_memory: bool = False
    turns: tuple[int, int] = (5, 20)
    #: A person's pause between two turns (reading the answer, typing the next message).
    idle_s: tuple[float, float] = (2.0, 10.0)
    postgres: bool = True
    #: Diagnosis (``--census``, `benchmarks._soak_census`): the tracked objects 40% into the load, then the
    #: cyclic garbage for 30% of it (slow, and its own collections count among the pauses).
    census: bool = False
    #: ``--freeze-every``: freeze what is alive every so many seconds under load (0: only once, after the warm-up).
    freeze_every_s: float = 0.0

    @property
    def local_sessions(self) -> int:
        return self.sessions - self.workers * self.worker_sessions


def plan_of(args: argparse.Namespace) -> Plan:
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    if args.short:
        sessions = args.sessions or 10
        return Plan(
            sessions=sessions,
            duration_s=12.0,
            seed=seed,
            workers=1,
            worker_sessions=3,
            postgres_sessions=2,
            mcp_sessions=1,
            kill_every_s=(2.5, 4.0),
            mcp_chaos_every_s=(1.0, 3.0),
            sample_every_s=0.5,
            turns=(3, 8),
            idle_s=(0.05, 0.5),
            postgres=not args.no_postgres,
        )
    sessions = args.sessions or 100
    workers = max(1, round(sessions * 0.12 / 4))
    local = sessions - workers * 4
    return Plan(
        sessions=sessions,
        duration_s=args.minutes * 60,
        seed=seed,
        workers=workers,
        worker_sessions=4,
        postgres_sessions=max(1, round(local * 0.15)),
        mcp_sessions=max(1, round(local * 0.08)),
        postgres=not args.no_postgres,
    )


# -- child processes that print their port, serve until stdin closes, then print their counters -------------


@contextlib.contextmanager
def spawned(module: str, *args: str) -> Iterator[tuple[int, subprocess.Popen[str], dict[str, Any]]]:
    """``python -m module args``: (its port, the process, the counters it printed at the end, filled on exit)."""
    process = subprocess.Popen(
        [sys.executable, "-m", module, *args], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    counters: dict[str, Any] = {}
    try:
        assert process.stdout is not None and process.stdin is not None
        port = int(process.stdout.readline())
        yield port, process, counters
    finally:
        if process.stdin is not None:
            process.stdin.close()
        try:
            out = process.stdout.read() if process.stdout is not None else ""
            process.wait(timeout=20)
            lines = [line for line in out.splitlines() if line.strip()]
            if lines:
                counters.update(json.loads(lines[-1]))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# -- the run -------------------------------------------------------------------------------------------------


def _toolset_factory(config: dict[str, Any]) -> Any:
    from trioloop.mcp import McpToolset, StdioServer

    def make(sid: str) -> McpToolset:
        server = StdioServer(
            name="notes",
            command=sys.executable,
            args=[
                "-m",
                "benchmarks._soak_mcp_server",
                "--sid",
                sid,
                "--ledger",
                str(Path(config["folder"]) / "mcp.jsonl"),
                "--pids",
                str(Path(config["folder"]) / "pids"),
                "--seed",
                str(config["seed"]),
            ],
            cwd=str(ROOT),
            tools={"count_words": "read"},
        )
        return McpToolset(server, call_timeout=3.0, connect_timeout=15.0)

    return make


async def _trace_memory(duration_s: float) -> None:
    """Diagnosis (``--trace-memory``): the allocation sites whose live memory grew most from a quarter of the run
    to its end, printed to stderr."""
    import tracemalloc

    await trio.sleep(duration_s / 8)
    tracemalloc.start(12)
    await trio.sleep(duration_s / 8)
    first = tracemalloc.take_snapshot()
    try:
        await trio.sleep(duration_s * 3 / 4 - 1)
    finally:
        last = tracemalloc.take_snapshot()
        tracemalloc.stop()
        for stat in last.compare_to(first, "traceback")[:12]:
            print(f"{stat.size_diff / 1024:10.1f} KiB {stat.count_diff:+8d} blocks", file=sys.stderr)
            for line in stat.traceback.format()[-16:]:
                print("    " + line, file=sys.stderr)


async def warm_up(ctx: SoakContext, stores: dict[str, Any], toolset: Any, problems: list[str]) -> None:
    """Before the load: a conversation of `WARM_UP_TURNS` turns on each store (the SQLite one with the MCP server's
    tools when some sessions have them), retired and checked like any other, so that what first turns make once
    (lazily imported modules, caches, the stores' prepared statements) exists before ``gc.freeze()``."""
    eager = attrs.evolve(ctx, idle_s=(0.0, 0.0))  # the same provider, stores, ledger and instruments, no pauses
    async with trio.open_nursery() as nursery:
        for name, store in stores.items():
            plan = SlotPlan(
                slot=f"warm-{name}", store=store, store_name=name, toolset=toolset if name == "sqlite" else None
            )
            rng = random.Random(f"{ctx.seed}/{plan.slot}")
            conversation = Conversation(eager, plan, f"{plan.slot}-{rng.getrandbits(32):08x}", rng, WARM_UP_TURNS)
            nursery.start_soon(_warm, conversation, problems)


async def _warm(conversation: Conversation, problems: list[str]) -> None:
    try:
        await conversation.run(new=True)
    except Exception as exc:  # as a slot's: a finding, not the end of the soak
        problems.append(f"warm-up {conversation.sid} failed: {type(exc).__name__}: {exc}")


async def _slot(ctx: Any, plan: SlotPlan, problems: list[str]) -> None:
    try:
        await run_slot(ctx, plan)
    except Exception as exc:  # a slot that fails is a finding, not the end of the soak
        problems.append(f"slot {plan.slot} failed: {type(exc).__name__}: {exc}")
        ctx.ledger.emit("slot_failed", slot=plan.slot, error="".join(traceback.format_exception(exc))[-4000:])


async def soak(plan: Plan, config: dict[str, Any], config_path: Path, folder: Path) -> dict[str, Any]:
    steps = SlowSteps()
    tally = Tally()
    problems: list[str] = []
    end_at = config["end_at"]
    # The soak's own events go to a file like the workers' (not to the tally as they happen): this process's
    # memory then holds the sessions and not the soak's bookkeeping, so its growth is the library's.
    async with opened_context(config, folder / "main.jsonl", process="main") as (ctx, stores):
        sampler = Sampler(lambda: ctx.live_turns, plan.sample_every_s)
        workers = Workers(plan, config_path, folder, problems)
        chaos = McpChaos(plan, folder / "pids")
        toolset = _toolset_factory(config)
        ctx.causes.install()  # the loop thread's time, each collection: what a late leg waited for
        await warm_up(ctx, stores, toolset if plan.mcp_sessions else None, problems)
        # What a long-running service does once it has started and warmed up: the objects made so far (modules,
        # classes, and what the first turns made once and keep: caches, pools) leave the collector's generations,
        # so a full collection walks only what the load made. No session is open: none of theirs is frozen.
        gc.collect()
        gc.freeze()
        ctx.causes.gc.clear()  # the pauses of the load alone (warm-up's and the collection above are not its own)
        trio.lowlevel.add_instrument(steps)  # from here on: the load (startup's imports are not its steps)
        census: dict[str, Any] = {}
        async with trio.open_nursery() as top:
            top.start_soon(dump_on_signal)
            top.start_soon(sampler.run)
            top.start_soon(workers.run, end_at)
            top.start_soon(chaos.run, end_at)
            if plan.trace_memory:
                top.start_soon(_trace_memory, plan.duration_s)
            if plan.freeze_every_s > 0:
                top.start_soon(_freeze_every, plan.freeze_every_s)
            if plan.census:
                shared = [ctx, toolset, *stores.values(), *ctx.tools]
                top.start_soon(
                    census_later, plan.duration_s * 0.4, plan.local_sessions, shared, lambda: ctx.live_turns, census
                )
            grace = (plan.deadline_ms + plan.review_timeout_ms) / 1e3 + (10.0 if plan.duration_s < 60 else 60.0)
            slots_done = trio.Event()

            async def run_slots() -> None:
                async with trio.open_nursery() as slots:
                    for index in range(plan.local_sessions):
                        name = "postgres" if "postgres" in stores and index < plan.postgres_sessions else "sqlite"
                        mcp = plan.postgres_sessions <= index < plan.postgres_sessions + plan.mcp_sessions
                        slot = SlotPlan(
                            slot=f"m{index}", store=stores[name], store_name=name, toolset=toolset if mcp else None
                        )
                        slots.start_soon(_slot, ctx, slot, problems)
                slots_done.set()

            top.start_soon(run_slots)
            with trio.move_on_after(plan.duration_s + grace):
                await slots_done.wait()
            if not slots_done.is_set():
                problems.append(f"sessions still running {grace:.0f} s after the end: cancelled (tasks on stderr)")
                print(dump_tasks(), file=sys.stderr, flush=True)
            with trio.move_on_after(grace):
                await workers.done.wait()  # each ends by itself once its sessions retired
            if not workers.done.is_set():
                problems.append("worker processes still running long after the end: killed (tasks in worker-N.err)")
                for process in workers.processes.values():
                    with contextlib.suppress(ProcessLookupError):
                        process.send_signal(signal.SIGUSR1)
                await trio.sleep(1.0)
            top.cancel_scope.cancel()
        if plan.census:  # every session retired: what the load made and left behind (made once, kept for good)
            census["left_after_the_load"] = left_behind()
        trio.lowlevel.remove_instrument(steps)
        loop_thread = ctx.causes.run.totals()
        gc_figures = ctx.causes.gc.summary()
        ctx.causes.remove()
        ledgers = [folder / "main.jsonl", *sorted(folder.glob("worker-*.jsonl")), folder / "mcp.jsonl"]  # noqa: ASYNC240
        for path in ledgers:  # the load is over: nothing else waits on the loop while they are read
            tally.feed_all(read_events(path))
        await _sweep(tally, stores, ctx, problems)
    return {
        "tally": tally,
        "problems": problems,
        "samples": sampler.samples,
        "lag": sampler.lag,
        "kills": workers.kills,
        "worker_starts": workers.starts,
        "mcp_chaos": dict(chaos.counts),
        "slow_steps": steps.figures(),
        "gc": gc_figures,
        "loop_thread": loop_thread,
        "census": census,
        "append_ms": {
            store: {
                "appends": len(values),
                "p50": round(percentile(values, 50) * 1e3, 2),
                "p99": round(percentile(values, 99) * 1e3, 2),
                "max": round(max(values) * 1e3, 2),
            }
            for store, values in ctx.append_times.seconds.items()
            if values
        },
    }


async def _sweep(tally: Tally, stores: dict[str, Any], ctx: Any, problems: list[str]) -> None:
    """Read back, from their journals, the documents of conversations nobody retired (a worker killed last)."""
    from benchmarks._soak_sessions import _open

    for sid, store in sorted(tally.sessions.items()):
        if sid in tally.final_docs or store not in stores:
            continue
        plan = SlotPlan(slot="sweep", store=stores[store], store_name=store)
        try:
            session = await _open(ctx, plan, sid, ctx.tools, new=False)
        except Exception as exc:
            problems.append(f"sweep could not reopen {sid}: {type(exc).__name__}: {exc}")
            continue
        tally.final_docs[sid] = session.document
        await session.aclose()


async def _freeze_every(seconds: float) -> None:
    """Freeze what is alive every ``seconds`` (no collection first: that would be the full pause this avoids)."""
    while True:
        await trio.sleep(seconds)
        gc.freeze()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sessions", type=int, help="concurrent sessions (default 100; --short: 10)")
    parser.add_argument("--minutes", type=float, default=10.0, help="how long the load runs")
    parser.add_argument("--seed", type=int, help="seeds the proxies, the server, the people (default: random)")
    parser.add_argument("--short", action="store_true", help="a small soak for the tests: 10 sessions, ~12 s")
    parser.add_argument("--no-postgres", action="store_true", help="SQLite only, even with PostgreSQL installed")
    parser.add_argument("--keep", help="keep the run's files (journals, ledgers) in this folder")
    parser.add_argument(
        "--trace-memory", action="store_true", help="diagnosis: print the allocation sites that grew most (slow)"
    )
    parser.add_argument(
        "--census", action="store_true", help="diagnosis: the objects the collector tracks, per session (slow, once)"
    )
    parser.add_argument(
        "--freeze-every",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="freeze what is alive this often under load (gc.freeze): shorter full collections, for a leak",
    )
    args = parser.parse_args(argv)
    plan = plan_of(args)
    plan.trace_memory = args.trace_memory
    plan.census = args.census
    plan.freeze_every_s = args.freeze_every
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        if args.keep:
            folder = Path(args.keep)
            folder.mkdir(parents=True, exist_ok=True)
        else:
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="trioloop-soak-")))
        (folder / "pids").mkdir(exist_ok=True)
        JournalSigner.generate().save(folder / "key")
        seed = str(plan.seed)
        server_port, _, server = stack.enter_context(spawned("benchmarks._soak_server", "--seed", seed))
        stall = str(plan.deadline_ms / 1e3 + 1.5)
        http_port, _, http_proxy = stack.enter_context(
            spawned(
                "benchmarks._fault_proxy", "--upstream", f"127.0.0.1:{server_port}", "--seed", seed, "--stall-s", stall
            )
        )
        proxies = {"http": http_proxy}
        pg_url = None
        bindir = find_postgres_bin() if plan.postgres else None
        if bindir is not None:
            direct = stack.enter_context(running_postgres(bindir))
            pg_port = int(direct.rsplit(":", 1)[1].split("/", 1)[0])
            proxy_port, _, pg_proxy = stack.enter_context(
                spawned(
                    "benchmarks._fault_proxy", "--upstream", f"127.0.0.1:{pg_port}", "--mix", "postgres", "--seed", seed
                )
            )
            proxies["postgres"] = pg_proxy
            pg_url = direct.replace(f":{pg_port}/", f":{proxy_port}/")
        else:
            plan.postgres_sessions = 0
        config = {
            "folder": str(folder),
            "provider_url": f"http://127.0.0.1:{http_port}",
            "pg_url": pg_url,
            "seed": plan.seed,
            "end_at": time.time() + plan.duration_s,
            "deadline_ms": plan.deadline_ms,
            "review_timeout_ms": plan.review_timeout_ms,
            "lease_ttl_s": plan.lease_ttl_s,
            "worker_sessions": plan.worker_sessions,
            "turns": plan.turns,
            "idle_s": plan.idle_s,
            "key": str(folder / "key"),
        }
        config_path = folder / "config.json"
        config_path.write_text(json.dumps(config))
        load_started = time.monotonic()
        result = trio.run(soak, plan, config, config_path, folder)
        load_s = time.monotonic() - load_started
    return report(plan, result, proxies, server, load_s, time.monotonic() - started)


if __name__ == "__main__":
    sys.exit(main())
