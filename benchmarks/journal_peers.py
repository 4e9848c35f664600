"""LangGraph on `benchmarks.journal`'s shape: what its ``SqliteSaver`` checkpoint costs one agent-loop iteration.

A ``StateGraph`` agent loop (``MessagesState``): a model node answers from an in-process fake model, exactly as
`benchmarks.loop`'s in-process provider does (iteration i < K asks for ``read_note`` on note i, iteration K answers
in text), and a ``ToolNode`` runs ``read_note``, which returns the same 200-character text; ``tools_condition``
routes between them, the usual LangGraph tool loop. It runs once without a checkpointer and once with
``SqliteSaver`` on a file; each turn is a new thread (``thread_id``) in one database file, as each of trioloop's
turns is a new session in one journal file. Only ``graph.invoke`` is timed, per turn, divided by K.

Durability matched to trioloop's ``sqlite_durable``: ``SqliteSaver`` puts its file in WAL mode itself and leaves
``synchronous`` at SQLite's default; the connection passed to it gets ``PRAGMA synchronous=FULL`` explicitly (the
value trioloop's durable store sets, and the default of the SQLite Python ships), so every commit fsyncs. Graphs run
with ``durability="sync"``: each step's checkpoint is written before the next step starts, as trioloop makes a call's
start durable before its tool runs (LangGraph's default, ``"async"``, writes it in a background thread while the next
step runs; process CPU time counts that thread too).

The sync API (``graph.invoke``) is used: ``SqliteSaver`` is sync only (its async sibling, ``AsyncSqliteSaver``,
hands every statement to aiosqlite's thread), and LangGraph's sync path runs a one-task step inline with no event
loop, so it is LangGraph's cheapest way to this checkpoint; measuring it is the conservative comparison for trioloop.
"""

from __future__ import annotations

import contextlib
import importlib
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from benchmarks import loop

__all__ = ["LANGGRAPH_DISTS", "langgraph_contenders", "langgraph_missing"]

#: The distributions whose versions the LangGraph records carry.
LANGGRAPH_DISTS = ("langgraph", "langgraph-checkpoint", "langgraph-checkpoint-sqlite", "langchain-core")

#: Each step's checkpoint written before the next step starts (see the module's docstring).
DURABILITY = "sync"

Sample = tuple[float, float]
Contender = Callable[[Any, int], list[Sample]]


def langgraph_missing() -> str | None:
    """Why the LangGraph peer cannot run here (an import error), or None when it can."""
    try:
        for module in (
            "langchain_core.messages",
            "langgraph.checkpoint.sqlite",
            "langgraph.graph",
            "langgraph.prebuilt",
        ):
            importlib.import_module(module)
    except ImportError as exc:
        return f"{exc} (pip install -e '.[bench]')"
    return None


def _build(checkpointer: Any) -> Any:
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    @tool
    def read_note(id: str) -> str:
        """Read one note by id."""
        return loop.NOTE_TEXT

    def model(state: MessagesState) -> dict[str, list[AIMessage]]:
        i = 0
        for message in reversed(state["messages"]):
            if message.type == "human":
                break
            i += message.type == "ai"
        if i < loop.K:
            call = {"name": "read_note", "args": {"id": f"n{i}"}, "id": f"call_{i}", "type": "tool_call"}
            return {"messages": [AIMessage(content="", tool_calls=[call], id=f"answer_{i}")]}
        return {"messages": [AIMessage(content=loop.FINAL_TEXT, id=f"answer_{i}")]}

    builder = StateGraph(MessagesState)
    builder.add_node("model", model)
    builder.add_node("tools", ToolNode([read_note]))
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", tools_condition)
    builder.add_edge("tools", "model")
    return builder.compile(checkpointer=checkpointer)


def _check(result: dict[str, Any]) -> None:
    messages = result["messages"]
    results = [m for m in messages if m.type == "tool"]
    if messages[-1].content != loop.FINAL_TEXT or len(results) != loop.K or any(m.status != "success" for m in results):
        raise RuntimeError(f"unexpected LangGraph turn: {len(results)} tool results, last {messages[-1].content!r}")


def _runner(graph: Any, prefix: str, durability: str | None) -> Contender:
    opened = 0
    options = {} if durability is None else {"durability": durability}

    def run(document: Any, turns: int) -> list[Sample]:
        nonlocal opened
        samples = []
        for _ in range(turns):
            opened += 1
            config = {"configurable": {"thread_id": f"{prefix}-{opened}"}, "recursion_limit": 2 * loop.K + 5}
            wall, cpu = time.perf_counter(), time.process_time()
            result = graph.invoke({"messages": [("user", loop.PROMPT)]}, config, **options)
            samples.append(((time.perf_counter() - wall) / loop.K, (time.process_time() - cpu) / loop.K))
            _check(result)
        return samples

    return run


def synchronous_of(connection: sqlite3.Connection) -> str:
    """The connection's ``synchronous`` setting by name (FULL is 2)."""
    (value,) = connection.execute("PRAGMA synchronous").fetchone()
    return {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}.get(value, str(value))


@contextlib.contextmanager
def langgraph_contenders(folder: Path) -> Iterator[tuple[list[tuple[str, Contender]], dict[str, str]]]:
    """The two LangGraph contenders (no checkpointer; ``SqliteSaver`` on a file in ``folder``) and their settings.

    The settings say what the saver ran with: the connection's journal mode and synchronous, read back after
    setup, and the graph's durability mode.
    """
    from langgraph.checkpoint.sqlite import SqliteSaver

    with contextlib.closing(sqlite3.connect(folder / "langgraph.db", check_same_thread=False)) as connection:
        connection.execute("PRAGMA synchronous=FULL")
        saver = SqliteSaver(connection)
        saver.setup()
        (journal_mode,) = connection.execute("PRAGMA journal_mode").fetchone()
        settings = {"journal_mode": str(journal_mode).upper(), "synchronous": synchronous_of(connection)}
        if settings != {"journal_mode": "WAL", "synchronous": "FULL"}:
            raise RuntimeError(f"SqliteSaver's connection is not WAL with synchronous=FULL: {settings}")
        settings["durability"] = DURABILITY
        yield (
            [
                ("langgraph_no_checkpointer", _runner(_build(None), "plain", None)),
                ("langgraph_sqlite_saver", _runner(_build(saver), "saved", DURABILITY)),
            ],
            settings,
        )
