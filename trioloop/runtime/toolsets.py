"""Tools that need a live connection (an MCP server, say): each `Toolset` runs in the session's nursery, hands
over its tools once connected, and may list them again between turns when its server says they changed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Generic, Protocol, TypeVar

import trio

from trioloop.machine.tools import RegisteredTool, ToolRegistry, create_tool_registry
from trioloop.runtime.observer import log as observer_log

__all__ = ["Toolset", "Toolsets"]

D = TypeVar("D")


class Toolset(Protocol[D]):
    """Tools that need a live connection (an MCP server, say), run in the session's nursery.

    ``run`` connects, hands its tools to ``task_status.started``, then keeps the connection until it is
    cancelled, closing it cleanly. `Session.add_toolset` starts it with ``nursery.start``.
    """

    async def run(self, *, task_status: trio.TaskStatus[Sequence[RegisteredTool[D]]] = ...) -> None:
        """Connect, hand the tools to ``task_status.started``, then hold the connection until cancelled."""
        ...


class Toolsets(Generic[D]):
    """The tools a session offers (``registry``) and its toolsets, each with the tools it gave (so a refresh
    replaces exactly those)."""

    def __init__(self, registry: ToolRegistry[D]) -> None:
        self.registry = registry
        self._started: list[tuple[Toolset[D], tuple[RegisteredTool[D], ...]]] = []

    def __bool__(self) -> bool:
        return bool(self._started)

    async def add(self, toolset: Toolset[D], nursery: trio.Nursery) -> tuple[RegisteredTool[D], ...]:
        """Start ``toolset`` in ``nursery`` and offer its tools with the others."""
        scope = trio.CancelScope()

        async def hosted(task_status: trio.TaskStatus[Sequence[RegisteredTool[D]]] = trio.TASK_STATUS_IGNORED) -> None:
            with scope:
                await toolset.run(task_status=task_status)

        tools = tuple(await nursery.start(hosted))
        try:
            self.registry = create_tool_registry((*self.registry.tools, *tools))
        except ValueError:
            scope.cancel()  # refused (a duplicate name): its connection closes now, not at session close
            raise
        self._started.append((toolset, tools))
        return tools

    async def refresh(self) -> None:
        """Before a turn: a toolset whose server said its tools changed (a ``refresh`` method that returns the
        new tools) is listed again and the registry offers its new tools; a turn's tool set stays frozen."""
        for index, (toolset, old) in enumerate(self._started):
            refresh = getattr(toolset, "refresh", None)
            if refresh is None:
                continue
            try:
                new = await refresh()
            except Exception:  # the server could not be listed again: its old tools stay (a call will say why)
                observer_log.warning("a toolset could not list its tools again; its old tools stay", exc_info=True)
                continue
            if new is None:
                continue
            kept = [tool for tool in self.registry.tools if all(tool is not gone for gone in old)]
            try:
                self.registry = create_tool_registry((*kept, *new))
            except ValueError:
                observer_log.warning("a toolset's new tools clash with others by name; its old tools stay")
                continue
            self._started[index] = (toolset, tuple(new))
