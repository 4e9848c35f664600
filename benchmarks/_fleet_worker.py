"""The processes of ``benchmarks/fleet.py``: a worker that continues decided sessions, and the decider.

    python -m benchmarks._fleet_worker worker CONFIG OUT
    python -m benchmarks._fleet_worker decider CONFIG OUT

CONFIG is the JSON file ``fleet.py`` writes (the PostgreSQL URL, the folder, the sessions and their calls, the
rate). The decision queue is a table, ``fleet_decision``: the decider inserts one row per decided session (with
the wall time of the decision) and sends ``NOTIFY fleet``; a worker's lane claims the oldest open row with
``FOR UPDATE SKIP LOCKED`` and keeps that row locked while it opens the session, approves the decided call,
continues the turn and closes it, then marks the row done in the same transaction. A killed worker's
transaction ends with its connection, so its rows are claimed again by a live worker; the journal, not the
queue, makes sure a call that had started is never run again. The tool writes its call id and the wall time it
started to this process's ledger file (``ledger-PID.txt``); OUT receives the process's figures as JSON.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio

from benchmarks._common import InProcessProvider, wire_events
from trioloop import (
    FileWitness,
    JournalSigner,
    Session,
    ToolExecutionContext,
    ToolOutcome,
    define_document_kind,
    function_tool,
)
from trioloop.durable.replay import INTERRUPTED_CALL_TEXT
from trioloop.machine.reducer import CallStatus
from trioloop.protocol.events import StreamEvent
from trioloop.protocol.tools import ChatRequest
from trioloop.stores import PostgresJournalStore

NOTE = define_document_kind("note", dump=str, load=str)
MODEL = "scripted-1"
TOOL = "record_effect"
#: The kill case's victim only: its tool's call number STICK_ENV (1-based) writes the ledger, creates
#: ``stuck-PID`` in the folder and never returns, so the kill lands mid-call.
STICK_ENV = "FLEET_STICK_AT"
#: A call's outcome when a crash cut it short and the journal settled it failed, never to run again.
INTERRUPTED = "interrupted"

QUEUE_SCHEMA = """
CREATE TABLE IF NOT EXISTS fleet_decision (
    session_id text PRIMARY KEY,
    call_id text NOT NULL,
    decided_at double precision NOT NULL,
    done_at double precision,
    worker integer,
    found text,
    outcome text
);
CREATE INDEX IF NOT EXISTS fleet_decision_open ON fleet_decision (decided_at) WHERE done_at IS NULL
"""
_CLAIM = (
    "SELECT session_id, call_id FROM fleet_decision WHERE done_at IS NULL "
    "ORDER BY decided_at LIMIT 1 FOR UPDATE SKIP LOCKED"
)
_DONE = "UPDATE fleet_decision SET done_at = %s, worker = %s, found = %s, outcome = %s WHERE session_id = %s"
_LEFT = "SELECT count(*), count(*) FILTER (WHERE done_at IS NULL) FROM fleet_decision"


def call_id_of(index: int) -> str:
    return f"fleet-{index}"


def effect_tool(ledger: int, folder: Path | None = None) -> Any:
    """The mutating tool: its first act writes (its call's key, wall time, pid) to the ledger file.

    The model passes the call's id as ``key`` (a tool does not see its call id)."""
    stick_at = int(os.environ.get(STICK_ENV) or 0)
    started = 0

    @function_tool(effect="mutate", summary="Record the effect {key}")
    async def record_effect(ctx: ToolExecutionContext[str], key: str) -> ToolOutcome[str]:
        """Do something outside the document that must happen at most once."""
        nonlocal started
        os.write(ledger, f"{key} {time.time():.6f} {os.getpid()}\n".encode())
        started += 1
        if started == stick_at and folder is not None:
            await trio.Path(folder / f"stuck-{os.getpid()}").touch()
            await trio.sleep_forever()
        return ToolOutcome.success("Recorded.", document=f"{ctx.document}- recorded\n")

    return record_effect


def proposing(call_id: str) -> InProcessProvider:
    """A model that asks for one ``record_effect`` call (``call_id``) and then ends the turn."""
    first = wire_events(calls=[(call_id, TOOL, {"key": call_id})])
    last = wire_events("Recorded.")

    def answer(request: ChatRequest) -> Sequence[StreamEvent]:
        return last if request.messages[-1].role == "user" and len(request.messages) > 1 else first

    return InProcessProvider(answer)


def ending() -> InProcessProvider:
    """The model after the approved call ran: a text answer that ends the turn."""
    last = wire_events("Recorded.")
    return InProcessProvider(lambda request: last)


def open_options(folder: Path) -> dict[str, Any]:
    """Every process signs with the run's key and keeps heads in the run's witness folder (no key: unsigned)."""
    if not (folder / "key").exists():
        return {"signer": None, "witness": None}
    return {"signer": JournalSigner.load(folder / "key"), "witness": FileWitness(folder / "witness")}


def rss() -> int:
    """Resident set size now (Linux: ``/proc/self/statm``)."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# -- the worker ------------------------------------------------------------------------------------


class _Worker:
    def __init__(self, config: dict[str, Any], store: PostgresJournalStore) -> None:
        self.config = config
        self.store = store
        self.folder = Path(config["folder"])
        ledger_path = self.folder / f"ledger-{os.getpid()}.txt"
        self.ledger = os.open(ledger_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.tools = [effect_tool(self.ledger, self.folder)]
        self.options = open_options(self.folder)
        self.provider = ending()
        self.continued = 0
        self.doorbell_send, self.doorbell = trio.open_memory_channel[None](1000000)

    async def listen(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Ring the doorbell once per ``NOTIFY fleet`` (a new decision), from a thread that waits on the server."""
        import psycopg

        connection = await trio.to_thread.run_sync(lambda: psycopg.connect(self.config["url"], autocommit=True))
        await trio.to_thread.run_sync(connection.execute, "LISTEN fleet")
        task_status.started()
        token = trio.lowlevel.current_trio_token()

        def wait() -> None:
            for _ in connection.notifies(timeout=0.2):
                trio.from_thread.run_sync(self.doorbell_send.send_nowait, None, trio_token=token)

        try:
            while True:
                await trio.to_thread.run_sync(wait, abandon_on_cancel=True)
        finally:
            connection.close()

    async def lane(self) -> None:
        import psycopg

        queue = await trio.to_thread.run_sync(lambda: psycopg.connect(self.config["url"]))
        try:
            while True:
                row = await trio.to_thread.run_sync(lambda: queue.execute(_CLAIM).fetchone())
                if row is None:
                    counts = await trio.to_thread.run_sync(lambda: queue.execute(_LEFT).fetchone())
                    await trio.to_thread.run_sync(queue.rollback)
                    total, left = counts or (0, 0)
                    if total == self.config["sessions"] and left == 0:
                        return
                    with trio.move_on_after(0.2):
                        await self.doorbell.receive()
                    continue
                session_id, call_id = row
                found, outcome = await self.take_up(session_id, call_id)
                await trio.to_thread.run_sync(_finish, queue, session_id, found, outcome)
                self.continued += 1
        finally:
            queue.close()

    async def take_up(self, session_id: str, call_id: str) -> tuple[str, str]:
        """Open the session, apply the decision, continue the turn: (how the call was found, how it ended)."""
        session = await Session.open(
            self.store, session_id, kind=NOTE, provider=self.provider, tools=self.tools, wait_s=10.0, **self.options
        )
        found, outcome = "settled", "none"  # a killed worker finished the turn but not its queue row
        async with session:
            if session.suspended and session.state is not None:
                call = session.state.call(call_id)
                found = call.status.value if call is not None else "missing"
                if call is not None and call.status is CallStatus.PENDING:
                    session.approve(call_id)
                state = await session.continue_turn()
                ended = state.call(call_id)
                outcome = ended.status.value if ended is not None else "missing"
                if ended is not None and ended.status is CallStatus.FAILED:
                    outcome = INTERRUPTED if ended.result == INTERRUPTED_CALL_TEXT else f"failed: {ended.result}"
        return found, outcome


def _finish(queue: Any, session_id: str, found: str, outcome: str) -> None:
    """Mark the claimed row done and commit, which releases its lock."""
    queue.execute(_DONE, (time.time(), os.getpid(), found, outcome, session_id))
    queue.commit()


async def run_worker(config: dict[str, Any]) -> dict[str, Any]:
    async with PostgresJournalStore(config["url"]) as store:
        worker = _Worker(config, store)
        rss_start = rss()
        started = time.time()
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.listen)
            await trio.Path(worker.folder / f"ready-{os.getpid()}").touch()
            async with trio.open_nursery() as lanes:
                for _ in range(config["lanes"]):
                    lanes.start_soon(worker.lane)
            nursery.cancel_scope.cancel()
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return {
            "pid": os.getpid(),
            "continued": worker.continued,
            "rss_start": rss_start,
            "rss_end": rss(),
            "maxrss": usage.ru_maxrss * 1024,
            "cpu_s": usage.ru_utime + usage.ru_stime,
            "wall_s": time.time() - started,
        }


# -- holding suspended sessions ---------------------------------------------------------------------


async def run_hold(config: dict[str, Any]) -> dict[str, Any]:
    """Open ``hold`` suspended sessions at once and report what they cost this process's RSS (then close them).

    Each open session holds its lease's connection, so the count stays under the server's connection limit."""
    ids = [session_id for session_id, _ in config["calls"][: config["hold"]]]
    options = open_options(Path(config["folder"]))
    tools = [effect_tool(os.open(os.devnull, os.O_WRONLY))]
    provider = ending()
    async with PostgresJournalStore(config["url"]) as store:
        warm = await Session.open(store, ids[0], kind=NOTE, provider=provider, tools=tools, **options)
        await warm.aclose()  # imports, caches and the store's own connection come before the baseline
        before = rss()
        sessions = [
            await Session.open(store, session_id, kind=NOTE, provider=provider, tools=tools, **options)
            for session_id in ids
        ]
        held = rss()
        suspended = sum(1 for session in sessions if session.suspended)
        for session in sessions:
            await session.aclose()
    return {"held": len(ids), "suspended": suspended, "rss_before": before, "rss_held": held}


# -- the decider -----------------------------------------------------------------------------------


def run_decider(config: dict[str, Any], out: Path) -> None:
    """Insert one decision per session at ``rate`` per second (0: all at once), each with its wall time."""
    import psycopg

    rate = config["rate"]
    late = 0.0
    with psycopg.connect(config["url"], autocommit=True) as connection:
        began = time.monotonic()
        for n, (session_id, call_id) in enumerate(config["calls"]):
            if rate > 0:
                due = began + n / rate
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                else:
                    late = max(late, -wait)
            connection.execute(
                "INSERT INTO fleet_decision (session_id, call_id, decided_at) VALUES (%s, %s, %s)",
                (session_id, call_id, time.time()),
            )
            connection.execute("NOTIFY fleet")
        out.write_text(json.dumps({"wall_s": time.monotonic() - began, "max_late_s": late}))


if __name__ == "__main__":
    role, config_path, out_path = sys.argv[1:4]
    loaded = json.loads(Path(config_path).read_text())
    if role == "decider":
        run_decider(loaded, Path(out_path))
    elif role == "hold":
        Path(out_path).write_text(json.dumps(trio.run(run_hold, loaded)))
    else:
        Path(out_path).write_text(json.dumps(trio.run(run_worker, loaded)))
