"""What waits for a reviewer, read from a journal store: every session whose journal shows an open review, verified,
and the decisions posted on its cards.

`Inbox` holds no session and writes no journal. It reads each journal whole, verifies it (`verify_journal`: numbering,
hash chain, every seal against the keys given) in a worker thread, and folds it into the review that waits
(`waiting_review`); a journal that does not verify is listed as refused, with the reason, and nothing of it is shown
as a card. The verified view of each session is cached by its last entry's number: `sync` asks the store for every
journal's head in one query (`heads`) and re-reads only the sessions whose head moved, and asks the decision box for
what changed since the last change number it saw (`decision_changes`). A decision record is shown as what it proves
(`open_decision`, with the inbox's own keys), never as what it merely says.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Iterable, Sequence
from typing import Final, Literal, Protocol, final

import attrs
import trio

from trioloop.durable.decisions import DecisionError, PostedDecision, ReviewDecision, decision_slot, open_decision
from trioloop.durable.journal import JournalEntry, JournalError, decode_entries, verify_journal
from trioloop.durable.review_view import CardView, ReviewView, waiting_review
from trioloop.durable.signing import JournalKeys
from trioloop.durable.store import JournalStoreError, StoredEntry

__all__ = ["Inbox", "ReviewStore", "SessionReview", "ShownDecision"]

#: The largest input shown for editing (as JSON text); a larger one is edited by writing it whole.
_EDIT_CHARS: Final = 16_000
_READERS: Final = 16
_HIDDEN: Final = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


class ReviewStore(Protocol):
    """What the inbox asks of a store: its journals' heads, a journal read without a lease, and the decision box."""

    async def heads(self) -> dict[str, int]: ...

    async def read(self, session_id: str) -> Sequence[StoredEntry]: ...

    async def post_decision(self, session_id: str, slot: str, data: bytes) -> tuple[bool, PostedDecision]: ...

    async def decisions(self, session_id: str, *, waiting_only: bool = False) -> Sequence[PostedDecision]: ...

    async def decision_changes(self, after: int = 0) -> tuple[int, Sequence[PostedDecision]]: ...


@final
@attrs.frozen(kw_only=True)
class SessionReview:
    """One session as the inbox read it: the review that waits (None: nothing waits), or why its journal was refused;
    and each waiting card's input as JSON text, for editing (empty when too large to offer)."""

    session_id: str
    last_seq: int
    view: ReviewView | None = None
    refused: str = ""
    inputs: dict[str, str] = attrs.field(factory=dict)

    def card(self, call_id: str) -> CardView | None:
        if self.view is None:
            return None
        return next((card for card in self.view.cards if card.call_id == call_id), None)


@final
@attrs.frozen(kw_only=True)
class ShownDecision:
    """A posted decision as a page shows it: what it proves (``decision``; None with ``unproven`` saying why) and
    what became of it (``status``, ``note``)."""

    id: int
    slot: str
    status: Literal["waiting", "applied", "refused"]
    note: str
    decision: ReviewDecision | None
    unproven: str = ""

    @property
    def holds(self) -> bool:
        """Whether it holds its card (a refused record frees the slot)."""
        return self.status != "refused"

    def describe(self) -> str:
        """``approved by Ada (ada)`` (or why the record proves nothing)."""
        if self.decision is None:
            return f"a record this inbox cannot prove ({self.unproven})"
        return self.decision.describe()


def _json_escape(char: str) -> str:
    code = ord(char)
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def editable_json(value: object) -> str:
    """``value`` as indented JSON for a person to edit: readable text kept, but every invisible, bidi or control
    character written as its ``\\uXXXX`` escape (the same JSON value, nothing hidden)."""
    text = json.dumps(value, indent=2, ensure_ascii=False)
    return "".join(_json_escape(c) if c != "\n" and unicodedata.category(c) in _HIDDEN else c for c in text)


def _inputs(entries: Sequence[JournalEntry], view: ReviewView) -> dict[str, str]:
    """The waiting cards' inputs as the model sent them (the last ``stream`` entry with cards holds them)."""
    waiting = {card.call_id for card in view.waiting}
    for entry in reversed(entries):
        if entry.kind != "stream" or not entry.data.get("cards"):
            continue
        found: dict[str, str] = {}
        for event in entry.data.get("events") or ():
            if type(event) is dict and event.get("type") == "tool_call_complete" and event.get("id") in waiting:
                text = editable_json(event.get("input"))
                found[event["id"]] = text if len(text) <= _EDIT_CHARS else ""
        return found
    return {}


def _judge(session_id: str, stored: Sequence[StoredEntry], keys: JournalKeys, last_seq: int) -> SessionReview:
    """Verify and fold one journal (in a worker thread: a large journal must not stall the event loop)."""
    try:
        entries = decode_entries(stored)
        verify_journal(entries, session_id=session_id, keys=keys)
    except JournalError as exc:
        return SessionReview(session_id=session_id, last_seq=last_seq, refused=str(exc))
    view = waiting_review(session_id, entries)
    seq = entries[-1].seq if entries else last_seq
    if view is None:
        return SessionReview(session_id=session_id, last_seq=seq)
    return SessionReview(session_id=session_id, last_seq=seq, view=view, inputs=_inputs(entries, view))


def _shown(record: PostedDecision, keys: JournalKeys) -> ShownDecision:
    try:
        decision, _ = open_decision(record.data, keys)
    except DecisionError as exc:
        return ShownDecision(
            id=record.id, slot=record.slot, status=record.status, note=record.note, decision=None, unproven=str(exc)
        )
    if decision.session_id != record.session_id or decision.slot != record.slot:
        return ShownDecision(
            id=record.id,
            slot=record.slot,
            status=record.status,
            note=record.note,
            decision=None,
            unproven="it was signed for another card",
        )
    return ShownDecision(id=record.id, slot=record.slot, status=record.status, note=record.note, decision=decision)


@final
class Inbox:
    """The reviews waiting in ``store`` whose journals ``keys`` verify, and the decisions posted on them (proven
    with ``decision_keys``: the inbox's own key, and any other inbox's that shares the store)."""

    def __init__(self, store: ReviewStore, keys: JournalKeys, decision_keys: JournalKeys) -> None:
        if not keys:
            raise ValueError("an inbox needs the public keys its journals are verified with")
        self.store = store
        self._keys = keys
        self._decision_keys = decision_keys
        self._sessions: dict[str, SessionReview] = {}
        self._decisions: dict[str, dict[int, ShownDecision]] = {}
        self._change = 0
        self._synced = False
        self._lock = trio.Lock()
        self._limiter = trio.CapacityLimiter(_READERS)

    async def _read(self, session_id: str, last_seq: int) -> SessionReview:
        async with self._limiter:
            try:
                stored = await self.store.read(session_id)
            except (JournalStoreError, JournalError) as exc:
                return SessionReview(session_id=session_id, last_seq=last_seq, refused=f"it could not be read: {exc}")
            return await trio.to_thread.run_sync(_judge, session_id, stored, self._keys, last_seq)

    async def sync(self) -> set[str]:
        """Catch up with the store: the ids of the sessions whose journal or decisions changed since the last call
        (every session on the first)."""
        async with self._lock:
            heads = await self.store.heads()
            changed = {sid for sid, seq in heads.items() if (s := self._sessions.get(sid)) is None or s.last_seq != seq}
            gone = set(self._sessions) - set(heads)
            read: dict[str, SessionReview] = {}

            async def one(session_id: str) -> None:
                read[session_id] = await self._read(session_id, heads[session_id])

            async with trio.open_nursery() as nursery:
                for session_id in changed:
                    nursery.start_soon(one, session_id)
            self._sessions.update(read)
            for session_id in gone:
                del self._sessions[session_id]
            latest, records = await self.store.decision_changes(self._change)
            self._change = max(self._change, latest)
            changed |= self._take(records)
            self._synced = True
            return changed | gone

    def _take(self, records: Iterable[PostedDecision]) -> set[str]:
        touched = set()
        for record in records:
            shown = _shown(record, self._decision_keys)
            self._decisions.setdefault(record.session_id, {})[record.id] = shown
            touched.add(record.session_id)
        return touched

    async def reviews(self, *, session: str = "", tool: str = "", kind: str = "") -> list[SessionReview]:
        """The sessions whose review waits (and those whose journal was refused), newest first, filtered: ``session``
        a part of the session id, ``tool`` a waiting card's tool, ``kind`` the document kind or a part of its
        source (a refused journal matches only by session)."""
        await self.sync()
        found = []
        for review in self._sessions.values():
            if session and session not in review.session_id:
                continue
            if review.view is None:
                if review.refused and not tool and not kind:
                    found.append(review)
                continue
            if tool and not any(card.tool == tool for card in review.view.waiting):
                continue
            if kind and kind != review.view.document_kind and kind not in review.view.source:
                continue
            found.append(review)
        found.sort(key=lambda r: (r.view.since_ms if r.view else 0, r.session_id), reverse=True)
        return found

    async def current(self, session_id: str) -> SessionReview:
        """One session read again from the store now (what a decision is checked against), and its decisions."""
        stored_seq = self._sessions[session_id].last_seq if session_id in self._sessions else 0
        review = await self._read(session_id, stored_seq)
        if review.last_seq or review.refused:
            async with self._lock:
                known = self._sessions.get(session_id)
                if known is None or known.last_seq <= review.last_seq:
                    self._sessions[session_id] = review
        records = await self.store.decisions(session_id)
        self._decisions[session_id] = {record.id: _shown(record, self._decision_keys) for record in records}
        return review

    def cached(self, session_id: str) -> SessionReview | None:
        """The session as last read (None: not a journal the inbox knows)."""
        return self._sessions.get(session_id)

    def decisions(self, session_id: str) -> list[ShownDecision]:
        """The decisions posted in ``session_id`` as last read, in the order they were posted."""
        return sorted(self._decisions.get(session_id, {}).values(), key=lambda d: d.id)

    def decision_on(self, session_id: str, turn_id: str, call_id: str) -> ShownDecision | None:
        """The decision that holds a card (else the latest refused one), or None."""
        slot = decision_slot(turn_id, call_id)
        on_card = [d for d in self.decisions(session_id) if d.slot == slot]
        holding = [d for d in on_card if d.holds] or on_card
        return holding[-1] if holding else None

    def waiting_decisions(self, session_id: str) -> int:
        """How many decisions of ``session_id`` wait for its process."""
        return sum(1 for d in self._decisions.get(session_id, {}).values() if d.status == "waiting")

    def shown(self, record: PostedDecision) -> ShownDecision:
        """A record just posted or met, as a page shows it."""
        return _shown(record, self._decision_keys)

    @property
    def ready(self) -> bool:
        """Whether the first `sync` has run."""
        return self._synced

    def tools(self) -> list[str]:
        """Every tool of a waiting card (what the list page's filter offers)."""
        names = {c.tool for r in self._sessions.values() if r.view for c in r.view.waiting}
        return sorted(names)[:200]

    def kinds(self) -> list[str]:
        """Every document kind of a waiting review."""
        return sorted({r.view.document_kind for r in self._sessions.values() if r.view and r.view.document_kind})[:200]
