"""A lease holder in a process of its own, for the lease tests (``tests/test_leases.py``) and
``benchmarks/leases.py``: ``python tests/lease_worker.py STORE SESSION TTL_S MODE DIR``.

STORE is a SQLite file or a ``postgresql://`` URL. The worker opens a session on it (lease time to live TTL_S)
and says so by creating ``DIR/holding``. Then, by MODE:

- ``hold``: it keeps the session open (renewing its lease) until it is killed.
- ``tool``: it runs a turn whose one call, ``effect``, is approved; right after the journal append that holds
  the call's ``start`` it creates ``DIR/started`` and stops itself there (SIGSTOP), inside the append, without a
  checkpoint; the test takes the session over meanwhile and wakes it (SIGCONT). Then the turn goes on as the
  runtime decides. The tool creates ``DIR/effect`` if it ever runs; the worker ends by writing how the turn ended
  to ``DIR/ended``.
- ``spawn`` (``... spawn DIR ROUNDS``): ROUNDS times, on sessions ``SESSION-0``, ``SESSION-1``, ..., with
  ``DIR/N`` for round N, it runs a turn whose response asks for four calls of ``touch`` (an ``async def`` read
  tool: they start together, each in a task of its own). When the first tool task is spawned (before its first
  step) the worker creates ``DIR/N/spawned`` and stops itself (SIGSTOP); the test takes the session over meanwhile
  and wakes it (SIGCONT). Each ``touch`` that ever runs creates ``DIR/N/effect-K``; the worker writes how the
  turn ended to ``DIR/N/ended``.
"""

from __future__ import annotations

import os
import secrets
import signal
import sys
from collections.abc import Sequence
from contextlib import aclosing
from pathlib import Path
from typing import Any

import trio

from trioloop import ScriptedProvider, Session, ToolExecutionContext, ToolOutcome, define_document_kind, function_tool
from trioloop.durable.postgres import PostgresJournalStore
from trioloop.durable.sqlite import SQLiteJournalStore
from trioloop.durable.store import StoredEntry
from trioloop.providers.scripted import ScriptedCall, ScriptStep

NOTE = define_document_kind("note", dump=lambda text: text, load=lambda text: text)
SCRIPT = [ScriptStep(tool_calls=(ScriptedCall(id="e1", name="effect", input={}),)), ScriptStep(text="Done.")]


def make_store(target: str, ttl_s: float) -> Any:
    if target.startswith("postgresql://"):
        return PostgresJournalStore(target, lease_ttl_s=ttl_s)
    return SQLiteJournalStore(target, lease_ttl_s=ttl_s)


def effect_tool(folder: Path) -> Any:
    @function_tool(effect="mutate")
    def effect(ctx: ToolExecutionContext[str]) -> ToolOutcome[str]:
        """Do something outside the document that must happen at most once."""
        (folder / "effect").write_text(str(ctx.fencing_epoch))
        return ToolOutcome.success("done", document=ctx.document + "effect\n")

    return effect


BATCH = [
    ScriptStep(tool_calls=tuple(ScriptedCall(id=f"t{n}", name="touch", input={}) for n in range(1, 5))),
    ScriptStep(text="Done."),
]


def touch_tool(folder: Path) -> Any:
    @function_tool(effect="read")
    async def touch(ctx: ToolExecutionContext[str]) -> ToolOutcome[str]:
        """Touch something outside the document: an effect that must never happen under a lost lease."""
        (folder / f"effect-{secrets.token_hex(4)}").write_text(str(ctx.fencing_epoch))
        return ToolOutcome.success("touched")

    return touch


class _FreezeAtSpawn(trio.abc.Instrument):
    """Stops the process (SIGSTOP) the moment the first tool task is spawned, before that task's first step."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.done = False

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        if not self.done and task.name.startswith("trioloop tool"):
            self.done = True
            (self.folder / "spawned").touch()
            os.kill(os.getpid(), signal.SIGSTOP)


class _PausingLease:
    """The real lease, stopping its process (no checkpoint) right after the append that holds a ``start``."""

    def __init__(self, inner: Any, folder: Path) -> None:
        self._inner = inner
        self._folder = folder

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def append(self, entries: Sequence[StoredEntry]) -> None:
        await self._inner.append(entries)
        if any(b'"kind":"start"' in e.data[:40] for e in entries):
            (self._folder / "started").touch()
            os.kill(os.getpid(), signal.SIGSTOP)  # frozen in here until the test has taken the session over


class _PausingStore:
    def __init__(self, inner: Any, folder: Path) -> None:
        self._inner = inner
        self._folder = folder

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def acquire(self, session_id: str, *, wait_s: float = 0.0) -> Any:
        return _PausingLease(await self._inner.acquire(session_id, wait_s=wait_s), self._folder)


async def spawn_rounds(target: str, session_id: str, ttl_s: float, folder: Path, rounds: int) -> None:
    """``spawn`` mode: ``rounds`` turns, each frozen at its first tool task's spawn (see the module docstring)."""
    async with make_store(target, ttl_s) as store:
        for n in range(rounds):
            here = folder / str(n)
            here.mkdir(parents=True, exist_ok=True)
            async with ScriptedProvider(BATCH) as provider:
                session = await Session.open(
                    store, f"{session_id}-{n}", kind=NOTE, provider=provider, document="", model="m",
                    tools=[touch_tool(here)], wait_s=20,  # the file busy past its timeout (10 writers) reads as held
                )  # fmt: skip
                async with session:
                    freeze = _FreezeAtSpawn(here)
                    trio.lowlevel.add_instrument(freeze)
                    try:
                        state = await session.send("touch it")
                        ended = f"{state.outcome.value if state.outcome else state.phase.value}"
                    except Exception as exc:  # the session refused (its journal failed): say how
                        ended = f"{type(exc).__name__}: {exc}"
                    finally:
                        trio.lowlevel.remove_instrument(freeze)
            (here / "ended.part").write_text(ended)
            os.replace(here / "ended.part", here / "ended")  # whole when the test sees it


async def main(target: str, session_id: str, ttl_s: float, mode: str, folder: Path) -> None:
    async with make_store(target, ttl_s) as store, ScriptedProvider(SCRIPT) as provider:
        wrapped = _PausingStore(store, folder) if mode == "tool" else store
        session = await Session.open(
            wrapped, session_id, kind=NOTE, provider=provider, document="", model="m", tools=[effect_tool(folder)]
        )
        async with session:
            (folder / "holding").touch()
            if mode == "hold":
                await trio.sleep_forever()
            async with trio.open_nursery() as nursery:

                async def approve_when_asked() -> None:
                    async with aclosing(session.states()) as states:
                        async for state in states:
                            if any(c.id == "e1" and c.status.value == "pending" for c in state.current_calls):
                                session.approve("e1")
                                return

                nursery.start_soon(approve_when_asked)
                try:
                    state = await session.send("do it")
                    ended = f"{state.outcome.value if state.outcome else state.phase.value}"
                except Exception as exc:  # the session refused (its journal failed): say how
                    ended = f"{type(exc).__name__}: {exc}"
                nursery.cancel_scope.cancel()
            (folder / "ended").write_text(ended)


if __name__ == "__main__":
    store_target, sid, ttl, run_mode, out = sys.argv[1:6]
    if run_mode == "spawn":
        trio.run(spawn_rounds, store_target, sid, float(ttl), Path(out), int(sys.argv[6]))
    else:
        trio.run(main, store_target, sid, float(ttl), run_mode, Path(out))
