"""`FileWitness`'s file: two slots written in place, each with its own check, and heads kept by name.

A torn write (a crash in the middle of one) leaves the other slot, one head behind, never a false alarm; a
head is never replaced by an older one, nor by another journal's (only after a retirement); files of the earlier
JSON format are read; a head longer than a slot gets a file with larger slots; a head the journal key
authenticated that was edited since is refused; a file's size is judged before it is read.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trioloop.durable import witness as witness_module
from trioloop.durable.journal import JournalError
from trioloop.durable.signing import JournalSigner
from trioloop.durable.witness import FileWitness, WitnessedHead, witness_name

JOURNAL = "journal-1"
STORE = "sqlite:/somewhere/notes.db"
NAME = witness_name(STORE, "s1")


def head(seq: int, session: str = "s1", *, journal: str = JOURNAL, store: str = STORE, **kw: Any) -> WitnessedHead:
    return WitnessedHead(journal=journal, session=session, seq=seq, hash=f"{seq:064x}", store=store, **kw)


def the_file(witness: FileWitness) -> Path:
    (path,) = [p for p in witness.folder.iterdir() if not p.name.startswith(".")]
    return path


def test_heads_are_written_in_place_and_the_newest_is_read(tmp_path: Path) -> None:
    witness = FileWitness(tmp_path)
    witness.witness_now(head(3))
    path = the_file(witness)
    inode = path.stat().st_ino
    for seq in (5, 9, 12):
        witness.witness_now(head(seq))
    assert witness._read(NAME) == head(12)
    assert path.stat().st_ino == inode  # written in place: no new file, no rename
    assert (path.stat().st_mode & 0o777) == 0o600


def test_an_older_head_never_replaces_a_newer_one(tmp_path: Path) -> None:
    witness = FileWitness(tmp_path)
    witness.witness_now(head(10))
    witness.witness_now(head(12))
    before = the_file(witness).read_bytes()
    for seq in (4, 11, 12):
        witness.witness_now(head(seq))
    assert the_file(witness).read_bytes() == before
    assert witness._read(NAME) == head(12)


def torn_pwrite(keep: int) -> Any:
    """An `os.pwrite` that writes only the first ``keep`` bytes, as a crash in the middle of the write leaves."""

    real = os.pwrite

    def pwrite(descriptor: int, data: bytes, offset: int) -> int:
        return real(descriptor, data[:keep], offset)

    return pwrite


@pytest.mark.parametrize("keep", [0, 1, 4, 30, 60, 130])
def test_a_torn_write_leaves_the_head_before_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keep: int) -> None:
    witness = FileWitness(tmp_path)
    witness.witness_now(head(1))
    witness.witness_now(head(2))
    with monkeypatch.context() as patch:
        patch.setattr(witness_module.os, "pwrite", torn_pwrite(keep))
        witness.witness_now(head(3))  # overwrites the slot of head 1, and is cut
    assert witness._read(NAME) == head(2)  # one behind: never an error
    witness.witness_now(head(4))  # goes into the torn slot again: head 2 stays whole meanwhile
    assert witness._read(NAME) == head(4)


def test_a_file_whose_slots_both_fail_their_check_is_refused(tmp_path: Path) -> None:
    witness = FileWitness(tmp_path)
    witness.witness_now(head(1))
    witness.witness_now(head(2))
    path = the_file(witness)
    data = bytearray(path.read_bytes())
    start = len(witness_module._MAGIC) + 4
    for slot in (0, 1):
        data[start + slot * witness_module._SLOT + 20] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(JournalError, match="not a witnessed head"):
        witness._read(NAME)
    with pytest.raises(JournalError, match="not a witnessed head"):
        witness.witness_now(head(3))
    path.write_bytes(b"{}")
    with pytest.raises(JournalError, match="not a witnessed head"):
        witness._read(NAME)


def test_a_file_of_another_session_is_refused(tmp_path: Path) -> None:
    witness = FileWitness(tmp_path)
    witness.witness_now(head(5, session="other"))
    other = the_file(witness)
    other.rename(witness._path(NAME))  # a file copied over another session's
    with pytest.raises(JournalError, match="not a witnessed head"):
        witness._read(NAME)


def test_another_journal_never_replaces_the_witnessed_one_until_it_is_retired(tmp_path: Path) -> None:
    witness = FileWitness(tmp_path)
    witness.witness_now(head(9))
    witness.witness_now(head(20, journal="journal-2"))  # another journal of the same session: not kept
    assert witness._read(NAME) == head(9)
    witness.witness_now(head(9, retired=True))  # the explicit act: a retirement is always kept, in both slots
    assert witness._read(NAME) == head(9, retired=True)
    witness.witness_now(head(2, journal="journal-2"))  # the new journal's first head replaces the retired one
    assert witness._read(NAME) == head(2, journal="journal-2")
    witness.witness_now(head(30))  # the retired journal's heads are never kept again
    assert witness._read(NAME) == head(2, journal="journal-2")


def test_an_earlier_json_file_is_read_by_its_journal(tmp_path: Path) -> None:
    # Earlier versions kept heads by the journal's id, in JSON: still read (by that id, which `Session.open` asks
    # for when no head is kept under the session's name), and a head under the name does not touch it.
    witness = FileWitness(tmp_path)
    legacy = witness._path(JOURNAL, ".json")
    legacy.write_text(json.dumps({"journal": JOURNAL, "session": "s1", "seq": 7, "hash": f"{7:064x}"}))
    assert witness._read(JOURNAL) == head(7, store="")
    witness.witness_now(head(8))
    assert witness._read(NAME) == head(8) and witness._read(JOURNAL) == head(7, store="")


def test_a_head_longer_than_a_slot_gets_a_file_with_larger_slots(tmp_path: Path) -> None:
    witness = FileWitness(tmp_path)
    store = "sqlite:/" + "s" * 5000
    name = witness_name(store, "s1")
    for seq in (1, 2, 3):
        witness.witness_now(head(seq, store=store))
        assert witness._read(name) == head(seq, store=store)


def _reslot(path: Path, edit: Any) -> None:
    """Rewrite the newest slot's JSON with ``edit`` and a length and checksum that fit: an edit made on purpose."""
    import hashlib

    data = bytearray(path.read_bytes())
    start = len(witness_module._MAGIC) + 4
    for slot in (0, 1):
        offset = start + slot * witness_module._SLOT
        (length,) = witness_module._LENGTH.unpack_from(data, offset)
        if not length:
            continue
        value = json.loads(bytes(data[offset + 4 : offset + 4 + length]))
        text = json.dumps(edit(value), sort_keys=True, separators=(",", ":")).encode()
        body = witness_module._LENGTH.pack(len(text)) + text + hashlib.sha256(text).digest()
        data[offset : offset + witness_module._SLOT] = body.ljust(witness_module._SLOT, b"\0")
    path.write_bytes(bytes(data))


def test_a_head_the_journal_key_authenticated_that_was_edited_is_refused(tmp_path: Path) -> None:
    signer = JournalSigner.generate()
    witness = FileWitness(tmp_path, signer=signer)
    witness.witness_now(head(12))
    assert witness._read(NAME) == head(12)
    _reslot(the_file(witness), lambda value: {**value, "seq": 3})  # rolled back to an older head, checksum fixed
    with pytest.raises(JournalError, match="was edited"):
        witness._read(NAME)
    _reslot(the_file(witness), lambda value: {**value, "seq": 12, "mac": "0" * 64})
    with pytest.raises(JournalError, match="was edited"):
        witness._read(NAME)
    # Read by a witness without the key, or with another, the head is taken as it stands (no worse than deleting
    # the file, the documented limit of a local witness); with the key, a head without its MAC likewise.
    assert FileWitness(tmp_path)._read(NAME) is not None
    assert FileWitness(tmp_path, signer=JournalSigner.generate())._read(NAME) is not None
    _reslot(the_file(witness), lambda value: {k: v for k, v in value.items() if k not in ("mac", "key")})
    assert witness._read(NAME) == head(12)


def test_a_witness_file_is_judged_by_its_size_before_it_is_read(tmp_path: Path) -> None:
    witness = FileWitness(tmp_path)
    witness.folder.mkdir(exist_ok=True)
    with open(witness._path(NAME), "wb") as file:
        file.truncate(1 << 30)  # 1 GiB, sparse: reading it whole would take that much memory
    with pytest.raises(JournalError, match="over 65536 bytes"):
        witness._read(NAME)
    with pytest.raises(JournalError, match="over 65536 bytes"):
        witness.witness_now(head(1))
    witness._path(NAME).unlink()
    with open(witness._path(JOURNAL, ".json"), "wb") as file:
        file.truncate(1 << 30)
    with pytest.raises(JournalError, match="over 65536 bytes"):
        witness._read(JOURNAL)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    writes=st.lists(
        st.tuples(st.integers(min_value=1, max_value=60), st.none() | st.integers(min_value=0, max_value=120)),
        min_size=1,
        max_size=25,
    )
)
def test_the_newest_head_whole_written_is_always_read(tmp_path_factory: pytest.TempPathFactory, writes: Any) -> None:
    """For all sequences of heads, some of them torn (cut after a number of bytes): the head read is the
    newest one written whole, or newer (never older, never an error)."""
    witness = FileWitness(tmp_path_factory.mktemp("w"))
    whole = 0
    real_pwrite = os.pwrite
    for seq, cut in writes:
        if cut is None:
            witness.witness_now(head(seq))
            whole = max(whole, seq)
        else:
            witness_module.os.pwrite = torn_pwrite(cut)  # type: ignore[attr-defined]
            try:
                witness.witness_now(head(seq))
            finally:
                witness_module.os.pwrite = real_pwrite  # type: ignore[attr-defined]
        read = witness._read(NAME)
        assert read is not None
        assert read.seq >= whole and read == head(read.seq)
