"""Reviews as data: a turn's waiting cards as one signed JSON document, and the decisions on them as another.

A review can leave the process that holds the session as text (a queue message, a ticket, a chat message) and its
decisions can come back the same way, later, maybe to another process. Two documents carry them:

- The **review document** (`ReviewDocument`, made by `Session.pending_review`): the session and turn, the journal
  head it was read at, the person's request, the model's text before its calls, and each waiting card (call id,
  tool, effect, destructive marker, the canonical input, its digest, every input field the digest covers, the dry
  run's preview, who asked for the review), signed with the session's journal key. `open_review_document` proves
  one (size cap before parsing, canonical form, exact fields, version, signature, expiry); it decides nothing.
- The **decisions document** (`seal_decisions`): a list of decision records (`trioloop.durable.decisions`), each
  one signed on its own by a key the session must accept, and each bound to one card's session, turn, call and
  digest. `read_decisions` takes it apart (size cap before parsing, canonical form, exact fields, version); the
  session proves every record against its live turn (`Session.apply_decisions`).

Both are canonical JSON (`canonical_json`): any change to a byte of a signed document is refused, never read
another way. See ``docs/howto/review-data.md`` for the schema.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, Final, Literal, final

import attrs

from trioloop.durable.bounded_json import parse_bounded_json
from trioloop.durable.decisions import MAX_DECISION_BYTES, ReviewDecision, seal_decision
from trioloop.durable.journal_writer import shown_card
from trioloop.durable.signing import JournalKeys, JournalSigner
from trioloop.machine.calls import CallRecord, CallStatus
from trioloop.machine.canonical import canonical_json
from trioloop.machine.state import TurnState
from trioloop.protocol.messages import Message, TextBlock

__all__ = [
    "DECISIONS_DOCUMENT_VERSION",
    "MAX_DECISIONS_DOCUMENT_BYTES",
    "MAX_DECISIONS_PER_DOCUMENT",
    "MAX_REVIEW_DOCUMENT_BYTES",
    "REVIEW_DOCUMENT_VERSION",
    "ReviewCard",
    "ReviewDocument",
    "ReviewDocumentError",
    "open_review_document",
    "read_decisions",
    "review_document_of",
    "seal_decisions",
    "seal_review_document",
]

REVIEW_DOCUMENT_VERSION: Final = 1
"""The review document's format version (its ``trioloop_review`` field): another version is refused."""
DECISIONS_DOCUMENT_VERSION: Final = 1
"""The decisions document's format version (its ``trioloop_decisions`` field)."""
MAX_REVIEW_DOCUMENT_BYTES: Final = 4 * 1024 * 1024
"""Largest review document made or read: judged before it is parsed."""
MAX_DECISIONS_DOCUMENT_BYTES: Final = 16 * MAX_DECISION_BYTES
"""Largest decisions document read: judged before it is parsed."""
MAX_DECISIONS_PER_DOCUMENT: Final = 64
"""Most records in one decisions document."""
_DOMAIN: Final = b"trioloop review document v1\x00"
_PREVIEW_LINES: Final = 200
_PREVIEW_CHARS: Final = 1000
_TEXT_CHARS: Final = 100_000
_DEPTH: Final = 96
_DOCUMENT_FIELDS: Final = frozenset(
    {
        "trioloop_review",
        "session_id",
        "turn_id",
        "head",
        "request",
        "model_text",
        "suspended",
        "exported_at",
        "expires_at",
        "cards",
        "key_id",
        "signature",
    }
)
_CARD_FIELDS: Final = frozenset(
    {"call_id", "tool", "summary", "effect", "destructive", "input", "digest", "details", "preview", "asked_by"}
)


class ReviewDocumentError(ValueError):
    """A review or decisions document that is not one: too large, not canonical JSON of exactly its fields, of
    another version, signed by a key not accepted, a signature that does not verify, expired; or no review to
    export. The message says which."""


def _text(value: str, limit: int = _TEXT_CHARS) -> str:
    """``value`` capped, as UTF-8 can carry it (a lone surrogate becomes U+FFFD)."""
    value = value[:limit]
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        value = value.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    return value


def _plain(value: Any) -> Any:
    """A JSON value with every string as UTF-8 can carry it."""
    if type(value) is str:
        return _text(value, len(value))
    if type(value) is list or type(value) is tuple:
        return [_plain(item) for item in value]
    if type(value) is dict:
        return {_text(key, len(key)): _plain(item) for key, item in value.items()}
    return value


@final
@attrs.frozen(kw_only=True)
class ReviewCard:
    """One waiting card of a review document (see the module docstring)."""

    call_id: str
    tool: str
    summary: str
    effect: str
    destructive: bool
    #: The input as its digest covers it (plain JSON values), or None when the tool does not give it.
    input: Any
    #: The digest a decision must name (`CallRecord.input_digest`).
    digest: str
    #: Every input field the digest covers: (path, value) lines, in order.
    details: tuple[tuple[str, str], ...] = ()
    #: The dry run's preview lines (empty when the tool has none).
    preview: tuple[str, ...] = ()
    #: Who sent the call to review (a rule, a function), when not simply the policy.
    asked_by: str = ""

    @property
    def rule_options(self) -> tuple[str, ...]:
        """The "always" options a decision may carry: none to approve a destructive call."""
        return ("deny:tool",) if self.destructive else ("approve:tool", "approve:input", "deny:tool")

    def to_json(self) -> dict[str, Any]:
        return {
            "call_id": self.call_id,
            "tool": self.tool,
            "summary": self.summary,
            "effect": self.effect,
            "destructive": self.destructive,
            "input": self.input,
            "digest": self.digest,
            "details": [[path, value] for path, value in self.details],
            "preview": list(self.preview),
            "asked_by": self.asked_by,
        }


@final
@attrs.frozen(kw_only=True)
class ReviewDocument:
    """A turn's waiting review, signed with the session's journal key (see the module docstring)."""

    session_id: str
    turn_id: str
    #: The journal's last entry when the review was read: its number and hash.
    head_seq: int
    head_hash: str
    #: The person's request that started the turn, and what the model wrote before its calls.
    request: str
    model_text: str
    #: True when the turn was suspended (no process drives it until `continue_turn`).
    suspended: bool
    cards: tuple[ReviewCard, ...]
    #: When it was made and (optionally) when it stops being offered (wall clock, unix ms).
    exported_at: int
    expires_at: int | None = None
    key_id: str
    signature: str

    def fields(self) -> dict[str, Any]:
        """The signed fields (all but ``signature``), as JSON values."""
        return {
            "trioloop_review": REVIEW_DOCUMENT_VERSION,
            "session_id": self.session_id,
            "turn_id": self.turn_id,
            "head": {"seq": self.head_seq, "hash": self.head_hash},
            "request": self.request,
            "model_text": self.model_text,
            "suspended": self.suspended,
            "exported_at": self.exported_at,
            "expires_at": self.expires_at,
            "cards": [card.to_json() for card in self.cards],
            "key_id": self.key_id,
        }

    def to_json(self) -> str:
        """The document as canonical JSON text: what goes into the queue, the ticket or the message."""
        return canonical_json({**self.fields(), "signature": self.signature})

    def card(self, call_id: str) -> ReviewCard:
        """The card of ``call_id`` (KeyError when the document has none)."""
        for card in self.cards:
            if card.call_id == call_id:
                return card
        raise KeyError(call_id)

    def decision(
        self,
        call_id: str,
        action: Literal["approve", "deny"],
        *,
        reviewer: str,
        reviewer_name: str = "",
        edited_input: dict[str, Any] | None = None,
        reason: str = "",
        always: Literal["tool", "input"] | None = None,
        at: int = 0,
    ) -> ReviewDecision:
        """A reviewer's decision on card ``call_id`` as this document showed it: bound to its session, turn and
        digest (seal it with `seal_decisions`)."""
        card = self.card(call_id)
        return ReviewDecision(
            session_id=self.session_id,
            turn_id=self.turn_id,
            call_id=call_id,
            digest=card.digest,
            action=action,
            edited_input=edited_input,
            reason=reason,
            always=always,
            reviewer=reviewer,
            reviewer_name=reviewer_name,
            at=at,
        )


def _message(fields: Mapping[str, Any]) -> bytes:
    return _DOMAIN + canonical_json(fields).encode("utf-8")


def _blocks_text(message: Message | None) -> str:
    if message is None:
        return ""
    return "".join(block.text for block in message.content if isinstance(block, TextBlock))


def _card_of(call: CallRecord, document: Any) -> ReviewCard:
    shown = shown_card(call, document)
    preview = [_text(line, _PREVIEW_CHARS) for line in shown.get("preview", ())[:_PREVIEW_LINES]]
    canonical = None if call.prepared is None else call.prepared.canonical
    return ReviewCard(
        call_id=_text(call.id),
        tool=_text(call.tool_name),
        summary=_text(call.summary),
        effect=_text(str(call.effect)),
        destructive=call.destructive,
        input=_plain(canonical),
        digest=call.input_digest,
        details=tuple((_text(path), _text(value)) for path, value in shown["details"]),
        preview=tuple(preview),
        asked_by=_text(shown.get("asked_by", "")),
    )


def review_document_of(
    state: TurnState,
    *,
    document: Any,
    session_id: str,
    head: tuple[int, str],
    suspended: bool,
    signer: JournalSigner,
    now_ms: int,
    expires_at: int | None = None,
) -> ReviewDocument:
    """The review document of ``state``'s waiting cards (those still pending in its current iteration), previews
    shown on ``document``, signed by ``signer``. `ReviewDocumentError` when no card waits, or the document would
    be over `MAX_REVIEW_DOCUMENT_BYTES`."""
    waiting = [call for call in state.current_calls if call.status is CallStatus.PENDING]
    if state.is_settled or not waiting:
        raise ReviewDocumentError("no card of this session's turn waits for a decision")
    turn = state.turn_messages
    request = next((m for m in turn if m.role == "user"), None)
    answer = next((m for m in reversed(turn) if m.role == "assistant"), None)
    unsigned = ReviewDocument(
        session_id=_text(session_id),
        turn_id=_text(state.turn_id),
        head_seq=head[0],
        head_hash=head[1],
        request=_text(_blocks_text(request)),
        model_text=_text(_blocks_text(answer)),
        suspended=suspended,
        cards=tuple(_card_of(call, document) for call in waiting),
        exported_at=now_ms,
        expires_at=expires_at,
        key_id=signer.key_id,
        signature="",
    )
    return seal_review_document(unsigned, signer)


def seal_review_document(document: ReviewDocument, signer: JournalSigner) -> ReviewDocument:
    """``document`` signed by ``signer`` (its ``key_id`` and ``signature`` replaced); `ReviewDocumentError` when
    its text would be over `MAX_REVIEW_DOCUMENT_BYTES`. `review_document_of` makes and seals one."""
    unsigned = attrs.evolve(document, key_id=signer.key_id, signature="")
    signed = attrs.evolve(unsigned, signature=signer.sign(_message(unsigned.fields())))
    size = len(signed.to_json().encode("utf-8"))
    if size > MAX_REVIEW_DOCUMENT_BYTES:
        raise ReviewDocumentError(f"the review is {size} bytes, over the {MAX_REVIEW_DOCUMENT_BYTES}-byte cap")
    return signed


def _raw(data: bytes | bytearray | str, cap: int, what: str) -> bytes:
    """``data`` as bytes, judged against ``cap`` before anything else is done with it."""
    if isinstance(data, str):
        if len(data) > cap:  # each character is at least one byte
            raise ReviewDocumentError(f"{what} of {len(data)} characters is over the {cap}-byte cap")
        try:
            data = data.encode("utf-8")
        except UnicodeEncodeError:
            raise ReviewDocumentError(f"{what} that is not UTF-8 text") from None
    if len(data) > cap:
        raise ReviewDocumentError(f"{what} of {len(data)} bytes is over the {cap}-byte cap")
    return bytes(data)


def _canonical_object(raw: bytes, cap: int, what: str) -> dict[str, Any]:
    value = parse_bounded_json(raw, max_bytes=cap, max_depth=_DEPTH, error=ReviewDocumentError, subject=what)
    if type(value) is not dict:
        raise ReviewDocumentError(f"{what} that is not a JSON object")
    if canonical_json(value).encode("utf-8") != raw:
        raise ReviewDocumentError(f"{what} that is not in canonical form")
    return value


def _lines(value: object, width: int) -> bool:
    """Whether ``value`` is a list of text lines (``width`` 1) or of [text, text] pairs (``width`` 2)."""
    if type(value) is not list:
        return False
    if width == 1:
        return all(type(line) is str for line in value)
    return all(type(line) is list and len(line) == 2 and all(type(p) is str for p in line) for line in value)


def _card_from(value: object) -> ReviewCard:
    if not isinstance(value, dict) or set(value) != _CARD_FIELDS:
        raise ReviewDocumentError("a card that does not have exactly the fields of a card")
    texts = ("call_id", "tool", "summary", "effect", "digest", "asked_by")
    if not all(type(value[name]) is str for name in texts) or type(value["destructive"]) is not bool:
        raise ReviewDocumentError("a card with a field of the wrong type")
    if not _lines(value["details"], 2) or not _lines(value["preview"], 1):
        raise ReviewDocumentError("a card whose details or preview are not lines of text")
    return ReviewCard(
        call_id=value["call_id"],
        tool=value["tool"],
        summary=value["summary"],
        effect=value["effect"],
        destructive=value["destructive"],
        input=value["input"],
        digest=value["digest"],
        details=tuple((path, text) for path, text in value["details"]),
        preview=tuple(value["preview"]),
        asked_by=value["asked_by"],
    )


def open_review_document(
    data: bytes | bytearray | str, keys: JournalKeys | None, *, now_ms: int | None = None
) -> ReviewDocument:
    """The review document ``data`` proves; `ReviewDocumentError` for anything else: over
    `MAX_REVIEW_DOCUMENT_BYTES` (judged before parsing), not canonical JSON of exactly the document's fields, of
    another version, signed by a key not in ``keys`` (None or empty accepts none), a signature that does not
    verify, or (``now_ms`` given) expired. Reading one decides nothing: decisions go back as a decisions
    document."""
    what = "a review document"
    raw = _raw(data, MAX_REVIEW_DOCUMENT_BYTES, what)
    value = _canonical_object(raw, MAX_REVIEW_DOCUMENT_BYTES, what)
    if set(value) != _DOCUMENT_FIELDS:
        raise ReviewDocumentError("a review document that does not have exactly the fields of one")
    if value["trioloop_review"] != REVIEW_DOCUMENT_VERSION or type(value["trioloop_review"]) is not int:
        raise ReviewDocumentError(f"a review document of version {value['trioloop_review']!r}, not 1")
    key_id, signature = value.pop("key_id"), value.pop("signature")
    if type(key_id) is not str or type(signature) is not str:
        raise ReviewDocumentError("a review document's key id and signature must be text")
    if not keys or key_id not in keys.ids:
        raise ReviewDocumentError(f"a review document signed by key {key_id[:40]!r}, which is not accepted")
    if not keys.verify(key_id, _message({**value, "key_id": key_id}), signature):
        raise ReviewDocumentError(f"a review document whose signature by key {key_id} does not verify")
    head, cards = value["head"], value["cards"]
    texts = ("session_id", "turn_id", "request", "model_text")
    if (
        not all(type(value[name]) is str for name in texts)
        or type(value["suspended"]) is not bool
        or type(value["exported_at"]) is not int
        or not (value["expires_at"] is None or type(value["expires_at"]) is int)
        or not (type(head) is dict and set(head) == {"seq", "hash"})
        or type(head["seq"]) is not int
        or type(head["hash"]) is not str
        or type(cards) is not list
    ):
        raise ReviewDocumentError("a review document with a field of the wrong type")
    document = ReviewDocument(
        session_id=value["session_id"],
        turn_id=value["turn_id"],
        head_seq=head["seq"],
        head_hash=head["hash"],
        request=value["request"],
        model_text=value["model_text"],
        suspended=value["suspended"],
        cards=tuple(_card_from(card) for card in cards),
        exported_at=value["exported_at"],
        expires_at=value["expires_at"],
        key_id=key_id,
        signature=signature,
    )
    if now_ms is not None and document.expires_at is not None and now_ms > document.expires_at:
        raise ReviewDocumentError("a review document that has expired")
    return document


def seal_decisions(decisions: Iterable[ReviewDecision], signer: JournalSigner) -> str:
    """The decisions document of ``decisions``, each record sealed by ``signer`` (`seal_decision`): canonical JSON
    text, what goes back to the session (`Session.apply_decisions`)."""
    records = [json.loads(seal_decision(decision, signer)) for decision in decisions]
    if not records or len(records) > MAX_DECISIONS_PER_DOCUMENT:
        raise ReviewDocumentError(f"a decisions document holds 1 to {MAX_DECISIONS_PER_DOCUMENT} decisions")
    text = canonical_json({"trioloop_decisions": DECISIONS_DOCUMENT_VERSION, "decisions": records})
    if len(text.encode("utf-8")) > MAX_DECISIONS_DOCUMENT_BYTES:
        raise ReviewDocumentError(f"the decisions are over the {MAX_DECISIONS_DOCUMENT_BYTES}-byte cap")
    return text


def read_decisions(data: bytes | bytearray | str) -> tuple[bytes, ...]:
    """The decision records of a decisions document, each as the canonical bytes `open_decision` proves; nothing
    is proven here. `ReviewDocumentError` for a document over `MAX_DECISIONS_DOCUMENT_BYTES` (judged before
    parsing), not canonical JSON of exactly its fields, of another version, with no record, more than
    `MAX_DECISIONS_PER_DOCUMENT`, or one that is not a JSON object."""
    what = "a decisions document"
    raw = _raw(data, MAX_DECISIONS_DOCUMENT_BYTES, what)
    value = _canonical_object(raw, MAX_DECISIONS_DOCUMENT_BYTES, what)
    if set(value) != {"trioloop_decisions", "decisions"}:
        raise ReviewDocumentError("a decisions document that does not have exactly the fields of one")
    version, records = value["trioloop_decisions"], value["decisions"]
    if type(version) is not int or version != DECISIONS_DOCUMENT_VERSION:
        raise ReviewDocumentError(f"a decisions document of version {version!r}, not 1")
    if type(records) is not list or not 0 < len(records) <= MAX_DECISIONS_PER_DOCUMENT:
        raise ReviewDocumentError(f"a decisions document holds a list of 1 to {MAX_DECISIONS_PER_DOCUMENT} records")
    if not all(type(record) is dict for record in records):
        raise ReviewDocumentError("a decisions document whose records are not all JSON objects")
    return tuple(canonical_json(record).encode("utf-8") for record in records)
