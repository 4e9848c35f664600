"""The crash torture's worker (``tests/test_torture_crash.py``): a zygote forking one scenario process per kill point.

The harness starts ``python tests/crash_worker.py`` once; this zygote imports Trio and trioloop, warms up (runs
one uncut turn, suspended and resumed, in a scratch folder: what a first run does once per process, lazy imports
and caches, is then done before the fork, not in every child), freezes its objects out of the garbage collector's
reach (so a child's collections do not copy the zygote's pages), and reads one JSON command per line on stdin. For
each it forks a child that runs the command's scenario under ``trio.run`` and leaves with ``os._exit`` (so a child
costs a fork, not an interpreter start), waits for it (killing it with SIGKILL after ``delay_s``, when given), and
answers one JSON line: how the child ended.

A child either runs the turn from the start (``original``; ``suspend`` suspends it in review after the batch
approval) or reopens the journal and drives the turn to its end (``resume``), with an optional kill of itself
right before or right after its k-th journal append, or inside a tool once its run is counted. Each tool run is
appended to the runs file and fsynced before the tool does anything else, so a run that started is counted.
"""

from __future__ import annotations

import gc
import json
import os
import select
import signal
import sqlite3
import sys
import tempfile
import time
import traceback
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Final

import trio

from trioloop import (
    CallStatus,
    Phase,
    ScriptedProvider,
    Session,
    ToolExecutionContext,
    ToolOutcome,
    TurnState,
    define_document_kind,
    function_tool,
)
from trioloop.durable.journal import decode_entries
from trioloop.durable.journal_writer import call_card
from trioloop.durable.sqlite import SQLiteJournalStore
from trioloop.durable.store import JournalLease, StoredEntry
from trioloop.protocol.events import StreamEvent
from trioloop.protocol.messages import assert_tool_pairing
from trioloop.protocol.tools import ChatRequest
from trioloop.providers.scripted import ScriptedCall, ScriptStep

SESSION_ID: Final = "crash"
MODEL: Final = "scripted-1"
INITIAL: Final = "title\n"
TEXT: Final = "Tidy the note."

NOTE = define_document_kind("note", dump=lambda text: text, load=lambda text: text)


def _call(call_id: str, tool: str, **fields: str) -> ScriptedCall:
    return ScriptedCall(id=call_id, name=tool, input={"call": call_id, **fields})


#: The model's answers: reads and mutations (one to edit, one to deny, one destructive), one more mutation, text.
STEPS: Final = (
    ScriptStep(
        text="Let me look at the note first.",
        tool_calls=(
            _call("r1", "read_note"),
            _call("r2", "count_lines"),
            _call("m1", "append_line", line="alpha"),
            _call("m2", "append_line", line="beta"),
            _call("e1", "append_line", line="draft"),
            _call("d1", "append_line", line="unwanted"),
            _call("x1", "drop_first_line"),
        ),
    ),
    ScriptStep(tool_calls=(_call("m3", "append_line", line="gamma"),)),
    ScriptStep(text="Done."),
)
#: Every call and its input as the model asked for it.
CALLS: Final[dict[str, tuple[str, dict[str, str]]]] = {
    call.id: (call.name, {k: str(v) for k, v in dict(call.input).items()}) for step in STEPS for call in step.tool_calls
}
READS: Final = frozenset({"r1", "r2"})
#: The review plan: one batch click for the safe mutations, an edit on approval, a denial, the rest one by one.
BATCH: Final = ("m1", "m2")
EDITS: Final[Mapping[str, dict[str, str]]] = {"e1": {"call": "e1", "line": "edited"}}
DENIALS: Final[Mapping[str, str]] = {"d1": "not this line"}
ALONE: Final = frozenset({"x1", "m3"})


def apply_call(document: str, call_id: str) -> str:
    """What call ``call_id`` (as reviewed: edits applied) does to ``document``; the harness folds with this."""
    tool, fields = CALLS[call_id]
    fields = EDITS.get(call_id, fields)
    if tool == "append_line":
        return document + fields["line"] + "\n"
    if tool == "drop_first_line":
        return document.split("\n", 1)[1] if "\n" in document else ""
    return document


# ---------------------------------------------------------------------------------------------
# The tools: each counts its run (appended and fsynced) before anything else.

RUNS_PATH = ""
SEEN_PATH = ""
LABEL = ""
KILL_IN_TOOL: str | None = None


def _kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)
    while True:  # pragma: no cover - SIGKILL cannot be caught
        time.sleep(1)


def _append_line(path: str, line: str) -> None:
    """Append ``line`` to ``path`` and fsync it before going on (what this process did outlives its kill)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode("ascii") + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)


def _count_run(call: str) -> None:
    _append_line(RUNS_PATH, f"{call} {LABEL}")
    if call == KILL_IN_TOOL:
        _kill_self()


def _saw(kind: str, **data: Any) -> None:
    """Log what the outside world saw of this process: a request sent to the model, the cards shown."""
    _append_line(SEEN_PATH, json.dumps({"label": LABEL, "kind": kind, **data}))


@function_tool(effect="read")
async def read_note(ctx: ToolExecutionContext[str], call: str) -> ToolOutcome[str]:
    """Read the note."""
    _count_run(call)
    await trio.lowlevel.checkpoint()
    return ToolOutcome.success(ctx.document)


@function_tool(effect="read")
async def count_lines(ctx: ToolExecutionContext[str], call: str) -> ToolOutcome[str]:
    """Count the note's lines."""
    _count_run(call)
    await trio.lowlevel.checkpoint()
    return ToolOutcome.success(str(ctx.document.count("\n")))


@function_tool
async def append_line(ctx: ToolExecutionContext[str], call: str, line: str) -> ToolOutcome[str]:
    """Append one line to the note."""
    _count_run(call)
    await trio.lowlevel.checkpoint()
    return ToolOutcome.success(f"appended {line}", document=ctx.document + line + "\n")


@function_tool(destructive=True)
async def drop_first_line(ctx: ToolExecutionContext[str], call: str) -> ToolOutcome[str]:
    """Delete the note's first line."""
    _count_run(call)
    await trio.lowlevel.checkpoint()
    document = ctx.document
    return ToolOutcome.success("dropped", document=document.split("\n", 1)[1] if "\n" in document else "")


TOOLS: Final = (read_note, count_lines, append_line, drop_first_line)


# ---------------------------------------------------------------------------------------------
# A store whose lease kills its process right before or right after its k-th append.

APPENDS = 0
#: ``time.monotonic()`` (one clock for every process) as each append began.
APPEND_TIMES: list[float] = []


class KillingLease:
    def __init__(self, inner: JournalLease, kill: Mapping[str, Any]) -> None:
        self._inner = inner
        self._kill = kill

    @property
    def session_id(self) -> str:
        return self._inner.session_id

    @property
    def epoch(self) -> int:
        return self._inner.epoch

    @property
    def renew_every_s(self) -> float | None:
        return getattr(self._inner, "renew_every_s", None)

    async def renew(self) -> None:
        await self._inner.renew()

    def check_held(self) -> None:
        self._inner.check_held()

    async def entries(self, *, after: int = 0) -> Sequence[StoredEntry]:
        return await self._inner.entries(after=after)

    async def last_seq(self) -> int:
        return await self._inner.last_seq()

    async def append(self, entries: Sequence[StoredEntry]) -> None:
        global APPENDS
        APPENDS += 1
        APPEND_TIMES.append(time.monotonic())
        at, index = self._kill.get("at"), self._kill.get("index")
        if at == "before_append" and index == APPENDS:
            _kill_self()
        await self._inner.append(entries)
        if at == "after_append" and index == APPENDS:
            _kill_self()

    async def discard_before(self, seq: int) -> None:
        await self._inner.discard_before(seq)

    async def release(self) -> None:
        await self._inner.release()

    async def __aenter__(self) -> KillingLease:
        await trio.lowlevel.checkpoint()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.release()


class KillingStore:
    def __init__(self, inner: SQLiteJournalStore, kill: Mapping[str, Any]) -> None:
        self.inner = inner
        self._kill = kill

    @property
    def identity(self) -> str:
        """The SQLite store's: a witness keeps this store's heads apart from every other's."""
        return self.inner.identity

    async def acquire(self, session_id: str, *, wait_s: float = 0.0) -> KillingLease:
        return KillingLease(await self.inner.acquire(session_id, wait_s=wait_s), self._kill)

    async def session_ids(self) -> Sequence[str]:
        return await self.inner.session_ids()

    async def read(self, session_id: str) -> Sequence[StoredEntry]:
        return await self.inner.read(session_id)


# ---------------------------------------------------------------------------------------------
# The scenario.


def pending_cards(state: TurnState | None) -> list[dict[str, Any]]:
    if state is None or state.is_settled:
        return []
    return [call_card(c) for c in state.current_calls if c.status is CallStatus.PENDING]


class LoggedProvider:
    """The scripted provider, logging each request before it is sent (the model has seen the turn from then on)."""

    def __init__(self, inner: ScriptedProvider) -> None:
        self._inner = inner

    async def stream(
        self,
        request: ChatRequest,
        send: trio.abc.SendChannel[StreamEvent],
        *,
        cancel_scope: trio.CancelScope | None = None,
    ) -> None:
        _saw("request")
        await self._inner.stream(request, send, cancel_scope=cancel_scope)


async def review(session: Session[str], decided: set[str], suspend: bool) -> None:
    """The scripted reviewer: decides each pending call once (in this process) by the plan."""
    async for state in session.states():
        if not session.busy or state.phase is not Phase.AWAITING_APPROVAL:
            continue
        shown = pending_cards(state)
        if shown:
            _saw("cards", cards=shown)
        pending = [c.id for c in state.current_calls if c.status is CallStatus.PENDING and c.id not in decided]
        batch = [i for i in pending if i in BATCH]
        if batch:
            session.approve_batch(batch)
            decided.update(batch)
            if suspend:
                await session.suspend()
                return
        for call_id in pending:
            if call_id in EDITS:
                session.approve(call_id, dict(EDITS[call_id]))
            elif call_id in DENIALS:
                session.deny(call_id, DENIALS[call_id])
            elif call_id in ALONE:
                session.approve(call_id)
            decided.add(call_id)


async def drive(session: Session[str], start: Callable[[], Awaitable[TurnState]], *, suspend: bool) -> TurnState:
    """Run ``start`` (send or continue_turn) with the reviewer beside it, until the turn returns."""
    result: list[TurnState] = []
    async with trio.open_nursery() as nursery:

        async def run() -> None:
            result.append(await start())
            if not suspend:
                nursery.cancel_scope.cancel()

        nursery.start_soon(run)
        while not session.busy and not result:
            await trio.lowlevel.checkpoint()
        if not result:
            nursery.start_soon(review, session, set(), suspend)
    return result[0]


def recorded_streams(db: str) -> int:
    """How many model answers the live turn's journal already holds (the provider resumes after them)."""
    if not os.path.exists(db):
        return 0
    connection = sqlite3.connect(db)
    try:
        rows = connection.execute(
            "SELECT seq, data FROM trioloop_journal WHERE session_id = ? ORDER BY seq", (SESSION_ID,)
        ).fetchall()
    except sqlite3.OperationalError:  # no table yet: the very first append never happened
        rows = []
    finally:
        connection.close()
    entries = decode_entries(StoredEntry(seq, bytes(data)) for seq, data in rows)
    streams = 0
    for entry in entries:
        if entry.kind == "submit":
            streams = 0
        elif entry.kind == "stream":
            streams += 1
    return streams


def write_json(path: str, value: Any) -> None:
    """Write ``value`` where the harness reads it, whole or not at all (this process may be killed)."""
    scratch = path + ".tmp"
    Path(scratch).write_text(json.dumps(value), encoding="utf-8")
    os.replace(scratch, path)


def calls_of(state: TurnState | None) -> list[dict[str, Any]]:
    if state is None:
        return []
    return [
        {"id": c.id, "status": c.status.value, "result": c.result, "changed_document": c.changed_document}
        for c in state.calls
    ]


async def scenario(command: Mapping[str, Any]) -> dict[str, Any]:
    mode = command["mode"]
    kill = command.get("kill") or {}
    steps = STEPS[recorded_streams(command["db"]) :] if mode == "resume" else STEPS
    report: dict[str, Any] = {"mode": mode, "steps_skipped": len(STEPS) - len(steps)}
    store = KillingStore(SQLiteJournalStore(command["db"]), kill)
    try:
        async with ScriptedProvider(steps, model=MODEL) as scripted:
            provider = LoggedProvider(scripted)
            session = await Session.open(
                store, SESSION_ID, kind=NOTE, provider=provider, document=INITIAL, model=MODEL, tools=TOOLS
            )
            async with session:
                if mode == "resume":
                    report["opened"] = {
                        "suspended": session.suspended,
                        "phase": None if session.state is None else session.state.phase.value,
                        "pending_cards": pending_cards(session.state if session.suspended else None),
                        "document": session.document,
                    }
                    write_json(command["result"], report)
                    if session.suspended:
                        final = await drive(session, session.continue_turn, suspend=False)
                    elif session.state is None:
                        final = await drive(session, lambda: session.send(TEXT), suspend=False)
                    else:
                        final = session.state
                    report["final"] = {
                        "outcome": None if final.outcome is None else final.outcome.value,
                        "retries": final.budget.retries_used,
                        "calls": calls_of(final),
                        "document": session.document,
                        "pairing": [p.kind.value for p in assert_tool_pairing(session.history)],
                    }
                    report["undo"] = await session.undo()
                    report["after_undo"] = session.document
                else:
                    final = await drive(session, lambda: session.send(TEXT), suspend=mode == "suspend")
                    report["final"] = {
                        "outcome": None if final.outcome is None else final.outcome.value,
                        "phase": final.phase.value,
                        "calls": calls_of(final),
                        "document": session.document,
                    }
                    report["suspended"] = session.suspended
    finally:
        await store.inner.close()
    report["appends"] = APPENDS
    report["append_times"] = APPEND_TIMES
    return report


def child(command: Mapping[str, Any]) -> int:
    global RUNS_PATH, SEEN_PATH, LABEL, KILL_IN_TOOL
    RUNS_PATH = command["runs"]
    SEEN_PATH = command["seen"]
    LABEL = command["label"]
    KILL_IN_TOOL = (command.get("kill") or {}).get("call")
    try:
        report = trio.run(scenario, command)
    except BaseException:
        Path(command["result"] + ".error").write_text(traceback.format_exc(), encoding="utf-8")
        return 1
    write_json(command["result"], report)
    return 0


# ---------------------------------------------------------------------------------------------
# The zygote.


def _wait(pid: int, delay_s: float | None) -> tuple[int, bool]:
    """Wait for ``pid``; SIGKILL it once ``delay_s`` has passed. Its wait status, and whether we killed it."""
    if delay_s is None:
        return os.waitpid(pid, 0)[1], False
    if hasattr(os, "pidfd_open"):
        fd = os.pidfd_open(pid)
        try:
            ended = bool(select.select([fd], [], [], delay_s)[0])
        finally:
            os.close(fd)
    else:  # no pidfd (not Linux): poll
        deadline = time.monotonic() + delay_s
        while time.monotonic() < deadline:
            reaped, status = os.waitpid(pid, os.WNOHANG)
            if reaped:
                return status, False
            time.sleep(0.0005)
        ended = False
    if not ended:
        os.kill(pid, signal.SIGKILL)
    return os.waitpid(pid, 0)[1], not ended


def fork_child(command: Mapping[str, Any]) -> dict[str, Any]:
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the child: leave only through os._exit, never back into the zygote's loop
        code = 1
        try:
            null = os.open(os.devnull, os.O_RDWR)
            os.dup2(null, 0)
            os.dup2(null, 1)
            code = child(command)
        finally:
            os._exit(code)
    status, killed = _wait(pid, command.get("delay_s"))
    return {
        "pid": pid,
        "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        "exit": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        "killed_by_parent": killed,
        "forked_at": started,
        "seconds": time.monotonic() - started,
    }


def warm_up() -> None:
    """Run one turn here, suspended then resumed to its end, in a scratch folder; then reset what it counted."""
    global APPENDS
    with tempfile.TemporaryDirectory(prefix="crash-warm-up-") as scratch:
        for label, mode in (("w0", "suspend"), ("w1", "resume")):
            command = {
                "mode": mode,
                "db": os.path.join(scratch, "journal.db"),
                "runs": os.path.join(scratch, "runs.txt"),
                "seen": os.path.join(scratch, "seen.jsonl"),
                "result": os.path.join(scratch, f"{label}.json"),
                "label": label,
                "kill": None,
            }
            if child(command) != 0:
                raise RuntimeError(Path(command["result"] + ".error").read_text(encoding="utf-8"))
    APPENDS = 0
    APPEND_TIMES.clear()
    gc.collect()
    gc.freeze()


def zygote() -> None:
    warm_up()
    for line in sys.stdin:
        reply = fork_child(json.loads(line))
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    zygote()
