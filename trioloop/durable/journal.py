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
  kind's text form and its digest (`document_digest`). The snapshots name the document's kind and source.
- ``advance``, ``retry``, ``cancel``, ``revoke``, ``undo``: the other reducer inputs.
- ``suspend``, ``resume``: the turn was suspended in review (with the machine time spent and the time the
  review had waited), and taken up again.
- ``seal``: the end of an append batch, signing its head: the session id, the key's id and an Ed25519
  signature (`trioloop.durable.signing`) over the session id and the number and hash of the entry before it
  (the seal's own ``seq`` - 1 and ``prev``; seals of earlier versions also repeat them as ``seq`` and
  ``head``). `verify_journal` checks every seal and that nothing follows the last one; a snapshot names the
  seal it follows (``after``) and whether the journal may be compacted (``compact``), so a journal may start
  after entry 1 only at such a snapshot.

This module is the format: encoding, decoding and the hash chain. `JournalWriter`
(`trioloop.durable.journal_writer`) makes the entries of a live session; replay (`trioloop.durable.replay`) folds
them back.

Replay (`replay_journal`) feeds the same inputs to `reduce_turn` and gives the state the live session had,
field for field. `recovery_inputs` says what a reopened turn must do first: a call that was ``running`` is
settled failed and never run again (at most once), a call whose tool now prepares a different digest is
revoked, a request that was in flight is asked again as a retry.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from json.encoder import c_make_encoder, encode_basestring_ascii  # type: ignore[attr-defined]
from typing import Any, Final, Literal, TypeAlias, final

import attrs

from trioloop.durable.bounded_json import parse_bounded_json
from trioloop.durable.signing import SEAL_VERSION, JournalKeys, head_message
from trioloop.durable.store import StoredEntry

__all__ = [
    "GENESIS",
    "JOURNAL_KINDS",
    "MAX_ENTRY_BYTES",
    "VERIFY_IN_THREAD_BYTES",
    "JournalEntry",
    "JournalError",
    "JournalIntegrity",
    "decode_entries",
    "decode_entry",
    "decode_numbered",
    "document_digest",
    "encode_entry",
    "entry_hash",
    "journal_id_of",
    "refuse_unsigned_tail",
    "verify_chain",
    "verify_journal",
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
        "before_request",
        "undo",
        "redo",
        "suspend",
        "resume",
        "seal",
        "forget",
        "rules",
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
    """One decoded entry; ``raw`` is its exact bytes (what the next entry's ``prev`` hashes). An entry decoded
    ``lazy`` (`decode_entry`) reads its ``data`` from ``raw`` when first asked (`JournalError` if it is not data)."""

    seq: int
    kind: str
    prev: str
    at_ms: int
    _data: Mapping[str, Any] | None = attrs.field(alias="data", eq=False, repr=False)
    raw: bytes = attrs.field(repr=False)

    @property
    def data(self) -> Mapping[str, Any]:
        data = self._data
        if data is None:
            data = _data_of(self.raw, self.seq)
            object.__setattr__(self, "_data", data)
        return data

    @property
    def hash(self) -> str:
        return entry_hash(self.raw)


def entry_hash(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def document_digest(text: str) -> str:
    """A document's identity in the journal: the SHA-256 (hex) of its text form, UTF-8 encoded."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def encode_entry(seq: int, kind: str, prev: str, at_ms: int, data: Mapping[str, Any]) -> bytes:
    """One entry's bytes: ASCII JSON, keys in the documented order, no whitespace, one line."""
    if kind not in JOURNAL_KINDS:
        raise ValueError(f"unknown journal entry kind {kind!r}")
    value = {"seq": seq, "kind": kind, "prev": prev, "at": at_ms, "data": data}
    if _encode is None:
        return json.dumps(value, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")
    return "".join(_encode(value, 0)).encode("ascii")


def _refuse(value: object) -> object:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


# The standard library's C encoder, made once: ``json.dumps`` with these options makes a new one for every call,
# about 2 us of a 3-5 us entry. The same bytes (a property test holds them equal); where the C encoder is missing,
# ``json.dumps``. No circular-reference markers: entries are built from the session's own acyclic values.
_encode: Final = (
    None
    if c_make_encoder is None
    else c_make_encoder(None, _refuse, encode_basestring_ascii, None, ":", ",", False, False, False)
)


#: The start of an entry exactly as `encode_entry` writes it: what a ``lazy`` decode reads without the data.
_ENVELOPE: Final = re.compile(
    rb'\{"seq":([1-9][0-9]{0,15}),"kind":"([a-z_]{1,32})","prev":"([0-9a-f]{64})","at":(-?(?:0|[1-9][0-9]{0,15})),"data":\{'
)


def decode_entry(raw: bytes, *, lazy: bool = False) -> JournalEntry:
    """Decode one stored entry; `JournalError` for anything that is not a well-formed entry.

    Read in bounded memory (`parse_bounded_json`: at most about 8 times the entry's size), strict (no
    NaN, no repeated key, nesting at most `MAX_ENTRY_DEPTH`), ASCII only, as `encode_entry` writes. With ``lazy``,
    an entry in exactly `encode_entry`'s form has its number, kind, prev hash and time read now and its data when
    first asked (what hashing and verifying a journal need, without parsing entries nothing replays): the same
    reading, or the same `JournalError` then; any other entry is decoded whole now."""
    if lazy and type(raw) is bytes and len(raw) <= MAX_ENTRY_BYTES and raw.endswith(b"}}") and raw.isascii():
        envelope = _ENVELOPE.match(raw)
        if envelope is not None and (kind := envelope[2].decode("ascii")) in JOURNAL_KINDS:
            seq, prev, at = int(envelope[1]), envelope[3].decode("ascii"), int(envelope[4])
            return JournalEntry(seq=seq, kind=kind, prev=prev, at_ms=at, data=None, raw=raw)
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


def _data_of(raw: bytes, seq: int) -> Mapping[str, Any]:
    """A ``lazy`` entry's data: the object after its envelope, read as `decode_entry` would read it within the entry
    (one level of nesting less); anything else is decoded whole, which names what is wrong."""
    envelope = _ENVELOPE.match(raw)
    if envelope is not None:
        with contextlib.suppress(JournalError):
            value = parse_bounded_json(
                raw[envelope.end() - 1 : -1],
                max_bytes=MAX_ENTRY_BYTES,
                max_depth=MAX_ENTRY_DEPTH - 1,
                error=JournalError,
                subject="a journal entry",
            )
            if type(value) is dict:
                return value
    return decode_numbered(StoredEntry(seq, raw)).data


def decode_numbered(item: StoredEntry, *, lazy: bool = False) -> JournalEntry:
    """`decode_entry` of a stored entry, a failure naming the entry by the number it is stored under."""
    try:
        return decode_entry(item.data, lazy=lazy)
    except JournalError as exc:
        if exc.seq is not None:
            raise
        raise JournalError(f"journal entry {item.seq} cannot be decoded: {exc}", seq=item.seq) from None


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


def decode_entries(stored: Iterable[StoredEntry], *, lazy: bool = False) -> list[JournalEntry]:
    """Decode stored entries (``lazy``: see `decode_entry`), checking each one's number against the store's."""
    decoded = []
    for item in stored:
        entry = decode_numbered(item, lazy=lazy)
        if entry.seq != item.seq:
            raise JournalError(f"journal entry stored as {item.seq} says it is {entry.seq}", seq=item.seq)
        decoded.append(entry)
    return decoded


@final
@attrs.frozen(kw_only=True)
class JournalIntegrity:
    """What `verify_journal` proved of a journal: whether every entry is signed (and by which keys), whether
    the signatures were checked, and where a compacted journal starts."""

    #: Every entry is covered by a seal (the last entry is one).
    signed: bool
    #: The seals were checked against public keys (False: signed but no key to check it, or unsigned).
    verified: bool
    key_ids: frozenset[str] = frozenset()
    #: The number of the first stored entry (1 unless compacted).
    first_seq: int = 1

    def describe(self) -> str:
        """One line for a person: signed and verified (by which keys), signed but unchecked, or unsigned."""
        keys = ", ".join(sorted(self.key_ids))
        if self.verified:
            return f"signed and verified ({keys})"
        if self.signed:
            return f"signed by {keys}, not verified (no public key given)"
        return "unsigned: nothing proves who wrote it"


def _seal_fields(entry: JournalEntry) -> tuple[str, int, str, str, str, bytes]:
    """A seal's session, the number and hash of the entry it signs (its own place in the chain; seals written
    before that was so repeat them, and must agree), key id, signature, and the message the signature is over
    (version 2, ``"v": 2``, signs the seal's own time as well; a seal without ``v`` is version 1)."""
    data = entry.data
    session, key, sig = data.get("session"), data.get("key"), data.get("sig")
    seq, head = data.get("seq", entry.seq - 1), data.get("head", entry.prev)
    if not (type(session) is str and type(seq) is int and type(head) is str and type(key) is str and type(sig) is str):
        raise JournalError(f"journal entry {entry.seq} is a seal without its fields", seq=entry.seq)
    version = data.get("v", 1)
    if type(version) is not int or version not in (1, SEAL_VERSION) or set(data) - _SEAL_KEYS[version]:
        raise JournalError(f"journal entry {entry.seq} is a seal of an unknown form", seq=entry.seq)
    at_ms = entry.at_ms if version == SEAL_VERSION else None
    return session, seq, head, key, sig, head_message(session, seq, head, at_ms)


#: The fields a seal of each version may have: any other field would be outside the signature.
_SEAL_KEYS: Final = {
    1: frozenset({"session", "seq", "head", "key", "sig"}),
    SEAL_VERSION: frozenset({"session", "v", "key", "sig"}),
}


def _check_seal(
    entry: JournalEntry, before: JournalEntry | None, session_id: str, keys: JournalKeys | None, *, signature: bool
) -> str:
    """Check one seal against the entry it follows (and, with ``signature``, its signature); its key id."""
    session, seq, head, key, sig, message = _seal_fields(entry)
    if session != session_id:
        raise JournalError(
            f"journal entry {entry.seq} seals session {session!r}, not {session_id!r}: these entries belong to "
            "another session",
            seq=entry.seq,
        )
    if before is None or seq != before.seq or head != before.hash or entry.prev != head:
        raise JournalError(f"journal entry {entry.seq} seals an entry that is not the one before it", seq=entry.seq)
    if keys is not None and key not in keys.ids:
        raise JournalError(
            f"journal entry {entry.seq} is signed by key {key}, which is not among the keys given (a key since "
            "rotated or lost: pass its public key; or not the journal's writer)",
            seq=entry.seq,
        )
    if signature and keys is not None and not keys.verify(key, message, sig):
        raise JournalError(
            f"journal entry {entry.seq}'s signature does not verify (key {key}): entries up to it were changed or "
            "forged",
            seq=entry.seq,
        )
    return key


def _check_start(first: JournalEntry, session_id: str, keys: JournalKeys | None) -> None:
    """A journal that starts after entry 1 must start at a snapshot that allows compaction and (signed) names
    the seal it followed, whose signature holds."""
    # Without keys nothing is proved anyway, and a journal compacted before snapshots said so still opens.
    allowed = first.data.get("compact") is True or (keys is None and first.data.get("compact") is None)
    if first.kind != "snapshot" or not allowed:
        raise JournalError(
            f"the journal starts at entry {first.seq}, not 1, and not at a snapshot that allows compaction: "
            "entries before it were removed",
            seq=first.seq,
        )
    after = first.data.get("after")
    if keys is None:
        return
    if type(after) is not str or entry_hash(after.encode("ascii", "replace")) != first.prev:
        raise JournalError(
            f"journal entry {first.seq} does not name the signed head of the entries compacted before it",
            seq=first.seq,
        )
    seal = decode_entry(after.encode("ascii"))
    if seal.kind != "seal" or seal.seq != first.seq - 1:
        raise JournalError(f"journal entry {first.seq} follows no seal", seq=first.seq)
    session, _, _, key, sig, message = _seal_fields(seal)
    if session != session_id or not keys.verify(key, message, sig):
        raise JournalError(f"journal entry {first.seq} names a head the compacted entries did not have", seq=first.seq)


def journal_id_of(entries: Sequence[JournalEntry], session_id: str) -> str:
    """Which journal this is, wherever it is stored: the id its snapshots carry (a journal from before they did:
    the session and its first entry's hash). A witness keeps heads by it."""
    named = entries[0].data.get("journal") if entries else None
    if type(named) is str and named:
        return named
    return f"{session_id}@{entries[0].hash}" if entries else session_id


#: The largest stored entry taken for a seal when looking for the last one before decoding (a seal is ~300 bytes).
_MAX_SEAL_BYTES: Final = 4096
#: How much may follow the last seal ``keys`` verify before it is refused unread (a journal's own tail: its last
#: batch, when a later seal is forged; beyond this, decoding it first would cost more than judging it by position).
UNSIGNED_TAIL_BYTES: Final = 16 * 1024 * 1024


Outline: TypeAlias = Sequence[tuple[int, int, "bytes | None"]]


def refuse_unsigned_tail(outline: Outline, *, session_id: str, keys: JournalKeys) -> None:
    """Refuse (`JournalError`), by position and length before the rest is read, more than `UNSIGNED_TAIL_BYTES` of
    stored entries after the last seal whose signature ``keys`` verify. ``outline`` holds, for each stored entry,
    its number, its length and (a short one, as every seal is) its bytes: entries nobody signed can make nothing
    run, and an unsigned entry of hundreds of MB after the last seal (or before a forged one) would otherwise be
    read and decoded whole first. A smaller tail is left to `verify_journal`, which names exactly what is wrong."""
    unknown: str | None = None
    tail = 0
    for seq, size, data in reversed(outline):
        if data is not None and size <= _MAX_SEAL_BYTES and data.startswith(b'{"seq":%d,"kind":"seal"' % seq):
            try:
                session, _, _, key, sig, message = _seal_fields(decode_entry(data))
            except JournalError:
                session, key, sig, message = "", "", "", b""
            if session == session_id and keys.verify(key, message, sig):
                break
            if session == session_id and key not in keys.ids:
                unknown = unknown or key
        tail += size
    else:
        if outline and unknown is not None and tail > UNSIGNED_TAIL_BYTES:
            raise JournalError(f"the journal is signed by key {unknown}, which is not among the keys given")
    if tail > UNSIGNED_TAIL_BYTES:
        raise JournalError(
            f"{tail} bytes of journal entries follow the last seal the keys given verify: nobody signed them "
            "(refused unread)"
        )


#: A journal this long (its entries' bytes) is decoded and verified in a worker thread (opening a session, reading one
#: to fork it): the work is CPU (about 0.2 ms per KiB), and on the event loop it would hold every other task (and
#: their deadlines) meanwhile.
VERIFY_IN_THREAD_BYTES: Final = 32 * 1024


def verify_journal(
    entries: Sequence[JournalEntry],
    *,
    session_id: str,
    keys: JournalKeys | None,
    signatures: Literal["every", "newest"] = "every",
) -> JournalIntegrity:
    """Check a whole journal before anything of it is replayed: numbering, the hash chain from the genesis (or
    from a compaction snapshot), every seal (session, head, and with ``keys`` the signature), and that no entry
    follows the last seal. `JournalError` names the first entry that does not hold.

    With ``keys``, an unsigned journal, or one with entries after its last seal, is refused: entries nobody
    signed can make nothing run. Without, an unsigned journal is read and reported as such (`JournalIntegrity`).

    ``signatures="newest"`` checks the signature of the newest seal only (every seal's session, place and key are
    checked all the same): it signs the hash of the entry before it, which the chain, checked whole, binds to every
    entry before that, earlier seals included, so it proves what checking them all would, for one signature instead
    of one per append. What `Session.open` does; an audit checks every one (``"every"``, the default).
    """
    if not entries:
        raise JournalError("the journal is empty")
    first = entries[0]
    if first.seq != 1:
        _check_start(first, session_id, keys)
    verify_chain(entries, first_prev=GENESIS if first.seq == 1 else None)
    key_ids: set[str] = set()
    sealed_to = first.seq - 1
    before: JournalEntry | None = None
    newest = next((i for i in range(len(entries) - 1, -1, -1) if entries[i].kind == "seal"), -1)
    every = signatures == "every"
    for index, entry in enumerate(entries):
        if entry.kind == "seal":
            key_ids.add(_check_seal(entry, before, session_id, keys, signature=every or index == newest))
            sealed_to = entry.seq
        before = entry
    if first.seq != 1 and not any(entry.kind == "submit" for entry in entries):
        # Compaction keeps the snapshot the last turn started from, and that turn: a compacted journal with no turn
        # after its first snapshot was cut back to it (it would reopen as if no turn had ever run).
        raise JournalError(
            f"the journal starts at the compacted snapshot {first.seq} and holds no turn after it: the entries of its "
            "last turn were removed",
            seq=first.seq,
        )
    last = entries[-1].seq
    signed = sealed_to == last
    if keys is not None and not signed:
        if not key_ids:
            raise JournalError("the journal is not signed: open it without keys to read it as unsigned")
        raise JournalError(
            f"journal entries {sealed_to + 1} to {last} follow the last seal: nobody signed them", seq=sealed_to + 1
        )
    return JournalIntegrity(
        signed=signed, verified=signed and keys is not None, key_ids=frozenset(key_ids), first_seq=first.seq
    )
