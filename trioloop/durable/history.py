"""A journal's past, as points a new session can start from: the session at the journal's first snapshot and after
each turn that settled (`journal_points`), each named by the entry it settled at and the chained head there; and
what a fork's journal records of where it came from (`ForkOrigin`).

Pure functions over entries already verified (`trioloop.durable.audit.verified_journal`): the turns are folded
through the same `reduce_turn` replay uses (`replay_settled`), so the session at a point is the one the source
held then, field for field. Only settled turns are points: a turn suspended in review, or cut short by a crash,
has grants and cards that belong to its own session, and a fork never carries them over.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Generic, TypeVar, final

import attrs

from trioloop.durable.journal import JournalEntry
from trioloop.durable.replay import Replayed, replay_settled
from trioloop.durable.session_file import SessionSnapshot, UndoRecord
from trioloop.machine.state import Outcome
from trioloop.machine.tools import ToolRegistry

__all__ = ["ForkError", "ForkOrigin", "JournalPoint", "SettledTurn", "journal_points", "snapshot_at"]

D = TypeVar("D")


class ForkError(ValueError):
    """A fork that cannot start where it was asked: the source has no journal, the turn named is not one of its
    settled turns (unknown, compacted away, suspended in review or cut short by a crash), or the new session id
    already has a journal. Nothing was written."""


@final
@attrs.frozen(kw_only=True)
class SettledTurn:
    """One settled turn of a journaled session, as `Session.settled_turns` lists it: a point `Session.fork` can start a
    new session from (the session as it stood once this turn settled)."""

    #: The session whose journal holds the turn.
    session: str
    #: The turn's id (``turn-3``) and its number among the session's turns (3).
    turn_id: str
    ordinal: int
    #: What the person sent to start it.
    text: str
    #: How it ended: completed, cancelled, bounded or failed.
    outcome: Outcome
    #: The journal entry the turn settled at, and that entry's SHA-256 (the chained head there: it covers every
    #: entry before it), which a fork's journal records.
    seq: int
    head: str
    #: When it settled (Unix milliseconds, as journaled).
    at_ms: int


@final
@attrs.frozen(kw_only=True)
class ForkOrigin:
    """Where a forked session came from, as the snapshots of its journal record it (``forked_from``): the source
    session and journal, and the entry (with its chained head) after which the fork's state is the source's."""

    session: str
    journal: str
    seq: int
    head: str

    def to_json(self) -> dict[str, Any]:
        """The ``forked_from`` value of a fork's snapshots."""
        return {"session": self.session, "journal": self.journal, "seq": self.seq, "head": self.head}

    @classmethod
    def from_json(cls, value: object) -> ForkOrigin | None:
        """The origin a snapshot's ``forked_from`` names; None when absent or not of this shape (it informs a
        reader; nothing is decided by it)."""
        if not isinstance(value, Mapping):
            return None
        session, journal, seq, head = (value.get(key) for key in ("session", "journal", "seq", "head"))
        if type(session) is not str or type(journal) is not str or type(seq) is not int or type(head) is not str:
            return None
        return cls(session=session, journal=journal, seq=seq, head=head)


@final
@attrs.frozen(kw_only=True)
class JournalPoint(Generic[D]):
    """A point of a verified journal: the session there (``replayed``), the turn that had just settled (None at the
    journal's first snapshot) and the origin a fork from it records."""

    origin: ForkOrigin
    turn: SettledTurn | None
    replayed: Replayed[D]


def journal_points(
    entries: Sequence[JournalEntry],
    *,
    session_id: str,
    journal_id: str,
    load_document: Callable[[str], D],
    registry: ToolRegistry[D],
    load_data: Callable[[Any], D] | None = None,
) -> Iterator[JournalPoint[D]]:
    """The points of ``entries`` (a verified journal of ``session_id``), oldest first, one at a time (a caller keeps
    what it needs: each point holds the whole session there): its first snapshot, then each settled turn.
    `JournalError` for anything replay refuses."""
    submits = [(entry.seq, entry.data.get("text")) for entry in entries if entry.kind == "submit"]
    starts = [seq for seq, _ in submits]
    first = True
    for entry, replayed in replay_settled(entries, load_document=load_document, registry=registry, load_data=load_data):
        origin = ForkOrigin(session=session_id, journal=journal_id, seq=entry.seq, head=entry.hash)
        state = None if first else replayed.state  # the first point is the journal's first snapshot
        first = False
        turn = None
        if state is not None and state.outcome is not None:
            submitted = submits[bisect.bisect_left(starts, entry.seq) - 1][1] if starts else None
            turn = SettledTurn(
                session=session_id,
                turn_id=state.turn_id,
                ordinal=replayed.turn_count,
                text=submitted if type(submitted) is str else "",
                outcome=state.outcome,
                seq=entry.seq,
                head=entry.hash,
                at_ms=entry.at_ms,
            )
        yield JournalPoint(origin=origin, turn=turn, replayed=replayed)


def snapshot_at(replayed: Replayed[D]) -> SessionSnapshot[D]:
    """The session at a point, as a snapshot: what a fork starts from (its undo history as it stood, redo aside)."""
    undo = replayed.undo
    return SessionSnapshot(
        messages=replayed.messages,
        document=replayed.document,
        undo=tuple(UndoRecord(turn_id=entry.turn_id, document=entry.document) for entry in undo.entries),
        undo_max_entries=undo.max_entries,
        last_turn_id=replayed.last_turn_id,
        turn_count=replayed.turn_count,
        model=replayed.model,
        kind=replayed.kind,
        source=replayed.source,
        usage=replayed.usage,
        rules=replayed.rules,
    )
