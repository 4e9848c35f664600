"""The session file: conversation, document and undo history in one versioned JSON file, so an app
can stop and later continue the same conversation on the same document, undo included.

Pure functions: `encode_session(snapshot, dump_document=...) -> bytes` and
`decode_session(data, load_document=...) -> SessionSnapshot`. The document type is the caller's:
it passes ``dump_document`` (D -> str) and ``load_document`` (str -> D; it must refuse hostile text
itself, as `load_thf` does, and raise on anything invalid). Write the bytes with
`trioloop.durable.files.write_atomic`.

Format (version 2), one JSON object with exactly these keys::

    {"format": "trioloop-session", "version": 2, "model": str | null,
     "kind": str | null,                     # the document kind's name ("threat model")
     "source": str | null,                   # where the document lives, as the app named it (the CLI: its file)
     "messages": [...],                      # trioloop.protocol.serialization, pairable
     "document": str,                        # dump_document(the live document)
     "undo": [{"turn_id": str, "document": str}, ...],   # oldest first, the pre-turn documents
     "undo_max_entries": int,
     "last_turn_id": str | null,
     "turn_count": int,                      # turns started so far: new turn ids continue after it
     "usage": {"input_tokens": int, "output_tokens": int, "cache_read_input_tokens": int,
               "cache_creation_input_tokens": int, "reasoning_tokens": int}}   # every settled turn's tokens

Version 1 files (without ``kind`` and ``source``) are still read; they name no kind and no source. ``usage`` may
be absent (a file written before it was kept): the session then counts from nothing.

Decoding refuses, with `SessionFileError` (a `ValueError`) and never anything else: more than
``max_bytes``, bytes that are not UTF-8, text that is not JSON (NaN and Infinity included, and a
number too large for a float), a duplicate key anywhere, nesting deeper than `MAX_JSON_DEPTH`, a
file whose JSON values would take more than 8 times its size plus 1 MiB of memory (a million
``{}`` in 2.9 MiB, say), a missing, unknown or mistyped key, another format or version, messages
that do not deserialize or whose tool calls and results do not pair, more than `MAX_UNDO_ENTRIES`
undo entries or duplicate turn ids among them, and any document text ``load_document`` refuses.

Memory: the JSON is read by `trioloop.durable.bounded_json.parse_bounded_json`, which prices what
the parse would build before building it, so reading the JSON never holds more than 8 times the
file's size plus 1 MiB (a file `encode_session` wrote holds about 5.5 times its size while it is
read; see that module for the prices and measurements). Then ``load_document`` runs once per
document, and its memory is what it allows per document.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from functools import partial
from typing import Any, Final, Generic, TypeVar, final

import attrs

from trioloop.durable.bounded_json import parse_bounded_json
from trioloop.durable.document_form import TEXT_FORM
from trioloop.machine.conditions import RuleError
from trioloop.machine.rules import SESSION_SOURCE, ApprovalRule, RuleSet
from trioloop.machine.transaction import UndoEntry, UndoHistory
from trioloop.protocol.events import Usage
from trioloop.protocol.messages import Message, assert_tool_pairing
from trioloop.protocol.serialization import SerializationError, messages_from_json, messages_to_json

__all__ = [
    "MAX_JSON_DEPTH",
    "MAX_SESSION_BYTES",
    "MAX_UNDO_ENTRIES",
    "SESSION_FORMAT",
    "SESSION_VERSION",
    "SessionFileError",
    "SessionSnapshot",
    "UndoRecord",
    "decode_session",
    "encode_session",
    "session_from_json",
    "session_to_json",
]

SESSION_FORMAT: Final = "trioloop-session"
SESSION_VERSION: Final = 2
#: Default cap on a session file's size (a document may be up to 5 MiB, and undo keeps several).
MAX_SESSION_BYTES: Final = 64 * 1024 * 1024
#: Most undo entries a session file may hold (the default undo history keeps 20).
MAX_UNDO_ENTRIES: Final = 100
#: Deepest JSON nesting accepted (a message needs about 6; tool inputs nest further).
MAX_JSON_DEPTH: Final = 128

_KEYS_V1: Final = frozenset(
    {"format", "version", "model", "messages", "document", "undo", "undo_max_entries", "last_turn_id", "turn_count"}
)
_KEYS: Final = _KEYS_V1 | {"kind", "source"}
#: Keys a version 2 file may hold or leave out (written since they were added; a file without them still reads).
_OPTIONAL_KEYS: Final = frozenset({"usage", "rules", "document_form"})
_USAGE_FIELDS: Final = (
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "reasoning_tokens",
)

D = TypeVar("D")
_TURN_ID: Final = re.compile(r"turn-([0-9]{1,18})")


class SessionFileError(ValueError):
    """A session file that cannot be resumed; the message says why (never echoing its content)."""


@final
@attrs.frozen(kw_only=True)
class UndoRecord(Generic[D]):
    """One undo entry: the document as it was before ``turn_id`` changed it."""

    turn_id: str
    document: D


@final
@attrs.frozen(kw_only=True)
class SessionSnapshot(Generic[D]):
    """What a session file holds.

    ``undo`` is oldest first. ``last_turn_id`` is the turn an "undo last turn" would undo; its
    pre-turn document is the top undo entry's when that entry is the last turn's, and otherwise
    the live document (the turn changed nothing, or was already undone). ``turn_count`` is how many
    turns were started, so a resumed session numbers new turns after every id already used. ``kind`` is
    the document kind's name and ``source`` where the document lives, as the app named it (the CLI: the
    file's absolute path); both None in a version 1 file.
    """

    messages: tuple[Message, ...]
    document: D
    undo: tuple[UndoRecord[D], ...] = ()
    undo_max_entries: int = 20
    last_turn_id: str | None = None
    turn_count: int = 0
    model: str | None = None
    kind: str | None = None
    source: str | None = None
    #: The tokens every settled turn of the session used (a file written before they were kept: none).
    usage: Usage = attrs.field(factory=Usage)
    #: The session's own approval rules (a person's "always" from a card), in the order they were added.
    rules: tuple[ApprovalRule, ...] = ()

    def undo_history(self) -> UndoHistory[D]:
        """The undo history these records make (oldest first, capped as saved)."""
        entries = tuple(UndoEntry(turn_id=r.turn_id, document=r.document) for r in self.undo)
        return UndoHistory(entries=entries, max_entries=self.undo_max_entries)

    def turns_started(self) -> int:
        """How many turns to count as started: new turn ids continue after every id the snapshot uses (its
        count, its undo records, its last turn), so no new turn can pass for an old one."""
        used = [r.turn_id for r in self.undo] + [self.last_turn_id or ""]
        numbered = [int(m.group(1)) for m in map(_TURN_ID.fullmatch, used) if m is not None]
        return max([self.turn_count, *numbered])


def encode_session(snapshot: SessionSnapshot[D], *, dump_document: Callable[[D], str]) -> bytes:
    """The session file's bytes (ASCII JSON: every non-ASCII character escaped, so any text survives)."""
    value = session_to_json(snapshot, dump_document=dump_document)
    return (json.dumps(value, ensure_ascii=True, allow_nan=False, indent=1) + "\n").encode("ascii")


def session_to_json(
    snapshot: SessionSnapshot[D], *, dump_document: Callable[[D], str], document_form: str | None = None
) -> dict[str, Any]:
    """The session file's JSON object (a journal's snapshot entry holds it as it is). ``document_form`` names the
    form ``dump_document`` writes the documents in when it is not the kind's text form (a journal's data form:
    `trioloop.durable.document_form`)."""
    problems = assert_tool_pairing(snapshot.messages)
    if problems:
        raise SessionFileError(f"the conversation is not pairable: {problems[0].kind.value}")
    value = {
        "format": SESSION_FORMAT,
        "version": SESSION_VERSION,
        "kind": snapshot.kind,
        "source": snapshot.source,
        "model": snapshot.model,
        "messages": messages_to_json(snapshot.messages),
        "document": dump_document(snapshot.document),
        "undo": [{"turn_id": r.turn_id, "document": dump_document(r.document)} for r in snapshot.undo],
        "undo_max_entries": snapshot.undo_max_entries,
        "last_turn_id": snapshot.last_turn_id,
        "turn_count": snapshot.turn_count,
        "usage": {name: getattr(snapshot.usage, name) for name in _USAGE_FIELDS},
        "rules": [rule.to_json() for rule in snapshot.rules],
    }
    if document_form is not None:
        value["document_form"] = document_form
    return value


def decode_session(
    data: bytes, *, load_document: Callable[[str], D], max_bytes: int = MAX_SESSION_BYTES
) -> SessionSnapshot[D]:
    """Read a session file's bytes; raises `SessionFileError` for anything but a valid session."""
    if not isinstance(data, bytes | bytearray):
        raise SessionFileError(f"a session file is bytes, got {type(data).__name__}")
    value = parse_bounded_json(
        data, max_bytes=max_bytes, max_depth=MAX_JSON_DEPTH, error=SessionFileError, subject="the session file"
    )
    return session_from_json(value, load_document=load_document)


def session_from_json(
    value: Any, *, load_document: Callable[[str], D], decode_document: Callable[[str, str], D] | None = None
) -> SessionSnapshot[D]:
    """A session from its parsed JSON object (every check of `decode_session` but the parse). Documents in a
    form other than the text form (``document_form``: a journal's data form) go to ``decode_document(form,
    text)``; without it, such a session is refused."""
    if not isinstance(value, dict):
        raise SessionFileError("the session file is not a JSON object")
    if value.get("format") != SESSION_FORMAT:
        raise SessionFileError("not a trioloop session file")
    version = value.get("version")
    if type(version) is not int or version not in (1, SESSION_VERSION):
        raise SessionFileError(f"session file version {version!r} is not supported (this reads 1 to {SESSION_VERSION})")
    keys = _KEYS if version == SESSION_VERSION else _KEYS_V1
    missing = sorted(keys - value.keys())
    unknown = sorted(value.keys() - keys - (_OPTIONAL_KEYS if version == SESSION_VERSION else frozenset()))
    if missing or unknown:
        raise SessionFileError(
            f"the session file {'lacks' if missing else 'has the unknown key'} {(missing or unknown)[0]!r}"
        )
    model = _optional_text(value["model"], "model")
    kind = _optional_text(value.get("kind"), "kind")
    source = _optional_text(value.get("source"), "source")
    messages = _messages(value["messages"])
    undo_max = value["undo_max_entries"]
    if type(undo_max) is not int or not 1 <= undo_max <= MAX_UNDO_ENTRIES:
        raise SessionFileError(f"undo_max_entries must be a whole number from 1 to {MAX_UNDO_ENTRIES}")
    turn_count = value["turn_count"]
    if type(turn_count) is not int or turn_count < 0:
        raise SessionFileError("turn_count must be a whole number, 0 or more")
    last_turn_id = _optional_text(value["last_turn_id"], "last_turn_id")
    records = _undo_records(value["undo"], undo_max)
    form = value.get("document_form", TEXT_FORM)
    if form != TEXT_FORM:
        if decode_document is None or type(form) is not str:
            raise SessionFileError(f"the documents are in a form this reader does not take: {form!r}")
        load_document = partial(decode_document, form)
    document = _document(value["document"], "document", load_document)
    undo = tuple(
        UndoRecord(turn_id=turn_id, document=_document(text, f"undo[{i}].document", load_document))
        for i, (turn_id, text) in enumerate(records)
    )
    return SessionSnapshot(
        messages=messages,
        document=document,
        undo=undo,
        undo_max_entries=undo_max,
        last_turn_id=last_turn_id,
        turn_count=turn_count,
        model=model,
        kind=kind,
        source=source,
        usage=_usage(value.get("usage")),
        rules=session_rules_from_json(value.get("rules", []), SessionFileError),
    )


def session_rules_from_json(value: object, error: Callable[[str], Exception]) -> tuple[ApprovalRule, ...]:
    """A session's own rules as `session_to_json` (or a journal's ``rules`` entry) wrote them; ``error`` for a
    list that is not one of session rules, numbered once each."""
    try:
        rules = RuleSet.from_json(value).rules
    except RuleError as exc:
        raise error(f"the session's rules are not valid: {exc}") from None
    numbers = [rule.number for rule in rules]
    if any(rule.source != SESSION_SOURCE or rule.number < 1 for rule in rules) or len(set(numbers)) != len(numbers):
        raise error("the session's rules are not valid: each must be a numbered session rule")
    return rules


def _usage(value: object) -> Usage:
    if value is None:
        return Usage()
    if type(value) is not dict or value.keys() != set(_USAGE_FIELDS):
        raise SessionFileError(f"usage must be an object with exactly the keys {', '.join(_USAGE_FIELDS)}")
    if not all(type(count) is int and 0 <= count < 2**63 for count in value.values()):
        raise SessionFileError("usage counts must be whole numbers, 0 or more")
    return Usage(**value)


def _optional_text(value: object, name: str) -> str | None:
    if value is not None and type(value) is not str:
        raise SessionFileError(f"{name} must be text or null")
    return value


def _messages(value: object) -> tuple[Message, ...]:
    try:
        messages = messages_from_json(value)
    except SerializationError:
        raise SessionFileError("the conversation holds a message that is not valid") from None
    problems = assert_tool_pairing(messages)
    if problems:
        first = problems[0]
        raise SessionFileError(f"the conversation is not pairable: {first.kind.value} at message {first.message_index}")
    return messages


def _undo_records(value: object, undo_max: int) -> list[tuple[str, str]]:
    if type(value) is not list:
        raise SessionFileError("undo must be a list")
    if len(value) > undo_max:
        raise SessionFileError(f"undo holds {len(value)} entries, more than undo_max_entries ({undo_max})")
    records: list[tuple[str, str]] = []
    seen: set[str] = set()
    for index, entry in enumerate(value):
        if type(entry) is not dict or entry.keys() != {"turn_id", "document"}:
            raise SessionFileError(f"undo[{index}] must be an object with turn_id and document")
        turn_id, text = entry["turn_id"], entry["document"]
        if type(turn_id) is not str or not turn_id:
            raise SessionFileError(f"undo[{index}].turn_id must be non-empty text")
        if turn_id in seen:
            raise SessionFileError(f"undo[{index}].turn_id repeats an earlier entry's turn id")
        seen.add(turn_id)
        records.append((turn_id, text))
    return records


def _document(value: object, name: str, load_document: Callable[[str], D]) -> D:
    if type(value) is not str:
        raise SessionFileError(f"{name} must be text")
    try:
        return load_document(value)
    except Exception as exc:
        detail = getattr(exc, "message", None)
        reason = f": {detail}" if isinstance(detail, str) else f" ({type(exc).__name__})"
        raise SessionFileError(f"{name} is not a valid document{reason}") from None
