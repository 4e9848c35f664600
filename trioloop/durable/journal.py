"""The session journal: what a session records so that a review outlives its process, and the audit trail.

A turn is the fold of its inputs through `reduce_turn`, so a journal of those inputs *is* the turn. Pure
functions and values only; the `Session` hands the encoded entries to a `JournalStore` and awaits them.

Entries. Each is one line of ASCII JSON with its keys in this order::

    {"seq": 7, "kind": "approve", "prev": "<sha256 of entry 6's bytes>", "at": <unix ms>, "data": {...}}

``seq`` counts from 1 with no gap; ``prev`` is the SHA-256 (hex) of the previous entry's exact bytes (64 zeros
for the first entry), so changing, removing or reordering any entry breaks the chain from there on;
``at`` is the wall clock when it was written (for people: nothing replays by it). The kinds:

- ``snapshot``: the whole session as a session file holds it (conversation, document, undo history, turn
  count). The first entry, and written again after every settled turn and undo: opening replays from the
  last snapshot, so reopening costs what one turn costs, however long the session ran.
- ``submit``: a turn starts (turn id, the person's text, the limits, the names of the tools offered).
- ``stream``: one model response as the reducer took it, text deltas joined, written when the response ends
  (a response cut by a crash is asked again). ``cards`` lists what each card awaiting review showed.
- ``approve``, ``approve_batch``, ``deny``: the person's decisions, with who made them, the edited input or
  the reason, and the digest and lines of the card decided on.
- ``start``, ``settled``: a call started, and how it ended; a commit carries the committed document in the
  kind's text form.
- ``advance``, ``retry``, ``cancel``, ``revoke``, ``undo``: the other reducer inputs.
- ``suspend``, ``resume``: the turn was suspended in review (with the machine time spent and the time the
  review had waited), and taken up again.

Replay (`replay_journal`) feeds the same inputs to `reduce_turn` and gives the state the live session had,
field for field. `recovery_inputs` says what a reopened turn must do first: a call that was ``running`` is
settled failed and never run again (at most once), a call whose tool now prepares a different digest is
revoked, a request that was in flight is asked again as a retry.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final, Generic, TypeVar, final

import attrs

from trioloop.durable.bounded_json import parse_bounded_json
from trioloop.durable.session_file import SessionFileError, SessionSnapshot, session_from_json, session_to_json
from trioloop.durable.store import StoredEntry
from trioloop.machine.inputs import (
    Advance,
    ApproveBatch,
    ApproveCall,
    CallSettled,
    Cancel,
    DenyCall,
    Retry,
    Revoke,
    StartCall,
    Submit,
    TurnInput,
    UndoTurn,
)
from trioloop.machine.limits import TurnLimits
from trioloop.machine.reducer import reduce_turn
from trioloop.machine.state import CallRecord, CallStatus, Phase, TurnState
from trioloop.machine.tools import ToolOutcome, ToolRegistry
from trioloop.machine.transaction import UndoEntry, UndoHistory, redo_step, undo_step
from trioloop.protocol.events import StreamError, StreamEvent, TextDelta, is_terminal
from trioloop.protocol.serialization import SerializationError, event_from_json, event_to_json

__all__ = [
    "GENESIS",
    "INTERRUPTED_CALL_TEXT",
    "JOURNAL_KINDS",
    "JournalEntry",
    "JournalError",
    "JournalWriter",
    "Replayed",
    "call_card",
    "decode_entry",
    "encode_entry",
    "entry_hash",
    "recovery_inputs",
    "replay_journal",
    "verify_chain",
]

D = TypeVar("D")

#: The ``prev`` of a journal's first entry.
GENESIS: Final = "0" * 64
#: Largest entry accepted when reading (a snapshot holds a document and its undo history).
MAX_ENTRY_BYTES: Final = 256 * 1024 * 1024
#: What the model and the card read for a call that was running when its process died.
INTERRUPTED_CALL_TEXT: Final = (
    "Interrupted: the session stopped while this call was running. It may have run, partly or wholly, with "
    "effects outside the document; it was not run again and its result is unknown."
)

JOURNAL_KINDS: Final = frozenset(
    {
        "snapshot",
        "submit",
        "stream",
        "approve",
        "approve_batch",
        "deny",
        "start",
        "settled",
        "advance",
        "retry",
        "cancel",
        "revoke",
        "undo",
        "redo",
        "suspend",
        "resume",
    }
)
_ENTRY_KEYS: Final = ("seq", "kind", "prev", "at", "data")
#: Deepest nesting an entry may have: a session file's own limit plus the entry's envelope.
MAX_ENTRY_DEPTH: Final = 160
#: Documents a writer keeps in text form (the live one, the undo history's, a few more).
_DUMP_CACHE: Final = 64


class JournalError(ValueError):
    """A journal that cannot be replayed: the message names the first entry that does not verify."""

    def __init__(self, message: str, *, seq: int | None = None) -> None:
        super().__init__(message)
        self.seq = seq


@final
@attrs.frozen
class JournalEntry:
    """One decoded entry; ``raw`` is its exact bytes (what the next entry's ``prev`` hashes)."""

    seq: int
    kind: str
    prev: str
    at_ms: int
    data: Mapping[str, Any]
    raw: bytes = attrs.field(repr=False)

    @property
    def hash(self) -> str:
        return entry_hash(self.raw)


def entry_hash(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def encode_entry(seq: int, kind: str, prev: str, at_ms: int, data: Mapping[str, Any]) -> bytes:
    """One entry's bytes: ASCII JSON, keys in the documented order, no whitespace, one line."""
    if kind not in JOURNAL_KINDS:
        raise ValueError(f"unknown journal entry kind {kind!r}")
    value = {"seq": seq, "kind": kind, "prev": prev, "at": at_ms, "data": data}
    return json.dumps(value, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")


def decode_entry(raw: bytes) -> JournalEntry:
    """Decode one stored entry; `JournalError` for anything that is not a well-formed entry.

    Read in bounded memory (`parse_bounded_json`: at most about 8 times the entry's size), strict (no
    NaN, no repeated key, nesting at most `MAX_ENTRY_DEPTH`), ASCII only, as `encode_entry` writes."""
    if not isinstance(raw, bytes | bytearray) or not bytes(raw).isascii():
        raise JournalError("a journal entry is not ASCII JSON")
    value = parse_bounded_json(
        bytes(raw), max_bytes=MAX_ENTRY_BYTES, max_depth=MAX_ENTRY_DEPTH, error=JournalError, subject="a journal entry"
    )
    if type(value) is not dict or tuple(value) != _ENTRY_KEYS:
        raise JournalError("a journal entry does not have the keys seq, kind, prev, at, data in that order")
    seq, kind, prev, at, data = (value[k] for k in _ENTRY_KEYS)
    if type(seq) is not int or seq < 1:
        raise JournalError("a journal entry's seq is not a positive whole number")
    if type(kind) is not str or kind not in JOURNAL_KINDS:
        raise JournalError(f"journal entry {seq} has an unknown kind", seq=seq)
    if type(prev) is not str or len(prev) != 64 or prev.strip("0123456789abcdef"):
        raise JournalError(f"journal entry {seq} has no valid prev hash", seq=seq)
    if type(at) is not int or type(data) is not dict:
        raise JournalError(f"journal entry {seq} is malformed", seq=seq)
    return JournalEntry(seq=seq, kind=kind, prev=prev, at_ms=at, data=data, raw=bytes(raw))


def verify_chain(entries: Sequence[JournalEntry], *, first_prev: str | None = GENESIS) -> None:
    """Check numbering and the hash chain; `JournalError` names the first entry that does not match.

    ``first_prev`` is what the first entry's ``prev`` must be (None: anything, for a journal whose
    earlier entries were discarded by compaction).
    """
    expected_prev = first_prev
    expected_seq = entries[0].seq if entries else 1
    for entry in entries:
        if entry.seq != expected_seq:
            raise JournalError(f"journal entry {entry.seq} follows entry {expected_seq - 1}: a gap", seq=entry.seq)
        if expected_prev is not None and entry.prev != expected_prev:
            raise JournalError(
                f"journal entry {entry.seq} does not carry the hash of the entry before it", seq=entry.seq
            )
        expected_prev = entry.hash
        expected_seq += 1


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


def _limits_json(limits: TurnLimits) -> dict[str, Any]:
    return attrs.asdict(limits)


def call_card(call: CallRecord) -> dict[str, Any]:
    """What a call's review card shows, as the journal records it (and `trioloop audit` prints it)."""
    details = call.prepared.details if call.prepared is not None else ()
    return {
        "call_id": call.id,
        "tool": call.tool_name,
        "digest": call.input_digest,
        "summary": call.summary,
        "effect": call.effect,
        "destructive": call.destructive,
        "details": [[path, value] for path, value in details],
    }


class JournalWriter:
    """Turns the inputs a live turn takes into journal entries, numbered and chained, ready to append.

    `note` is called with each input the reducer took and the states around it; it never blocks. Stream
    events are held (consecutive text deltas joined) until the response ends, then written as one entry.
    `take` hands over what is ready; the caller appends it to the store and must not publish the state
    or start a call before that append returned.
    """

    def __init__(
        self, *, last_seq: int, last_hash: str, dump_document: Callable[[Any], str], clock: Callable[[], int] = _wall_ms
    ) -> None:
        self._seq = last_seq
        self._prev = last_hash
        self._dump = dump_document
        self._clock = clock
        self._ready: list[StoredEntry] = []
        # Documents already in their text form, by identity (the runner never changes a live document in
        # place: a commit swaps in another object): a snapshot after a turn that only read, and the undo
        # history's documents, cost no second dump. Most recent last; bounded.
        self._dumped: OrderedDict[int, tuple[Any, str]] = OrderedDict()
        self._commit_pending = False
        self._submit_pending = False
        self._since_snapshot = 0  # bytes written since the last snapshot
        self._snapshot_size = 0
        self._events: list[dict[str, Any]] = []
        self._text: list[str] = []  # text deltas not yet joined into the last event
        self.actor = ""

    @property
    def last_seq(self) -> int:
        return self._seq

    @property
    def last_hash(self) -> str:
        return self._prev

    @property
    def has_ready(self) -> bool:
        return bool(self._ready)

    @property
    def holding_stream(self) -> bool:
        """Whether a response is in mid-stream: its events are held until it ends."""
        return bool(self._events or self._text)

    @property
    def commit_pending(self) -> bool:
        """Whether an entry not yet taken records a commit (a document change): its state waits for it."""
        return self._commit_pending

    @property
    def submit_pending(self) -> bool:
        """Whether an entry not yet taken starts a turn: it is durable before the turn's first request."""
        return self._submit_pending

    def take(self) -> list[StoredEntry]:
        ready, self._ready = self._ready, []
        self._commit_pending = self._submit_pending = False
        return ready

    def add(self, kind: str, data: Mapping[str, Any]) -> None:
        """Number, chain and encode one entry (the stream held so far goes first)."""
        if kind != "stream" and (self._events or self._text):
            self._flush_stream(None)
        self._seq += 1
        raw = encode_entry(self._seq, kind, self._prev, self._clock(), data)
        self._prev = entry_hash(raw)
        self._ready.append(StoredEntry(self._seq, raw))
        if kind == "settled" and data.get("document") is not None:
            self._commit_pending = True
        elif kind == "submit":
            self._submit_pending = True
        if kind == "snapshot":
            self._since_snapshot, self._snapshot_size = 0, len(raw)
        else:
            self._since_snapshot += len(raw)

    @property
    def snapshot_due(self) -> bool:
        """Whether a session snapshot would pay for itself: once the entries since the last one weigh as much
        as it did, so snapshots cost at most what the rest of the journal does, and reopening replays at
        most about one snapshot's worth of entries."""
        return self._since_snapshot >= self._snapshot_size

    def dump(self, document: Any) -> str:
        """``document`` in its text form, from the cache when this very object was dumped before."""
        key = id(document)
        cached = self._dumped.get(key)
        if cached is not None and cached[0] is document:
            self._dumped.move_to_end(key)
            return cached[1]
        text = self._dump(document)
        self._dumped[key] = (document, text)
        if len(self._dumped) > _DUMP_CACHE:
            self._dumped.popitem(last=False)
        return text

    def _flush_stream(self, state: TurnState | None) -> None:
        self._join_text()
        events, self._events = self._events, []
        data: dict[str, Any] = {"events": events}
        if state is not None:
            # The cards a person reviews, whole; a call approved by the read-only policy is never shown, so
            # only its digest is kept (a resumed turn still refuses it if its tool changed).
            data["cards"] = [
                call_card(c) if c.status is CallStatus.PENDING else {"call_id": c.id, "digest": c.input_digest}
                for c in state.current_calls
                if not c.is_terminal
            ]
        self.add("stream", data)

    def _join_text(self) -> None:
        if self._text:
            self._events.append({"type": "text_delta", "text": "".join(self._text)})
            self._text = []

    def note(self, item: TurnInput, old: TurnState, new: TurnState, document: Any = None) -> None:
        """Record ``item``, which took ``old`` to ``new`` (nothing when the reducer left the state as it was).

        ``document`` is the live document after the input (read only for a settlement that committed).
        """
        if new is old:
            return
        cls = type(item)
        if cls is TextDelta:
            self._text.append(item.text)  # type: ignore[union-attr]
            return
        if cls not in _COMMANDS:
            self._join_text()
            self._events.append(event_to_json(item))  # type: ignore[arg-type]
            if is_terminal(item):  # type: ignore[arg-type]
                self._flush_stream(new)
            return
        self._command(item, old, new, document)

    def _command(self, item: TurnInput, old: TurnState, new: TurnState, document: Any) -> None:
        by = self.actor
        if isinstance(item, Submit):
            self.add(
                "submit",
                {
                    "turn_id": item.turn_id,
                    "text": item.text,
                    "limits": _limits_json(item.limits),
                    "tools": [tool.name for tool in item.tool_set],
                    "now_ms": item.now_ms,
                },
            )
        elif isinstance(item, ApproveCall):
            call = new.call(item.call_id)
            self.add(
                "approve",
                {
                    "call_id": item.call_id,
                    "edited_input": item.edited_input,
                    "by": by,
                    "card": None if call is None else call_card(call),
                    "edits": [] if call is None else [list(e) for e in call.edits],
                },
            )
        elif isinstance(item, ApproveBatch):
            cards = [call_card(c) for c in map(new.call, item.call_ids) if c is not None]
            self.add("approve_batch", {"call_ids": list(item.call_ids), "by": by, "cards": cards})
        elif isinstance(item, DenyCall):
            call = old.call(item.call_id)
            card = None if call is None else call_card(call)
            self.add("deny", {"call_id": item.call_id, "reason": item.reason, "by": by, "card": card})
        elif isinstance(item, StartCall):
            self.add("start", {"call_id": item.call_id, "now_ms": item.now_ms})
        elif isinstance(item, CallSettled):
            outcome = item.outcome
            text = outcome.is_text
            before, after = old.call(item.call_id), new.call(item.call_id)
            committed = (
                before is not None
                and before.status is CallStatus.RUNNING
                and after is not None
                and after.changed_document
            )
            self.add(
                "settled",
                {
                    "call_id": item.call_id,
                    "ok": outcome.ok if text else False,
                    "result": outcome.result if text else None,
                    "changed_document": bool(item.changed_document),
                    "now_ms": item.now_ms,
                    "document": self.dump(document) if committed else None,
                },
            )
        elif isinstance(item, Advance):
            self.add("advance", {"now_ms": item.now_ms})
        elif isinstance(item, Retry):
            failure = None if item.failure is None else event_to_json(item.failure)
            self.add("retry", {"now_ms": item.now_ms, "failure": failure, "wait_ms": item.wait_ms})
        elif isinstance(item, Cancel):
            self.add("cancel", {"reason": item.reason})
        elif isinstance(item, Revoke):
            self.add("revoke", {"call_id": item.call_id, "detail": item.detail})
        # UndoTurn is journaled by the session, which also restores the document (`undo` entry).

    def snapshot(self, snapshot: SessionSnapshot[Any]) -> None:
        """The whole session: written first, then after every settled turn and every undo."""
        self.add("snapshot", {"session": session_to_json(snapshot, dump_document=self.dump)})


_COMMANDS: Final[frozenset[type]] = frozenset(
    {Submit, ApproveCall, ApproveBatch, DenyCall, StartCall, CallSettled, Advance, Retry, Cancel, Revoke, UndoTurn}
)


# -- replay ------------------------------------------------------------------------------------------


@final
@attrs.frozen(kw_only=True)
class Replayed(Generic[D]):
    """A session as its journal leaves it: what `Session` restores, plus the live turn (if any)."""

    messages: tuple[Any, ...]
    document: D
    undo: UndoHistory[D]
    last_turn_id: str | None
    turn_count: int
    model: str | None
    #: The turn that had not settled when the journal ends (suspended in review, or cut by a crash).
    live: TurnState | None
    #: The last settled (or live) turn's state, as `Session.state` held it.
    state: TurnState | None
    #: Machine time the live turn had spent, and how long its review had waited, when it was suspended
    #: (None when it was not suspended: a crash, where the last journaled time stands in).
    suspended_machine_ms: int | None = None
    suspended_review_ms: int | None = None
    #: The live turn's machine time at its last iteration boundary (what a crash leaves to go by).
    advanced_machine_ms: int = 0
    #: The digest each card of the live turn showed, by call id, as journaled.
    card_digests: Mapping[str, str] = attrs.field(factory=dict)
    last_seq: int = 0
    last_hash: str = GENESIS
    #: How many entries were replayed (from the last snapshot on).
    replayed: int = 0


def _need(data: Mapping[str, Any], key: str, kind: type | tuple[type, ...], seq: int) -> Any:
    value = data.get(key)
    if not isinstance(value, kind) or (kind is int and type(value) is bool):
        raise JournalError(f"journal entry {seq} lacks a valid {key!r}", seq=seq)
    return value


def _text_or_none(data: Mapping[str, Any], key: str, seq: int) -> str | None:
    value = data.get(key)
    if value is not None and type(value) is not str:
        raise JournalError(f"journal entry {seq} has an invalid {key!r}", seq=seq)
    return value


def _event(value: Any, seq: int) -> StreamEvent:
    try:
        return event_from_json(value)
    except SerializationError:
        raise JournalError(f"journal entry {seq} holds an event that is not valid", seq=seq) from None


def _document(load: Callable[[str], D], text: Any, seq: int) -> D:
    if type(text) is not str:
        raise JournalError(f"journal entry {seq} lacks the committed document", seq=seq)
    try:
        return load(text)
    except Exception:
        raise JournalError(f"journal entry {seq} holds a document that does not load", seq=seq) from None


def replay_start(entries: Sequence[JournalEntry]) -> int:
    """Where replay starts: the last ``snapshot`` entry before the last turn's ``submit`` (so the last turn's
    state comes back too), or the last snapshot when no turn follows one. `JournalError` if there is none."""
    last_submit = next((i for i in range(len(entries) - 1, -1, -1) if entries[i].kind == "submit"), len(entries))
    for limit in (last_submit, len(entries)):
        for index in range(min(limit, len(entries)) - 1, -1, -1):
            if entries[index].kind == "snapshot":
                return index
    raise JournalError("the journal holds no session snapshot")


def replay_journal(
    entries: Sequence[JournalEntry],
    *,
    load_document: Callable[[str], D],
    registry: ToolRegistry[D],
    verify_from_genesis: bool = True,
) -> Replayed[D]:
    """Fold ``entries`` (a whole journal, or from a compaction on) into the session they record.

    The chain is verified first (from the genesis hash when the journal starts at entry 1), then the
    entries from the last snapshot on go through `reduce_turn` as the live session fed them. Anything
    that does not verify or decode raises `JournalError` naming the entry; nothing runs.
    """
    if not entries:
        raise JournalError("the journal is empty")
    starts_at_one = entries[0].seq == 1
    verify_chain(entries, first_prev=GENESIS if (starts_at_one and verify_from_genesis) else None)
    start = replay_start(entries)
    folder = _Folder(load_document, registry)
    for entry in entries[start:]:
        folder.apply(entry)
    last = entries[-1]
    return folder.result(last.seq, last.hash, len(entries) - start)


class _Folder(Generic[D]):
    def __init__(self, load: Callable[[str], D], registry: ToolRegistry[D]) -> None:
        self.load = load
        self.registry = registry
        self.snapshot: SessionSnapshot[D] | None = None
        self.messages: tuple[Any, ...] = ()
        self.document: D | None = None
        self.undo: UndoHistory[D] = UndoHistory()
        self.last_turn_id: str | None = None
        self.turn_count = 0
        self.model: str | None = None
        self.turn: TurnState | None = None  # the turn being replayed (live until it settles)
        self.state: TurnState | None = None  # what Session.state would hold
        self.machine_ms: int | None = None
        self.review_ms: int | None = None
        self.cards: dict[str, str] = {}
        self.advanced_ms = 0

    def feed(self, item: TurnInput, seq: int) -> None:
        if self.turn is None:
            raise JournalError(f"journal entry {seq} belongs to no turn", seq=seq)
        self.turn = reduce_turn(self.turn, item)
        self.state = self.turn
        if self.turn.is_settled:
            self.messages = self.turn.messages
            self.last_turn_id = self.turn.turn_id
            self.turn = None
            self.cards = {}

    def apply(self, entry: JournalEntry) -> None:
        kind, data, seq = entry.kind, entry.data, entry.seq
        if kind != "suspend":
            self.machine_ms = self.review_ms = None  # a suspension is over once anything else happened
        if kind == "snapshot":
            if self.snapshot is None:
                self.restore(entry)  # where replay starts
            else:
                # A later snapshot records what the fold already holds (and keeps no redo): nothing to take.
                self.turn, self.cards = None, {}
        elif kind == "submit":
            self.submit(data, seq)
        elif kind == "stream":
            events = _need(data, "events", list, seq)
            for value in events:
                self.feed(_event(value, seq), seq)
            for card in data.get("cards") or ():
                if type(card) is dict and type(card.get("call_id")) is str and type(card.get("digest")) is str:
                    self.cards[card["call_id"]] = card["digest"]
        elif kind == "approve":
            edited = data.get("edited_input")
            if edited is not None and type(edited) is not dict:
                raise JournalError(f"journal entry {seq} has an invalid edited input", seq=seq)
            call_id = _need(data, "call_id", str, seq)
            self.feed(ApproveCall(call_id=call_id, edited_input=edited), seq)
            card = data.get("card")
            if edited is not None and type(card) is dict and type(card.get("digest")) is str:
                self.cards[call_id] = card["digest"]
        elif kind == "approve_batch":
            ids = _need(data, "call_ids", list, seq)
            if not all(type(i) is str for i in ids):
                raise JournalError(f"journal entry {seq} has an invalid call id", seq=seq)
            self.feed(ApproveBatch(call_ids=tuple(ids)), seq)
        elif kind == "deny":
            self.feed(DenyCall(call_id=_need(data, "call_id", str, seq), reason=_need(data, "reason", str, seq)), seq)
        elif kind == "start":
            self.feed(StartCall(call_id=_need(data, "call_id", str, seq), now_ms=_need(data, "now_ms", int, seq)), seq)
        elif kind == "settled":
            self.settled(data, seq)
        elif kind == "advance":
            now_ms = _need(data, "now_ms", int, seq)
            self.feed(Advance(now_ms=now_ms), seq)
            if self.turn is not None:
                self.advanced_ms = max(now_ms - self.turn.budget.started_at_ms, 0)
        elif kind == "retry":
            failure = data.get("failure")
            error = None if failure is None else _event(failure, seq)
            if error is not None and type(error) is not StreamError:
                raise JournalError(f"journal entry {seq} has an invalid failure", seq=seq)
            wait = _need(data, "wait_ms", int, seq)
            self.feed(Retry(now_ms=_need(data, "now_ms", int, seq), failure=error, wait_ms=wait), seq)
        elif kind == "cancel":
            reason = data.get("reason")
            if reason not in ("stop", "deadline", "review_timeout"):
                raise JournalError(f"journal entry {seq} has an invalid cancel reason", seq=seq)
            self.feed(Cancel(reason=reason), seq)
        elif kind == "revoke":
            self.feed(Revoke(call_id=_need(data, "call_id", str, seq), detail=_need(data, "detail", str, seq)), seq)
        elif kind == "undo":
            self.undo_turn(_need(data, "turn_id", str, seq), seq)
        elif kind == "redo":
            self.redo_turn(_need(data, "turn_id", str, seq), seq)
        elif kind == "suspend":
            self.machine_ms = _need(data, "machine_ms", int, seq)
            self.review_ms = _need(data, "review_waited_ms", int, seq)
        # "resume" is for the audit trail only.

    def restore(self, entry: JournalEntry) -> None:
        try:
            snapshot = session_from_json(entry.data.get("session"), load_document=self.load)
        except SessionFileError as exc:
            detail = f"journal entry {entry.seq} holds a session that is not valid: {exc}"
            raise JournalError(detail, seq=entry.seq) from None
        self.snapshot = snapshot
        self.messages = snapshot.messages
        self.document = snapshot.document
        self.undo = snapshot.undo_history()
        self.last_turn_id = snapshot.last_turn_id
        self.turn_count = snapshot.turns_started()
        self.model = snapshot.model
        self.turn = None  # a snapshot is written only between turns (``state`` keeps the last turn's)
        self.cards = {}

    def submit(self, data: Mapping[str, Any], seq: int) -> None:
        if self.turn is not None:
            raise JournalError(f"journal entry {seq} starts a turn while another is live", seq=seq)
        limits_value = _need(data, "limits", dict, seq)
        try:
            limits = TurnLimits(**limits_value)
        except (TypeError, ValueError):
            raise JournalError(f"journal entry {seq} has invalid limits", seq=seq) from None
        turn_id = _need(data, "turn_id", str, seq)
        self.turn = TurnState.idle()
        self.turn_count += 1
        self.advanced_ms = 0
        self.feed(
            Submit(
                turn_id=turn_id,
                text=_need(data, "text", str, seq),
                base_messages=self.messages,
                tool_set=self.registry,
                limits=limits,
                now_ms=_need(data, "now_ms", int, seq),
            ),
            seq,
        )

    def settled(self, data: Mapping[str, Any], seq: int) -> None:
        call_id = _need(data, "call_id", str, seq)
        ok = data.get("ok")
        result = _text_or_none(data, "result", seq)
        changed = data.get("changed_document")
        if type(ok) is not bool or type(changed) is not bool:
            raise JournalError(f"journal entry {seq} is a settlement without ok and changed_document", seq=seq)
        call = None if self.turn is None else self.turn.call(call_id)
        if changed and ok and result is not None and call is not None and call.status is CallStatus.RUNNING:
            turn_id = self.turn.turn_id if self.turn is not None else ""
            top = self.undo.top
            if top is None or top.turn_id != turn_id:
                assert self.document is not None
                self.undo = self.undo.push(UndoEntry(turn_id=turn_id, document=self.document))
            self.document = _document(self.load, data.get("document"), seq)
        outcome: ToolOutcome[Any] = (
            ToolOutcome(ok=ok, result=result) if result is not None else ToolOutcome(ok=False, result=None)  # type: ignore[arg-type]
        )
        self.feed(
            CallSettled(
                call_id=call_id, outcome=outcome, now_ms=_need(data, "now_ms", int, seq), changed_document=changed
            ),
            seq,
        )

    def undo_turn(self, turn_id: str, seq: int) -> None:
        assert self.document is not None
        undone = undo_step(self.undo, self.document)
        if undone is None or undone[2] != turn_id:
            raise JournalError(f"journal entry {seq} undoes a turn that cannot be undone", seq=seq)
        self.document, self.undo, _ = undone
        if self.state is not None and turn_id == self.last_turn_id:
            self.state = reduce_turn(self.state, UndoTurn())

    def redo_turn(self, turn_id: str, seq: int) -> None:
        assert self.document is not None
        redone = redo_step(self.undo, self.document)
        if redone is None or redone[2] != turn_id:
            raise JournalError(f"journal entry {seq} redoes a turn that was not undone", seq=seq)
        self.document, self.undo, _ = redone

    def result(self, last_seq: int, last_hash: str, replayed: int) -> Replayed[D]:
        assert self.document is not None
        return Replayed(
            messages=self.messages,
            document=self.document,
            undo=self.undo,
            last_turn_id=self.last_turn_id,
            turn_count=self.turn_count,
            model=self.model,
            live=self.turn,
            state=self.state,
            suspended_machine_ms=self.machine_ms,
            suspended_review_ms=self.review_ms,
            advanced_machine_ms=self.advanced_ms,
            card_digests=dict(self.cards),
            last_seq=last_seq,
            last_hash=last_hash,
            replayed=replayed,
        )


def recovery_inputs(live: TurnState, card_digests: Mapping[str, str], *, now_ms: int) -> list[TurnInput]:
    """What a reopened live turn takes first, before anything runs: each call that was ``running`` settles
    failed as interrupted (never run again); each undecided or approved call whose re-prepared digest is
    not the one its card showed is revoked; a turn that was waiting for the model asks again, as a retry."""
    inputs: list[TurnInput] = []
    for call in live.current_calls:
        if call.status is CallStatus.RUNNING:
            outcome: ToolOutcome[Any] = ToolOutcome.failure(INTERRUPTED_CALL_TEXT)
            inputs.append(CallSettled(call_id=call.id, outcome=outcome, now_ms=now_ms))
        elif call.status in (CallStatus.PENDING, CallStatus.APPROVED):
            shown = card_digests.get(call.id)
            if shown is not None and shown != call.input_digest:
                detail = (
                    f"the card showed digest {shown[:12]}, the tool now prepares {call.input_digest[:12] or 'nothing'}"
                )
                inputs.append(Revoke(call_id=call.id, detail=detail))
    interrupted = StreamError(code="transport", message="The session was interrupted while the model was answering.")
    if live.phase is Phase.REQUESTING and live.budget.retries_used < live.limits.max_retries_per_turn:
        # Counted as a retry while the budget allows; past it the request is still asked again (the turn
        # cannot go on otherwise), uncounted.
        inputs.append(Retry(now_ms=now_ms, failure=interrupted, wait_ms=0))
    elif live.phase is Phase.STREAMING:
        # Not written by a live session (a response is journaled whole, once it ended); a journal that ends
        # mid-response all the same ends its turn as failed rather than waiting on a stream that is gone.
        inputs.append(interrupted)
    return inputs


def decode_entries(stored: Iterable[StoredEntry]) -> list[JournalEntry]:
    """Decode stored entries, checking each one's number against the store's."""
    decoded = []
    for item in stored:
        entry = decode_entry(item.data)
        if entry.seq != item.seq:
            raise JournalError(f"journal entry stored as {item.seq} says it is {entry.seq}", seq=item.seq)
        decoded.append(entry)
    return decoded
