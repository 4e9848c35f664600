"""How a soak process (the soak itself or a worker) is wired: its stores, its provider, its signing key.

The provider is `AnthropicProvider` on one ``httpx.AsyncClient`` for the whole process, pointed at the fault
proxy in front of `benchmarks._soak_server`. Journals go to SQLite (one file for the soak's own process, one
shared by the workers; ``durable=False``: a killed process loses nothing the kernel already has, and fsync is
the disk's cost, not the library's) and, when the soak found PostgreSQL binaries, to a throwaway server behind a
second fault proxy. Every journal is signed with one key made for the run and witnessed in files under the
run's folder, so a reopened journal is verified as an app's would be.
"""

from __future__ import annotations

from array import array
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import trio

from benchmarks._soak_causes import Causes
from benchmarks._soak_sessions import SoakContext
from benchmarks._soak_tools import Event, Ledger, make_tools
from benchmarks._sse_server import MODEL, TABLE
from trioloop import FileWitness, JournalSigner, TurnLimits
from trioloop.providers import AnthropicProvider
from trioloop.stores import PostgresJournalStore, SQLiteJournalStore


class AppendTimes:
    """How long each journal append took, per store (queueing for the store's worker thread included), and each
    live session's last few writes (start, end), so a late turn can be matched with a write in flight.

    Floats in arrays, not objects: this bookkeeping adds nothing to the garbage collector's walk (a tuple per
    write would), and a session's writes go when its conversation retires (`forget`)."""

    KEEP_PER_SESSION = 16

    def __init__(self) -> None:
        self.seconds: dict[str, array[float]] = {}
        self.recent: dict[str, array[float]] = {}  # session -> start, end, start, end, ...

    def add(self, store: str, session: str, started: float, ended: float) -> None:
        values = self.seconds.get(store)
        if values is None:
            values = self.seconds[store] = array("d")
        values.append(ended - started)
        if len(values) > 400_000:
            del values[::2]  # bounded: every other one goes (the tail keeps its shape)
        recent = self.recent.get(session)
        if recent is None:
            if len(self.recent) > 10_000:
                self.recent.clear()  # sessions a killed process never retired
            recent = self.recent[session] = array("d")
        recent.extend((started, ended))
        if len(recent) > 2 * self.KEEP_PER_SESSION:
            del recent[:2]

    def writes(self, session: str) -> list[tuple[float, float]]:
        """The session's last few writes: (start, end) on Trio's clock."""
        recent = self.recent.get(session, ())
        return [(recent[i], recent[i + 1]) for i in range(0, len(recent), 2)]

    def forget(self, session: str) -> None:
        self.recent.pop(session, None)

    def busy(self, session: str, due: float, settled: float) -> float:
        """How much of ``due`` .. ``settled`` (a deadline and the settle after it) the session's journal writes
        (appends and their witness) covered, from ``due`` on: what the settle may have waited for."""
        ends = [min(end, settled) - due for start, end in self.writes(session) if start < settled and end > due]
        return max(ends, default=0.0)


class _TimedLease:
    def __init__(self, inner: Any, name: str, times: AppendTimes) -> None:
        self._inner, self._name, self._times = inner, name, times

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self._inner, attribute)

    async def append(self, entries: Any) -> None:
        started = trio.current_time()
        try:
            await self._inner.append(entries)
        finally:
            self._times.add(self._name, self._inner.session_id, started, trio.current_time())

    async def discard_before(self, seq: int) -> None:
        """Compaction, which the session awaits right after the append that made it possible: a journal write."""
        started = trio.current_time()
        try:
            await self._inner.discard_before(seq)
        finally:
            self._times.add("discard", self._inner.session_id, started, trio.current_time())


class TimedWitness:
    """A witness whose writes are timed as part of their session's journal writes (the runner awaits both)."""

    def __init__(self, inner: Any, times: AppendTimes) -> None:
        self._inner, self._times = inner, times

    async def last_head(self, journal: str) -> Any:
        return await self._inner.last_head(journal)

    async def witness(self, head: Any) -> None:
        started = trio.current_time()
        try:
            await self._inner.witness(head)
        finally:
            self._times.add("witness", head.session, started, trio.current_time())


class TimedStore:
    """A store whose leases time their appends (everything else is the store's own)."""

    def __init__(self, inner: Any, name: str, times: AppendTimes) -> None:
        self._inner, self._name, self._times = inner, name, times

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self._inner, attribute)

    async def acquire(self, session_id: str, *, wait_s: float = 0.0) -> Any:
        return _TimedLease(await self._inner.acquire(session_id, wait_s=wait_s), self._name, self._times)


def limits(config: dict[str, Any]) -> TurnLimits:
    """Every turn's bounds: the deadline, a review timeout, and room for the model's iterations and retries."""
    return TurnLimits(
        turn_deadline_ms=config["deadline_ms"],
        review_timeout_ms=config["review_timeout_ms"],
        max_iterations=6,
        max_retries_per_turn=3,
    )


@asynccontextmanager
async def opened_context(
    config: dict[str, Any],
    ledger_path: Path | None = None,
    *,
    process: str,
    sink: Callable[[Event], None] | None = None,
) -> AsyncIterator[tuple[SoakContext, dict[str, Any]]]:
    """The process's `SoakContext` and its stores by name (``sqlite``, and ``postgres`` when there is one)."""
    ledger = Ledger(sink=sink, path=ledger_path)
    async with AsyncExitStack() as stack:
        stack.callback(ledger.close)
        folder = Path(config["folder"])
        database = folder / ("main.db" if process == "main" else "workers.db")
        times = AppendTimes()
        sqlite = SQLiteJournalStore(database, durable=False, lease_ttl_s=config["lease_ttl_s"])
        stores: dict[str, Any] = {"sqlite": TimedStore(await stack.enter_async_context(sqlite), "sqlite", times)}
        if config.get("pg_url"):
            postgres = PostgresJournalStore(config["pg_url"], lease_ttl_s=config["lease_ttl_s"])
            stores["postgres"] = TimedStore(await stack.enter_async_context(postgres), "postgres", times)
        client = await stack.enter_async_context(
            httpx.AsyncClient(
                trust_env=False,
                timeout=httpx.Timeout(30.0, read=None),
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=0),
            )
        )
        provider = AnthropicProvider("soak-key", base_url=config["provider_url"], client=client, model_table=TABLE)
        ctx = SoakContext(
            provider=provider,
            model=MODEL,
            limits=limits(config),
            ledger=ledger,
            seed=config["seed"],
            end_at=config["end_at"],
            open_options={
                "signer": JournalSigner.load(config["key"]),
                "witness": TimedWitness(FileWitness(folder / "witness"), times),
            },
            tools=make_tools(ledger),
            append_times=times,
            causes=Causes(times),
            turns=tuple(config["turns"]),
            idle_s=tuple(config["idle_s"]),
        )
        stack.callback(ctx.causes.remove)
        yield ctx, stores
