"""The journal's format: the entries a session records so that a review outlives its process, and their chain.

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

This module is the format: encoding, decoding and the hash chain. `JournalWriter`
(`trioloop.durable.journal_writer`) makes the entries of a live session; replay (`trioloop.durable.replay`) folds
them back.

Replay (`replay_journal`) feeds the same inputs to `reduce_turn` and gives the state the live session had,
field for field. `recovery_inputs` says what a reopened turn must do first: a call that was ``running`` is
settled failed and never run again (at most once), a call whose tool now prepares a different digest is
revoked, a request that was in flight is asked again as a retry.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, final

import attrs

from trioloop.durable.bounded_json import parse_bounded_json
from trioloop.durable.store import StoredEntry

__all__ = [
    "GENESIS",
    "JOURNAL_KINDS",
    "MAX_ENTRY_BYTES",
    "JournalEntry",
    "JournalError",
    "decode_entries",
    "decode_entry",
    "encode_entry",
    "entry_hash",
    "verify_chain",
]

#: The ``prev`` of a journal's first entry.
GENESIS: Final = "0" * 64
#: Largest entry accepted when reading (a snapshot holds a document and its undo history).
MAX_ENTRY_BYTES: Final = 256 * 1024 * 1024
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


def decode_entries(stored: Iterable[StoredEntry]) -> list[JournalEntry]:
    """Decode stored entries, checking each one's number against the store's."""
    decoded = []
    for item in stored:
        entry = decode_entry(item.data)
        if entry.seq != item.seq:
            raise JournalError(f"journal entry stored as {item.seq} says it is {entry.seq}", seq=item.seq)
        decoded.append(entry)
    return decoded
