"""Opening a journal checks one signature, the newest seal's, however many seals it holds; an audit checks them all.

The newest seal signs the hash of the entry before it, and the chain (checked whole on every open) binds that hash to
every entry before it, the earlier seals included: whatever is changed anywhere before it, the chain recomputed or
not, either breaks the chain or changes what the newest seal would have to sign. Each test tampers with a real
SQLite journal (the scene of `test_journal_integrity`: a destructive call waits, suspended, for the person).
"""

from __future__ import annotations

import base64
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import trio
from test_journal_integrity import RUNS, Journal, open_note, rechained, refused, resealed_with, suspended_in_review

from trioloop import JournalError
from trioloop.durable.audit import verify_session
from trioloop.durable.journal import JournalEntry, decode_entry, encode_entry, verify_journal
from trioloop.durable.signing import JournalKeys, JournalSigner, head_message
from trioloop.durable.sqlite import SQLiteJournalStore


@pytest.fixture
def signer() -> JournalSigner:
    return JournalSigner.generate()


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    yield Journal("sqlite", tmp_path, None)


@pytest.fixture
def checked(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of the seal each signature check is of (`JournalKeys.verify`, counted as it is called)."""
    seen: list[int] = []
    real = JournalKeys.verify

    def counting(keys: JournalKeys, key_id: str, message: bytes, signature: str) -> bool:
        seen.append(int(message.split(b"\x00")[2]) + 1)  # the message names the entry the seal follows
        return real(keys, key_id, message, signature)

    monkeypatch.setattr(JournalKeys, "verify", counting)
    return seen


def _seals(rows: Sequence[tuple[int, bytes]]) -> list[int]:
    return [seq for seq, data in rows if decode_entry(data).kind == "seal"]


def _flipped(signature: str) -> str:
    raw = base64.b64decode(signature)
    return base64.b64encode(bytes([raw[0] ^ 1]) + raw[1:]).decode()


def resealed(
    rows: Sequence[tuple[int, bytes]], signer: JournalSigner, session_id: str, *, forged: int
) -> list[tuple[int, bytes]]:
    """The journal chained again with every seal signed again by ``signer`` (as a writer holding the key but
    checking nothing would), except seal ``forged``, whose signature is one ``signer`` never made."""

    def seal(seq: int, prev: str, entry: JournalEntry) -> dict[str, Any]:
        sig = signer.sign(head_message(session_id, seq - 1, prev, entry.at_ms))
        return {**entry.data, "sig": _flipped(sig) if seq == forged else sig}

    return resealed_with(rows, seal)


async def test_opening_checks_the_newest_seals_signature_alone_and_an_audit_checks_each(
    journal: Journal, signer: JournalSigner, checked: list[int]
) -> None:
    await suspended_in_review(journal, signer)
    seals = _seals(journal.rows())
    assert len(seals) >= 3
    checked.clear()
    session = await open_note(journal, signer=signer, witness=None)
    assert set(checked) == {seals[-1]}  # (judged by the outline first, then by the entries: the same one)
    assert session.journal_integrity is not None and session.journal_integrity.verified and session.suspended
    await session.aclose()
    checked.clear()
    store = SQLiteJournalStore(journal.file)
    try:
        _, verdict = await verify_session(store, journal.sid("s1"), keys=signer.keys, witness=None)
    finally:
        await store.close()
    assert verdict.verdict == "verified" and set(checked) == set(seals)


async def test_a_forged_signature_of_any_seal_is_refused_on_open_the_chain_recomputed_or_not(
    journal: Journal, signer: JournalSigner
) -> None:
    await suspended_in_review(journal, signer)
    rows = journal.rows()
    for index, (seq, data) in enumerate(rows):
        entry = decode_entry(data)
        if entry.kind != "seal":
            continue
        forged = encode_entry(seq, "seal", entry.prev, entry.at_ms, {**entry.data, "sig": _flipped(entry.data["sig"])})
        tampered = [*rows[:index], (seq, forged), *rows[index + 1 :]]
        journal.rewrite(tampered)  # as stored: the next entry no longer carries its hash (or, the last, it fails)
        await refused(journal, signer, "does not (verify|carry the hash)", witness=None)
        journal.rewrite(rechained([raw for _, raw in tampered]))  # the chain made whole again after it
        await refused(journal, signer, "does not verify", witness=None)
    assert RUNS == []


async def test_a_bad_seal_that_the_key_holder_sealed_over_opens_and_only_an_audit_names_it(
    journal: Journal, signer: JournalSigner
) -> None:
    """What checking one signature gives up: a seal whose signature never held, followed by seals the key's holder
    made over it (no trioloop session does: each checks the journal before it appends). The key's holder vouched
    for everything before its newest seal, so the session opens; `trioloop audit` still names the bad seal."""
    await suspended_in_review(journal, signer)
    rows = journal.rows()
    first = _seals(rows)[0]
    journal.rewrite(resealed(rows, signer, journal.sid("s1"), forged=first))
    session = await open_note(journal, signer=signer, witness=None)
    assert session.suspended and RUNS == []
    await session.aclose()
    store = SQLiteJournalStore(journal.file)
    try:
        _, verdict = await verify_session(store, journal.sid("s1"), keys=signer.keys, witness=None)
    finally:
        await store.close()
    assert verdict.verdict == "refused" and verdict.entry == first and "does not verify" in (verdict.error or "")


def test_verify_journal_checks_every_signature_unless_asked_for_the_newest(
    journal: Journal, signer: JournalSigner, checked: list[int]
) -> None:
    """The default stays every seal: a caller has to ask for the cheaper proof."""

    async def scene() -> list[tuple[int, bytes]]:
        await suspended_in_review(journal, signer)
        return journal.rows()

    rows = trio.run(scene)
    entries = [decode_entry(data) for _, data in rows]
    seals = _seals(rows)
    checked.clear()
    verify_journal(entries, session_id=journal.sid("s1"), keys=signer.keys)
    assert checked == seals
    checked.clear()
    verify_journal(entries, session_id=journal.sid("s1"), keys=signer.keys, signatures="newest")
    assert checked == [seals[-1]]
    other: Any = JournalSigner.generate().keys
    with pytest.raises(JournalError, match="not among the keys given"):  # every seal's key is still checked
        verify_journal(entries, session_id=journal.sid("s1"), keys=other, signatures="newest")
