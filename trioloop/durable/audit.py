"""The audit trail of a journaled session: who approved which exact input, when, what the card showed, what
changed; and whether the journal is the one that was written (its hash chain, its signatures, its witnessed head).

`audit_session` reads a session's entries from a store (no lease: a running session can be audited) and
yields printable lines; `audit_records` gives the same as JSON-ready dicts (``trioloop audit --json`` prints
one per line). Both verify numbering and the hash chain as they go and stop at the first entry that does not
match, raising `JournalError` naming it, after yielding every entry before it. `verify_session` reads a
session as one consistent view (the witnessed head first, then the journal, which a running session only ever
lengthens) and gives its `AuditVerdict`: verified (with a public key), unverified (no key: nothing proves who
wrote it), or refused (naming the first entry that does not hold).
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal, final

import attrs
import trio

from trioloop.durable.decisions import DecisionError, open_decision
from trioloop.durable.document_form import DATA_FORM
from trioloop.durable.journal import (
    GENESIS,
    VERIFY_IN_THREAD_BYTES,
    JournalEntry,
    JournalError,
    JournalIntegrity,
    decode_entries,
    decode_numbered,
    document_digest,
    journal_id_of,
    refuse_unsigned_tail,
    verify_journal,
)
from trioloop.durable.signing import JournalKeys
from trioloop.durable.store import JournalStore, StoredEntry, outline_of, store_identity
from trioloop.durable.witness import HeadWitness, check_witnessed, witness_name
from trioloop.machine.canonical import canonical_json
from trioloop.machine.untrusted_text import sanitize_scalar

__all__ = [
    "AuditVerdict",
    "audit_lines",
    "audit_records",
    "audit_session",
    "recorded_decision",
    "verified_entries",
    "verified_journal",
    "verify_decision_entries",
    "verify_session",
    "verify_stored",
]

_VALUE_MAX = 200


def verified_entries(stored: Sequence[StoredEntry]) -> Iterator[JournalEntry]:
    """Decode and verify ``stored`` in order; `JournalError` at the first entry that does not match."""
    prev: str | None = GENESIS
    expected: int | None = None
    for item in stored:
        entry = decode_numbered(item)
        if entry.seq != item.seq:
            raise JournalError(f"entry {item.seq} says it is entry {entry.seq}", seq=item.seq)
        if expected is None:
            expected = entry.seq
            prev = GENESIS if entry.seq == 1 else None  # compacted: the chain starts at the first kept entry
        if entry.seq != expected:
            raise JournalError(f"entry {entry.seq} follows entry {expected - 1}: an entry is missing", seq=entry.seq)
        if prev is not None and entry.prev != prev:
            raise JournalError(
                f"entry {entry.seq} does not carry the SHA-256 of the entry before it: "
                "this entry or an earlier one was changed",
                seq=entry.seq,
            )
        yield entry
        prev = entry.hash
        expected += 1


def _when(at_ms: int) -> str:
    moment = datetime.datetime.fromtimestamp(at_ms / 1000, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{at_ms % 1000:03d}Z"


def _show(value: Any) -> str:
    """A value from the journal as one safe line: control and bidi characters stripped, capped."""
    text = value if isinstance(value, str) else repr(value)
    shown, cut = sanitize_scalar(text, _VALUE_MAX)
    return shown + "…" if cut else shown


def _card_lines(card: Any, indent: str) -> list[str]:
    if not isinstance(card, Mapping):
        return []
    if "tool" not in card:  # approved by the read-only policy: never shown, its digest kept
        call_id, digest = _show(card.get("call_id")), _show(card.get("digest"))
        return [f"{indent}call {call_id} approved by the read-only policy, digest {digest}"]
    head = (
        f"{indent}card {_show(card.get('call_id'))}: {_show(card.get('tool'))} "
        f"({'destructive ' if card.get('destructive') else ''}{_show(card.get('effect'))}), "
        f"digest {_show(card.get('digest'))}"
    )
    lines = [head, f"{indent}  {_show(card.get('summary'))}"]
    for pair in card.get("details") or ():
        if isinstance(pair, list) and len(pair) == 2:
            lines.append(f"{indent}  {_show(pair[0])}: {_show(pair[1])}")
    return lines


def recorded_decision(entry: JournalEntry) -> dict[str, Any] | None:
    """The signed record an ``approve`` or ``deny`` entry keeps (a decision made in the web inbox), or None."""
    if entry.kind not in ("approve", "deny"):
        return None
    record = entry.data.get("decision")
    return record if type(record) is dict else None


def verify_decision_entries(entries: Sequence[JournalEntry], *, session_id: str, keys: JournalKeys) -> dict[int, str]:
    """Prove every decision made in the inbox that ``entries`` record: its signed record verifies with ``keys`` and
    says what the entry says (this session, the call, approve or deny, the reviewer, the edited input or reason).
    The signing key's id per entry number; `JournalError` naming the first entry that does not hold."""
    signed_by: dict[int, str] = {}
    for entry in entries:
        record = recorded_decision(entry)
        if record is None:
            continue
        try:
            decision, key_id = open_decision(canonical_json(record).encode("utf-8"), keys)
        except DecisionError as exc:
            message = f"journal entry {entry.seq} keeps a decision that is not proven: {exc}"
            raise JournalError(message, seq=entry.seq) from None
        data = entry.data
        said = (
            decision.session_id == session_id
            and decision.call_id == data.get("call_id")
            and decision.action == ("approve" if entry.kind == "approve" else "deny")
            and decision.reviewer == data.get("reviewer") == data.get("by")
            and decision.digest == data.get("seen_digest")
            and (decision.edited_input == data.get("edited_input") if entry.kind == "approve" else True)
            and (decision.reason == data.get("reason") if entry.kind == "deny" else True)
            and decision.always == data.get("always")
        )
        if not said:
            raise JournalError(f"journal entry {entry.seq} says other than the decision it keeps", seq=entry.seq)
        signed_by[entry.seq] = key_id
    return signed_by


def _inbox_lines(entry: JournalEntry) -> list[str]:
    """Who decided away from the session (the web inbox, a decisions document), and the key that signed their record
    (proven by `verify_session`)."""
    record = recorded_decision(entry)
    if record is None:
        return []
    name = f"{_show(record.get('reviewer_name'))} ({_show(record.get('reviewer'))})"
    where = "away from the session (web inbox or decisions document)"
    return [f"  decided {where} by reviewer {name}, record signed by key {_show(record.get('key_id'))}"]


def _describe(entry: JournalEntry) -> list[str]:
    data = entry.data
    kind = entry.kind
    by = f" by {_show(data.get('by'))}" if data.get("by") else ""
    if kind == "snapshot":
        session = data.get("session")
        if not isinstance(session, Mapping):
            return ["session snapshot (not readable)"]
        document = session.get("document")
        sha = document_digest(document)[:16] if isinstance(document, str) else ""
        form = " (its data form)" if session.get("document_form") == DATA_FORM else ""
        messages = session.get("messages")
        count = len(messages) if isinstance(messages, list) else 0
        of = f" of the {_show(session['kind'])}" if isinstance(session.get("kind"), str) else ""
        source = f" ({_show(session['source'])})" if isinstance(session.get("source"), str) else ""
        turns = _show(session.get("turn_count"))
        lines = [f"session snapshot{of}{source}: {count} messages, {turns} turns, document sha256 {sha}…{form}"]
        origin = data.get("forked_from")
        if isinstance(origin, Mapping):
            lines.append(
                f"  forked from session {_show(origin.get('session'))} after its entry {_show(origin.get('seq'))} "
                f"(head {_show(origin.get('head'))[:16]}…, journal {_show(origin.get('journal'))})"
            )
        return lines
    if kind == "submit":
        tools = ", ".join(_show(t) for t in data.get("tools") or ())
        return [f"turn {_show(data.get('turn_id'))} starts: {_show(data.get('text'))}", f"  tools offered: {tools}"]
    if kind == "stream":
        events = data.get("events") or ()
        calls = [e for e in events if isinstance(e, Mapping) and e.get("type") == "tool_call_complete"]
        stops = [e.get("stop_reason") for e in events if isinstance(e, Mapping) and e.get("type") == "message_stop"]
        errors = [e.get("message") for e in events if isinstance(e, Mapping) and e.get("type") == "error"]
        text = "".join(e.get("text", "") for e in events if isinstance(e, Mapping) and e.get("type") == "text_delta")
        head = f"model answered: {len(text)} characters of text, {len(calls)} tool call(s)"
        if stops:
            head += f", stop {_show(stops[-1])}"
        if errors:
            head += f", error {_show(errors[-1])}"
        lines = [head]
        for card in data.get("cards") or ():
            lines.extend(_card_lines(card, "  "))
        for decided in data.get("decided") or ():
            if isinstance(decided, Mapping):
                lines.append(
                    f"  call {_show(decided.get('call_id'))} ({_show(decided.get('tool'))}) "
                    f"{_show(decided.get('decided_by'))}"
                )
        return lines
    if kind == "forget":
        return [f"session rule {_show(data.get('number'))} removed{by}"]
    if kind == "rules":
        rules = data.get("rules")
        count = len(rules) if isinstance(rules, list) else 0
        return [f"the session's rules set to {count} rule(s){by}"]
    if kind == "approve":
        always = data.get("always")
        remembered = f", and always for this session ({_show(always)})" if always else ""
        lines = [f"approved {_show(data.get('call_id'))}{by}{remembered}", *_inbox_lines(entry)]
        lines.extend(_card_lines(data.get("card"), "  "))
        for edit in data.get("edits") or ():
            if isinstance(edit, list) and len(edit) == 3:
                lines.append(f"  edited {_show(edit[0])}: {_show(edit[1])} -> {_show(edit[2])}")
        return lines
    if kind == "approve_batch":
        ids = ", ".join(_show(i) for i in data.get("call_ids") or ())
        lines = [f"approved together{by}: {ids}"]
        for card in data.get("cards") or ():
            lines.extend(_card_lines(card, "  "))
        return lines
    if kind == "deny":
        reason = data.get("reason")
        always = ", and always for this session" if data.get("always") else ""
        lines = [f"declined {_show(data.get('call_id'))}{by}{always}" + (f": {_show(reason)}" if reason else "")]
        lines.extend(_inbox_lines(entry))
        lines.extend(_card_lines(data.get("card"), "  "))
        return lines
    if kind == "start":
        return [f"call {_show(data.get('call_id'))} started"]
    if kind == "settled":
        status = "succeeded" if data.get("ok") else "failed"
        document = data.get("document")
        committed = ""
        if isinstance(document, str):
            digest = document_digest(document)[:16]
            form = "its data form, " if data.get("document_form") == DATA_FORM else ""
            committed = f", committed the document ({form}sha256 {digest}…)"
        return [f"call {_show(data.get('call_id'))} {status}{committed}: {_show(data.get('result'))}"]
    if kind == "advance":
        return ["iteration done: the model is asked again (or the turn ends at a limit)"]
    if kind == "retry":
        failure = data.get("failure")
        message = failure.get("message") if isinstance(failure, Mapping) else None
        return [f"request retried after {data.get('wait_ms')} ms" + (f": {_show(message)}" if message else "")]
    if kind == "cancel":
        reason = data.get("reason")
        return ["Stop: the turn was cancelled" if reason == "stop" else f"the turn ended at a limit: {_show(reason)}"]
    if kind == "before_request":
        return [
            f"request not sent: about {data.get('input_tokens')} tokens in and up to {data.get('output_tokens')} out"
            " would pass a token or cost bound"
        ]
    if kind == "revoke":
        return [f"call {_show(data.get('call_id'))} refused: its tool changed ({_show(data.get('detail'))})"]
    if kind == "undo":
        return [f"turn {_show(data.get('turn_id'))} undone{by}"]
    if kind == "redo":
        return [f"turn {_show(data.get('turn_id'))} redone{by}"]
    if kind == "suspend":
        return [
            f"suspended in review (machine time {data.get('machine_ms')} ms, review waited "
            f"{data.get('review_waited_ms')} ms)"
        ]
    if kind == "resume":
        return [f"turn {_show(data.get('turn_id'))} taken up again{by}"]
    if kind == "seal":
        return [f"signed head of entry {_show(data.get('seq', entry.seq - 1))} by {_show(data.get('key'))}"]
    return [kind]


def audit_lines(stored: Sequence[StoredEntry]) -> Iterator[str]:
    """The trail as text: one block per entry, each headed by its number, time and hash."""
    for entry in verified_entries(stored):
        head, *rest = _describe(entry)
        yield f"#{entry.seq} {_when(entry.at_ms)} {entry.hash[:12]} {entry.kind}: {head}"
        for line in rest:
            yield f"    {line}"


def audit_records(stored: Sequence[StoredEntry]) -> Iterator[dict[str, Any]]:
    """The trail as JSON-ready records: each entry's number, kind, time, hashes and data, verified."""
    for entry in verified_entries(stored):
        yield {
            "seq": entry.seq,
            "kind": entry.kind,
            "at": _when(entry.at_ms),
            "at_ms": entry.at_ms,
            "prev": entry.prev,
            "hash": entry.hash,
            "data": entry.data,
        }


async def audit_session(store: JournalStore, session_id: str) -> Sequence[StoredEntry]:
    """A session's stored entries, read without a lease."""
    return await store.read(session_id)


@final
@attrs.frozen(kw_only=True)
class AuditVerdict:
    """What auditing one session proved: ``verdict`` is ``verified`` (every signature checked against a public key
    given, the witnessed head extended), ``unverified`` (the chain holds, but no key was given: nothing proves who
    wrote it, and a journal `Session.open` would refuse can look the same), ``refused`` (``error`` names why,
    ``entry`` the first entry that does not hold, when there is one), or ``missing`` (no journal, and no head
    witnessed for one)."""

    session: str
    verdict: Literal["verified", "unverified", "refused", "missing"]
    entries: int
    first: int | None = None
    last: int | None = None
    integrity: JournalIntegrity | None = None
    witnessed: int | None = None
    error: str | None = None
    entry: int | None = None

    def describe(self) -> str:
        """One line for a person."""
        if self.verdict == "missing":
            return f"session {self.session}: no journal"
        if self.verdict == "refused":
            where = f"entry {self.entry}" if self.entry is not None else "the journal"
            return f"session {self.session}: {where} does not verify: {self.error}"
        witnessed = "" if self.witnessed is None else f"; witnessed up to entry {self.witnessed}"
        chain = f"hash chain verified ({self.entries} entries)"
        if self.verdict == "unverified":
            what = "nothing proves who wrote it" if self.integrity is None else self.integrity.describe()
            return (
                f"session {self.session}: {chain}{witnessed}; NOT VERIFIED: no public key was given "
                f"(--public-key, --public-keys, or your own signing key), {what}"
            )
        assert self.integrity is not None
        return f"session {self.session}: {chain}; {self.integrity.describe()}{witnessed}"

    def record(self) -> dict[str, Any]:
        """The verdict as a JSON-ready dict (``trioloop audit --json`` prints it after the session's entries)."""
        return {
            "session": self.session,
            "verdict": self.verdict,
            "entries": self.entries,
            "first": self.first,
            "last": self.last,
            "signed": None if self.integrity is None else self.integrity.signed,
            "key_ids": [] if self.integrity is None else sorted(self.integrity.key_ids),
            "witnessed": self.witnessed,
            "error": self.error,
            "entry": self.entry,
        }


async def verify_session(
    store: JournalStore, session_id: str, *, keys: JournalKeys | None, witness: HeadWitness | None
) -> tuple[Sequence[StoredEntry], AuditVerdict]:
    """Read ``session_id`` as one consistent view and judge it: the head ``witness`` keeps for it is read first, then
    the journal (appends only lengthen it, so a running session's journal always holds that head); then numbering,
    chain, every seal (with ``keys``; without, the verdict is ``unverified``) and the witnessed head are checked.
    The entries read, and the verdict. `JournalStoreError` when the store cannot be read."""
    stored, _, verdict = await verified_journal(store, session_id, keys=keys, witness=witness)
    return stored, verdict


async def verify_stored(
    stored: Sequence[StoredEntry],
    *,
    session_id: str,
    keys: JournalKeys | None,
    decisions: bool = False,
    signatures: Literal["every", "newest"] = "every",
    lazy: bool = False,
) -> tuple[list[JournalEntry], JournalIntegrity, str]:
    """``stored`` decoded and verified (`verify_journal`, checking ``signatures``; with ``decisions`` and ``keys``,
    every decision made away from the session proven by its signed record too): the entries, what verifying proved,
    and the journal's id. With ``lazy``, the entries of a journal that verified keep their data unread until asked
    (`decode_entry`); those of one that did not are all read here.
    `JournalError` for what does not hold. A journal of `VERIFY_IN_THREAD_BYTES` or more is verified in a worker
    thread: CPU work that would hold every other task (and their deadlines) meanwhile."""

    def check() -> tuple[list[JournalEntry], JournalIntegrity, str]:
        if keys is not None:  # a store without an outline: judged by position at least before it is decoded
            refuse_unsigned_tail(outline_of(stored), session_id=session_id, keys=keys)
        entries = decode_entries(stored, lazy=lazy)
        integrity = verify_journal(entries, session_id=session_id, keys=keys, signatures=signatures)
        if lazy and not integrity.verified:  # nothing proves who wrote them: every entry is read, as without lazy
            for entry in entries:
                entry.data  # noqa: B018 (read for its check)
        if decisions and keys is not None:
            verify_decision_entries(entries, session_id=session_id, keys=keys)
        return entries, integrity, journal_id_of(entries, session_id)

    if sum(len(entry.data) for entry in stored) < VERIFY_IN_THREAD_BYTES:
        await trio.lowlevel.checkpoint()
        return check()
    return await trio.to_thread.run_sync(check)


async def verified_journal(
    store: JournalStore, session_id: str, *, keys: JournalKeys | None, witness: HeadWitness | None
) -> tuple[Sequence[StoredEntry], list[JournalEntry], AuditVerdict]:
    """`verify_session`, with the entries it decoded and verified too (none unless the verdict is ``verified`` or
    ``unverified``): what a fork reads its source from (`trioloop.durable.history`)."""
    name = witness_name(store_identity(store), session_id)
    head = None if witness is None else await witness.last_head(name)
    outline = getattr(store, "outline", None)
    try:
        if keys is not None and outline is not None:  # judged by position and length before it is read
            refuse_unsigned_tail(await outline(session_id), session_id=session_id, keys=keys)
        stored = await store.read(session_id)
    except JournalError as exc:  # an entry too large to read, or not stored as bytes
        return (), [], AuditVerdict(session=session_id, verdict="refused", entries=0, error=str(exc), entry=exc.seq)
    verdict = AuditVerdict(session=session_id, verdict="refused", entries=len(stored))
    if not stored:
        try:
            check_witnessed((), head)  # an emptied session is refused; one never witnessed (or retired) is missing
        except JournalError as exc:
            return stored, [], attrs.evolve(verdict, error=str(exc))
        return stored, [], attrs.evolve(verdict, verdict="missing")
    try:
        entries, integrity, journal_id = await verify_stored(stored, session_id=session_id, keys=keys, decisions=True)
        if head is None and witness is not None:  # a head an earlier version kept under the journal's own id
            legacy = await witness.last_head(journal_id)
            head = legacy if legacy is not None and not legacy.store and legacy.session == session_id else None
        check_witnessed(entries, head, journal_id)
    except JournalError as exc:
        return stored, [], attrs.evolve(verdict, error=str(exc), entry=exc.seq)
    return (
        stored,
        entries,
        attrs.evolve(
            verdict,
            verdict="verified" if keys is not None and integrity.verified else "unverified",
            first=entries[0].seq,
            last=entries[-1].seq,
            integrity=integrity,
            witnessed=None if head is None else head.seq,
        ),
    )
