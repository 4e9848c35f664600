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
turn settled within its deadline + 50 ms (time waiting for the person excluded), and no growth of this
process's memory, file descriptors or Trio tasks beyond a bound per 1,000 turns. It prints JSON lines (a
``summary`` record with every figure and the ``verdict``, a ``samples`` record) and a table, and exits 1 when an
invariant failed. ``--short`` runs a small soak (10 sessions, ~12 s of load, under 30 s in all) for the tests.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Final

import attrs
import trio

from benchmarks._common import case_record, emit, print_table
from benchmarks._live_sessions import GcPauses
from benchmarks._soak_dump import dump_on_signal, dump_tasks
from benchmarks._soak_report import OVERSHOOT_BOUND_MS, Tally, growth, verdict
from benchmarks._soak_sessions import SlotPlan, percentile, run_slot
from benchmarks._soak_tools import read_events
from benchmarks._soak_wiring import opened_context
from trioloop import JournalSigner

ROOT: Final = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.pg_support import find_postgres_bin, running_postgres  # noqa: E402 -- a throwaway server, as the tests

PEERS: Final = ("psutil", "psycopg", "mcp")


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


# -- this process's health: memory, descriptors, tasks, loop lag ---------------------------------------------


def rss_mib() -> float:
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def open_fds() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return -1


def trio_tasks() -> int:
    """Every task in this Trio run (walked from the root task through each nursery)."""
    stack = [trio.lowlevel.current_root_task()]
    count = 0
    while stack:
        task = stack.pop()
        if task is None:
            continue
        count += 1
        for nursery in task.child_nurseries:
            stack.extend(nursery.child_tasks)
    return count


class SlowSteps(trio.abc.Instrument):
    """The longest task steps (the loop held by one task without a checkpoint), by task name: what makes a
    deadline late when the loop itself is."""

    def __init__(self, keep: int = 8) -> None:
        self.keep = keep
        self.started = 0.0
        self.started_cpu = 0.0
        self.longest: list[tuple[float, str]] = []

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.started = time.perf_counter()
        self.started_cpu = time.thread_time()

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        if not self.started:
            return  # installed in the middle of this step
        took = time.perf_counter() - self.started
        if len(self.longest) < self.keep or took > self.longest[-1][0]:
            cpu = time.thread_time() - self.started_cpu
            frames = [(f.f_code.co_filename, f.f_code.co_name, line) for f, line in task.iter_await_frames()]
            # Where the step ended: the innermost frames of ours (trioloop's or the soak's), then the last one.
            ours = [f"{name}:{line}" for file, name, line in frames if "/trioloop/" in file or "/benchmarks/" in file]
            last = frames[-1][0].rsplit("/", 1)[-1] + f":{frames[-1][2]}" if frames else "?"
            where = " > ".join([*ours[-4:], last])
            self.longest.append((took, f"{task.name} ({cpu * 1e3:.1f} ms CPU) @ {where}"))
            self.longest.sort(reverse=True)
            del self.longest[self.keep :]

    def figures(self) -> list[dict[str, Any]]:
        return [{"ms": round(took * 1e3, 2), "task": name} for took, name in self.longest]


class Sampler:
    """Samples RSS, descriptors, tasks and the turns so far every ``every`` seconds; times the loop's lag."""

    def __init__(self, turns: Any, every: float) -> None:
        self.turns = turns
        self.every = every
        self.samples: list[dict[str, Any]] = []
        self.lag: list[float] = []
        self.started = 0.0

    async def run(self) -> None:
        self.started = trio.current_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._lag)
            while True:
                self.samples.append(
                    {
                        "t": round(trio.current_time() - self.started, 2),
                        "turns": self.turns(),
                        "rss_mib": round(rss_mib(), 2),
                        "fds": open_fds(),
                        "tasks": trio_tasks(),
                        "cpu_s": round(time.process_time(), 2),
                    }
                )
                await trio.sleep(self.every)

    async def _lag(self) -> None:
        while True:
            asked = trio.current_time()
            await trio.sleep(0.05)
            self.lag.append((trio.current_time() - asked - 0.05) * 1e3)


# -- chaos ---------------------------------------------------------------------------------------------------


class Workers:
    """The worker processes: started, killed at random (SIGKILL), started again until they end by themselves."""

    def __init__(self, plan: Plan, config_path: Path, folder: Path, problems: list[str]) -> None:
        self.plan = plan
        self.config_path = config_path
        self.folder = folder
        self.problems = problems
        self.processes: dict[int, trio.Process] = {}
        self.kills = 0
        self.starts = 0
        self.done = trio.Event()

    async def run(self, end_at: float) -> None:
        async with trio.open_nursery() as nursery:
            for worker in range(self.plan.workers):
                nursery.start_soon(self._keep, worker)
            nursery.start_soon(self._killer, end_at)
        self.done.set()

    async def _keep(self, worker: int) -> None:
        while True:
            with (self.folder / f"worker-{worker}.err").open("ab") as errors:
                process = await trio.lowlevel.open_process(
                    [sys.executable, "-m", "benchmarks._soak_worker", str(self.config_path), str(worker)],
                    cwd=ROOT,
                    stderr=errors,
                )
            self.starts += 1
            self.processes[worker] = process
            try:
                code = await process.wait()
            finally:
                self.processes.pop(worker, None)
                if process.returncode is None:
                    process.kill()
                    with trio.CancelScope(shield=True):
                        await process.wait()
            if code == -signal.SIGKILL:
                continue  # the killer's: start it again, it takes up its sessions
            if code != 0:
                self.problems.append(f"worker {worker} exited with status {code} (see worker-{worker}.err)")
            return

    async def _killer(self, end_at: float) -> None:
        rng = random.Random(f"{self.plan.seed}/killer")
        while True:
            await trio.sleep(rng.uniform(*self.plan.kill_every_s))
            if time.time() >= end_at:
                return
            running = sorted(self.processes)
            if running:
                process = self.processes[rng.choice(running)]
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGKILL)
                    self.kills += 1


class McpChaos:
    """Freezes (SIGSTOP for a while, then SIGCONT) or kills (SIGKILL) the MCP servers' processes at random."""

    def __init__(self, plan: Plan, pids: Path) -> None:
        self.plan = plan
        self.pids = pids
        self.counts: Counter[str] = Counter()

    def _ours(self) -> list[int]:
        found = []
        for entry in self.pids.iterdir():
            with contextlib.suppress(OSError, ValueError):
                pid = int(entry.name)
                if b"_soak_mcp_server" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    found.append(pid)
        return found

    async def run(self, end_at: float) -> None:
        rng = random.Random(f"{self.plan.seed}/mcp")
        while time.time() < end_at:
            await trio.sleep(rng.uniform(*self.plan.mcp_chaos_every_s))
            pids = self._ours()
            if not pids:
                continue
            pid = rng.choice(pids)
            if rng.random() < 0.3:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    self.counts["mcp_sigkill"] += 1
                continue
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                continue
            self.counts["mcp_sigstop"] += 1
            try:
                await trio.sleep(rng.uniform(0.3, 3.0))
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)


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


async def _slot(ctx: Any, plan: SlotPlan, problems: list[str]) -> None:
    try:
        await run_slot(ctx, plan)
    except Exception as exc:  # a slot that fails is a finding, not the end of the soak
        problems.append(f"slot {plan.slot} failed: {type(exc).__name__}: {exc}")
        ctx.ledger.emit("slot_failed", slot=plan.slot, error="".join(traceback.format_exception(exc))[-4000:])


async def soak(plan: Plan, config: dict[str, Any], config_path: Path, folder: Path) -> dict[str, Any]:
    steps = SlowSteps()
    pauses = GcPauses()
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
        # What a long-running service does once it has started: the objects made so far (modules, classes: most of
        # the heap) leave the collector's generations, so a full collection walks only what the load made.
        gc.collect()
        gc.freeze()
        trio.lowlevel.add_instrument(steps)  # from here on: the load (startup's imports are not its steps)
        pauses.__enter__()
        async with trio.open_nursery() as top:
            top.start_soon(dump_on_signal)
            top.start_soon(sampler.run)
            top.start_soon(workers.run, end_at)
            top.start_soon(chaos.run, end_at)
            if plan.trace_memory:
                top.start_soon(_trace_memory, plan.duration_s)
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
        trio.lowlevel.remove_instrument(steps)
        pauses.__exit__(None, None, None)
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
        "gc": pauses.summary(),
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


def _faults(result: dict[str, Any], proxies: dict[str, dict[str, Any]], server: dict[str, Any]) -> dict[str, Any]:
    tally: Tally = result["tally"]
    faults: dict[str, Any] = {}
    for edge, counters in proxies.items():
        for kind, count in counters.get("fired", {}).items():
            faults[f"{edge}_{kind}"] = count
    for kind in ("http_429", "http_529"):
        faults[f"provider_{kind}"] = server.get(kind, 0)
    faults["worker_sigkill"] = result["kills"]
    faults.update(result["mcp_chaos"])
    for kind, count in tally.mcp_faults.items():
        faults[f"mcp_server_{kind}"] = count
    return faults


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
    args = parser.parse_args(argv)
    plan = plan_of(args)
    plan.trace_memory = args.trace_memory
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


def report(
    plan: Plan,
    result: dict[str, Any],
    proxies: dict[str, dict[str, Any]],
    server: dict[str, Any],
    load_s: float,
    wall_s: float,
) -> int:
    tally: Tally = result["tally"]
    figures = tally.figures()
    faults = _faults(result, proxies, server)
    growth_figures = growth(result["samples"], plan.duration_s)
    lag = sorted(result["lag"])
    failed = verdict(figures, growth_figures, result["problems"])
    setup = {
        "sessions": plan.sessions,
        "in_process": plan.local_sessions,
        "in_workers": plan.workers * plan.worker_sessions,
        "workers": plan.workers,
        "postgres_sessions": plan.postgres_sessions + (plan.workers if plan.postgres_sessions else 0),
        "mcp_sessions": plan.mcp_sessions,
        "minutes": round(plan.duration_s / 60, 2),
        "seed": plan.seed,
        "deadline_ms": plan.deadline_ms,
        "review_timeout_ms": plan.review_timeout_ms,
        "overshoot_bound_ms": OVERSHOOT_BOUND_MS,
    }
    summary = {
        "setup": setup,
        **figures,
        "faults": faults,
        "faults_total": sum(faults.values()),
        "worker_starts": result["worker_starts"],
        "loop_lag_ms": {
            "p99": round(lag[max(0, int(len(lag) * 0.99) - 1)], 3) if lag else None,
            "max": round(lag[-1], 3) if lag else None,
        },
        "longest_task_steps": result["slow_steps"],
        "gc": result["gc"],
        "journal_append_ms": result["append_ms"],
        "growth": growth_figures,
        "provider_server": server,
        "proxy_connections": {edge: counters.get("connections") for edge, counters in proxies.items()},
        "load_s": round(load_s, 1),
        "wall_s": round(wall_s, 1),
        "verdict": failed or "held",
    }
    emit(case_record("soak", "summary", PEERS, **summary))
    emit(case_record("soak", "samples", PEERS, samples=result["samples"]))
    rows: list[tuple[str, Any]] = [
        ("turns", figures["turns"]),
        ("turns/s", round(figures["turns"] / max(load_s, 1e-9), 1)),
        *((f"legs: {kind}", count) for kind, count in figures["legs_by_kind"].items()),
        *((f"outcome: {kind}", count) for kind, count in figures["outcomes"].items()),
        *((f"fault: {kind}", count) for kind, count in sorted(faults.items())),
        ("max overshoot ms (review excluded)", figures["max_overshoot_ms"]),
        ("p99 overshoot ms", figures["p99_overshoot_ms"]),
        ("legs over the bound", figures["legs_over_bound"]),
        ("  of which journal writes covered all but 50 ms of", figures["legs_over_bound_journal_covered"]),
        ("max overshoot ms, review ending at the click", figures["max_overshoot_person_ms"]),
        ("legs over the bound, review ending at the click", figures["legs_over_bound_person"]),
        ("max overshoot after a crash ms (lower bound)", figures["max_overshoot_after_crash_ms_lower_bound"]),
        ("p99 settle ms (review excluded)", figures["p99_settle_ms_review_excluded"]),
        ("max unwind ms (settled -> send returns)", figures["max_unwind_ms"]),
        ("loop lag ms p99 / max", f"{summary['loop_lag_ms']['p99']} / {summary['loop_lag_ms']['max']}"),
        ("longest task step ms", result["slow_steps"][0]["ms"] if result["slow_steps"] else None),
        ("gc: collections / longest pause ms", f"{result['gc']['collections']} / {result['gc']['max_pause_ms']}"),
        *(
            (f"journal append ms, {store}: p50 / p99 / max", f"{t['p50']} / {t['p99']} / {t['max']}")
            for store, t in result["append_ms"].items()
        ),
        ("runs / approvals", f"{figures['runs']} / {figures['approvals']}"),
        ("unauthorized runs", figures["unauthorized_runs"]),
        ("calls run twice", figures["calls_run_twice"]),
        ("commits seen / lost", f"{figures['commits_seen']} / {figures['lost_commits']}"),
        ("conversations / checked", f"{figures['conversations']} / {figures['conversations_checked']}"),
        ("journal errors / reopens", f"{figures['journal_errors']} / {figures['reopens']}"),
        ("worker kills / starts", f"{result['kills']} / {result['worker_starts']}"),
    ]
    for key in ("rss_mib", "fds", "tasks"):
        metric = growth_figures[key]
        judged = "" if growth_figures["judged"] else ", not judged: too few turns"
        rows.append((f"{key}: first / peak / last", f"{metric['first']} / {metric['peak']} / {metric['last']}"))
        rows.append(
            (
                f"{key}: per 1,000 turns (bound)",
                f"{metric['per_1000_turns']} ({metric['bound_per_1000_turns']}{judged})",
            )
        )
    rows.append(("verdict", "; ".join(failed) if failed else "every invariant held"))
    print()
    print_table(["soak", "value"], rows)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
