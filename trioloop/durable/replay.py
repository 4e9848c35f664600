"""Reading a journal back: `replay_journal` folds its entries through the same `reduce_turn` the live session
used and gives the state it had, field for field; `replay_settled` folds every turn a journal holds and gives the
session after each one settled (the points a fork starts from). What a reopened turn must do first is
`trioloop.durable.recovery`'s (`recovery_inputs`, re-exported here)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import partial
from typing import Any, Generic, TypeVar, final

import attrs

from trioloop.durable.document_form import TEXT_FORM, DocumentCodec, DocumentFormError
from trioloop.durable.journal import GENESIS, JournalEntry, JournalError, document_digest, verify_chain
from trioloop.durable.journal_scan import replay_start, settled_snapshot, tools_used
from trioloop.durable.recovery import INTERRUPTED_CALL_TEXT, recovery_inputs
from trioloop.durable.session_file import (
    SessionFileError,
    SessionSnapshot,
    session_from_json,
    session_rules_from_json,
)
from trioloop.durable.spend_json import limits_from_json, spending_from_json
from trioloop.machine.answers import AnswerChecked, AnswerSpec
from trioloop.machine.conditions import RuleError
from trioloop.machine.inputs import (
    Advance,
    ApproveBatch,
    ApproveCall,
    BeforeRequest,
    CallSettled,
    Cancel,
    DenyCall,
    ForgetRule,
    Retry,
    Revoke,
    StartCall,
    Submit,
    TurnInput,
    UndoTurn,
)
from trioloop.machine.reducer import reduce_turn
from trioloop.machine.rules import SESSION_SOURCE, Always, ApprovalRule, CodeVerdict, RuleSet
from trioloop.machine.state import CallStatus, TurnState
from trioloop.machine.tools import ToolOutcome, ToolRegistry
from trioloop.machine.transaction import UndoEntry, UndoHistory, redo_step, undo_step
from trioloop.protocol.events import StreamError, StreamEvent, Usage, usage_sum
from trioloop.protocol.serialization import SerializationError, event_from_json

__all__ = [
    "INTERRUPTED_CALL_TEXT",
    "Replayed",
    "recovery_inputs",
    "replay_journal",
    "replay_settled",
    "replay_start",
    "tools_used",
]

D = TypeVar("D")
T = TypeVar("T")


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
    #: The document kind's name and the document's source, as the newest snapshot records them (None in a
    #: journal written before they were recorded).
    kind: str | None = None
    source: str | None = None
    #: The tokens every settled turn used (the snapshot's count, then each turn replayed after it).
    usage: Usage = attrs.field(factory=Usage)
    #: The session's own approval rules as the journal leaves them (the live turn's, when one is live).
    rules: tuple[ApprovalRule, ...] = ()
    #: A last turn settled before the newest snapshot, with ``defer_settled``: its state, folded when called.
    settled_state: Callable[[], TurnState | None] | None = None


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


def _code_verdict(value: Mapping[str, Any], seq: int) -> CodeVerdict:
    try:
        return CodeVerdict.from_json(value)
    except (RuleError, ValueError):
        raise JournalError(f"journal entry {seq} holds a needs_approval verdict that is not valid", seq=seq) from None


def _answer(read: Callable[[Any], T], value: Any, seq: int) -> T:
    """A typed answer's spec (a turn's) or check (a final call's), as `AnswerSpec` / `AnswerChecked` read it."""
    try:
        return read(value)
    except ValueError as exc:
        raise JournalError(f"journal entry {seq} has an invalid typed answer: {exc}", seq=seq) from None


def _always(data: Mapping[str, Any], seq: int) -> Always | None:
    value = data.get("always")
    if value is None:
        return None
    if type(value) is not str or value not in ("input", "tool"):
        raise JournalError(f"journal entry {seq} has an invalid always", seq=seq)
    return Always(value)


def _remote(data: Mapping[str, Any], seq: int) -> tuple[str, str]:
    """A decision's digest seen and reviewer (empty for one made where the session runs)."""
    seen, reviewer = data.get("seen_digest", ""), data.get("reviewer", "")
    if type(seen) is not str or type(reviewer) is not str:
        raise JournalError(f"journal entry {seq} names its reviewer or digest seen wrongly", seq=seq)
    return seen, reviewer


def _document(codec: DocumentCodec[D], form: Any, text: Any, seq: int, digest: Any = None) -> D:
    if type(text) is not str:
        raise JournalError(f"journal entry {seq} lacks the committed document", seq=seq)
    if digest is not None and digest != document_digest(text):  # absent in journals written before it was recorded
        raise JournalError(f"journal entry {seq} holds a document whose digest is not the one it records", seq=seq)
    try:
        return codec.decode(form, text)
    except DocumentFormError as exc:
        raise JournalError(f"journal entry {seq} holds a document that does not load: {exc}", seq=seq) from None
    except Exception:
        raise JournalError(f"journal entry {seq} holds a document that does not load", seq=seq) from None


def replay_journal(
    entries: Sequence[JournalEntry],
    *,
    load_document: Callable[[str], D],
    registry: ToolRegistry[D],
    verify_from_genesis: bool = True,
    load_data: Callable[[Any], D] | None = None,
    defer_settled: bool = False,
) -> Replayed[D]:
    """Fold ``entries`` (a whole journal, or from a compaction on) into the session they record.

    The chain is verified first (from the genesis hash when the journal starts at entry 1), then the
    entries from the last snapshot before the last turn on go through `reduce_turn` as the live session fed them.
    Anything that does not verify or decode raises `JournalError` naming the entry; nothing runs. Documents journaled
    in their data form (`trioloop.durable.document_form`) are read with ``load_data`` (the kind's ``from_data``);
    a journal holding one is refused without it. With ``defer_settled``, a last turn that settled before the newest
    snapshot is not replayed: the session comes from that snapshot on, and ``settled_state`` folds the turn's state
    when asked (what a signed, verified journal's reopening does: its entries are the ones its writer folded).
    """
    if not entries:
        raise JournalError("the journal is empty")
    verify_chain(entries, first_prev=GENESIS if (entries[0].seq == 1 and verify_from_genesis) else None)
    start = replay_start(entries)
    later = settled_snapshot(entries, start) if defer_settled else None
    codec = DocumentCodec(_no_dump, load_document, None, load_data)
    first = start if later is None else later
    replayed = _fold(entries[first:], codec, registry).result(entries[-1].seq, entries[-1].hash, len(entries) - first)
    if later is None:
        return replayed
    return attrs.evolve(replayed, settled_state=partial(_fold_state, entries[start:], codec, registry))


def _fold(entries: Sequence[JournalEntry], codec: DocumentCodec[D], registry: ToolRegistry[D]) -> _Folder[D]:
    folder = _Folder(codec, registry)
    for entry in entries:
        folder.apply(entry)
    return folder


def _fold_state(entries: Sequence[JournalEntry], codec: DocumentCodec[Any], registry: ToolRegistry[Any]) -> Any:
    return _fold(entries, codec, registry).state


def replay_settled(
    entries: Sequence[JournalEntry],
    *,
    load_document: Callable[[str], D],
    registry: ToolRegistry[D],
    load_data: Callable[[Any], D] | None = None,
) -> Iterator[tuple[JournalEntry, Replayed[D]]]:
    """Fold every turn ``entries`` hold (from their first snapshot, not only the last turn as `replay_journal`
    does) and give the session as it stood at the first snapshot, then after each turn settled: the entry it
    settled at, and the session there (no live turn; ``last_seq`` and ``last_hash`` are that entry's). The chain is
    verified first; anything that does not verify or decode raises `JournalError` naming the entry."""
    if not entries:
        raise JournalError("the journal is empty")
    verify_chain(entries, first_prev=GENESIS if entries[0].seq == 1 else None)
    start = next((index for index, entry in enumerate(entries) if entry.kind == "snapshot"), None)
    if start is None:
        raise JournalError("the journal holds no session snapshot")
    folder = _Folder(DocumentCodec(_no_dump, load_document, None, load_data), registry)
    for count, entry in enumerate(entries[start:], 1):
        live = folder.turn
        folder.apply(entry)
        if count == 1 or (live is not None and folder.turn is None):
            yield entry, folder.result(entry.seq, entry.hash, count)


def _no_dump(document: Any) -> str:
    raise TypeError("replay never writes a document")


class _Folder(Generic[D]):
    def __init__(self, codec: DocumentCodec[D], registry: ToolRegistry[D]) -> None:
        self.codec = codec
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
        self.kind: str | None = None
        self.source: str | None = None
        self.usage = Usage()
        self.rules: tuple[ApprovalRule, ...] = ()

    def feed(self, item: TurnInput, seq: int) -> None:
        if self.turn is None:
            raise JournalError(f"journal entry {seq} belongs to no turn", seq=seq)
        self.turn = reduce_turn(self.turn, item)
        self.state = self.turn
        if self.turn.is_settled:
            self.messages = self.turn.messages
            self.last_turn_id = self.turn.turn_id
            self.usage = usage_sum(self.usage, self.turn.usage)
            self.rules = self.turn.rules.of_source(SESSION_SOURCE)
            self.turn = None
            self.cards = {}

    def apply(self, entry: JournalEntry) -> None:
        kind, data, seq = entry.kind, entry.data, entry.seq
        if kind == "seal":
            return  # proves who wrote what came before (`verify_journal`); nothing to replay
        if kind != "suspend":
            self.machine_ms = self.review_ms = None  # a suspension is over once anything else happened
        if kind == "snapshot":
            if self.snapshot is None:
                self.restore(entry)  # where replay starts
            else:
                # A later snapshot records what the fold already holds (and keeps no redo): only its names.
                self.turn, self.cards = None, {}
                self.names(entry.data.get("session"), seq)
        elif kind == "submit":
            self.submit(data, seq)
        elif kind == "stream":
            events = _need(data, "events", list, seq)
            for value in events:
                if type(value) is dict and value.get("type") == "code_verdict":
                    self.feed(_code_verdict(value, seq), seq)
                elif type(value) is dict and value.get("type") == "answer_check":
                    self.feed(_answer(AnswerChecked.from_json, value, seq), seq)
                else:
                    self.feed(_event(value, seq), seq)
            for card in data.get("cards") or ():
                if type(card) is dict and type(card.get("call_id")) is str and type(card.get("digest")) is str:
                    self.cards[card["call_id"]] = card["digest"]
        elif kind == "approve":
            edited = data.get("edited_input")
            if edited is not None and type(edited) is not dict:
                raise JournalError(f"journal entry {seq} has an invalid edited input", seq=seq)
            call_id = _need(data, "call_id", str, seq)
            seen, reviewer = _remote(data, seq)
            self.feed(
                ApproveCall(
                    call_id=call_id, edited_input=edited, always=_always(data, seq), seen_digest=seen, reviewer=reviewer
                ),
                seq,
            )
            card = data.get("card")
            if edited is not None and type(card) is dict and type(card.get("digest")) is str:
                self.cards[call_id] = card["digest"]
        elif kind == "approve_batch":
            ids = _need(data, "call_ids", list, seq)
            if not all(type(i) is str for i in ids):
                raise JournalError(f"journal entry {seq} has an invalid call id", seq=seq)
            self.feed(ApproveBatch(call_ids=tuple(ids)), seq)
        elif kind == "deny":
            call_id, reason = _need(data, "call_id", str, seq), _need(data, "reason", str, seq)
            seen, reviewer = _remote(data, seq)
            deny = DenyCall(
                call_id=call_id, reason=reason, always=_always(data, seq), seen_digest=seen, reviewer=reviewer
            )
            self.feed(deny, seq)
        elif kind == "forget":
            self.feed(ForgetRule(number=_need(data, "number", int, seq)), seq)
        elif kind == "rules":
            if self.turn is not None:
                raise JournalError(f"journal entry {seq} changes the session's rules while a turn is live", seq=seq)
            self.rules = session_rules_from_json(data.get("rules"), partial(JournalError, seq=seq))
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
        elif kind == "before_request":
            tokens = (_need(data, "input_tokens", int, seq), _need(data, "output_tokens", int, seq))
            if min(tokens) < 0:
                raise JournalError(f"journal entry {seq} has a negative token count", seq=seq)
            self.feed(BeforeRequest(input_tokens=tokens[0], output_tokens=tokens[1]), seq)
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
            decode = self.codec.decode
            session = entry.data.get("session")
            snapshot = session_from_json(session, load_document=partial(decode, TEXT_FORM), decode_document=decode)
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
        self.kind, self.source = snapshot.kind, snapshot.source
        self.usage = snapshot.usage
        self.rules = snapshot.rules
        self.turn = None  # a snapshot is written only between turns (``state`` keeps the last turn's)
        self.cards = {}

    def names(self, session: Any, seq: int) -> None:
        """The kind and source a later snapshot records (an app may move its document)."""
        if type(session) is not dict:
            raise JournalError(f"journal entry {seq} holds a session that is not valid", seq=seq)
        kind, source = session.get("kind"), session.get("source")
        if not all(v is None or type(v) is str for v in (kind, source)):
            raise JournalError(f"journal entry {seq} names its document's kind or source wrongly", seq=seq)
        self.kind, self.source = kind, source

    def submit(self, data: Mapping[str, Any], seq: int) -> None:
        if self.turn is not None:
            raise JournalError(f"journal entry {seq} starts a turn while another is live", seq=seq)
        limits_value = _need(data, "limits", dict, seq)
        try:
            limits = limits_from_json(limits_value)
            spending = spending_from_json(data.get("spending"))
        except (TypeError, ValueError):
            raise JournalError(f"journal entry {seq} has invalid limits", seq=seq) from None
        turn_id = _need(data, "turn_id", str, seq)
        try:
            rules = RuleSet.from_json(data.get("rules", []))
        except RuleError as exc:
            raise JournalError(f"journal entry {seq} has invalid rules: {exc}", seq=seq) from None
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
                spending=spending,
                rules=rules,
                answer=None if data.get("answer") is None else _answer(AnswerSpec.from_json, data["answer"], seq),
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
            form = data.get("document_form", TEXT_FORM)
            self.document = _document(self.codec, form, data.get("document"), seq, data.get("document_digest"))
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
            kind=self.kind,
            source=self.source,
            usage=self.usage,
            rules=self.rules if self.turn is None else self.turn.rules.of_source(SESSION_SOURCE),
        )
