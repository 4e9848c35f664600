"""Writing a live session's journal: each input the reducer took becomes an entry, numbered and chained, and
is handed over in batches ready to append, each batch ending with a ``seal`` that signs its head (see
`trioloop.durable.journal` for the format and `trioloop.durable.signing` for the keys)."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, Final

from trioloop.durable.document_form import DATA_FORM, TEXT_FORM, DocumentCodec
from trioloop.durable.journal import document_digest, encode_entry, entry_hash
from trioloop.durable.session_file import SessionSnapshot, session_to_json
from trioloop.durable.signing import SEAL_VERSION, JournalSigner, head_message
from trioloop.durable.spend_json import limits_to_json, spending_to_json
from trioloop.durable.store import StoredEntry
from trioloop.machine.answers import AnswerChecked
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
from trioloop.machine.limits import NO_SPENDING, TurnLimits
from trioloop.machine.preview import preview_call
from trioloop.machine.rules import CodeVerdict, DeciderKind
from trioloop.machine.state import CallRecord, CallStatus, TurnState
from trioloop.protocol.events import TextDelta, is_terminal
from trioloop.protocol.serialization import event_to_json

__all__ = ["JournalWriter", "call_card"]

#: The deciders a stream entry names (the person's decisions have entries of their own).
_AUTOMATIC: Final = frozenset({DeciderKind.RULE, DeciderKind.CODE})
#: Documents a writer keeps in text form (the live one, the undo history's, a few more).
_DUMP_CACHE: Final = 64


def _no_load(text: str) -> Any:
    raise TypeError("a JournalWriter never reads a document back")


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


def _limits_json(limits: TurnLimits) -> dict[str, Any]:
    return limits_to_json(limits)


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


#: A card's preview is journaled up to this many lines of this many characters (a face shows "... more").
PREVIEW_LINES: Final = 400
PREVIEW_LINE_CHARS: Final = 2000


def shown_card(call: CallRecord, document: Any) -> dict[str, Any]:
    """`call_card` and what else the person's card shows: the dry run's preview on ``document`` (lines, capped)
    and, for a call a rule or a function sent to review, who asked."""
    card = call_card(call)
    preview = None if call.prepared is None else preview_call(call.prepared, document)
    if preview is not None:
        lines = preview.lines()
        card["preview"] = [line[:PREVIEW_LINE_CHARS] for line in lines[:PREVIEW_LINES]]
        if len(lines) > PREVIEW_LINES:
            card["preview"].append(f"... {len(lines) - PREVIEW_LINES} more lines")
    if call.decided_by is not None:
        card["asked_by"] = call.decided_by.describe()
    return card


class JournalWriter:
    """Turns the inputs a live turn takes into journal entries, numbered and chained, ready to append.

    `note` is called with each input the reducer took and the states around it; it never blocks. Stream
    events are held (consecutive text deltas joined) until the response ends, then written as one entry.
    `take` hands over what is ready; the caller appends it to the store and must not publish the state
    or start a call before that append returned.
    """

    def __init__(
        self,
        *,
        last_seq: int,
        last_hash: str,
        dump_document: Callable[[Any], str] | None = None,
        codec: DocumentCodec[Any] | None = None,
        clock: Callable[[], int] = _wall_ms,
        session_id: str = "",
        signer: JournalSigner | None = None,
        compact: bool = False,
        last_seal: bytes | None = None,
        journal_id: str = "",
        forked_from: Mapping[str, Any] | None = None,
    ) -> None:
        self._seq = last_seq
        self._prev = last_hash
        self._session_id = session_id
        self._signer = signer
        self._compact = compact
        self._last_seal = last_seal  # the last seal's bytes: a snapshot that follows it names it
        self._journal_id = journal_id  # which journal this is, whatever store it is in (a witness's key)
        self._forked_from = None if forked_from is None else dict(forked_from)  # a fork's origin, in every snapshot
        if codec is None:
            if dump_document is None:
                raise TypeError("a JournalWriter needs dump_document or codec")
            codec = DocumentCodec(dump_document, _no_load)
        self._codec = codec
        self._clock = clock
        self._ready: list[StoredEntry] = []
        # Documents already in their journal form, by identity (the runner never changes a live document in
        # place: a commit swaps in another object): a snapshot after a turn that only read, and the undo
        # history's documents, cost no second encoding. Most recent last; bounded.
        self._dumped: OrderedDict[int, tuple[Any, tuple[str, str]]] = OrderedDict()
        self._commit_pending = False
        self._submit_pending = False
        self._since_snapshot = 0  # bytes written since the last snapshot
        self._snapshot_size = 0
        self._events: list[dict[str, Any]] = []
        self._text: list[str] = []  # text deltas not yet joined into the last event
        self.actor = ""
        self._vouchers: dict[str, Mapping[str, Any]] = {}

    @property
    def signer(self) -> JournalSigner | None:
        """The key that seals this journal's batches (None: an unsigned journal)."""
        return self._signer

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
        """What is ready to append, as one batch; signed, it ends with a seal over its last entry."""
        if self._ready and self._signer is not None:
            self._seal(self._signer)
        ready, self._ready = self._ready, []
        self._commit_pending = self._submit_pending = False
        return ready

    def add(self, kind: str, data: Mapping[str, Any]) -> None:
        """Number, chain and encode one entry (the stream held so far goes first)."""
        if kind != "stream" and (self._events or self._text):
            self._flush_stream(None)
        self._append_entry(kind, data)
        if kind == "settled" and data.get("document") is not None:
            self._commit_pending = True
        elif kind == "submit":
            self._submit_pending = True

    def _append_entry(self, kind: str, data: Mapping[str, Any], at_ms: int | None = None) -> bytes:
        self._seq += 1
        raw = encode_entry(self._seq, kind, self._prev, self._clock() if at_ms is None else at_ms, data)
        self._prev = entry_hash(raw)
        self._ready.append(StoredEntry(self._seq, raw))
        if kind == "snapshot":
            self._since_snapshot, self._snapshot_size = 0, len(raw)
        else:
            self._since_snapshot += len(raw)
        return raw

    def _seal(self, signer: JournalSigner) -> None:
        """Sign the head: the session, the last entry's number and its hash, and the seal's own time (version 2:
        every byte of the seal but the signature is signed). A stream still held stays held."""
        at_ms = self._clock()
        message = head_message(self._session_id, self._seq, self._prev, at_ms)
        seal = {"session": self._session_id, "v": SEAL_VERSION, "key": signer.key_id, "sig": signer.sign(message)}
        self._last_seal = self._append_entry("seal", seal, at_ms)  # the head it signs is its own ``prev``

    @property
    def snapshot_due(self) -> bool:
        """Whether a session snapshot would pay for itself: once the entries since the last one weigh as much
        as it did, so snapshots cost at most what the rest of the journal does, and reopening replays at
        most about one snapshot's worth of entries."""
        return self._since_snapshot >= self._snapshot_size

    def dump(self, document: Any) -> tuple[str, str]:
        """``document``'s journal form and text (`DocumentCodec.encode`), from the cache when this very object
        was encoded before."""
        key = id(document)
        cached = self._dumped.get(key)
        if cached is not None and cached[0] is document:
            self._dumped.move_to_end(key)
            return cached[1]
        encoded = self._codec.encode(document)
        self._dumped[key] = (document, encoded)
        if len(self._dumped) > _DUMP_CACHE:
            self._dumped.popitem(last=False)
        return encoded

    def _flush_stream(self, state: TurnState | None, document: Any = None) -> None:
        self._join_text()
        events, self._events = self._events, []
        data: dict[str, Any] = {"events": events}
        if state is not None:
            # The cards a person reviews, whole (with the dry run's preview and who asked, for a face that reads
            # them from the journal); a call approved by the read-only policy is never shown, so only its digest is
            # kept (a resumed turn still refuses it if its tool changed).
            data["cards"] = [
                shown_card(c, document)
                if c.status is CallStatus.PENDING
                else {"call_id": c.id, "digest": c.input_digest}
                for c in state.current_calls
                if not c.is_terminal
            ]
            # Who decided each call no person reviewed (a rule, a needs_approval function), for the audit trail.
            decided = [
                {"call_id": c.id, "tool": c.tool_name, "digest": c.input_digest, "decided_by": c.decided_by.describe()}
                for c in state.current_calls
                if c.decided_by is not None and c.decided_by.kind in _AUTOMATIC
            ]
            if decided:
                data["decided"] = decided
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
        if cls is CodeVerdict or cls is AnswerChecked:  # held with the response it decides a call of: never asked again
            self._join_text()
            self._events.append(item.to_json())  # type: ignore[union-attr]
            return
        if cls not in _COMMANDS:
            self._join_text()
            self._events.append(event_to_json(item))  # type: ignore[arg-type]
            if is_terminal(item):  # type: ignore[arg-type]
                self._flush_stream(new, document)
            return
        self._command(item, old, new, document)

    def vouch(self, call_id: str, record: Mapping[str, Any]) -> None:
        """The signed decision record (`trioloop.durable.decisions`) the next decision on ``call_id`` came from: its
        journal entry keeps it, so the audit proves who decided again."""
        self._vouchers[call_id] = record

    def _remote(self, call_id: str, reviewer: str, seen_digest: str) -> dict[str, Any]:
        """A decision's fields beyond the terminal's: the named reviewer, the digest seen, the signed record."""
        fields: dict[str, Any] = {}
        if reviewer:
            fields["reviewer"] = reviewer
        if seen_digest:
            fields["seen_digest"] = seen_digest
        record = self._vouchers.pop(call_id, None)
        if record is not None:
            fields["decision"] = record
        return fields

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
                    **({} if item.spending == NO_SPENDING else {"spending": spending_to_json(item.spending)}),
                    "rules": item.rules.to_json(),
                    **({} if item.answer is None else {"answer": item.answer.to_json()}),
                },
            )
        elif isinstance(item, BeforeRequest):  # journaled only when it bounded the turn (else nothing changed)
            self.add("before_request", {"input_tokens": item.input_tokens, "output_tokens": item.output_tokens})
        elif isinstance(item, ApproveCall):
            call = new.call(item.call_id)
            self.add(
                "approve",
                {
                    "call_id": item.call_id,
                    "edited_input": item.edited_input,
                    "by": item.reviewer or by,
                    "card": None if call is None else call_card(call),
                    "edits": [] if call is None else [list(e) for e in call.edits],
                    "always": None if item.always is None else item.always.value,
                    **self._remote(item.call_id, item.reviewer, item.seen_digest),
                },
            )
        elif isinstance(item, ApproveBatch):
            cards = [call_card(c) for c in map(new.call, item.call_ids) if c is not None]
            self.add("approve_batch", {"call_ids": list(item.call_ids), "by": by, "cards": cards})
        elif isinstance(item, DenyCall):
            call = old.call(item.call_id)
            card = None if call is None else call_card(call)
            always = None if item.always is None else item.always.value
            self.add(
                "deny",
                {
                    "call_id": item.call_id,
                    "reason": item.reason,
                    "by": item.reviewer or by,
                    "card": card,
                    "always": always,
                    **self._remote(item.call_id, item.reviewer, item.seen_digest),
                },
            )
        elif isinstance(item, ForgetRule):
            self.add("forget", {"number": item.number, "by": by})
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
            form, dumped = self.dump(document) if committed else (TEXT_FORM, None)
            self.add(
                "settled",
                {
                    "call_id": item.call_id,
                    "ok": outcome.ok if text else False,
                    "result": outcome.result if text else None,
                    "changed_document": bool(item.changed_document),
                    "now_ms": item.now_ms,
                    "document": dumped,
                    "document_digest": None if dumped is None else document_digest(dumped),
                    **({} if form == TEXT_FORM else {"document_form": form}),
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
        """The whole session: written first, then after every settled turn and every undo.

        A snapshot starts a batch of its own (what is ready before it is sealed first), and names what it
        follows: the seal before it (``after``, its exact text), so a journal compacted to start at this
        snapshot still accounts for the signed head of what was discarded, and whether the journal may be
        compacted at all (``compact``: a journal that starts at a snapshot saying no was cut, not compacted); a fork's
        snapshots also name where it came from (``forked_from``: the source session, journal, entry and head), so
        compaction keeps that too."""
        if self._ready and self._signer is not None:
            self._seal(self._signer)
        seal = self._last_seal
        after = seal.decode("ascii") if seal is not None and entry_hash(seal) == self._prev else None
        data = {
            "session": self._session_json(snapshot),
            "journal": self._journal_id,
            "compact": self._compact,
            "after": after,
        }
        if self._forked_from is not None:
            data["forked_from"] = self._forked_from
        self.add("snapshot", data)

    def _session_json(self, snapshot: SessionSnapshot[Any]) -> dict[str, Any]:
        """The snapshot's session, its documents all in one form: the data form when every one has it."""
        documents = [snapshot.document, *(record.document for record in snapshot.undo)]
        encoded = {id(document): self.dump(document) for document in documents}
        if all(form == DATA_FORM for form, _ in encoded.values()):
            return session_to_json(snapshot, dump_document=lambda d: encoded[id(d)][1], document_form=DATA_FORM)
        texts: dict[int, str] = {}
        for document in documents:
            form, value = encoded[id(document)]
            texts[id(document)] = value if form == TEXT_FORM else self._codec.encode_text(document)
        return session_to_json(snapshot, dump_document=lambda d: texts[id(d)])


_COMMANDS: Final[frozenset[type]] = frozenset(
    {
        Submit,
        ApproveCall,
        ApproveBatch,
        DenyCall,
        StartCall,
        CallSettled,
        Advance,
        Retry,
        Cancel,
        Revoke,
        UndoTurn,
        ForgetRule,
        BeforeRequest,
    }
)
