"""The production tool registry a turn offers the model: the four read tools, then the twelve graph edits.

Registration order is what the model sees and what `ToolRegistry.names` reports; the registry is frozen and
resolves names only by exact match.
"""

from __future__ import annotations

from trioloop.machine.tools import ToolRegistry, create_tool_registry
from trioloop.threatmodel.graph_tools import GRAPH_ACTION_TOOLS
from trioloop.threatmodel.model import ThreatModel
from trioloop.threatmodel.read_tools import READ_TOOLS

__all__ = ["GRAPH_ACTION_TOOLS", "READ_TOOLS", "create_ai_tool_registry"]


def create_ai_tool_registry() -> ToolRegistry[ThreatModel]:
    """A fresh registry of every shipped tool: read tools first, then graph action tools."""
    return create_tool_registry((*READ_TOOLS, *GRAPH_ACTION_TOOLS))
