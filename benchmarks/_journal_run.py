"""`benchmarks.journal`'s contenders: sessions timed phase by phase, the stores they journal in, and the floors.

A session is timed in three phases, each on the wall clock and on the process's CPU clock: ``open`` (a journaled
session's ``Session.open(...)`` and the ``async with`` entry; for a session with no store, constructing it and
entering it), ``send`` (``await session.send(...)``: the turn, with its closing snapshot when one is due) and
``close`` (the ``async with`` exit). A contender is ``run(document, turns, workload=None)`` and returns one `Phases`
per session; given a `benchmarks._floor.Workload`, a journaled contender records into it what its sessions'
journals did (the warm-up does this; the timed rounds never record). A floor contender replays the workload its
journaled contender recorded (`benchmarks._floor.replay`).
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import trio

from benchmarks import loop
from benchmarks._common import InProcessProvider
from benchmarks._floor import PostgresFloor, RecordingStore, SqliteFloor, Workload, replay, signing_key
from benchmarks._sse_server import MODEL, TABLE
from trioloop.durable import signing
from trioloop.durable.store import JournalStore, MemoryJournalStore
from trioloop.machine.reducer import CallStatus, Outcome
from trioloop.providers import AnthropicProvider
from trioloop.runtime.session import Session
from trioloop.stores import PostgresJournalStore, SQLiteJournalStore
from trioloop.threatmodel import THREAT_MODEL, ThreatModel, threat_model_session
from trioloop.threatmodel.session import THREAT_MODEL_SYSTEM_PROMPT

ROOT = Path(__file__).resolve().parent.parent
#: The PostgreSQL settings a record carries (`tests.pg_support`'s throwaway server runs with fsync off).
PG_SETTINGS = ("synchronous_commit", "fsync", "full_page_writes")


class Phases(NamedTuple):
    """One session's wall and CPU seconds per phase; a floor's also the CPU of its signing and its transactions."""

    open_wall: float
    open_cpu: float
    send_wall: float
    send_cpu: float
    close_wall: float
    close_cpu: float
    sign_cpu: float = 0.0
    txn_cpu: float = 0.0
    #: The same session opened again (an existing journal: verified and replayed) and closed, not in the whole.
    reopen_wall: float = 0.0
    reopen_cpu: float = 0.0
    #: Opened once more as the app's next process would: nothing of this process's remembered (`_forget`).
    cold_reopen_wall: float = 0.0
    cold_reopen_cpu: float = 0.0

    @property
    def whole_wall(self) -> float:
        return self.open_wall + self.send_wall + self.close_wall

    @property
    def whole_cpu(self) -> float:
        return self.open_cpu + self.send_cpu + self.close_cpu


Contender = Callable[..., list[Phases]]
_opened = 0
#: Where the benchmark's sessions witness their heads: a folder of the run's own, not the user's config folder.
witness: Any = "default"


def _clocks() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


_Clocks = tuple[float, float]


def _phases(t0: _Clocks, t1: _Clocks, t2: _Clocks, t3: _Clocks) -> Phases:
    return Phases(t1[0] - t0[0], t1[1] - t0[1], t2[0] - t1[0], t2[1] - t1[1], t3[0] - t2[0], t3[1] - t2[1])


def _forget() -> None:
    """What a process remembers of journal keys: the signatures it made or checked (a session reopened where it was
    written checks none of its seals again) and the default key's file, read once while it is unchanged. The app's
    next start has neither."""
    signing._VERIFIED.clear()
    signing._LOADED.clear()


async def _reopen(store: JournalStore, provider: Any, document: ThreatModel, model: str) -> tuple[float, float]:
    """The wall and CPU seconds of opening the latest benchmark session again and closing it."""
    t0 = _clocks()
    session = await _open(store, store, provider, document, model)
    async with session:
        pass
    t1 = _clocks()
    return t1[0] - t0[0], t1[1] - t0[1]


def _check(state: Any) -> None:
    if state.outcome is not Outcome.COMPLETED or [c.status for c in state.calls] != [CallStatus.SUCCEEDED] * loop.K:
        raise RuntimeError(f"unexpected turn: {state.outcome} with {len(state.calls)} calls")


async def plain(
    document: ThreatModel, turns: int, provider: Any = None, model: str = "scripted-1", workload: Any = None
) -> list[Phases]:
    """Sessions with no store: constructing and entering one is its open, its ``async with`` exit its close."""
    provider = provider or InProcessProvider(loop.answer_in_process, batched=True)
    samples = []
    for _ in range(turns):
        t0 = _clocks()
        session = threat_model_session(
            document=document, provider=provider, model=model, tools=loop.REGISTRY, limits=loop.LIMITS
        )
        async with session:
            t1 = _clocks()
            state = await session.send(loop.PROMPT)
            t2 = _clocks()
        samples.append(_phases(t0, t1, t2, _clocks()))
        _check(state)
    return samples


async def _open(target: Any, store: JournalStore, provider: Any, document: ThreatModel, model: str) -> Any:
    """The benchmark's session ``bench-N`` (the latest N) in ``target``, new or existing, as `loop` sets it up."""
    return await Session.open(
        target,
        f"bench-{_opened}",
        kind=THREAT_MODEL,
        provider=provider,
        document=document,
        model=model,
        tools=loop.REGISTRY,
        limits=loop.LIMITS,
        system_prompt=THREAT_MODEL_SYSTEM_PROMPT,
        witness=None if isinstance(store, MemoryJournalStore) else witness,  # as by default: memory is not
    )


async def journaled(
    document: ThreatModel,
    turns: int,
    store: JournalStore,
    provider: Any = None,
    model: str = "scripted-1",
    workload: Workload | None = None,
) -> list[Phases]:
    """Sessions journaled in ``store``, each a new session id; recording into ``workload`` when given."""
    global _opened
    provider = provider or InProcessProvider(loop.answer_in_process, batched=True)
    target: Any = store if workload is None else RecordingStore(store, workload)
    samples = []
    for _ in range(turns):
        _opened += 1
        if workload is not None:
            workload.new_session()
        t0 = _clocks()
        session = await _open(target, store, provider, document, model)
        async with session:
            t1 = _clocks()
            if workload is not None:
                workload.phase = "send"
            state = await session.send(loop.PROMPT)
            if workload is not None:
                workload.phase = "close"
            t2 = _clocks()
        t3 = _clocks()
        # Opened again, as an app does on its next start: the journal read, verified and replayed, then closed; once
        # in this process, then as the next process would (`_forget`, outside the clocks).
        reopen_wall, reopen_cpu = await _reopen(store, provider, session.document, model)
        _forget()
        cold_wall, cold_cpu = await _reopen(store, provider, session.document, model)
        samples.append(
            _phases(t0, t1, t2, t3)._replace(
                reopen_wall=reopen_wall, reopen_cpu=reopen_cpu, cold_reopen_wall=cold_wall, cold_reopen_cpu=cold_cpu
            )
        )
        _check(state)
    return samples


def http_provider(client: httpx.AsyncClient, url: str) -> AnthropicProvider:
    return AnthropicProvider("k", base_url=f"{url}/loop/{loop.K}", client=client, retry=None, model_table=TABLE)


def _client() -> httpx.AsyncClient:
    return httpx.AsyncClient(trust_env=False, timeout=httpx.Timeout(30.0, read=None))


def stored(make_store: Callable[[], Any], url: str | None = None) -> Contender:
    """Sessions journaled in the store ``make_store()`` opens once per batch, in process or over HTTP at ``url``."""

    async def run(document: ThreatModel, turns: int, workload: Workload | None) -> list[Phases]:
        async with make_store() as store:
            if url is None:
                return await journaled(document, turns, store, workload=workload)
            async with _client() as client:
                return await journaled(document, turns, store, http_provider(client, url), MODEL, workload)

    return lambda document, turns, workload=None: trio.run(run, document, turns, workload)


def sqlite(folder: Path, durable: bool, url: str | None = None) -> Contender:
    path = folder / ("durable.db" if durable else "nofsync.db")
    return stored(lambda: SQLiteJournalStore(path, durable=durable), url)


def postgres(url: str, http_url: str | None = None) -> Contender:
    return stored(lambda: PostgresJournalStore(url), http_url)


def memory(store: JournalStore, url: str | None = None) -> Contender:
    async def run(document: ThreatModel, turns: int, workload: Workload | None) -> list[Phases]:
        if url is None:
            return await journaled(document, turns, store, workload=workload)
        async with _client() as client:
            return await journaled(document, turns, store, http_provider(client, url), MODEL, workload)

    return lambda document, turns, workload=None: trio.run(run, document, turns, workload)


def no_store(url: str | None = None) -> Contender:
    async def run(document: ThreatModel, turns: int) -> list[Phases]:
        if url is None:
            return await plain(document, turns)
        async with _client() as client:
            return await plain(document, turns, http_provider(client, url), MODEL)

    return lambda document, turns, workload=None: trio.run(run, document, turns)


def send_only(run: Callable[[Any, int], list[tuple[float, float]]]) -> Contender:
    """A peer timed per iteration over one call (LangGraph's ``invoke``): all of it is its send, nothing opens."""

    def timed(document: Any, turns: int, workload: Any = None) -> list[Phases]:
        return [Phases(0.0, 0.0, wall * loop.K, cpu * loop.K, 0.0, 0.0) for wall, cpu in run(document, turns)]

    return timed


def floor(workload: Workload, make_writer: Callable[[], SqliteFloor | PostgresFloor]) -> Contender:
    """Each session replays ``workload`` (what its journaled contender's warm-up recorded) through a bare writer."""
    key = signing_key()

    def run(document: Any, turns: int, _: Any = None) -> list[Phases]:
        global _opened
        if not workload.batches:
            raise RuntimeError("no recorded workload to replay: the journaled contender's warm-up recorded nothing")
        writer = make_writer()
        samples = []
        try:
            for _ in range(turns):
                _opened += 1
                samples.append(Phases(*replay(workload, writer, key, f"floor-{_opened}")))
        finally:
            writer.close()
        return samples

    return run


def server_settings(url: str) -> dict[str, str]:
    """What the server commits with: the client waits for each commit (synchronous_commit), the disk may not."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as probe:
        rows = {name: probe.execute(f"SHOW {name}").fetchone() for name in PG_SETTINGS}
    return {name: str(row[0]) if row else "unknown" for name, row in rows.items()}


def postmaster_pid(url: str) -> int | None:
    """The server's main process (its data directory's ``postmaster.pid``), to count its CPU as the run's own."""
    import psycopg

    try:
        with psycopg.connect(url, autocommit=True) as probe:
            row = probe.execute("SHOW data_directory").fetchone()
        return int((Path(str(row[0])) / "postmaster.pid").read_text().split()[0]) if row else None
    except (OSError, ValueError, psycopg.Error):
        return None


@contextlib.contextmanager
def running_postgres() -> Iterator[tuple[str | None, dict[str, str] | str]]:
    """A throwaway PostgreSQL server: its URL and settings, or None and why there is none."""
    try:
        import psycopg  # noqa: F401

        if str(ROOT) not in sys.path:
            sys.path.insert(0, str(ROOT))
        from tests.pg_support import find_postgres_bin, running_postgres
    except ImportError as exc:
        yield None, f"{exc} (pip install -e '.[postgres,test]')"
        return
    bindir = find_postgres_bin()
    if bindir is None:
        yield None, "no PostgreSQL server binaries (initdb, pg_ctl on PATH or in /usr/lib/postgresql/*/bin)"
        return
    with running_postgres(bindir) as url:
        yield url, server_settings(url)
