"""What a face that holds no session shows of one: the review a journal says is waiting, read from the entries alone.

`waiting_review` folds a session's verified entries (`verify_journal` first: nothing unproven is shown) into the
turn that waits for a person, if any: the person's request, the model's text before its calls, and each card as
the journal recorded it when the review opened (tool, effect, destructive marker, every input field the digest
covers, the dry run's preview, who asked for it), with what became of each card since (approved, denied, by whom).
It needs no document kind and no tools: the web inbox (`trioloop serve`) lists sessions with it, and a worker
picks which to take up. The process that holds the session still judges every decision against its own live
state: what this view says decides nothing.

A later ``snapshot`` ends the turn (a settled turn is followed by one), as replay reads it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal, final

import attrs

from trioloop.durable.journal import JournalEntry

__all__ = ["CardView", "ReviewView", "waiting_review"]

CardStatus = Literal["waiting", "approved", "denied", "started", "done"]
_TEXT_CHARS: Final = 100_000


@final
@attrs.frozen(kw_only=True)
class CardView:
    """One card as the journal recorded it, and what became of it (``status``, ``decided_by``)."""

    call_id: str
    tool: str
    digest: str
    summary: str
    effect: str
    destructive: bool
    #: Every input field the digest covers: (path, value) lines, in order.
    details: tuple[tuple[str, str], ...]
    #: The dry run's preview lines (empty when the tool has none).
    preview: tuple[str, ...] = ()
    #: Who sent the call to review (a rule, a function), when not simply the policy.
    asked_by: str = ""
    status: CardStatus = "waiting"
    decided_by: str = ""

    @property
    def rule_options(self) -> tuple[str, ...]:
        """The "always" options a person may add with a decision: ``approve:tool``, ``approve:input``,
        ``deny:tool``; none to approve a destructive call (a rule never approves one)."""
        return ("deny:tool",) if self.destructive else ("approve:tool", "approve:input", "deny:tool")


@final
@attrs.frozen(kw_only=True)
class ReviewView:
    """A turn waiting for a person, as its journal says (see the module docstring)."""

    session_id: str
    turn_id: str
    #: The person's request that started the turn.
    request: str
    #: What the model wrote in the response whose calls wait (its text before the calls).
    model_text: str
    cards: tuple[CardView, ...]
    #: True when the turn was suspended (no process drives it until a worker or the app takes it up).
    suspended: bool
    #: When the review opened (the journal's wall clock, unix ms) and the last entry read.
    since_ms: int
    last_seq: int
    #: The document the session edits, as the journal names it (kind, source file) for people.
    document_kind: str = ""
    source: str = ""

    @property
    def waiting(self) -> tuple[CardView, ...]:
        """The cards still waiting for a decision."""
        return tuple(card for card in self.cards if card.status == "waiting")


def _text(value: object) -> str:
    return value[:_TEXT_CHARS] if type(value) is str else ""


def _card(value: Mapping[str, Any]) -> CardView | None:
    """A full card of a ``stream`` entry (a call the read-only policy approved carries its digest only)."""
    if type(value.get("tool")) is not str or type(value.get("call_id")) is not str:
        return None
    details = value.get("details")
    lines: list[tuple[str, str]] = []
    if type(details) is list:
        for line in details:
            if type(line) is list and len(line) == 2:
                lines.append((_text(line[0]), _text(line[1])))
    preview = value.get("preview")
    return CardView(
        call_id=value["call_id"],
        tool=value["tool"],
        digest=_text(value.get("digest")),
        summary=_text(value.get("summary")),
        effect=_text(value.get("effect")),
        destructive=value.get("destructive") is True,
        details=tuple(lines),
        preview=tuple(_text(line) for line in preview) if type(preview) is list else (),
        asked_by=_text(value.get("asked_by")),
    )


def _model_text(events: object) -> str:
    if type(events) is not list:
        return ""
    parts = [
        e["text"] for e in events if type(e) is dict and e.get("type") == "text_delta" and type(e.get("text")) is str
    ]
    return "".join(parts)[:_TEXT_CHARS]


class _Fold:
    def __init__(self) -> None:
        self.turn_id = ""
        self.request = ""
        self.model_text = ""
        self.cards: dict[str, CardView] = {}
        self.suspended = False
        self.since_ms = 0
        self.kind = ""
        self.source = ""

    def decided(self, call_id: object, status: CardStatus, by: object) -> None:
        card = self.cards.get(call_id) if type(call_id) is str else None
        if card is not None and (card.status == "waiting" or status in ("started", "done")):
            who = card.decided_by if status in ("started", "done") else _text(by)
            self.cards[card.call_id] = attrs.evolve(card, status=status, decided_by=who)

    def apply(self, entry: JournalEntry) -> None:
        kind, data = entry.kind, entry.data
        if kind == "snapshot":  # the first one, or the one after a settled turn or an undo: no turn is live
            session = data.get("session")
            if type(session) is dict:
                self.kind = _text(session.get("kind")) or self.kind
                self.source = _text(session.get("source")) or self.source
            self.turn_id, self.cards, self.suspended = "", {}, False
        elif kind == "submit":
            self.turn_id, self.request = _text(data.get("turn_id")), _text(data.get("text"))
            self.model_text, self.cards, self.suspended = "", {}, False
        elif kind == "stream" and self.turn_id:
            cards = [c for c in (data.get("cards") or ()) if type(c) is dict]
            shown = [card for card in map(_card, cards) if card is not None]
            if shown:
                self.model_text = _model_text(data.get("events"))
                self.cards = {card.call_id: card for card in shown}
                self.since_ms = entry.at_ms
        elif kind == "approve":
            self.decided(data.get("call_id"), "approved", data.get("by"))
        elif kind == "approve_batch":
            for call_id in data.get("call_ids") or ():
                self.decided(call_id, "approved", data.get("by"))
        elif kind == "deny":
            self.decided(data.get("call_id"), "denied", data.get("by"))
        elif kind == "start":
            self.decided(data.get("call_id"), "started", "")
        elif kind in ("settled", "revoke"):
            self.decided(data.get("call_id"), "done", "")
        elif kind == "suspend":
            self.suspended = True
        elif kind == "resume":
            self.suspended = False


def waiting_review(session_id: str, entries: Sequence[JournalEntry]) -> ReviewView | None:
    """The review waiting in ``entries`` (a session's journal, verified, in order), or None when no card of a live
    turn waits for a decision."""
    fold = _Fold()
    for entry in entries:
        fold.apply(entry)
    if not fold.turn_id or not any(card.status == "waiting" for card in fold.cards.values()):
        return None
    return ReviewView(
        session_id=session_id,
        turn_id=fold.turn_id,
        request=fold.request,
        model_text=fold.model_text,
        cards=tuple(fold.cards.values()),
        suspended=fold.suspended,
        since_ms=fold.since_ms,
        last_seq=entries[-1].seq if entries else 0,
        document_kind=fold.kind,
        source=fold.source,
    )
