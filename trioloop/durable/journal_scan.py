"""What a journal's entries say before any is replayed: where replay starts, and which tools its calls used (so a
session is refused before replay when the app did not pass one of them). `trioloop.durable.replay` re-exports both.
"""

from __future__ import annotations

from collections.abc import Sequence

from trioloop.durable.journal import JournalEntry, JournalError

__all__ = ["replay_start", "settled_snapshot", "tools_used"]


def replay_start(entries: Sequence[JournalEntry]) -> int:
    """Where replay starts: the last ``snapshot`` entry before the last turn's ``submit`` (so the last turn's
    state comes back too), or the last snapshot when no turn follows one. `JournalError` if there is none."""
    last_submit = next((i for i in range(len(entries) - 1, -1, -1) if entries[i].kind == "submit"), len(entries))
    for limit in (last_submit, len(entries)):
        for index in range(min(limit, len(entries)) - 1, -1, -1):
            if entries[index].kind == "snapshot":
                return index
    raise JournalError("the journal holds no session snapshot")


def settled_snapshot(entries: Sequence[JournalEntry], start: int) -> int | None:
    """Where the newest ``snapshot`` stands when it follows the last turn's ``submit`` (it is past ``start``, the
    `replay_start` of ``entries``: the last one before that submit), else None. A snapshot is written only between
    turns: that turn settled before it, and the snapshot holds the session the turn left; but not what could be
    redone, so None too when an undo or redo lies between (replay from ``start`` knows it)."""
    newest = next(i for i in range(len(entries) - 1, start - 1, -1) if entries[i].kind == "snapshot")
    if newest == start or any(entry.kind in ("undo", "redo") for entry in entries[start:newest]):
        return None
    return newest


def tools_used(entries: Sequence[JournalEntry], *, every_turn: bool = False) -> frozenset[str]:
    """The tools the calls replay will prepare again used (from `replay_start` on; with ``every_turn``, in every
    turn the entries hold, as `replay_settled` folds them): a call's tool, when its turn offered one by that name (a
    name the model made up was never a tool, and fails as unknown either way)."""
    offered: set[str] = set()
    used: set[str] = set()
    for entry in entries[0 if every_turn else replay_start(entries) :]:
        if entry.kind == "submit":
            names = entry.data.get("tools")
            offered = {name for name in names if type(name) is str} if type(names) is list else set()
        elif entry.kind == "stream" and type(events := entry.data.get("events")) is list:
            for event in events:
                if type(event) is dict and event.get("type") == "tool_call_complete":
                    name = event.get("name")
                    if type(name) is str and name in offered:
                        used.add(name)
    return frozenset(used)
