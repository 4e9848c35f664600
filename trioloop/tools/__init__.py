"""Helpers for writing tools of any domain: tools from typed functions, untrusted-text sanitizing and
fencing, bounded read results. Nothing here knows a document type.
"""

from trioloop.machine.untrusted_text import END_MARKER, START_MARKER, fence, sanitize_scalar
from trioloop.tools.functions import ToolError, function_tool, parse_docstring

__all__ = ["END_MARKER", "START_MARKER", "ToolError", "fence", "function_tool", "parse_docstring", "sanitize_scalar"]
