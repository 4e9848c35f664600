"""Helpers for writing tools of any domain: untrusted-text sanitizing and fencing, bounded read results."""

from trioloop.tools.untrusted_text import END_MARKER, START_MARKER, fence

__all__ = ["END_MARKER", "START_MARKER", "fence"]
