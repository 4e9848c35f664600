"""A reviewer's decision made away from the process that holds the session: signed, bound, and proven on arrival.

The web inbox (`trioloop serve`) holds no session: it reads the cards from the journal and posts each decision to
the store's *decision box* (`DecisionBox`), one record per card. The process that holds the session (or the worker
that takes it up) reads the record, proves it, and only then feeds it to its turn as it would a click; its
journal entry then names the reviewer and keeps the signed record, so `trioloop audit` can prove it again.

A record is canonical JSON (`canonical_json`) of the decision's fields plus the signing key's id and an Ed25519
signature over those fields (domain-separated, so a journal seal can never pass for a decision or the reverse).
What it binds: the session id, the turn id, the call id, the card's input digest, the action (``approve`` or
``deny``), the edited input, the reason, the rule option (``always``), the reviewer and a nonce. So a record proves
one decision on one card, nothing else: moved to another session, turn or call, or to a card whose input changed,
it decides nothing (`refusal_for` says why in words the page and the person read).

A record is judged before it is read whole (`MAX_DECISION_BYTES`), and a key the session does not accept, a
signature that does not verify, or a field of the wrong type is a `DecisionError`, never a decision.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Mapping
from typing import Any, Final, Literal, final

import attrs

from trioloop.durable.bounded_json import parse_bounded_json
from trioloop.durable.signing import JournalKeys, JournalSigner
from trioloop.machine.canonical import canonical_json

__all__ = [
    "DECISION_ACTIONS",
    "DECISION_VERSION",
    "MAX_DECISION_BYTES",
    "DecisionError",
    "PostedDecision",
    "ReviewDecision",
    "decision_slot",
    "open_decision",
    "seal_decision",
]

DECISION_VERSION: Final = 1
"""The format's version: a record of another version is refused."""
MAX_DECISION_BYTES: Final = 256 * 1024
"""Largest record accepted (an edited input is at most this much less the rest): judged before it is read."""
DECISION_ACTIONS: Final = frozenset({"approve", "deny"})
_DOMAIN: Final = b"trioloop review decision v1\x00"
_REASON_CHARS: Final = 2000
_ID_CHARS: Final = 200
_FIELDS: Final = frozenset(
    {
        "v",
        "session_id",
        "turn_id",
        "call_id",
        "digest",
        "action",
        "edited_input",
        "reason",
        "always",
        "reviewer",
        "reviewer_name",
        "at",
        "nonce",
        "key_id",
        "signature",
    }
)

DecisionAction = Literal["approve", "deny"]


class DecisionError(ValueError):
    """A decision record that is not a proven decision (malformed, too large, unsigned, signed by a key the session
    does not accept, or not valid for its card); the message says which, in words a reviewer can read."""


def _short_text(name: str, limit: int) -> Any:
    def check(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
        if type(value) is not str:
            raise DecisionError(f"a decision's {name} must be text")
        if len(value) > limit:
            raise DecisionError(f"a decision's {name} is longer than {limit} characters")

    return check


def _nonempty(name: str) -> Any:
    def check(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
        if not value:
            raise DecisionError(f"a decision needs its {name}")

    return check


def _action(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value not in DECISION_ACTIONS:
        raise DecisionError(f"a decision's action is approve or deny, not {value!r}")


def _edited(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and type(value) is not dict:
        raise DecisionError("an edited input must be a JSON object")


def _always(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and value not in ("tool", "input"):
        raise DecisionError(f"a decision's rule option is 'tool' or 'input', not {value!r}")


def _at(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if type(value) is not int or value < 0:
        raise DecisionError("a decision's time must be a whole number of milliseconds")


@final
@attrs.frozen(kw_only=True)
class ReviewDecision:
    """One reviewer's decision on one card of one turn of one session (see the module docstring)."""

    session_id: str = attrs.field(validator=[_short_text("session id", 1000), _nonempty("session id")])
    turn_id: str = attrs.field(validator=[_short_text("turn id", _ID_CHARS), _nonempty("turn id")])
    call_id: str = attrs.field(validator=[_short_text("call id", _ID_CHARS), _nonempty("call id")])
    #: The input digest of the card the reviewer saw (`CallRecord.input_digest`).
    digest: str = attrs.field(validator=[_short_text("digest", _ID_CHARS), _nonempty("digest")])
    action: DecisionAction = attrs.field(validator=_action)
    edited_input: dict[str, Any] | None = attrs.field(default=None, validator=_edited)
    reason: str = attrs.field(default="", validator=_short_text("reason", _REASON_CHARS))
    always: Literal["tool", "input"] | None = attrs.field(default=None, validator=_always)
    #: The reviewer's id (as the inbox's config names them) and display name.
    reviewer: str = attrs.field(validator=[_short_text("reviewer", _ID_CHARS), _nonempty("reviewer")])
    reviewer_name: str = attrs.field(default="", validator=_short_text("reviewer's name", _ID_CHARS))
    #: When it was made (wall clock, unix ms): for people, nothing is decided by it.
    at: int = attrs.field(default=0, validator=_at)
    nonce: str = attrs.field(factory=lambda: secrets.token_hex(16), validator=_short_text("nonce", 64))

    def __attrs_post_init__(self) -> None:
        if self.action == "deny" and self.edited_input is not None:
            raise DecisionError("a denial carries no edited input")
        if self.action == "deny" and self.always == "input":
            raise DecisionError("a denial's rule option is 'tool' only")

    @property
    def slot(self) -> str:
        """The card it decides (`decision_slot`): at most one decision per slot applies."""
        return decision_slot(self.turn_id, self.call_id)

    def fields(self) -> dict[str, Any]:
        """The signed fields, as JSON values."""
        return {
            "v": DECISION_VERSION,
            "session_id": self.session_id,
            "turn_id": self.turn_id,
            "call_id": self.call_id,
            "digest": self.digest,
            "action": self.action,
            "edited_input": self.edited_input,
            "reason": self.reason,
            "always": self.always,
            "reviewer": self.reviewer,
            "reviewer_name": self.reviewer_name,
            "at": self.at,
            "nonce": self.nonce,
        }

    def describe(self) -> str:
        """``approved by Ada (ada)``: what the page and the audit say."""
        done = "approved" if self.action == "approve" else "denied"
        edited = " with an edited input" if self.edited_input is not None else ""
        who = f"{self.reviewer_name} ({self.reviewer})" if self.reviewer_name else self.reviewer
        return f"{done}{edited} by {who}"


def decision_slot(turn_id: str, call_id: str) -> str:
    """The card a decision is on: its turn and call ids (a call id is unique within its turn)."""
    return f"{turn_id}\x1f{call_id}"


def _message(fields: Mapping[str, Any], key_id: str) -> bytes:
    return _DOMAIN + canonical_json({**fields, "key_id": key_id}).encode("utf-8")


def seal_decision(decision: ReviewDecision, signer: JournalSigner) -> bytes:
    """The record of ``decision`` signed by ``signer``: canonical JSON, what the decision box keeps."""
    fields = decision.fields()
    signature = signer.sign(_message(fields, signer.key_id))
    raw = canonical_json({**fields, "key_id": signer.key_id, "signature": signature}).encode("utf-8")
    if len(raw) > MAX_DECISION_BYTES:
        raise DecisionError(f"the decision is {len(raw)} bytes, over the {MAX_DECISION_BYTES}-byte cap")
    return raw


@final
@attrs.frozen
class PostedDecision:
    """A record as the decision box holds it: its number in the box, the bytes, and what became of it
    (``waiting``; ``applied``; ``refused`` with the reason in ``note``)."""

    id: int
    session_id: str
    slot: str
    data: bytes = attrs.field(repr=lambda data: f"<{len(data)} bytes>")
    status: Literal["waiting", "applied", "refused"] = "waiting"
    note: str = ""

    @property
    def digest(self) -> str:
        """SHA-256 of the record's bytes: what a journal entry names it by."""
        return hashlib.sha256(self.data).hexdigest()


def open_decision(raw: bytes, keys: JournalKeys | None) -> tuple[ReviewDecision, str]:
    """The decision ``raw`` proves and the id of the key that signed it; `DecisionError` for anything else:
    over the size cap, not canonical JSON of exactly the record's fields, an unknown version, a key not in
    ``keys`` (None or empty accepts none), a signature that does not verify."""
    if len(raw) > MAX_DECISION_BYTES:
        raise DecisionError(f"a decision of {len(raw)} bytes is over the {MAX_DECISION_BYTES}-byte cap")
    value = parse_bounded_json(
        raw, max_bytes=MAX_DECISION_BYTES, max_depth=64, error=DecisionError, subject="a decision"
    )
    if type(value) is not dict or set(value) != _FIELDS:
        raise DecisionError("a decision record does not have exactly the fields of a decision")
    if canonical_json(value).encode("utf-8") != raw:
        raise DecisionError("a decision record that is not in canonical form")
    if value["v"] != DECISION_VERSION:
        raise DecisionError(f"a decision of version {value['v']!r}, not {DECISION_VERSION}")
    key_id, signature = value.pop("key_id"), value.pop("signature")
    if type(key_id) is not str or type(signature) is not str:
        raise DecisionError("a decision's key id and signature must be text")
    if not keys or key_id not in keys.ids:
        raise DecisionError(f"a decision signed by key {key_id[:40]!r}, which this session does not accept")
    if not keys.verify(key_id, _message(value, key_id), signature):
        raise DecisionError(f"a decision whose signature by key {key_id} does not verify")
    del value["v"]
    try:
        decision = ReviewDecision(**value)
    except TypeError as exc:  # a field of the wrong type that attrs itself refused
        raise DecisionError(f"a decision with a field of the wrong type: {exc}") from None
    return decision, key_id
