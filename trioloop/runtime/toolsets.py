"""Tools that need a live connection (an MCP server, say): each `Toolset` runs in the session's nursery, hands
over its tools once connected, and may list them again between turns when its server says they changed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Generic, Protocol, TypeVar

import attrs
import trio

from trioloop.machine.tools import RegisteredTool, ToolRegistry, create_tool_registry
from trioloop.machine.untrusted_text import sanitize_scalar
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
        self._needs_approval: dict[int, Callable[[Any], Any]] = {}  # by toolset index

    def __bool__(self) -> bool:
        return bool(self._started)

    async def add(
        self, toolset: Toolset[D], nursery: trio.Nursery, needs_approval: Callable[[Any], Any] | None = None
    ) -> tuple[RegisteredTool[D], ...]:
        """Start ``toolset`` in ``nursery`` and offer its tools with the others (each asking ``needs_approval``,
        when given, of its calls, as `trioloop.runtime.approvals` says)."""
        scope = trio.CancelScope()

        async def hosted(task_status: trio.TaskStatus[Sequence[RegisteredTool[D]]] = trio.TASK_STATUS_IGNORED) -> None:
            with scope:
                await toolset.run(task_status=task_status)

        tools = _asking(tuple(await nursery.start(hosted)), needs_approval)
        try:
            self.registry = create_tool_registry((*self.registry.tools, *tools))
        except ValueError:
            scope.cancel()  # refused (a duplicate name): its connection closes now, not at session close
            raise
        if needs_approval is not None:
            self._needs_approval[len(self._started)] = needs_approval
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
            except Exception as exc:  # the server could not be listed again: its old tools stay (a call will say why)
                # One line, no traceback: the error names the server and says why (an app with no logging set up
                # would otherwise print the whole traceback on the terminal).
                name, why = _named(toolset), _one_line(exc)
                observer_log.warning("toolset %s could not list its tools again; its old tools stay (%s)", name, why)
                continue
            if new is None:
                continue
            new = _asking(tuple(new), self._needs_approval.get(index))
            kept = [tool for tool in self.registry.tools if all(tool is not gone for gone in old)]
            try:
                self.registry = create_tool_registry((*kept, *new))
            except ValueError:
                observer_log.warning("a toolset's new tools clash with others by name; its old tools stay")
                continue
            self._started[index] = (toolset, tuple(new))


def _asking(
    tools: tuple[RegisteredTool[D], ...], function: Callable[[Any], Any] | None
) -> tuple[RegisteredTool[D], ...]:
    if function is None:
        return tools
    return tuple(attrs.evolve(tool, needs_approval=function) for tool in tools)


def _named(toolset: object) -> str:
    """A toolset as a log line names it: by its ``name`` if it has one (an MCP toolset's is its server's)."""
    name = getattr(toolset, "name", None)
    return f'"{sanitize_scalar(name, 40)[0]}"' if isinstance(name, str) else type(toolset).__name__


def _one_line(exc: BaseException) -> str:
    """An error as one line: its type and its message, cleaned and capped (a server's words may be in it)."""
    return f"{type(exc).__name__}: {sanitize_scalar(str(exc), 300)[0]}"
