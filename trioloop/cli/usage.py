"""The chat's token counts: the line after each turn, ``/usage``, and what the turns of a resumed journal used.

A journal keeps every model response's usage as the stream delivered it; a resumed chat counts its earlier turns
from there, as each turn's state counted them: per model request the usage it reported last (a retried request's
answer replaces the failed one's), summed over the requests of a turn and over the turns.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.text import Text

from trioloop.durable.journal import JournalEntry, decode_entries
from trioloop.durable.store import JournalStore
from trioloop.protocol.events import Usage, usage_sum
from trioloop.protocol.serialization import SerializationError, event_from_json

__all__ = ["journaled_usage", "show_usage", "usage_of_entries", "usage_text"]


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


async def journaled_usage(store: JournalStore, session_id: str, *, without_last_turn: bool = False) -> Usage:
    """What the turns journaled under ``session_id`` used (see `usage_of_entries`)."""
    return usage_of_entries(decode_entries(await store.read(session_id)), without_last_turn=without_last_turn)


def usage_of_entries(entries: Sequence[JournalEntry], *, without_last_turn: bool = False) -> Usage:
    """The tokens of every turn in ``entries``; ``without_last_turn`` leaves the last one out (a turn the chat
    takes up again counts its earlier requests itself when it settles)."""
    turns: list[Usage] = []
    before = current = Usage()  # the turn's requests before this one; the turn so far
    for entry in entries:
        if entry.kind == "submit":
            before = current = Usage()
            turns.append(current)
        elif entry.kind == "advance":
            before = current
        elif entry.kind == "stream" and turns:
            for value in entry.data.get("events") or ():
                try:
                    event = event_from_json(value)
                except SerializationError:
                    continue  # opening the session replayed these entries: nothing here is news
                if isinstance(event, Usage):
                    current = usage_sum(before, event)
                    turns[-1] = current
    if without_last_turn and turns:
        turns.pop()
    total = Usage()
    for turn in turns:
        total = usage_sum(total, turn)
    return total
