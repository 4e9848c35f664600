"""The chat's token counts: the line after each turn and ``/usage``, from the turn's state and `Session.usage` (the
session's settled turns, those before a ``--resume`` included)."""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

from trioloop.protocol.events import Usage

__all__ = ["show_usage", "usage_text"]


def usage_text(usage: Usage) -> str:
    cache = ""
    if usage.cache_read_input_tokens or usage.cache_creation_input_tokens:
        cache = f" (cache: {usage.cache_read_input_tokens} read, {usage.cache_creation_input_tokens} written)"
    return f"{usage.input_tokens} in{cache}, {usage.output_tokens} out"


def show_usage(console: Console, turn: Usage, totals: Usage) -> None:
    """The turn's tokens (cache reads and writes apart) and the session's running totals."""
    if not (turn.input_tokens or turn.output_tokens):
        return
    console.print(Text(f"tokens: {usage_text(turn)}; session: {usage_text(totals)}", style="dim"))
