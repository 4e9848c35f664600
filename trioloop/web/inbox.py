"""What waits for a reviewer, read from a journal store: every session whose journal shows an open review, verified,
and the decisions posted on its cards.

When no review waits, `last_turn` says how the session's last turn stands: still going on, suspended, or settled
(a ``snapshot`` follows a settled turn), with its outcome where the journal says it, what became of each call, and
the model's last text.

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
from collections.abc import Collection, Iterable, Sequence
from typing import Final, Literal, Protocol, final

import attrs
import trio

from trioloop.durable.decisions import DecisionError, PostedDecision, ReviewDecision, decision_slot, open_decision
from trioloop.durable.journal import JournalEntry, JournalError, decode_entries, verify_journal
from trioloop.durable.review_view import CardView, ReviewView, waiting_review
from trioloop.durable.signing import JournalKeys
from trioloop.durable.store import JournalStoreError, StoredEntry

__all__ = ["Inbox", "LastTurn", "ReviewStore", "SessionReview", "ShownDecision", "TurnCall", "last_turn"]

#: The largest input shown for editing (as JSON text); a larger one is edited by writing it whole.
_EDIT_CHARS: Final = 16_000
_READERS: Final = 16
_HIDDEN: Final = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
_TEXT_CHARS: Final = 100_000
#: What a ``cancel`` entry's reason settles the turn as (as the turn's machine does).
_CANCELLED: Final = {
    "stop": "cancelled",
    "deadline": "bounded: its deadline passed",
    "review_timeout": "bounded: its review timed out",
}
#: The limits under which a response that ends the turn may still settle it bounded (a token or cost bound).
_SPEND_LIMITS: Final = ("max_input_tokens", "max_output_tokens", "max_total_tokens", "max_cost_usd")


class ReviewStore(Protocol):
    """What the inbox asks of a store: its journals' heads, a journal read without a lease, and the decision box."""

    async def heads(self, only: Collection[str] | None = None) -> dict[str, int]: ...

    async def read(self, session_id: str) -> Sequence[StoredEntry]: ...

    async def post_decision(self, session_id: str, slot: str, data: bytes) -> tuple[bool, PostedDecision]: ...

    async def decisions(self, session_id: str, *, waiting_only: bool = False) -> Sequence[PostedDecision]: ...

    async def decision_changes(self, after: int = 0) -> tuple[int, Sequence[PostedDecision]]: ...


@final
@attrs.frozen(kw_only=True)
class TurnCall:
    """One call of a turn and what became of it: ``asked``, ``approved``, ``started`` (running, or cut off),
    ``succeeded``, ``failed``, ``denied`` or ``revoked``; ``detail`` is the failure's text or the denial's reason."""

    call_id: str
    tool: str
    status: str
    detail: str = ""


@final
@attrs.frozen(kw_only=True)
class LastTurn:
    """A session's last turn as its journal says, when no review waits: ``state`` (``going on``: started or taken
    up, neither suspended nor settled; ``suspended``; ``settled``), the ``outcome`` of a settled turn where the
    journal says it (empty otherwise), its calls, and the model's last text (every field untrusted)."""

    turn_id: str
    request: str
    state: Literal["going on", "suspended", "settled"]
    outcome: str
    model_text: str
    calls: tuple[TurnCall, ...]
    at_ms: int


def _str(value: object) -> str:
    return value[:_TEXT_CHARS] if type(value) is str else ""


class _TurnFold:
    """The last turn, folded from a journal's entries (see `last_turn`)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self, turn_id: str = "", request: str = "", spend_bounded: bool = False) -> None:
        self.turn_id = turn_id
        self.request = request
        self.spend_bounded = spend_bounded
        self.state: Literal["going on", "suspended", "settled"] = "going on"
        self.model_text = ""
        self.stop = ""
        self.error = ""
        self.cancel = ""
        self.calls: dict[str, TurnCall] = {}
        self.at_ms = 0

    def call(self, call_id: object, status: str, detail: object = "") -> None:
        known = self.calls.get(call_id) if type(call_id) is str else None
        if known is not None:
            self.calls[known.call_id] = attrs.evolve(known, status=status, detail=_str(detail))

    def stream(self, events: object) -> None:
        if type(events) is not list:
            return
        text = []
        for event in events:
            if type(event) is not dict:
                continue
            kind = event.get("type")
            if kind == "text_delta" and type(event.get("text")) is str:
                text.append(event["text"])
            elif kind == "tool_call_complete" and type(event.get("id")) is str:
                self.calls[event["id"]] = TurnCall(call_id=event["id"], tool=_str(event.get("name")), status="asked")
            elif kind == "message_stop":
                self.stop = _str(event.get("stop_reason"))
            elif kind == "error" and event.get("terminal") is not False:
                self.error = _str(event.get("message")) or "the model's stream failed"
        if text:
            self.model_text = "".join(text)[:_TEXT_CHARS]

    def apply(self, entry: JournalEntry) -> None:
        kind, data = entry.kind, entry.data
        if kind == "submit":
            limits = data.get("limits")
            spend = type(limits) is dict and any(limits.get(name) is not None for name in _SPEND_LIMITS)
            self.reset(_str(data.get("turn_id")), _str(data.get("text")), spend)
        if not self.turn_id:
            return
        self.at_ms = entry.at_ms
        if kind == "stream":
            self.stream(data.get("events"))
        elif kind == "retry":
            self.error = ""
        elif kind == "approve":
            self.call(data.get("call_id"), "approved")
        elif kind == "approve_batch":
            for call_id in data.get("call_ids") or ():
                self.call(call_id, "approved")
        elif kind == "deny":
            self.call(data.get("call_id"), "denied", data.get("reason"))
        elif kind == "start":
            self.call(data.get("call_id"), "started")
        elif kind == "settled":
            ok = data.get("ok") is True
            self.call(data.get("call_id"), "succeeded" if ok else "failed", "" if ok else data.get("result"))
        elif kind == "revoke":
            self.call(data.get("call_id"), "revoked", data.get("detail"))
        elif kind == "cancel":
            self.cancel = _str(data.get("reason"))
        elif kind in ("suspend", "resume"):
            self.state = "suspended" if kind == "suspend" else "going on"
        elif kind == "snapshot":  # what follows a settled turn
            self.state = "settled"

    def outcome(self) -> str:
        if self.state != "settled":
            return ""
        if self.cancel:
            return _CANCELLED.get(self.cancel, "")
        if self.error:
            return f"failed: {self.error}"
        if self.stop and self.stop not in ("tool_use", "pause_turn") and not self.spend_bounded:
            return "completed"
        return ""  # a bound the journal does not name (iterations, tokens, cost)


def last_turn(entries: Sequence[JournalEntry]) -> LastTurn | None:
    """How the last turn in ``entries`` (a verified journal) stands, or None when the journal holds no turn (none
    started, or compacted past it)."""
    fold = _TurnFold()
    for entry in entries:
        fold.apply(entry)
    if not fold.turn_id:
        return None
    return LastTurn(
        turn_id=fold.turn_id,
        request=fold.request,
        state=fold.state,
        outcome=fold.outcome(),
        model_text=fold.model_text,
        calls=tuple(fold.calls.values()),
        at_ms=fold.at_ms,
    )


@final
@attrs.frozen(kw_only=True)
class SessionReview:
    """One session as the inbox read it: the review that waits (None: nothing waits), or why its journal was refused;
    and each waiting card's input as JSON text, for editing (empty when too large to offer); when nothing waits, how
    the last turn stands (`LastTurn`)."""

    session_id: str
    last_seq: int
    view: ReviewView | None = None
    refused: str = ""
    inputs: dict[str, str] = attrs.field(factory=dict)
    last_turn: LastTurn | None = None

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
        return SessionReview(session_id=session_id, last_seq=seq, last_turn=last_turn(entries))
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
        self._moved: set[str] = set()  # changes a page's own read found: still to be told (`sync`)
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

    async def sync(self, *, tell: bool = True, only: set[str] | None = None) -> set[str]:
        """Catch up with the store: the ids of the sessions whose journal or decisions changed since the last call
        (every session on the first). ``tell=False`` is a page's own catch-up: what it finds is returned again by
        the next call that tells (the one whose answer the open pages hear of), and so is a session `current` read
        ahead. ``only``: the journals a store announced as grown (its heads alone are asked; none is found gone)."""
        async with self._lock:
            heads = await self.store.heads(only)
            changed = {sid for sid, seq in heads.items() if (s := self._sessions.get(sid)) is None or s.last_seq != seq}
            gone = set() if only is not None else set(self._sessions) - set(heads)
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
            if not tell:
                self._moved |= changed | gone
                return changed | gone
            found, self._moved = changed | gone | self._moved, set()
            return found

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
        await self.sync(tell=False)
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
                    if known is None or known.last_seq < review.last_seq:
                        # `sync` now finds this head known: it still tells every page of the change.
                        self._moved.add(session_id)
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
