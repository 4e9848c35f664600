"""The shipped tools: four read tools, twelve graph edits, untrusted-text fencing and the registry."""

from trioloop.tools.graph_actions import GRAPH_ACTION_TOOLS
from trioloop.tools.read_tools import READ_TOOLS
from trioloop.tools.registry import create_ai_tool_registry
from trioloop.tools.untrusted_text import END_MARKER, START_MARKER, fence

__all__ = [
    "END_MARKER",
    "GRAPH_ACTION_TOOLS",
    "READ_TOOLS",
    "START_MARKER",
    "create_ai_tool_registry",
    "fence",
]
