"""Opening a signed journal parses only the entries it reads: every entry's number, kind, prev hash and time are read
(and every byte hashed) at once, and its data when first asked. For any entry, and any bytes at all, the lazy reading
is the eager one: the same entry, or a `JournalError` (now or when its data is asked). A journal nothing verifies is
read whole at open, as before; `trioloop audit` reads every entry.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_reopen_settled import _rechained, _reopen, _run, _stored

from trioloop import JournalError, MemoryJournalStore
from trioloop.durable.audit import verify_session
from trioloop.durable.journal import JOURNAL_KINDS, MAX_ENTRY_DEPTH, decode_entry, encode_entry
from trioloop.durable.signing import JournalSigner
from trioloop.durable.store import StoredEntry

SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text()
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner), max_leaves=20)
ENTRIES = st.builds(
    encode_entry,
    st.integers(min_value=1, max_value=2**70),
    st.sampled_from(sorted(JOURNAL_KINDS)),
    st.text("0123456789abcdef", min_size=64, max_size=64),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.dictionaries(st.text(), JSON),
)


def _read(raw: bytes, lazy: bool) -> tuple[Any, ...] | str:
    """What decoding ``raw`` gives: the entry's fields with its data, or the error (now or when its data is read)."""
    try:
        entry = decode_entry(raw, lazy=lazy)
        return (entry.seq, entry.kind, entry.prev, entry.at_ms, entry.raw, json.dumps(entry.data, sort_keys=True))
    except JournalError:
        return "refused"


@settings(max_examples=300, deadline=None)
@given(raw=ENTRIES)
def test_for_any_entry_the_lazy_reading_is_the_eager_one(raw: bytes) -> None:
    eager, lazy = decode_entry(raw), decode_entry(raw, lazy=True)
    assert lazy == eager and lazy.data == eager.data and lazy.hash == eager.hash


@settings(max_examples=600, deadline=None)
@given(raw=ENTRIES, data=st.data())
def test_for_any_bytes_the_lazy_reading_is_the_eager_one_or_both_refuse(raw: bytes, data: st.DataObject) -> None:
    at = data.draw(st.integers(min_value=0, max_value=len(raw)), label="where")
    how = data.draw(st.sampled_from(["flip", "insert", "delete", "cut"]), label="how")
    byte = data.draw(st.sampled_from(b'{}[]",:\\ 0a-\x00\xff'), label="byte")
    if how == "flip" and at < len(raw):
        raw = raw[:at] + bytes([raw[at] ^ (byte or 1)]) + raw[at + 1 :]
    elif how == "insert":
        raw = raw[:at] + bytes([byte]) + raw[at:]
    elif how == "delete":
        raw = raw[:at] + raw[at + 1 :]
    else:
        raw = raw[:at]
    assert _read(raw, lazy=True) == _read(raw, lazy=False)


def test_an_entry_nested_to_the_limit_reads_the_same_and_one_level_more_is_refused_both_ways() -> None:
    for depth, ok in ((MAX_ENTRY_DEPTH - 1, True), (MAX_ENTRY_DEPTH, False)):
        nested: Any = 1
        for _ in range(depth - 1):
            nested = [nested]
        raw = encode_entry(1, "submit", "0" * 64, 0, {"x": nested})  # the entry, its data, then the lists
        assert (_read(raw, lazy=True) != "refused") is ok
        assert _read(raw, lazy=True) == _read(raw, lazy=False)


def test_a_lazy_entry_whose_data_is_not_json_is_refused_when_read() -> None:
    raw = encode_entry(7, "start", "0" * 64, 5, {"call_id": "c1"}).replace(b'"c1"', b"'c1'")
    entry = decode_entry(raw, lazy=True)  # its envelope is well formed
    assert (entry.seq, entry.kind) == (7, "start")
    with pytest.raises(JournalError, match="journal entry 7"):
        entry.data  # noqa: B018
    with pytest.raises(JournalError):
        decode_entry(raw)


async def test_an_entry_nothing_replays_is_read_only_by_an_audit_when_the_journal_is_signed() -> None:
    """What reading lazily gives up, shown: an entry of an earlier turn whose data is not JSON, signed over by the
    key's holder (trioloop's writer never writes one), no longer stops the session opening; an audit names it, and
    unsigned, it is refused at open as before."""
    for signer in (JournalSigner.generate(), None):
        store = MemoryJournalStore()
        await _run(store, signer, [("append", ""), ("talk", "")])
        rows = list(await store.read("s"))
        index = next(i for i, row in enumerate(rows) if decode_entry(row.data).kind == "start")  # turn 1's call
        rechained = _rechained(rows, signer)  # (signed again as it stands: the chain is what a key holder signs)
        broken_row = rechained[index].data.replace(b'"call_id":"c1"', b'"call_id":c1')
        broken = await _stored(_rechained_after(rechained, index, broken_row, signer))
        if signer is None:
            with pytest.raises(JournalError, match=f"journal entry {rows[index].seq}"):
                await _reopen(broken, None)
            continue
        session = await _reopen(broken, signer)
        async with session:
            assert session.document == "line 1\n" and session.state is not None
        _, verdict = await verify_session(broken, "s", keys=signer.keys, witness=None)
        assert verdict.verdict == "refused" and verdict.entry == rows[index].seq


def _rechained_after(
    rows: list[StoredEntry], index: int, raw: bytes, signer: JournalSigner | None
) -> list[StoredEntry]:
    """``rows`` with entry ``index`` replaced by ``raw`` (which need not decode) and the entries after it chained and
    signed again."""
    after = _rechained([StoredEntry(rows[index].seq, raw), *rows[index + 1 :]], signer)
    return [*rows[:index], StoredEntry(rows[index].seq, raw), *after[1:]]
